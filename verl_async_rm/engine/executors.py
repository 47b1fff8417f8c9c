"""Where a user's ``compute_score`` runs, chosen once per agent: on the event loop (``async def``),
on worker threads, or in worker processes. One method, ``start(item, token)``: async and process
calls return what the request pipeline waits on; thread calls report their ends to the pipeline
themselves (``reports_ends``), since a thread call can outlive the wait (``outlives_cancel``).

- ``AsyncCalls``: the coroutine runs inline in the attempt's task (no extra task per call: async
  throughput is the agent's headline figure). Cancellation reaches the reward's own awaits; a
  reward that swallows it is detected by the pipeline's hung-call watchdog.
- ``ThreadCalls``: through ``ThreadBridge``, which reports each call's end to the pipeline (no
  future per call). A thread cannot be stopped: after a timeout the call keeps running, holding its
  concurrency slot until it really ends or is declared hung and its thread replaced.
- ``ProcessCalls``: through pebble's ``ProcessPool``. Cancelling a running call terminates its
  worker, and a worker that dies (a crash, an OOM kill) fails only its own call
  (``ProcessExpired``); pebble starts a replacement either way. The standard library's
  ``ProcessPoolExecutor`` breaks for good at the first dead worker (``BrokenProcessPool``) and
  cannot stop a hung call, hence pebble.
"""

from __future__ import annotations

import asyncio
import functools
from typing import Awaitable, Callable

from verl_async_rm import process_worker
from verl_async_rm.items import RewardItem
from verl_async_rm.loader import UserReward
from verl_async_rm.thread_bridge import ThreadBridge


class AsyncCalls:
    outlives_cancel = False
    reports_ends = False  # (ThreadCalls reports through bind; the others return what to await)

    def __init__(self, reward: UserReward):
        self._fn = reward.score_fn
        self._kwargs = reward.call_kwargs

    def start(self, item: RewardItem, token=None) -> Awaitable:
        return self._fn(data_source=item.data_source, solution_str=item.solution_str, ground_truth=item.ground_truth,
                        extra_info=item.extra_info, **self._kwargs)  # the coroutine: run by the attempt's task

    def replace_hung_thread(self, delta: int = 1) -> None:
        """A hung coroutine holds no thread."""

    def threads(self) -> int | None:
        """Worker threads now (None: this executor has none)."""
        return None

    async def aclose(self) -> None:
        return None


class ThreadCalls:
    """Sync rewards on worker threads. No future per call: the bridge reports each call's end,
    in batches, to the pipeline's ``on_end(attempt, ok, value)`` (``bind``)."""

    outlives_cancel = True
    reports_ends = True

    def __init__(self, reward: UserReward, loop: asyncio.AbstractEventLoop, max_threads: int, name: str = "reward-agent"):
        self._fn = reward.score_fn
        self._kwargs = reward.call_kwargs
        self._loop, self._max_threads, self._name = loop, max_threads, name
        self.bridge: ThreadBridge | None = None

    def bind(self, on_end: Callable) -> None:
        self.bridge = ThreadBridge(self._loop, self._max_threads, on_end, self._name)

    def start(self, item: RewardItem, token=None) -> None:
        self.bridge.run(self._call, item, token)

    def _call(self, item: RewardItem):  # on a worker thread
        return self._fn(data_source=item.data_source, solution_str=item.solution_str, ground_truth=item.ground_truth,
                        extra_info=item.extra_info, **self._kwargs)

    def replace_hung_thread(self, delta: int = 1) -> None:
        """One more thread while a hung one is stuck (``delta=-1`` once it has returned after all)."""
        self.bridge.add_capacity(delta)

    def threads(self) -> int | None:
        return self.bridge.threads if self.bridge is not None else 0

    async def aclose(self) -> None:
        if self.bridge is not None:
            self.bridge.shutdown()  # threads stuck in a hung call cannot be joined: they are daemons


class ProcessCalls:
    outlives_cancel = False
    reports_ends = False

    def __init__(self, reward: UserReward, workers: int):
        import pebble  # imported here: only the process executor needs it

        if reward.spec is not None:
            # A function loaded from a file cannot be pickled by reference in a fresh process: each
            # worker loads the reward itself, once, from its spec.
            self._call, initializer, initargs = process_worker.score, process_worker.load, (reward.spec,)
        else:
            self._call = functools.partial(process_worker.call, reward.score_fn, reward.call_kwargs)
            initializer, initargs = None, ()
        self.pool = pebble.ProcessPool(max_workers=workers, initializer=initializer, initargs=initargs)

    def start(self, item: RewardItem, token=None) -> asyncio.Future:
        fields = {"data_source": item.data_source, "solution_str": item.solution_str,
                  "ground_truth": item.ground_truth, "extra_info": item.extra_info}
        # Cancelling the asyncio future cancels pebble's, which terminates the worker running it.
        return asyncio.wrap_future(self.pool.schedule(self._call, args=(fields,)))

    def replace_hung_thread(self, delta: int = 1) -> None:
        """A cancelled process call is killed: nothing to replace here (pebble starts a new worker)."""

    def threads(self) -> int | None:
        return None

    async def aclose(self) -> None:
        self.pool.stop()  # terminates workers, hung ones included
        await asyncio.get_running_loop().run_in_executor(None, self.pool.join, 10)


def executor_for(reward: UserReward, kind: str, workers: int, loop: asyncio.AbstractEventLoop):
    if reward.score_is_async:
        return AsyncCalls(reward)
    if kind == "process":
        return ProcessCalls(reward, workers)
    return ThreadCalls(reward, loop, workers)
