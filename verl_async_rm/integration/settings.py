"""A run's settings, read from verl's config and validated at start: the one reader of this package's
keys (the ``reward.async_agent`` block, the strategy flags) and of what it needs of verl's own.

``read_run_settings(config)`` returns them as one typed, frozen object (``RunSettings``: the agent's
settings, the strategy, the trainer's shape, the masking shape), after every check that needs nothing
built. It is called once where a run starts (``main_ppo.prepare``; on verl's own entry point, the start
callback in ``stock_entry.py``), and once in each process verl hands the config to (a trainer, a reward
manager, an agent-loop worker), which then hands the object down rather than reading the config again.

Agent settings live in a ``reward.async_agent`` block (``+reward.async_agent.max_concurrency=64`` with
verl's own config; declared with defaults in ``verl_async_rm/hydra_conf/``). Besides every ``AgentConfig`` field it
takes the integration's own keys below. The reward itself comes from verl's usual
``reward.custom_reward_function.path/name`` (+ ``reward_kwargs``); without one, verl's
``default_compute_score``.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, replace
from typing import Any, Optional

from omegaconf import DictConfig, OmegaConf, open_dict

from verl_async_rm.config import AgentConfig
from verl_async_rm.drift import DriftCheckSettings, drift_settings_from_mapping
from verl_async_rm.loader import RewardSpec
from verl_async_rm.masking import MaskShape, check_masking, mask_shape_from_config
from verl_async_rm.ray_agent import DEFAULT_ACTOR_NAME
from verl_async_rm.strategies.plan import (
    StrategyConfig,
    TrainerShape,
    VerlColocateAsync,
    check_strategy,
    off_policy_on_verl,
    shape_from_config,
    strategy_from_mapping,
)

DEFAULT_REWARD = "verl.utils.reward_score:default_compute_score"
DEFAULT_GROUP_WAIT = 10.0
# With a group-size signal (integration/group_sizes.py) a group closes when complete; this only ends
# one that a failed rollout session left short (v1), so nobody waits forever.
DEFAULT_GROUP_TIMEOUT = 600.0


@dataclass(frozen=True)
class AsyncAgentSettings:
    agent: AgentConfig
    reward: RewardSpec
    group_size: int  # samples per uid in training (default: actor_rollout_ref.rollout.n)
    group_wait: float | None  # per-sample path, no size signal: a group that stops growing this long is resolved as is
    group_timeout: float | None  # per-sample path with the size signal: the same, for a group left short
    actor_name: str  # the named Ray actor every reward worker shares
    extra_keys: tuple[str, ...]  # user extra-info keys passed through on the per-sample path
    reward_fn_key: str  # the data field holding the data source (verl's data.reward_fn_key)
    drift_check: DriftCheckSettings | None = None  # reward.async_agent.drift_check (verl_async_rm/drift.py)


def _plain(node: Any) -> Any:
    return OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else node


def _select(config: Any, dotted: str, default: Any = None) -> Any:
    value = OmegaConf.select(config, dotted, default=default) if isinstance(config, DictConfig) else default
    return default if value is None else value


def settings_from_verl_config(config: Any) -> AsyncAgentSettings:
    block = dict(_plain(_select(config, "reward.async_agent", {})) or {})
    group_size = block.pop("group_size", None)
    if group_size is None:
        group_size = _select(config, "actor_rollout_ref.rollout.n", 1)
    group_wait = block.pop("group_wait", DEFAULT_GROUP_WAIT)
    group_timeout = block.pop("group_timeout", DEFAULT_GROUP_TIMEOUT)
    actor_name = block.pop("actor_name", None) or DEFAULT_ACTOR_NAME
    extra_keys = tuple(block.pop("extra_keys", None) or ())
    drift_block = block.pop("drift_check", None)
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1:
        raise ValueError(f"reward.async_agent.group_size must be a positive integer, got {group_size!r}")
    for name, value in (("group_wait", group_wait), ("group_timeout", group_timeout)):
        if value is not None and (isinstance(value, bool) or not (isinstance(value, (int, float)) and value > 0)):
            raise ValueError(f"reward.async_agent.{name} must be a positive number of seconds or null, got {value!r}")
    try:
        agent = AgentConfig.from_mapping(block)
    except ValueError as exc:
        raise ValueError(f"reward.async_agent: {exc}") from None

    function = _plain(_select(config, "reward.custom_reward_function", {})) or {}
    path = function.get("path")
    kwargs = function.get("reward_kwargs") or _plain(_select(config, "reward.reward_kwargs", {})) or {}
    reward = RewardSpec(path, function.get("name") or "compute_score", dict(kwargs)) if path else RewardSpec(
        None, DEFAULT_REWARD, dict(kwargs)
    )
    drift_check = drift_settings_from_mapping(drift_block, reward, agent)
    return AsyncAgentSettings(
        drift_check=drift_check,
        agent=agent,
        reward=reward,
        group_size=group_size,
        group_wait=float(group_wait) if group_wait is not None else None,
        group_timeout=float(group_timeout) if group_timeout is not None else None,
        actor_name=str(actor_name),
        extra_keys=extra_keys,
        reward_fn_key=_select(config, "data.reward_fn_key", "data_source"),
    )


@dataclass(frozen=True)
class RunSettings:
    """Everything this package reads of a run's config, validated (``read_run_settings``)."""

    reward_manager: str  # reward.reward_manager.name
    agent: AsyncAgentSettings
    strategy: StrategyConfig
    shape: TrainerShape
    mask: MaskShape
    # off_policy_steps alone on v1: the run is verl's colocate_async with the agent (strategies/plan.py,
    # off_policy_on_verl); ``strategy`` and ``shape`` above are already that run's
    verl_mode: Optional[VerlColocateAsync] = None

    @property
    def uses_agent(self) -> bool:
        """The run scores through the agent: the async_agent manager, or a trainer strategy."""
        return self.reward_manager == "async_agent" or self.strategy.enabled


# The drift check adds metrics to the step's, where the trainer gathers them: this package's trainers
# (the strategies, v0 and v1) do; verl's own (RayPPOTrainer's fit, the v1 modes) offer no place to add any
# without changing verl's code, so there the check is refused at start rather than silently never run.
DRIFT_NEEDS_OUR_TRAINER = (
    "reward.async_agent.drift_check needs one of this package's trainers, i.e. a trainer strategy "
    "(mini_batch_pipeline, off_policy_steps with a pipeline or a pool, max_staleness): verl's own trainers (the "
    "async_agent reward manager alone, or off_policy_steps alone on v1, which runs as verl's colocate_async) offer "
    "no place to add a step's metrics without changing verl's code. For verl's own update, parameter for parameter, "
    "add mini_batch_pipeline=true mini_batch_order=index; or call verl_async_rm.replay.DriftCheck where your "
    "step's metrics are gathered (docs/guide/judge-operations.md, Drift check during training)")


def read_run_settings(config: Any) -> RunSettings:
    """Read and check a run's settings: one clear error for a bad value or a combination the strategies
    or ``failure_policy: mask`` cannot run as verl would. Loading the reward is left to the caller
    (``loader.check_spec``): it imports the user's file."""
    agent = settings_from_verl_config(config)
    strategy = strategy_from_mapping(config)
    shape = shape_from_config(config, ticket_deadline=agent.agent.ticket_deadline)
    masks_loss = agent.agent.failure.masks_loss
    verl_mode = off_policy_on_verl(strategy, shape, masks_loss)
    if verl_mode is not None:  # the run is verl's colocate_async with the agent (write_verl_mode writes it)
        strategy = replace(strategy, off_policy_steps=0)
        shape = replace(shape, trainer_mode=verl_mode.trainer_mode, reward_manager=verl_mode.reward_manager)
    check_strategy(strategy, shape)  # everything the strategies cannot run as verl would
    mask = replace(mask_shape_from_config(config, masks_loss=masks_loss, min_group_success=agent.agent.min_group_success,
                                          strategies=strategy.enabled), trainer_mode=shape.trainer_mode)
    check_masking(mask)  # failure_policy=mask: only where it is exact
    if agent.drift_check is not None and not strategy.enabled:
        raise ValueError(DRIFT_NEEDS_OUR_TRAINER)
    return RunSettings(reward_manager=shape.reward_manager, agent=agent, strategy=strategy, shape=shape, mask=mask,
                       verl_mode=verl_mode)


def prepare_drift_check(config: DictConfig, settings: RunSettings) -> None:
    """Where a run starts, when it has a drift check: its paths made absolute in the config every
    later process reads (the trainer runs in a Ray actor), and its calibration set and judge loaded
    once, so a log without the samples or a judge that cannot load stops the run now."""
    from verl_async_rm.drift import absolute_paths, check_at_start

    if settings.agent.drift_check is None:
        return
    block = _plain(_select(config, "reward.async_agent.drift_check", {}))
    with open_dict(config):
        OmegaConf.update(config, "reward.async_agent.drift_check", absolute_paths(block), merge=False, force_add=True)
    check_at_start(settings.agent.drift_check)


def write_verl_mode(config: DictConfig, mode: VerlColocateAsync) -> None:
    """``off_policy_steps`` alone on v1 (``RunSettings.verl_mode``): write verl's colocate_async with the
    agent into the config every later process reads (so they read the same settings), and say so.
    Called where a run starts, before any worker: ``main_ppo.prepare`` and verl's own entry point's
    start callback."""
    overrides = mode.overrides()
    with open_dict(config):
        for key, value in overrides.items():
            OmegaConf.update(config, key, value, force_add=True)
    print(f"[verl_async_rm] off_policy_steps={mode.off_policy_steps} on the v1 trainer runs as verl's own "
          f"{mode.trainer_mode} mode with the agent: " + " ".join(f"{k}={v}" for k, v in overrides.items()),
          file=sys.stderr, flush=True)
