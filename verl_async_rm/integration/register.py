"""Register ``async_agent`` in verl 0.9's two reward-manager registries, when verl imports them.

Called from the ``verl.plugins`` entry point, i.e. inside every ``import verl``; registration waits
for verl's own import of each registry (see ``import_hooks``), so a verl process that never looks
a reward manager up pays nothing.

Why the hooks wait for the registry *packages* (``verl.workers.reward_manager``, not its
``registry`` submodule): registering means importing our manager, which imports verl's
``RewardManagerBase``, which imports the reward-loop registry package, whose ``limited.py`` does
``from verl.workers.reward_manager import register``. Fired after the ``registry`` submodule, the
hook ran while ``verl/workers/reward_manager/__init__.py`` was still half-executed, and that
import failed (a circular ``ImportError`` for every user of the legacy registry). After a package's
``__init__`` has finished, every name verl's own modules import from it exists, in any import order.

A failure here never raises into verl's import: verl's registries must work for everyone in the
environment, including users who never select ``async_agent``. It is reported on stderr and as a
warning, and ``async_agent`` is then simply not registered.
"""

from __future__ import annotations

import sys
import warnings
from types import ModuleType

from verl_async_rm.integration.import_hooks import after_import
from verl_async_rm.integration.registries import LEGACY_PACKAGE, REGISTRY_OF_PACKAGE, REWARD_LOOP_PACKAGE
from verl_async_rm.verl_compat import require_verl

MANAGER_MODULE = "verl_async_rm.integration.reward_manager"


class RegistrationWarning(RuntimeWarning):
    """verl_async_rm could not register itself in verl; verl itself is unaffected."""


def _report(what: str, exc: BaseException) -> None:
    message = (
        f"[verl_async_rm] could not register {what}: {type(exc).__name__}: {exc}. "
        "verl works as without verl_async_rm; selecting it will fail with 'Unknown ...'."
    )
    # stderr: verl workers' warnings filters may hide a warning; the warning: for programmatic checks
    print(message, file=sys.stderr, flush=True)
    warnings.warn(message, RegistrationWarning, stacklevel=2)


def _register_into(package: ModuleType) -> None:
    registry_name = REGISTRY_OF_PACKAGE[package.__name__]
    try:
        require_verl("async_agent reward manager", ((registry_name, "register"),))
        module = sys.modules.get(MANAGER_MODULE)
        if module is not None and not hasattr(module, "AsyncAgentRewardManager"):
            return  # our module is being imported right now (it imports verl's base); its last line registers
        from verl_async_rm.integration.reward_manager import NAME, AsyncAgentRewardManager

        sys.modules[registry_name].register(NAME)(AsyncAgentRewardManager)
    except Exception as exc:  # noqa: BLE001 - never break verl's own import; reported loudly instead
        _report(f"the async_agent reward manager in {registry_name}", exc)


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
    except Exception as exc:  # noqa: BLE001 - as above
        _report("the async_reward v1 trainer mode", exc)


def install() -> None:
    after_import(REWARD_LOOP_PACKAGE, _register_into)
    after_import(LEGACY_PACKAGE, _register_into)
    after_import(V1_TRAINERS, _register_v1_mode)  # trainer.v1.trainer_mode=async_reward

