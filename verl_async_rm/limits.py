"""Admission control: the concurrency cap (adaptive, AIMD) and request/token rate limits.

Rate limits use aiolimiter. The adaptive concurrency cap is written here because no well-kept
asyncio library offers an AIMD-adjusted semaphore; its arithmetic (``AimdWindow``) is pure so it
can be tested exhaustively.
"""

from __future__ import annotations

import asyncio
from collections import deque

from aiolimiter import AsyncLimiter


class AimdWindow:
    """Additive-increase / multiplicative-decrease of an effective concurrency limit.

    On a throttle signal the limit halves (never below ``floor``), at most once per window of
    requests: throttles from requests admitted before the last cut report the same congestion
    event (as TCP counts several losses in one round trip once). Each success adds ``1/limit``,
    about +1 per limit's worth of successes. Never above ``cap``.
    """

    def __init__(self, cap: int, floor: int = 1, decrease: float = 0.5):
        if cap < 1 or not 1 <= floor <= cap or not 0 < decrease < 1:
            raise ValueError(f"bad AIMD parameters cap={cap} floor={floor} decrease={decrease}")
        self.cap, self.floor, self.decrease = cap, floor, decrease
        self.value = float(cap)
        self.admitted = 0  # sequence number of the last admitted request
        self._cut_at = 0  # requests admitted up to this number belong to the last cut's window

    @property
    def limit(self) -> int:
        return max(self.floor, int(self.value))

    def admit(self) -> int:
        self.admitted += 1
        return self.admitted

    def on_success(self) -> None:
        if self.value < self.cap:
            self.value = min(float(self.cap), self.value + 1.0 / self.value)

    def on_throttle(self, sequence: int) -> bool:
        """Throttle reported by the request admitted as ``sequence``; True if the limit was cut."""
        if sequence <= self._cut_at:
            return False
        self.value = max(float(self.floor), self.value * self.decrease)
        self._cut_at = self.admitted
        return True


class ConcurrencyLimiter:
    """FIFO admission under an (optionally adaptive) cap. Must be used from one event loop.

    Retry-After is honoured by the retried request itself (its backoff is never shorter); the cut
    of the limit is what slows everyone else down.
    """

    def __init__(self, cap: int, adaptive: bool = True):
        self.window = AimdWindow(cap)
        self.adaptive = adaptive
        self.in_use = 0
        self.peak = 0
        self._waiters: deque[asyncio.Future] = deque()

    @property
    def limit(self) -> int:
        return self.window.limit

    def _admit(self) -> int:
        self.in_use += 1
        if self.in_use > self.peak:
            self.peak = self.in_use
        return self.window.admit()

    async def acquire(self) -> int:
        """Wait for a slot; returns the request's admission number (for ``on_throttle``)."""
        if not self._waiters and self.in_use < self.window.limit:
            return self._admit()
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            return await waiter  # the slot is taken on our behalf in _wake before the result is set
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self.release()  # granted and cancelled in the same tick: hand the slot on
            else:
                self._waiters.remove(waiter)
            raise

    def release(self) -> None:
        self.in_use -= 1
        self._wake()

    def _wake(self) -> None:
        while self._waiters and self.in_use < self.window.limit:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(self._admit())

    def on_success(self) -> None:
        if self.adaptive and self.window.value < self.window.cap:
            self.window.on_success()
            self._wake()

    def on_throttle(self, sequence: int) -> None:
        """A 429/503 from the service for the request admitted as ``sequence``."""
        if self.adaptive:
            self.window.on_throttle(sequence)


def _bucket(per_minute: float) -> tuple[float, float]:
    """(capacity, drain per second) of a leaky bucket admitting at most ``per_minute`` in ANY 60 s.

    A plain ``AsyncLimiter(per_minute, 60)`` lets a full bucket burst through and then drains at the
    full rate: up to 2x the limit in one window. Capacity C (one second's worth) plus drain rate r
    with ``C + 60 r = per_minute`` makes the bound hold for every window.
    """
    capacity = max(1.0, per_minute / 60.0)
    drain_per_second = (per_minute - capacity) / 60.0
    if drain_per_second <= 0:
        raise ValueError(f"rate limit {per_minute}/min is too low to enforce (needs > 1 per minute)")
    return capacity, drain_per_second


def rate_bound(per_minute: float, window_s: float) -> float:
    """The most requests ``strict_rate_limiter(per_minute)`` admits in any window of ``window_s``."""
    capacity, drain = _bucket(per_minute)
    return capacity + drain * window_s


def strict_rate_limiter(per_minute: float) -> AsyncLimiter:
    """An aiolimiter leaky bucket that admits at most ``per_minute`` requests in any 60-second window."""
    capacity, drain = _bucket(per_minute)
    return AsyncLimiter(capacity, capacity / drain)
