"""Run sync reward calls on worker threads and report their ends to the event loop in batches.

Why not ``loop.run_in_executor`` on a ``ThreadPoolExecutor``, which this replaces (measured with
py-spy and cProfile on zero-latency sync rewards, where the event loop is the bottleneck):
- it wakes the loop once per finished call (a ``call_soon_threadsafe`` each: a self-pipe write and
  a loop iteration). Here a worker appends its result to a shared list and wakes the loop only if
  no wake-up is pending; one callback then reports every result that has arrived;
- it builds a ``concurrent.futures.Future`` (with its Condition and RLock) per call and chains it to
  an asyncio future with callbacks: 13% of the loop's time, then more. Here there is no future at
  all: a call is ``(function, token)``, and its end is ``on_end(token, ok, value)`` on the loop;
- a thread cannot be stopped, so a call the agent gave up on (a timeout) keeps running; the caller
  must know when it really ends (its concurrency slot is held until then), and a call that never
  ends must not take a thread for good: every call's end is reported, however late, a call whose
  token says ``given_up`` before it starts is skipped (and reported as such), and
  ``add_capacity`` lets the agent replace a hung thread. So threads are counted exactly: a call
  needs a thread from its submission until its end is reported (a hung call for good), so the pool
  may keep up to ``min(outstanding calls, max_threads)`` threads. ThreadPoolExecutor's idle semaphore instead
  keeps a permit for every finished job, which stays after the thread took another job; with hung
  threads those stale permits claim idle threads that do not exist, and calls wait forever;
- threads on demand: one to start with; while calls wait in the queue, every ``GROW_AFTER_S`` one
  more thread for each worker that has been inside its call longer than that (it blocks: on I/O,
  a sleep, a lock), up to that bound. Blocking rewards (the reason for threads) get a thread each
  within milliseconds; fast ones run on a few, since hundreds of threads handing the GIL around for
  microsecond calls cost more than the calls (measured: 256 threads ~35k zero-latency calls/s,
  2-8 threads ~80k/s). The queue's length alone cannot tell: calls also wait while the loop thread
  holds the GIL;
- no lock: only the loop thread counts (submissions, reported ends), and the workers hand results
  over through a deque (its append and popleft are atomic). A lock shared with 256 workers made
  the loop wait, whenever a worker holding it lost the GIL, for a whole switch interval.
Nothing polls: a result never waits for a timer.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections import deque
from typing import Any, Callable

_STOP = None
SKIPPED = object()  # the value reported for a call given up before it started
GROW_AFTER_S = 0.002  # calls waiting this long for a thread double the pool
_log = logging.getLogger(__name__)


class ThreadBridge:
    def __init__(
        self, loop: asyncio.AbstractEventLoop, max_threads: int, on_end: Callable[[Any, bool, Any], None],
        name: str = "reward-agent",
    ):
        """``on_end(token, ok, value)`` runs on ``loop`` for every call: ``ok`` with its return value,
        or not ok with its exception (or ``SKIPPED``)."""
        self._loop = loop
        self._max_threads = max_threads
        self._on_end = on_end
        self._name = name
        self._calls: queue.SimpleQueue = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._outstanding = 0  # submitted, end not reported yet (the loop thread's count alone)
        self._grow: asyncio.TimerHandle | None = None
        self._in_call_since: list[float] = []  # per thread: when its current call began (0.0: none)
        self._finished: deque[tuple[Any, bool, Any]] = deque()
        self._wake_pending = False
        self._closed = False

    @property
    def threads(self) -> int:
        return len(self._threads)

    def run(self, fn: Callable[[Any], Any], arg: Any, token: Any) -> None:
        """Schedule ``fn(arg)`` on a worker thread (from the loop's thread). If ``token.given_up`` is
        true when a thread takes it, it is skipped. Either way ``on_end(token, ...)`` follows.
        (``fn`` and ``arg`` rather than a closure: no object built per call beyond the job tuple.)"""
        if self._closed:
            raise RuntimeError("the reward agent's threads are shut down")
        self._outstanding += 1
        self._calls.put((fn, arg, token))
        if not self._threads:
            self._spawn(1)
        elif self._grow is None and len(self._threads) < min(self._outstanding, self._max_threads):
            self._grow = self._loop.call_later(GROW_AFTER_S, self._grow_if_waiting)

    def _grow_if_waiting(self) -> None:
        """Calls still wait for a thread: the threads are busy (blocking calls). Double the pool."""
        self._grow = None
        if self._closed:
            return
        room = min(self._outstanding, self._max_threads) - len(self._threads)
        waiting = self._calls.qsize()
        if waiting and room > 0:
            now = time.monotonic()
            blocked = sum(1 for since in self._in_call_since if since and now - since > GROW_AFTER_S)
            if blocked:
                self._spawn(min(waiting, room, blocked))
            room = min(self._outstanding, self._max_threads) - len(self._threads)
        if waiting and room > 0:
            self._grow = self._loop.call_later(GROW_AFTER_S, self._grow_if_waiting)

    def _spawn(self, count: int) -> None:
        for _ in range(count):
            number = len(self._threads)
            self._in_call_since.append(0.0)
            thread = threading.Thread(target=self._worker, args=(number,), name=f"{self._name}_{number}", daemon=True)
            self._threads.append(thread)
            thread.start()

    def add_capacity(self, delta: int) -> None:
        """One more (or fewer) thread allowed: a thread stuck in a hung call is replaced."""
        self._max_threads += delta
        if delta > 0 and self._grow is None and not self._closed:
            self._grow = self._loop.call_later(GROW_AFTER_S, self._grow_if_waiting)

    def shutdown(self) -> None:
        """Stop the workers once their current call returns (queued calls are dropped unreported)."""
        self._closed = True
        if self._grow is not None:
            self._grow.cancel()
        while True:
            try:
                self._calls.get_nowait()
            except queue.Empty:
                break
        for _ in self._threads:
            self._calls.put(_STOP)

    def _worker(self, number: int) -> None:
        in_call_since = self._in_call_since
        while True:
            job = self._calls.get()
            if job is _STOP:
                return
            fn, arg, token = job
            if token.given_up:
                self._finished.append((token, False, SKIPPED))
            else:
                in_call_since[number] = time.monotonic()
                try:
                    ok, value = True, fn(arg)
                except BaseException as exc:  # noqa: BLE001 - reported to the loop, like run_in_executor
                    ok, value = False, exc
                in_call_since[number] = 0.0
                self._finished.append((token, ok, value))
            # An idle worker must not keep its last call alive (the token is an attempt: it holds
            # its sample and, through it, the sample's whole ticket): dropped before the loop is
            # woken to take the result, so a caller handed the result never finds it still held.
            job = fn = arg = token = value = None
            self._wake_loop()

    def _wake_loop(self) -> None:
        # Wake the loop unless a drain is already pending. Two workers may both wake it (the second
        # drain finds nothing); none can be missed: the drain clears the flag before it empties
        # the deque, so whatever is appended after that sees the flag down and wakes it again.
        if not self._wake_pending:
            self._wake_pending = True
            try:
                self._loop.call_soon_threadsafe(self._drain)
            except RuntimeError:  # the loop closed while this call ran: nobody waits for it any more
                pass

    def _drain(self) -> None:
        self._wake_pending = False
        finished = self._finished
        while finished:
            token, ok, value = finished.popleft()
            self._outstanding -= 1
            try:
                self._on_end(token, ok, value)
            except Exception:  # noqa: BLE001 - the other results must still be reported
                _log.exception("reporting the end of a reward call failed")
