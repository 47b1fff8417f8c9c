"""The thread bridge: every sync call's result or exception reaches its awaiting task, batched wake-ups
lose none, and a cancelled waiter is skipped."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from verl_async_rm.thread_bridge import ThreadBridge

pytestmark = pytest.mark.quick


def bridged(coro_fn, workers: int = 8):
    async def main():
        bridge = ThreadBridge(asyncio.get_running_loop(), workers)
        try:
            return await coro_fn(bridge)
        finally:
            bridge.shutdown()

    return asyncio.run(main())


@settings(max_examples=30, deadline=None)
@given(st.lists(st.one_of(st.integers(), st.none()), min_size=1, max_size=300), st.integers(1, 16))
def test_every_result_and_error_reaches_its_own_waiter(outcomes, workers):
    def call(i, value):
        if value is None:
            raise ValueError(i)
        return (i, value)

    async def go(bridge):
        return await asyncio.gather(*(bridge.run(lambda i=i, v=v: call(i, v)) for i, v in enumerate(outcomes)),
                                    return_exceptions=True)

    for i, (value, got) in enumerate(zip(outcomes, bridged(go, workers))):
        if value is None:
            assert isinstance(got, ValueError) and got.args == (i,)
        else:
            assert got == (i, value)


def test_results_arriving_together_share_one_wake_up():
    release = threading.Event()
    wakes = []

    async def go(bridge):
        drain = bridge._drain
        bridge._drain = lambda: (wakes.append(1), drain())  # count loop wake-ups
        futures = [bridge.run(lambda i=i: release.wait() and i) for i in range(8)]
        await asyncio.sleep(0.05)  # all 8 calls are blocked in their threads
        release.set()
        time.sleep(0.3)  # blocks the loop: all 8 results arrive before it can drain any
        return await asyncio.gather(*futures)

    assert bridged(go) == list(range(8))
    assert len(wakes) == 1


def test_a_cancelled_waiter_is_skipped_and_others_still_complete():
    gate = threading.Event()

    async def go(bridge):
        slow = bridge.run(lambda: gate.wait(5) and "late")
        fast = bridge.run(lambda: "fast")
        slow.cancel()
        gate.set()
        assert await fast == "fast"
        await asyncio.sleep(0.05)  # the slow result arrives for a cancelled future: ignored, no error
        return slow.cancelled()

    assert bridged(go)


def test_stop_iteration_becomes_a_runtime_error():
    async def go(bridge):
        with pytest.raises(RuntimeError, match="StopIteration"):
            await bridge.run(lambda: next(iter([])))
        return True

    assert bridged(go)


def test_threads_are_spawned_on_demand_up_to_the_cap_and_stop_at_shutdown():
    gate = threading.Event()

    async def go(bridge):
        first = await asyncio.gather(*(bridge.run(lambda: 1) for _ in range(50)))  # sequential-ish: few threads
        blocked = [bridge.run(lambda: gate.wait(5)) for _ in range(10)]
        await asyncio.sleep(0.1)
        spawned = len(bridge._threads)
        gate.set()
        await asyncio.gather(*blocked)
        threads = list(bridge._threads)
        bridge.shutdown()
        for thread in threads:
            thread.join(5)
        with pytest.raises(RuntimeError, match="shut down"):
            bridge.run(lambda: 1)
        return first, spawned, [t.is_alive() for t in threads]

    first, spawned, alive = bridged(go, workers=4)
    assert first == [1] * 50
    assert spawned == 4  # 10 blocking calls, cap 4: the rest queue
    assert not any(alive)
