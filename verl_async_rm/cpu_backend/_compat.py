"""Version guard: the one place that knows which verl internals the CPU backend relies on.

The CPU backend registers into, and in a few places patches, verl internals that are not a stable
API. If verl moves them, we want one clear error naming the installed version and the missing
symbol, not an AttributeError deep inside a Ray worker.
"""

from __future__ import annotations

from verl_async_rm.verl_compat import (  # noqa: F401 - re-exported for the backend's modules
    VerlVersionError,
    check_installed_version,
    check_version,
    require_verl,
    verl_version,
)

# (module, attribute) pairs the backend touches; see the final report / README for why each.
REQUIRED_INTERNALS: tuple[tuple[str, str], ...] = (
    ("verl.plugin.platform.platform_base", "PlatformBase"),
    ("verl.plugin.platform.platform_manager", "PlatformRegistry"),
    ("verl.plugin.platform.platform_manager", "set_platform"),
    ("verl.plugin.platform.platform_manager", "_current_platform"),
    ("verl.utils.distributed", "initialize_global_process_group_ray"),
    ("verl.workers.rollout.replica", "RolloutReplicaRegistry"),
    ("verl.workers.rollout.replica", "RolloutReplica"),
    ("verl.workers.rollout.replica", "TokenOutput"),
    ("verl.workers.rollout.base", "BaseRollout"),
    ("verl.workers.rollout.base", "_ROLLOUT_REGISTRY"),
    ("verl.checkpoint_engine.base", "ColocatedCheckpointEngine"),
)


def check_verl(internals: tuple[tuple[str, str], ...] = REQUIRED_INTERNALS) -> str:
    """Raise VerlVersionError unless verl's version and every needed internal are present."""
    return require_verl("the CPU backend", internals)
