"""verl-async-rm: an asynchronous reward agent for verl.

Importing this package is light: no Ray start, no model load, no network, and the public names
below load on first use (verl imports our plugin in every one of its processes).
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0.dev0"

_EXPORTS = {
    "RewardAgent": "verl_async_rm.agent",
    "AsyncRewardAgent": "verl_async_rm.agent",
    "RewardClient": "verl_async_rm.client",
    "AgentConfig": "verl_async_rm.config",
    "RewardSpec": "verl_async_rm.loader",
    "load_reward": "verl_async_rm.loader",
    "RewardItem": "verl_async_rm.items",
    "ScoredChunk": "verl_async_rm.outcomes",
    # the exceptions: one tree under AsyncRMError (below; the tree: errors.py)
    "AgentClosed": "verl_async_rm.errors",
    "BudgetExceeded": "verl_async_rm.errors",
    "FailureBudgetExceeded": "verl_async_rm.errors",
    "RetryableError": "verl_async_rm.errors",
    "RewardError": "verl_async_rm.errors",
    "RewardFunctionError": "verl_async_rm.errors",
    "TicketCancelled": "verl_async_rm.errors",
}
__all__ = sorted([*_EXPORTS, "AsyncRMError"])


class AsyncRMError(Exception):
    """The base of every exception verl-async-rm raises (the tree: ``verl_async_rm/errors.py``).
    Defined with the package itself: on a verl it does not support, the plugin verl loads in every
    one of its processes raises ``verl_compat.VerlVersionError`` without loading any other module
    of ours."""


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'verl_async_rm' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
