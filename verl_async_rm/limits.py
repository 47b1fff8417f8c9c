"""Configured rate limits (requests and tokens per minute) as pure leaky buckets.

Why not aiolimiter (which this replaced): the agent admits requests from one place, a pump that
must know *when* the head of the queue may start, so that one timer wakes it (instead of one
parked coroutine per waiting request). aiolimiter only offers an awaitable ``acquire``. The bucket
below is the same arithmetic as aiolimiter's (level drains linearly; a request fits while
``level + amount <= capacity``), with ``wait_time`` added. Pure: the caller passes the time.
"""

from __future__ import annotations

import math
from typing import Any, Callable

from verl_async_rm.errors import EstimateRefused


class LeakyBucket:
    """``capacity`` units, draining at ``drain_per_s``. Times are seconds on the caller's clock."""

    __slots__ = ("capacity", "drain_per_s", "level", "_at")

    def __init__(self, capacity: float, drain_per_s: float):
        if not capacity > 0 or not drain_per_s > 0:
            raise ValueError(f"a bucket needs capacity > 0 and drain > 0, got {capacity}, {drain_per_s}")
        self.capacity = float(capacity)
        self.drain_per_s = float(drain_per_s)
        self.level = 0.0
        self._at: float | None = None

    def _drain(self, now: float) -> None:
        if self._at is not None and now > self._at:
            self.level = max(0.0, self.level - (now - self._at) * self.drain_per_s)
        if self._at is None or now > self._at:
            self._at = now

    def clamp(self, amount: float) -> float:
        """A single request larger than the bucket is admitted alone once the bucket is empty."""
        return min(float(amount), self.capacity)

    def wait_time(self, now: float, amount: float = 1.0) -> float:
        """Seconds until ``amount`` fits (0.0: it fits now)."""
        self._drain(now)
        excess = self.level + self.clamp(amount) - self.capacity
        return max(0.0, excess / self.drain_per_s)

    def take(self, now: float, amount: float = 1.0) -> None:
        self._drain(now)
        self.level += self.clamp(amount)


def _bucket_shape(per_minute: float) -> tuple[float, float]:
    """(capacity, drain per second) of a bucket admitting at most ``per_minute`` in ANY 60 s window.

    A bucket of capacity ``per_minute`` refilled at ``per_minute``/60 s lets a full bucket burst through
    and then drains at the full rate: up to 2x the limit in one window. Capacity C (one second's worth)
    plus drain rate r with ``C + 60 r = per_minute`` makes the bound hold for every window.
    """
    capacity = max(1.0, per_minute / 60.0)
    drain_per_s = (per_minute - capacity) / 60.0
    if drain_per_s <= 0:
        raise ValueError(f"rate limit {per_minute}/min is too low to enforce (needs > 1 per minute)")
    return capacity, drain_per_s


def strict_bucket(per_minute: float) -> LeakyBucket:
    """A bucket that admits at most ``per_minute`` units in any 60-second window."""
    return LeakyBucket(*_bucket_shape(per_minute))


def rate_bound(per_minute: float, window_s: float) -> float:
    """The most units ``strict_bucket(per_minute)`` admits in any window of ``window_s`` seconds."""
    capacity, drain = _bucket_shape(per_minute)
    return capacity + drain * window_s


def approx_tokens(item) -> int:
    """A request's tokens when the caller gives no estimator: ~4 characters a token (OpenAI's rule of
    thumb for English) over what a judge reads: the response, the reference and the extra info."""
    text = len(item.solution_str) + len(str(item.ground_truth or "")) + len(str(item.extra_info or ""))
    return text // 4 + 1


def checked_estimate(estimator: Callable[[Any], Any], name: str) -> Callable[[Any], float]:
    """``estimator`` whose every answer is checked: ``inf`` would make a request wait forever for a
    rate bucket or a budget it can never fit; NaN or a negative number would drain the bucket
    (``tokens_per_minute`` silently off) or credit the budget. Raises ``EstimateRefused`` naming
    ``name`` (the setting or method that produced it)."""

    def estimate(item: Any) -> float:
        value = estimator(item)
        try:
            tokens = float(value)
        except (TypeError, ValueError, OverflowError):
            raise EstimateRefused(f"{name} returned {value!r:.80}, not a number of tokens") from None
        if not (math.isfinite(tokens) and tokens >= 0):
            raise EstimateRefused(f"{name} returned {value!r:.80}: a request's tokens must be a finite number >= 0")
        return tokens

    return estimate
