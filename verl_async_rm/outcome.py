"""What one reward request ends as, what a caller gets back, and the errors a caller can see.
Plain data, no I/O.

Errors (all raised by ``get``/``take`` or the per-sample call, never swallowed):
- ``RewardError``: a reward could not be computed and the failure policy is ``raise``;
  ``FailureBudgetExceeded`` (a ``RewardError``): failures are systematic (service down, bad key,
  broken reward), past ``max_failure_rate`` of a ticket or of the agent's recent samples;
- ``BudgetExceeded`` (a ``RewardError``): the judge budget is spent; scoring stopped before crossing it;
- ``TicketCancelled``: the ticket was cancelled;
- ``AgentClosed``: the agent was closed while the caller waited;
- ``RewardFunctionError``: the reward or its return value is unusable (raised at load time, or
  recorded as a sample's ``invalid`` failure).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Hashable

MAX_ERROR_CHARS = 2_000  # a failed sample keeps at most this much of its error text


def bounded_message(text: str, limit: int = MAX_ERROR_CHARS) -> str:
    """Error text as kept per sample: a 10 MB HTTP body must not be copied into every sample."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]} ... [{len(text) - limit} more characters cut]"


@dataclass(slots=True)
class RewardItem:
    """One response to score. ``index`` is the sample's position in the submitted batch. (Not frozen:
    one is built per sample, and a frozen dataclass pays ``object.__setattr__`` per field.)"""

    index: int
    solution_str: str
    ground_truth: Any = None
    data_source: str = ""
    extra_info: dict | None = None
    uid: Hashable | None = None


SENT_TEXT_FIELDS = ("solution_str", "ground_truth", "data_source")


def unsendable_text(item: RewardItem) -> str | None:
    """Why ``item``'s text cannot be sent to a judge, or None. A lone surrogate (half of a UTF-16
    pair: text cut inside an emoji, or a ``\\ud83d`` escape in JSON input) has no UTF-8 encoding, so
    no HTTP request can carry it: found before the first attempt, the sample fails as ``invalid``
    instead of being retried as if the judge had answered badly."""
    for name in SENT_TEXT_FIELDS:
        text = getattr(item, name)
        if type(text) is str and not text.isascii():
            try:
                text.encode("utf-8")
            except UnicodeEncodeError as exc:
                return (f"{name} is not valid Unicode: a lone surrogate {text[exc.start]!a} at character "
                        f"{exc.start} (half of a UTF-16 pair: text cut inside an emoji, or an escape such as "
                        "\\ud83d in JSON input): it has no UTF-8 encoding, so no request can carry it")
    return None


@dataclass(slots=True)
class Scored:
    score: float
    extra: dict = field(default_factory=dict)
    attempts: int = 1
    cached: bool = False


@dataclass(slots=True)
class Failed:
    """A request that produced no usable score. ``kind`` is a short machine-readable cause
    (``timeout``, ``deadline``, ``error``, ``invalid``, ``http_429``, ``hook_error`` ...); ``message``
    names the sample and is bounded (``MAX_ERROR_CHARS``). The exception object itself is not kept:
    it can hold a whole HTTP response."""

    kind: str
    message: str
    attempts: int = 1

    def __post_init__(self) -> None:
        self.message = bounded_message(self.message)


Outcome = Scored | Failed


@dataclass
class ScoredChunk:
    """Whole groups of one ticket: ``indices`` sorted ascending, every list aligned with them."""

    indices: list[int]
    scores: list[float]
    extra_info: dict[str, list]
    groups: int = 0
    latencies: list[float | None] = field(default_factory=list)  # per sample: submit -> settled, seconds
    ready_after: float = 0.0  # submit -> the chunk's last group ready, seconds (the agent's clock)
    ready_at: float = 0.0  # time.monotonic() when its last group became ready (same machine only)

    def __len__(self) -> int:
        return len(self.indices)

    @classmethod
    def empty(cls) -> ScoredChunk:
        return cls([], [], {}, 0)


class RewardError(RuntimeError):
    """A reward could not be computed and the failure policy says to raise."""


class FailureBudgetExceeded(RewardError):
    """Failures are systematic: more than ``max_failure_rate`` of a ticket's samples, or of the agent's
    recent samples. The message gives the failure kinds and the first messages."""


class BudgetExceeded(RewardError):
    """The judge budget (``token_budget``, ``money_budget``) is spent: the next request could cross
    it, so scoring stopped before it did. Every ticket fails with it; samples refused are logged as
    ``budget`` failures, never scored by the failure policy."""


class TicketCancelled(RuntimeError):
    """The ticket was cancelled (``RewardAgent.cancel``): its remaining scores will never come."""


class AgentClosed(RuntimeError):
    """The agent was closed (or its loop stopped) while the caller waited or before it called."""


class RewardFunctionError(TypeError):
    """The user's reward function or its return value is unusable (names the function and sample)."""
