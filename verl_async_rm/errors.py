"""Every exception this package raises, in one tree: ``except AsyncRMError`` catches all of them.

Each also keeps the built-in base it always had, so an existing ``except RuntimeError`` (or
``ValueError``, ``TypeError``) still catches what it caught before.

    AsyncRMError
    ├── RewardError (RuntimeError)          a reward could not be computed and the failure policy is
    │   │                                   ``raise`` (raised by ``get``/``take`` or the per-sample call)
    │   ├── FailureBudgetExceeded           failures are systematic (service down, bad key, broken
    │   │                                   reward): past ``max_failure_rate`` of a ticket or of the
    │   │                                   agent's recent samples, or ``max_hung_calls``/``max_throttled_s``
    │   └── BudgetExceeded                  the judge budget is spent; scoring stopped before crossing it
    ├── TicketCancelled (RuntimeError)      the ticket was cancelled: its remaining scores never come
    ├── AgentClosed (RuntimeError)          the agent was closed while the caller waited, or before it called
    ├── RewardAgentStopped (RuntimeError)   verl's per-sample path: the agent stopped scoring for good,
    │                                       so the run stops at its next dispatch of prompts
    ├── RewardFunctionError (TypeError)     the reward or what it returned is unusable (raised at load
    │                                       time, or recorded as a sample's ``invalid`` failure)
    ├── EstimateRefused (ValueError)        a token estimate that is not a finite number >= 0 (the
    │                                       request is refused, never sent)
    ├── LimitsConflict (ValueError)         ``shared_limits``: another job holds the endpoint with other limits
    ├── RewardChanged (ValueError)          a verdict-log resume against a log written by another reward
    ├── VerlVersionError (RuntimeError)     the installed verl is not a supported release, or lacks an
    │                                       internal this package needs
    └── RetryableError                      the other direction: a reward raises it to ask for another
                                            attempt (never raised to a caller; a sample that runs out of
                                            attempts is a failure, not an exception)

Not in the tree: a bad argument or setting is the built-in ``ValueError``/``TypeError`` (pydantic's
``ValidationError`` for a config), an unknown ticket a ``KeyError``, and a ``get`` that times out
the built-in ``TimeoutError`` (nothing consumed): what Python code expects for those.

Plain classes: every module may raise from here without an import cycle. Two live elsewhere and
are imported here, so that verl's plugin, on a verl this package does not support, loads nothing of
ours beyond the version check: ``AsyncRMError`` (the package's ``__init__``) and
``VerlVersionError`` (``verl_compat.py``).
"""

from __future__ import annotations

from verl_async_rm import AsyncRMError
from verl_async_rm.verl_compat import VerlVersionError

__all__ = [
    "AsyncRMError", "RewardError", "FailureBudgetExceeded", "BudgetExceeded", "TicketCancelled", "AgentClosed",
    "RewardAgentStopped", "RewardFunctionError", "EstimateRefused", "LimitsConflict", "RewardChanged",
    "VerlVersionError", "RetryableError",
]


class RewardError(AsyncRMError, RuntimeError):
    """A reward could not be computed and the failure policy says to raise."""


class FailureBudgetExceeded(RewardError):
    """Failures are systematic: more than ``max_failure_rate`` of a ticket's samples, or of the agent's
    recent samples. The message gives the failure kinds and the first messages."""


class BudgetExceeded(RewardError):
    """The judge budget (``token_budget``, ``money_budget``) is spent: the next request could cross
    it, so scoring stopped before it did. Every ticket fails with it; samples refused are logged as
    ``budget`` failures, never scored by the failure policy."""


class TicketCancelled(AsyncRMError, RuntimeError):
    """The ticket was cancelled (``RewardAgent.cancel``): its remaining scores will never come."""


class AgentClosed(AsyncRMError, RuntimeError):
    """The agent was closed (or its loop stopped) while the caller waited or before it called."""


class RewardAgentStopped(AsyncRMError, RuntimeError):
    """The agent stopped scoring for good: the run stops at its next dispatch of prompts."""


class RewardFunctionError(AsyncRMError, TypeError):
    """The user's reward function or its return value is unusable (names the function and sample)."""


class EstimateRefused(AsyncRMError, ValueError):
    """A token estimate that is not a finite number >= 0: the request is refused, never sent."""


class LimitsConflict(AsyncRMError, ValueError):
    """Two jobs declared different limits for one endpoint."""


class RewardChanged(AsyncRMError, ValueError):
    """A resume against a log written by another reward (or by an unknown one)."""


class RetryableError(AsyncRMError):
    """Raise (or subclass) this from a reward function to ask the agent for another attempt.
    A subclass may set ``kind``: the short cause reported in metrics and in failed samples."""

    retryable = True
    kind = "retryable_error"

    def __init__(self, message: str = "", retry_after: float | None = None):
        super().__init__(message)
        self.retry_after = retry_after
