"""The thread bridge: every call's end (result, exception, or skipped) is reported exactly once to
the loop, batched wake-ups lose none, a given-up call is skipped, threads grow only for blocking
calls, and a hung thread is replaced when capacity is added."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from verl_async_rm.thread_bridge import SKIPPED, ThreadBridge

pytestmark = pytest.mark.quick


class Token:
    def __init__(self, number: int, given_up: bool = False):
        self.number = number
        self.given_up = given_up


def bridged(scenario, workers: int = 8):
    """Run ``scenario(bridge, ends)`` on a fresh loop; ``ends`` collects (token, ok, value) as reported."""

    async def main():
        ends: list[tuple[Token, bool, object]] = []
        bridge = ThreadBridge(asyncio.get_running_loop(), workers, lambda token, ok, value: ends.append((token, ok, value)))
        try:
            return await scenario(bridge, ends)
        finally:
            bridge.shutdown()

    return asyncio.run(main())


async def until(condition, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting"
        await asyncio.sleep(0.001)


@settings(max_examples=30, deadline=None)
@given(st.lists(st.one_of(st.integers(), st.none()), min_size=1, max_size=300), st.integers(1, 16))
def test_every_end_is_reported_once_to_its_own_token(outcomes, workers):
    def call(i, value):
        if value is None:
            raise ValueError(i)
        return (i, value)

    async def go(bridge, ends):
        tokens = [Token(i) for i in range(len(outcomes))]
        for token, value in zip(tokens, outcomes):
            bridge.run(lambda arg: call(*arg), (token.number, value), token)
        await until(lambda: len(ends) == len(outcomes))
        await asyncio.sleep(0.01)  # nothing more arrives
        return ends

    ends = bridged(go, workers)
    assert sorted(token.number for token, _, _ in ends) == list(range(len(outcomes)))
    for token, ok, value in ends:
        if outcomes[token.number] is None:
            assert not ok and isinstance(value, ValueError) and value.args == (token.number,)
        else:
            assert ok and value == (token.number, outcomes[token.number])


def test_results_arriving_together_share_one_wake_up():
    release = threading.Event()
    wakes = []

    async def go(bridge, ends):
        drain = bridge._drain
        bridge._drain = lambda: (wakes.append(1), drain())  # count loop wake-ups
        for i in range(8):
            bridge.run(lambda i: release.wait() and i, i, Token(i))
        await until(lambda: bridge.threads == 8 and all(bridge._in_call_since))  # all 8 blocked in their calls
        release.set()
        # Block the loop until all 8 results have arrived (counted, not timed: on a loaded machine the
        # threads may take a while to run), so none can be drained before the last one is in.
        deadline = time.monotonic() + 60
        while len(bridge._finished) < 8 and time.monotonic() < deadline:
            time.sleep(0.001)
        assert len(bridge._finished) == 8
        await until(lambda: len(ends) == 8)
        return sorted(value for _, _, value in ends)

    assert bridged(go) == list(range(8))
    assert len(wakes) == 1


def test_a_call_given_up_before_it_starts_is_skipped_and_still_reported():
    gate = threading.Event()

    async def go(bridge, ends):
        bridge.run(lambda _: gate.wait(5) and "first", None, Token(0))  # the only thread is busy with this
        late = Token(1)
        bridge.run(lambda _: "never runs", None, late)
        late.given_up = True  # the pipeline gave up on it (a timeout) before a thread took it
        gate.set()
        await until(lambda: len(ends) == 2)
        return {token.number: (ok, value) for token, ok, value in ends}

    ends = bridged(go, workers=1)
    assert ends[0] == (True, "first") and ends[1] == (False, SKIPPED)


def test_fast_calls_stay_on_few_threads_blocking_calls_get_one_each():
    """256 microsecond calls never block: a handful of threads. 64 calls that block (a wait, as
    I/O would) get a thread each, up to the bound, while none of them has returned."""
    all_in = threading.Barrier(64)

    def blocks(_):
        all_in.wait(timeout=10)  # returns once all 64 calls are inside their call at once
        return "in"

    async def go(bridge, ends):
        for i in range(256):
            bridge.run(lambda _: 1, None, Token(i))
        await until(lambda: len(ends) == 256)
        fast_threads = bridge.threads
        started = time.monotonic()
        for i in range(64):
            bridge.run(blocks, None, Token(1000 + i))
        await until(lambda: len(ends) == 256 + 64, timeout=30)
        return fast_threads, bridge.threads, ends[256:], time.monotonic() - started

    fast_threads, blocking_threads, blocking_ends, took = bridged(go, workers=64)
    assert fast_threads <= 4
    # No wall-clock bound (a loaded machine only delays the growth): each call blocks until all 64 are in
    # their calls at once, so fewer than 64 threads, or a pool that grows only as calls return, leaves the
    # barrier short: every call ends with BrokenBarrierError after 10 s, not ok.
    assert blocking_threads == 64
    assert [(ok, value) for _, ok, value in blocking_ends] == [(True, "in")] * 64
    # The timer doubles the pool every GROW_AFTER_S (2 ms): 64 threads in 7 doublings, milliseconds. 5 s
    # leaves a loaded machine room and still fails a pool that doubles only every 0.7 s or more.
    assert took < 5


def test_a_hung_thread_is_replaced_when_capacity_is_added_and_threads_stop_at_shutdown():
    hang = threading.Event()

    async def go(bridge, ends):
        bridge.run(hang.wait, 10, Token(0))  # the only thread hangs
        bridge.run(lambda _: "behind it", None, Token(1))
        await asyncio.sleep(0.05)
        stuck = [v for _, _, v in ends]
        bridge.add_capacity(+1)  # the pipeline declared the call hung
        await until(lambda: len(ends) == 1)
        threads = list(bridge._threads)
        hang.set()
        await until(lambda: len(ends) == 2)
        bridge.shutdown()
        for thread in threads:
            thread.join(5)
        with pytest.raises(RuntimeError, match="shut down"):
            bridge.run(lambda _: 1, None, Token(2))
        return stuck, [v for _, _, v in ends], [t.is_alive() for t in threads]

    stuck, values, alive = bridged(go, workers=1)
    assert stuck == [] and values[0] == "behind it" and not any(alive)
