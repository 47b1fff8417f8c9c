"""Admission control: the concurrency cap (adaptive, AIMD) and request/token rate limits.

Rate limits use aiolimiter. The adaptive concurrency cap is written here because no well-kept
asyncio library offers an AIMD limit that also pauses admission for a server's ``Retry-After``;
its arithmetic (``AimdWindow``) is pure so it can be tested exhaustively.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque

from aiolimiter import AsyncLimiter


class AimdWindow:
    """Additive-increase / multiplicative-decrease of an effective concurrency limit.

    On a throttle signal the limit halves (never below ``floor``); each success adds ``1/limit``,
    i.e. about +1 per limit's worth of successes, the classic TCP congestion-avoidance growth.
    Never above ``cap``.
    """

    def __init__(self, cap: int, floor: int = 1, decrease: float = 0.5):
        if cap < 1 or not 1 <= floor <= cap or not 0 < decrease < 1:
            raise ValueError(f"bad AIMD parameters cap={cap} floor={floor} decrease={decrease}")
        self.cap, self.floor, self.decrease = cap, floor, decrease
        self.value = float(cap)

    @property
    def limit(self) -> int:
        return max(self.floor, int(self.value))

    def on_success(self) -> None:
        if self.value < self.cap:
            self.value = min(float(self.cap), self.value + 1.0 / self.value)

    def on_throttle(self) -> None:
        self.value = max(float(self.floor), self.value * self.decrease)


class ConcurrencyLimiter:
    """FIFO admission under an (optionally adaptive) cap; pauses all admission until a Retry-After
    time has passed. Must be used from one event loop."""

    def __init__(self, cap: int, adaptive: bool = True):
        self.window = AimdWindow(cap)
        self.adaptive = adaptive
        self.in_use = 0
        self.peak = 0
        self._waiters: deque[asyncio.Future] = deque()
        self._paused_until = 0.0
        self._resume_handle: asyncio.TimerHandle | None = None

    @property
    def limit(self) -> int:
        return self.window.limit

    def _admissible(self) -> bool:
        return self.in_use < self.window.limit and time.monotonic() >= self._paused_until

    def _admit(self) -> None:
        self.in_use += 1
        if self.in_use > self.peak:
            self.peak = self.in_use

    async def acquire(self) -> None:
        if not self._waiters and self._admissible():
            self._admit()
            return
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter  # the slot is taken on our behalf in _wake before the result is set
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
        while self._waiters and self._admissible():
            waiter = self._waiters.popleft()
            if not waiter.done():
                self._admit()
                waiter.set_result(None)

    def on_success(self) -> None:
        if self.adaptive:
            self.window.on_success()
            self._wake()

    def on_throttle(self, retry_after: float | None) -> None:
        """A 429/503 (or similar) from the service: shrink the window and honour Retry-After for everyone."""
        if self.adaptive:
            self.window.on_throttle()
        if retry_after and retry_after > 0:
            until = time.monotonic() + retry_after
            if until > self._paused_until:
                self._paused_until = until
                if self._resume_handle is not None:
                    self._resume_handle.cancel()
                self._resume_handle = asyncio.get_running_loop().call_later(retry_after, self._wake)


def strict_rate_limiter(per_minute: float) -> AsyncLimiter:
    """An aiolimiter leaky bucket that admits at most ``per_minute`` in ANY 60-second window.

    A plain ``AsyncLimiter(per_minute, 60)`` lets a full bucket burst through and then drains at the
    full rate, up to 2x the limit in one window. Capacity C (one second's worth) plus drain rate r
    with ``C + 60 r = per_minute`` makes the bound hold for every window.
    """
    capacity = max(1.0, per_minute / 60.0)
    drain_per_second = (per_minute - capacity) / 60.0
    if drain_per_second <= 0:
        raise ValueError(f"rate limit {per_minute}/min is too low to enforce (needs > 1 per minute)")
    return AsyncLimiter(capacity, capacity / drain_per_second)
