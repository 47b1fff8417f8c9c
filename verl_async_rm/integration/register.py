"""Register ``async_agent`` in verl 0.9's two reward-manager registries, when verl imports them.

Called from the ``verl.plugins`` entry point, i.e. inside every ``import verl``; registration waits
for verl's own import of each registry (see ``import_hooks``), so a verl process that never looks
a reward manager up pays nothing.
"""

from __future__ import annotations

import sys
from types import ModuleType

from verl_async_rm.integration.import_hooks import after_import
from verl_async_rm.verl_compat import require_verl

REWARD_LOOP_REGISTRY = "verl.experimental.reward_loop.reward_manager.registry"
LEGACY_REGISTRY = "verl.workers.reward_manager.registry"
INTERNALS = (
    (REWARD_LOOP_REGISTRY, "register"),
    (LEGACY_REGISTRY, "register"),
    ("verl.experimental.reward_loop.reward_manager.base", "RewardManagerBase"),
)


MANAGER_MODULE = "verl_async_rm.integration.reward_manager"


def _register_into(registry: ModuleType) -> None:
    try:
        require_verl("async_agent reward manager", ((registry.__name__, "register"),))
        module = sys.modules.get(MANAGER_MODULE)
        if module is not None and not hasattr(module, "AsyncAgentRewardManager"):
            return  # our module is being imported right now (it imports verl's base); its last line registers
        from verl_async_rm.integration.reward_manager import NAME, AsyncAgentRewardManager

        registry.register(NAME)(AsyncAgentRewardManager)
    except Exception as exc:
        # verl would swallow this at DEBUG level and later report only "Unknown reward manager".
        print(
            f"[verl_async_rm] could not register the async_agent reward manager in {registry.__name__}: "
            f"{type(exc).__name__}: {exc}",
            file=sys.stderr,
            flush=True,
        )
        raise


V1_TRAINERS = "verl.trainer.ppo.v1"
V1_MODE_MODULE = "verl_async_rm.strategies.v1"


def _register_v1_mode(module: ModuleType) -> None:
    try:
        require_verl("the async_reward v1 trainer mode", ((V1_TRAINERS, "register_trainer"),))
        ours = sys.modules.get(V1_MODE_MODULE)
        if ours is not None and not hasattr(ours, "register_mode"):
            return  # our module is being imported right now (it imports verl's v1); its last line registers
        from verl_async_rm.strategies.v1 import register_mode

        register_mode(module)
    except Exception as exc:
        print(
            f"[verl_async_rm] could not register the async_reward v1 trainer mode: {type(exc).__name__}: {exc}",
            file=sys.stderr,
            flush=True,
        )
        raise


def install() -> None:
    after_import(REWARD_LOOP_REGISTRY, _register_into)
    after_import(LEGACY_REGISTRY, _register_into)
    after_import(V1_TRAINERS, _register_v1_mode)  # trainer.v1.trainer_mode=async_reward


def register_where_loaded(manager_cls: type, name: str) -> None:
    """Register into whichever registries are already imported (the rest wait for their import)."""
    for registry_name in (REWARD_LOOP_REGISTRY, LEGACY_REGISTRY):
        registry = sys.modules.get(registry_name)
        if registry is not None and hasattr(registry, "register"):
            registry.register(name)(manager_cls)
