"""verl's legacy reward config (top-level ``reward_model.*``, ``custom_reward_function.*``,
``sandbox_fusion.*``) moved to its ``reward.*`` home, as verl's own
``verl.experimental.reward_loop.migrate_legacy_reward_impl`` does (verl 0.9.1), with three differences:

- the selector may also be written ``reward_model.reward_manager.name=...`` (this project's advertised
  spelling) as well as verl's string form ``reward_model.reward_manager=...``;
- fields are merged one by one: a legacy ``custom_reward_function.path`` without a ``name`` keeps
  ``reward.custom_reward_function.name`` (``compute_score``) instead of setting it to None;
- the legacy nodes are reset to None instead of deleted, so the config keeps verl's shape.

verl 0.9.1's stock ``main_ppo`` never calls its migration: the legacy keys compose and are silently
ignored. This module is pure (a DictConfig in, the same DictConfig changed); the hydra hook that
applies it to the stock entry point is ``stock_entry``; ``main_ppo`` applies it to ours.
"""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict, read_write

ASYNC_AGENT = "async_agent"

# legacy key -> new key, for single values (verl 0.9.1's migrate_legacy_reward_impl, in its order)
SCALAR_MOVES = (
    ("reward_model.num_workers", "reward.num_workers"),
    ("reward_model.reward_loop_source", "reward.reward_manager.source"),
    ("reward_model.reward_loop_module_path", "reward.reward_manager.module.path"),
    ("reward_model.reward_loop_class_name", "reward.reward_manager.module.name"),
    ("reward_model.enable", "reward.reward_model.enable"),
    ("reward_model.enable_resource_pool", "reward.reward_model.enable_resource_pool"),
    ("reward_model.n_gpus_per_node", "reward.reward_model.n_gpus_per_node"),
    ("reward_model.nnodes", "reward.reward_model.nnodes"),
    ("reward_model.model.path", "reward.reward_model.model_path"),
    ("reward_model.reward_kwargs", "reward.reward_kwargs"),
)
# legacy node -> new node, moved key by key (every non-None key of the legacy node)
NODE_MOVES = (
    ("custom_reward_function", "reward.custom_reward_function"),
    ("reward_model.rollout", "reward.reward_model.rollout"),
    ("sandbox_fusion", "reward.sandbox_fusion"),
)


def _get(config: DictConfig, key: str) -> Any:
    return OmegaConf.select(config, key, default=None, throw_on_missing=False)


def legacy_selector(config: DictConfig) -> str | None:
    """The manager named by the legacy selector, in either spelling, or None."""
    node = _get(config, "reward_model.reward_manager")
    if isinstance(node, DictConfig):
        return node.get("name")
    return node


def selects_async_agent(config: DictConfig) -> bool:
    """Whether this run uses ``async_agent``, by the legacy selector or the current one."""
    return legacy_selector(config) == ASYNC_AGENT or _get(config, "reward.reward_manager.name") == ASYNC_AGENT


def has_legacy_reward_config(config: DictConfig) -> bool:
    return bool(moves(config))


def moves(config: DictConfig) -> list[tuple[str, str, Any]]:
    """Every (legacy key, new key, value) the migration would apply, in order."""
    planned: list[tuple[str, str, Any]] = []
    selector = legacy_selector(config)
    if selector is not None:
        planned.append(("reward_model.reward_manager", "reward.reward_manager.name", selector))
    for old, new in SCALAR_MOVES:
        value = _get(config, old)
        if value is not None:
            planned.append((old, new, OmegaConf.to_container(value, resolve=True) if isinstance(value, DictConfig) else value))
    for old, new in NODE_MOVES:
        node = _get(config, old)
        if isinstance(node, DictConfig):
            for key, value in OmegaConf.to_container(node, resolve=True).items():
                if value is not None:
                    planned.append((f"{old}.{key}", f"{new}.{key}", value))
    return planned


def exact_spelling(config: DictConfig) -> str:
    """The overrides that say in ``reward.*`` what the legacy keys of ``config`` say (dicts flattened;
    ``+`` where verl's ``reward`` config does not declare the key)."""
    parts = []

    def emit(key: str, value: Any) -> None:
        if isinstance(value, dict):
            for sub, item in value.items():
                emit(f"{key}.{sub}", item)
            return
        undeclared = key.startswith(("reward.custom_reward_function.reward_kwargs", "reward.reward_kwargs"))
        parts.append(f"{'+' if undeclared else ''}{key}={value}")

    for _, new, value in moves(config):
        emit(new, value)
    return " ".join(parts)


def _reset(config: DictConfig, key: str) -> None:
    parent_key, _, leaf = key.rpartition(".")
    parent = _get(config, parent_key) if parent_key else config
    if isinstance(parent, DictConfig) and leaf in parent:
        parent[leaf] = None


def migrate_legacy_reward_config(config: DictConfig) -> list[str]:
    """Move every legacy reward key of ``config`` to its ``reward.*`` key (in place); returns the moves
    as ``"old -> new"`` lines. Legacy values win over the current keys, as in verl's migration."""
    planned = moves(config)
    with read_write(config), open_dict(config):
        for old, new, value in planned:
            OmegaConf.update(config, new, value, merge=False, force_add=True)
        for old, _, _ in planned:
            _reset(config, old)
        if isinstance(_get(config, "reward_model.reward_manager"), DictConfig):
            config.reward_model.reward_manager = None  # back to verl's shape (a string slot)
    return [f"{old} -> {new}" for old, new, _ in planned]
