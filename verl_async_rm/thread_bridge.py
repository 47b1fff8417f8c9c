"""Run sync reward calls on worker threads and hand their results back to the event loop in batches.

Why not ``loop.run_in_executor`` on a ``ThreadPoolExecutor``, which this replaces (measured with
py-spy on 10k zero-latency sync rewards, where the event loop is the bottleneck):
- it wakes the loop once per finished call (a ``call_soon_threadsafe`` each: a self-pipe write and
  a loop iteration). Here a worker appends its result to a shared list and wakes the loop only if
  no wake-up is pending; one callback then settles every result that has arrived;
- ``executor.submit`` builds a ``concurrent.futures.Future`` (with its Condition and RLock) per call,
  13% of the loop's time, only to be chained to an asyncio future. Here the asyncio future is the
  only one, so the pool is a plain queue and threads (spawned on demand, up to ``max_threads``, as
  ThreadPoolExecutor does);
- a thread cannot be stopped, so a call the agent gave up on (a timeout) keeps running. The caller
  must know when it really ends (its concurrency slot is held until then), and a call that never
  ends must not take a thread for good: ``run(..., on_late_end=...)`` reports the end of a call
  whose future was already given up, and ``add_capacity`` lets the agent replace a hung thread.
  So threads are counted exactly (idle, and jobs waiting for one): ThreadPoolExecutor's idle
  semaphore keeps a permit for every finished job, which stays after the thread took another job;
  with hung threads those stale permits claim idle threads that do not exist, and jobs wait forever.
Nothing polls: a result never waits for a timer.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from typing import Any, Callable

_STOP = None
_log = logging.getLogger(__name__)


class ThreadBridge:
    def __init__(self, loop: asyncio.AbstractEventLoop, max_threads: int, name: str = "reward-agent"):
        self._loop = loop
        self._max_threads = max_threads
        self._name = name
        self._calls: queue.SimpleQueue = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()  # guards the counts below and the finished list
        self._idle_threads = 0  # waiting for a job
        self._waiting_jobs = 0  # queued, not taken by a thread yet
        self._finished: list[tuple[asyncio.Future, Callable | None, bool, Any]] = []
        self._wake_pending = False
        self._closed = False

    @property
    def threads(self) -> int:
        return len(self._threads)

    def run(self, call: Callable[[], Any], on_late_end: Callable[[], None] | None = None) -> asyncio.Future:
        """Schedule ``call()`` on a worker thread; the returned future (of this loop) gets its result.
        If that future is cancelled first, ``on_late_end()`` runs on the loop once the call has
        really ended (or was skipped because it had not started)."""
        if self._closed:
            raise RuntimeError("the reward agent's threads are shut down")
        future = self._loop.create_future()
        with self._lock:
            self._waiting_jobs += 1
            spawn = self._waiting_jobs > self._idle_threads and len(self._threads) < self._max_threads
            if spawn:
                thread = threading.Thread(target=self._worker, name=f"{self._name}_{len(self._threads)}", daemon=True)
                self._threads.append(thread)
        self._calls.put((call, future, on_late_end))
        if spawn:
            thread.start()
        return future

    def add_capacity(self, delta: int) -> None:
        """One more (or fewer) thread allowed: a thread stuck in a hung call is replaced."""
        self._max_threads += delta

    def shutdown(self) -> None:
        """Stop the workers once their current call returns (queued calls are dropped unread)."""
        self._closed = True
        while True:
            try:
                self._calls.get_nowait()
            except queue.Empty:
                break
        for _ in self._threads:
            self._calls.put(_STOP)

    def _worker(self) -> None:
        while True:
            with self._lock:
                self._idle_threads += 1
            job = self._calls.get()
            if job is _STOP:
                return
            with self._lock:
                self._idle_threads -= 1
                self._waiting_jobs -= 1
            call, future, on_late_end = job
            if future.done():  # given up before it started: skipped, but its end is still reported
                self._finish(future, on_late_end, False, None)
            else:
                self._finish(future, on_late_end, *self._call(call))

    @staticmethod
    def _call(call: Callable[[], Any]) -> tuple[bool, Any]:
        try:
            return True, call()
        except StopIteration as exc:  # an asyncio future refuses StopIteration itself
            return False, RuntimeError(f"reward raised StopIteration: {exc!r}")
        except BaseException as exc:  # noqa: BLE001 - handed to the awaiting task, like run_in_executor
            return False, exc

    def _finish(self, future: asyncio.Future, on_late_end: Callable | None, ok: bool, value: Any) -> None:
        with self._lock:
            self._finished.append((future, on_late_end, ok, value))
            if self._wake_pending:
                return  # the pending drain will take this result too
            self._wake_pending = True
        try:
            self._loop.call_soon_threadsafe(self._drain)
        except RuntimeError:  # the loop closed while this call ran: nobody awaits it any more
            pass

    def _drain(self) -> None:
        with self._lock:
            finished, self._finished = self._finished, []
            self._wake_pending = False
        for future, on_late_end, ok, value in finished:
            if future.done():  # the awaiting side gave up (timeout, deadline, cancel, close)
                if on_late_end is not None:
                    try:
                        on_late_end()
                    except Exception:  # noqa: BLE001 - the other results must still be delivered
                        _log.exception("reporting the late end of a reward call failed")
            elif ok:
                future.set_result(value)
            else:
                future.set_exception(value)
