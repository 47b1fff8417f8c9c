"""What one reward request ends as, and what a caller gets back: plain data, no I/O."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Hashable


@dataclass(frozen=True)
class RewardItem:
    """One response to score. ``index`` is the sample's position in the submitted batch."""

    index: int
    solution_str: str
    ground_truth: Any = None
    data_source: str = ""
    extra_info: dict | None = None
    uid: Hashable | None = None


@dataclass(frozen=True)
class Scored:
    score: float
    extra: dict = field(default_factory=dict)
    attempts: int = 1
    cached: bool = False


@dataclass(frozen=True)
class Failed:
    """A request that produced no usable score. ``kind`` is a short machine-readable cause
    (``timeout``, ``deadline``, ``error``, ``invalid``, ``http_429`` ...); ``message`` names the sample."""

    kind: str
    message: str
    error: BaseException | None = None
    attempts: int = 1


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


class TicketCancelled(RuntimeError):
    """The ticket was cancelled (``RewardAgent.cancel``): its remaining scores will never come."""


class RewardFunctionError(TypeError):
    """The user's reward function or its return value is unusable (names the function and sample)."""
