"""What one reward request ends as (``Scored``, ``Failed``: the engine's ``Outcome``) and what a caller
gets back (``ScoredChunk``: whole groups of one ticket). Plain data, no I/O. What a caller sends is
in ``items.py``; the errors a caller can see are in ``errors.py``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

MAX_ERROR_CHARS = 2_000  # a failed sample keeps at most this much of its error text


def bounded_message(text: str, limit: int = MAX_ERROR_CHARS) -> str:
    """Error text as kept per sample: a 10 MB HTTP body must not be copied into every sample."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]} ... [{len(text) - limit} more characters cut]"


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
