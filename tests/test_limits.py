"""Admission control: AIMD arithmetic (exhaustive), and the rate limiters against a real clock."""

from __future__ import annotations

import asyncio
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from verl_async_rm.limits import AimdWindow, ConcurrencyLimiter, rate_bound, strict_rate_limiter

pytestmark = pytest.mark.quick


@given(st.integers(1, 512), st.lists(st.sampled_from(["admit", "ok", "throttle_new", "throttle_old"]), max_size=400))
def test_aimd_stays_within_floor_and_cap_and_cuts_once_per_window(cap, events):
    window = AimdWindow(cap)
    admitted: list[int] = []
    for event in events:
        before = window.value
        if event == "admit":
            admitted.append(window.admit())
        elif event == "ok":
            window.on_success()
            assert window.value >= before
        elif admitted:
            sequence = admitted[-1] if event == "throttle_new" else admitted[0]
            cut_before = window._cut_at
            cut = window.on_throttle(sequence)
            assert cut == (sequence > cut_before)  # older requests report the same congestion event
            assert window.value == (max(1.0, before / 2) if cut else before)
        assert 1 <= window.limit <= cap and 1.0 <= window.value <= cap


def test_aimd_recovers_additively_to_the_cap():
    window = AimdWindow(64)
    window.on_throttle(window.admit())
    assert window.limit == 32
    successes = 0
    while window.limit < 64:
        window.on_success()
        successes += 1
    assert 32 * 32 <= successes <= 64 * 33  # ~ +1 per window's worth of successes, not a jump back


def test_limiter_never_admits_over_its_limit_and_shrinks_live():
    async def scenario():
        limiter = ConcurrencyLimiter(8)
        peak_over = []

        async def user(k):
            sequence = await limiter.acquire()
            peak_over.append(limiter.in_use - limiter.limit)
            await asyncio.sleep(0.001)
            if k == 10:
                limiter.on_throttle(sequence)
            limiter.release()

        await asyncio.gather(*(user(k) for k in range(200)))
        return limiter, peak_over

    limiter, over = asyncio.run(scenario())
    assert limiter.peak == 8 and max(over) <= 0 and limiter.in_use == 0
    assert limiter.limit == 4  # one throttle: one cut; successes are not reported here


def test_cancelled_waiter_does_not_leak_a_slot():
    async def scenario():
        limiter = ConcurrencyLimiter(1, adaptive=False)
        await limiter.acquire()
        waiter = asyncio.ensure_future(limiter.acquire())
        await asyncio.sleep(0)
        waiter.cancel()
        limiter.release()
        await asyncio.sleep(0)
        return limiter

    limiter = asyncio.run(scenario())
    assert limiter.in_use == 0 and not limiter._waiters


def _max_in_window(times: list[float], window: float) -> int:
    best, j = 0, 0
    for i, t in enumerate(times):
        while times[j] <= t - window:
            j += 1
        best = max(best, i - j + 1)
    return best


@pytest.mark.parametrize("per_minute", [3_000.0, 12_000.0])
def test_strict_rate_limiter_bound_holds_in_every_window(per_minute):
    """Admission times for 2.5 s of saturated demand; every window obeys C + r*w, and the long-run
    rate is the configured one (the bucket really drains, it does not just cap bursts)."""

    async def scenario():
        limiter = strict_rate_limiter(per_minute)
        times: list[float] = []
        deadline = time.monotonic() + 2.5

        async def user():
            while time.monotonic() < deadline:
                await limiter.acquire()
                times.append(time.monotonic())

        await asyncio.gather(*(user() for _ in range(50)))
        return sorted(times)

    times = asyncio.run(scenario())
    for window in (0.1, 0.5, 1.0, 2.0):
        assert _max_in_window(times, window) <= rate_bound(per_minute, window) + 1
    steady = [t for t in times if t > times[0] + 1.0]
    rate = len(steady) / (steady[-1] - steady[0])
    assert rate == pytest.approx((per_minute - per_minute / 60) / 60, rel=0.15)
    assert rate_bound(per_minute, 60.0) == pytest.approx(per_minute)


def test_rate_limit_too_low_is_refused():
    with pytest.raises(ValueError, match="too low"):
        strict_rate_limiter(1)
