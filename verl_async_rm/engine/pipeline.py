"""The request pipeline: one sample's life from admission to outcome, on the agent's event loop.

A sample is plain data while it waits; it is an *attempt* only while a call for it runs:

    queued --admitted--> running --answered--> done: Scored | Failed   (-> ``on_outcome``)
      ^                     |--throttled (429/503)--> queued again, at the front; no attempt used
      |                     '--retryable error--> waiting (a timer) --> queued
      '-- abandoned from any state by the engine (deadline, ticket cancel, close): no outcome here

Admission is one pump over one queue: a sample starts when every meter allows it (a
concurrency slot, the flow control, the rate limits, the judge budget: ``meters.py``); otherwise
one timer (or the next freed slot) wakes the pump. So 40,000 queued samples cost 40,000 small
records, not 40,000 parked coroutines, and dropping them is O(1) each. The queue is a FIFO deque
(``admission_order: fifo``, the default), or, with ``admission_order: deadline``, a queue with the
deque's verbs that puts first what the trainer needs first (``admission_order.RankedQueue``): the
pump is the same code over either, and the deque pays nothing for the other.

An attempt is driven by what the executor started: a thread or process call's future reports back
through its done callback (no task at all), a coroutine runs in one task. Timeouts need no timer
per attempt: every attempt has the same ``request_timeout``, so deadlines come in start order and
one FIFO queue with one timer serves them all.

A concurrency slot is held by an attempt from its start until the user's call really ends: a
thread that keeps running after a timeout keeps its slot (``max_concurrency`` is what the service
sees), until it returns or is declared hung, ``max(request_timeout, 1 s)`` after the timeout,
whichever is first. A declared-hung call frees its slot, its thread is replaced, and it is counted;
past ``max_hung_calls`` the engine fails loudly. An async reward that swallows its cancellation is
caught by the same watchdog: its attempt is finished from outside as a timeout.

Every exit of an attempt, exceptions of every kind included, goes through ``_attempt_ended``:
there is no path on which a sample is neither answered, retried, requeued nor abandoned.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from verl_async_rm.cache import ResultCache, request_key
from verl_async_rm.cost import USAGE_KEY, Usage, take_usage
from verl_async_rm.engine.flow import FlowControl
from verl_async_rm.engine.meters import ConcurrencyCap, Meter
from verl_async_rm.engine.spend import Spending
from verl_async_rm.errors import RewardFunctionError
from verl_async_rm.items import RewardItem, unsendable_text
from verl_async_rm.outcomes import Failed, Outcome, Scored
from verl_async_rm.retry import RetryPolicy, classify
from verl_async_rm.reward_returns import normalize_score

_log = logging.getLogger(__name__)
_PLAIN = (float, int, bool, dict, tuple, str, type(None))  # what a reward returns: never awaitable

QUEUED, RUNNING, WAITING, DONE = range(4)
NO_TIMEOUT_GRACE = 30.0  # without request_timeout, an abandoned call is declared hung after this long


def _maybe_awaitable(value: Any) -> bool:
    """``inspect.isawaitable`` without its abstract-class check for the plain values rewards return."""
    return value.__class__ not in _PLAIN and inspect.isawaitable(value)


class Sample:
    """One request's state. ``owner`` is the engine's (its ticket or stream member), and names the
    sample in error messages (``owner.describe(item)``, only called on error)."""

    # ``ranked_as`` and ``queue_entry`` belong to the ranked admission queue (engine/admission_order.py)
    # and are never stored under FIFO: they stay unset, at no cost per sample. ``judge`` (the index of
    # the judge whose pipeline holds it) belongs to a judge list (engine/fallback.py), unset without one.
    __slots__ = ("item", "owner", "state", "settled", "attempts", "throttles", "attempt", "timer", "cache_key",
                 "group_call", "reservation", "log_key", "tokens", "input_estimate", "ranked_as", "queue_entry", "judge")

    def __init__(self, item: RewardItem, owner: Any):
        self.item = item
        self.owner = owner
        self.state = QUEUED
        self.settled = False  # the engine's flag: its outcome has been recorded
        self.attempts = 0  # attempts that ended in an error (throttles are not counted)
        self.throttles = 0
        self.attempt: Attempt | None = None
        self.timer: asyncio.TimerHandle | None = None  # retry wait
        self.cache_key: Any = None
        self.group_call: Any = None  # a group judge's call standing for this sample (engine/group_judge.py)
        self.reservation = None  # its budget reservation while an attempt is in flight (engine/spend.py)
        self.log_key: str | None = None  # its verdict-log request key (engine/verdicts.py)
        self.tokens: float | None = None  # its tokens for tokens_per_minute, once estimated
        self.input_estimate: int | None = None  # its input tokens for a budget's reservation, once estimated

    def where(self) -> str:
        return self.owner.describe(self.item)

    def scored(self, value: Any) -> Outcome:
        """What an answer makes of this request (a group judge's call answers for a whole group)."""
        score, extra = normalize_score(value, self.where)
        return Scored(score, extra, self.attempts + 1)

    def unsendable(self) -> str | None:
        """Why this request cannot be sent at all (``items.unsendable_text``), or None."""
        return unsendable_text(self.item)

    def admission_rank(self) -> tuple:
        """Where its owner ranks it under ``admission_order: deadline`` (engine/admission_order.py):
        (training, not validation; the ticket's or stream group's opening number, the caller's rank,
        unsettled members of its group)."""
        return self.owner.admission_rank(self.item)


@dataclass(frozen=True)
class PipelineStatistics:
    in_flight: int  # attempts holding a concurrency slot
    peak_in_flight: int
    queued: int  # waiting for admission
    hung_now: int  # calls declared hung that have not returned yet
    threads: int | None = None  # the thread executor's worker threads (None: another executor)


class Attempt:
    __slots__ = ("sample", "epoch", "sent_at", "call", "unstarted", "timer", "timed_out", "given_up", "finished",
                 "holds_slot", "hung")

    def __init__(self, sample: Sample, epoch: int, sent_at: float):
        self.sample = sample
        self.epoch = epoch
        self.sent_at = sent_at
        self.call: Any = None  # the task running a coroutine, or the future of a thread/process call
        self.unstarted: Any = None  # the user's coroutine until its task first runs (closed if it never does)
        self.timer: asyncio.TimerHandle | None = None  # the hung-call watchdog, once given up
        self.timed_out = False
        self.given_up = False  # timed out or abandoned: a thread not started yet skips it
        self.finished = False  # the sample has moved on from this attempt
        self.holds_slot = True
        self.hung = False


class RequestPipeline:
    def __init__(
        self,
        *,
        loop: asyncio.AbstractEventLoop,
        calls,
        max_concurrency: int,
        request_timeout: float | None,
        retry: RetryPolicy,
        flow: FlowControl,
        metrics,
        on_outcome: Callable[[Sample, Outcome], None],
        on_systemic_failure: Callable[[str], None],
        max_hung_calls: int,
        max_throttled_s: float | None,
        meters: Sequence[Meter] = (),
        cache: ResultCache | None = None,
        spend: Spending | None = None,
        answer_early: Callable[[list[Sample]], list[Sample]] | None = None,
        queue: Any = None,
        on_throttled_out: Callable[[Sample, str], None] | None = None,
        on_attempt_error: Callable[[Sample, str, BaseException], None] | None = None,
    ):
        """Admission asks the concurrency cap (``max_concurrency``: slots held until a call really
        ends) and the flow control (its answers come from here) first, then ``meters``, in order.
        ``queue``: the admission queue when it is ranked (``admission_order: deadline``: the engine
        gives an ``admission_order.RankedQueue``, which has the deque's verbs); None: a FIFO deque."""
        self.loop = loop
        self.calls = calls
        self.slots = ConcurrencyCap(max_concurrency)
        self.meters: list[Meter] = [self.slots, flow, *meters]
        self._waits = [meter.wait for meter in self.meters if not meter.reserves]
        self._reservations = [meter.wait for meter in self.meters if meter.reserves]
        self._takes = [meter.take for meter in self.meters]
        self.timeout = request_timeout
        # A call given up (timeout, cancel) that has not ended this much later is declared hung.
        self.hung_grace = max(request_timeout, 1.0) if request_timeout is not None else NO_TIMEOUT_GRACE
        self.retry = retry
        self.flow = flow
        self.metrics = metrics
        self.on_outcome = on_outcome
        self.on_systemic_failure = on_systemic_failure
        self.max_hung_calls = max_hung_calls
        self.max_throttled_s = max_throttled_s
        # A judge of a fallback list (engine/fallback.py) throttled past max_throttled_s is down, not
        # a loud failure: the sample whose throttle said so is handed over instead.
        self.on_throttled_out = on_throttled_out
        self.on_attempt_error = on_attempt_error  # (sample, kind, error) of each failed attempt, not a throttle
        self.cache = cache
        # Hooks of judge operations (cost.py, verdict_log.py): usage per attempt, and the budget's
        # reservation released with it (the budget is a meter too); samples answered from the
        # verdict log instead of being sent (a resumed run).
        self.spend = spend
        self.budgeted = spend is not None and spend.limited
        self.answer_early = answer_early
        self.queue: deque[Sample] = deque() if queue is None else queue  # or a RankedQueue: the same verbs
        self.hung_now = 0  # declared hung and not returned yet
        self.tasks: dict[asyncio.Task, Attempt] = {}  # coroutine attempts (stuck ones too, until they end)
        self._timeouts: deque[tuple[float, Attempt]] = deque()  # (deadline, attempt), in start order
        self._timeout_timer: asyncio.TimerHandle | None = None
        self._wake: asyncio.TimerHandle | None = None
        self._wake_at = float("inf")
        self._pumping = self._pump_again = False
        self._closed = False
        self._reported = calls.reports_ends  # thread calls: their ends come through _thread_end
        if self._reported:
            calls.bind(self._thread_end)

    # -- entry -----------------------------------------------------------------------------------
    def enqueue(self, samples: list[Sample]) -> None:
        samples = self._refuse_unsendable(samples)
        if self.answer_early is not None:
            samples = self.answer_early(samples)
        if self.cache is None:
            self.queue.extend(samples)
        else:
            for sample in samples:
                self._enqueue_cached(sample)
        self.pump()

    def _refuse_unsendable(self, samples: list[Sample]) -> list[Sample]:
        """Samples no request can carry fail as ``invalid`` at once, never sent (settled on the next
        loop turn, as answers from the verdict log are: the caller is still inside ``submit``)."""
        sendable = []
        for sample in samples:
            problem = sample.unsendable()
            if problem is None:
                sendable.append(sample)
                continue
            sample.state = DONE
            self.loop.call_soon(self.on_outcome, sample, Failed("invalid", f"{sample.where()} was not sent: {problem}", 0))
        return sendable

    @property
    def in_flight(self) -> int:
        """Attempts holding a concurrency slot."""
        return self.slots.in_flight

    @property
    def cap(self) -> int:
        return self.slots.limit

    def abandon(self, sample: Sample) -> None:
        """The engine settles ``sample`` itself (deadline, cancel, close): stop whatever it is doing.
        A queued sample is skipped lazily by the pump; a running attempt is cancelled (its slot is
        freed when its call ends); a retry wait is dropped."""
        state, sample.state = sample.state, DONE
        if state == RUNNING and sample.attempt is not None:
            attempt = sample.attempt
            if not attempt.finished:
                attempt.finished = True
                self.flow.on_abandoned()
                if self.budgeted:  # it may have been billed: charged its reservation
                    self.spend.release(sample, None)
            self._give_up(attempt)
        elif state == WAITING and sample.timer is not None:
            sample.timer.cancel()
        if sample.cache_key is not None:
            self._release_followers(sample, None)
        call = sample.group_call
        if call is not None and call.state != DONE and all(m.state == DONE for m in call.members):
            self.abandon(call)  # every member of a group judge's call was settled from outside

    def abandon_all(self, samples: list[Sample]) -> None:
        """``abandon`` for many samples at once (a deadline over a backlog): a plain queued sample is
        only marked, with no call (the pump drops it when it reaches it); the others (running,
        waiting to retry, a cache leader, a group judge's member) take ``abandon``."""
        abandon = self.abandon
        for sample in samples:
            if sample.state == QUEUED and sample.cache_key is None and sample.group_call is None:
                sample.state = DONE
            else:
                abandon(sample)

    # -- admission ---------------------------------------------------------------------------------
    def pump(self) -> None:
        """Start every queued sample that may start now; arrange to be called again when more may.
        Re-entrant calls (a call that fails as it starts frees its slot, which pumps) only ask the
        running pump for one more round: no recursion, however many fail at once."""
        if self._pumping:
            self._pump_again = True
            return
        self._pumping = True
        try:
            self._pump_again = True
            while self._pump_again:
                self._pump_again = False
                self._pump_once()
        finally:
            self._pumping = False

    def _pump_once(self) -> None:
        queue = self.queue
        if not queue:
            return
        now = self.loop.time()
        waits, reservations, takes = self._waits, self._reservations, self._takes
        while queue:
            sample = queue[0]
            if sample.state != QUEUED:  # abandoned while queued
                queue.popleft()
                continue
            if self._closed:
                return
            delay = 0.0
            try:
                for wait in waits:
                    until = wait(sample, now)
                    if until is None:
                        return  # not before an event: a finished call, an answer, a lease pumps again
                    if until > delay:
                        delay = until
                if delay > 0:
                    self._wake_after(now, delay)
                    return
                for wait in reservations:  # only for a sample that may start now
                    if wait(sample, now) is None:
                        return
            except Exception as exc:  # noqa: BLE001 - the user's (or the reward's) token estimate: refused, never sent
                self._refuse(sample, exc)
                continue
            queue.popleft()
            for take in takes:
                take(sample, now)
            self._start(sample, now)
        if self.slots.in_flight == 0:
            self.flow.on_backlog_cleared(now)

    def _refuse(self, sample: Sample, error: BaseException) -> None:
        """A sample whose token estimate (a rate limit's, the budget's) is unusable fails as
        ``invalid`` without being sent (a systematically bad estimator trips the failure budgets,
        loudly)."""
        self.queue.popleft()
        self._finish(sample, Failed("invalid", f"{sample.where()} not sent: {type(error).__name__}: {error}", sample.attempts))

    def _wake_after(self, now: float, delay: float) -> None:
        at = now + delay
        if self._wake is not None and self._wake_at <= at:
            return
        if self._wake is not None:
            self._wake.cancel()
        self._wake_at = at
        self._wake = self.loop.call_at(at, self._on_wake)

    def _on_wake(self) -> None:
        self._wake, self._wake_at = None, float("inf")
        self.pump()

    # -- one attempt --------------------------------------------------------------------------------
    def _start(self, sample: Sample, now: float) -> None:
        sample.state = RUNNING
        attempt = sample.attempt = Attempt(sample, self.flow.epoch, now)  # its slot and its send: taken by the meters
        if self.timeout is not None:
            self._timeouts.append((now + self.timeout, attempt))
            if self._timeout_timer is None:
                self._timeout_timer = self.loop.call_at(now + self.timeout, self._expire_timeouts)
        try:
            call = self.calls.start(sample.item, attempt)
        except BaseException as exc:  # noqa: BLE001 - e.g. an async reward called with wrong arguments
            self._attempt_ended(attempt, None, exc)
            return
        if self._reported:
            return  # a thread call: its end comes through _thread_end
        if isinstance(call, asyncio.Future):  # a thread or process call: its callback drives the attempt
            attempt.call = call
            call.add_done_callback(lambda future: self._call_done(attempt, future))
        else:  # a coroutine: one task
            attempt.unstarted = call
            task = attempt.call = self.loop.create_task(self._run(attempt, call))
            self.tasks[task] = attempt
            task.add_done_callback(self._task_done)

    def _thread_end(self, attempt: Attempt, ok: bool, value: Any) -> None:
        """A thread call ended (or was skipped: given up before it started)."""
        if attempt.given_up:  # timed out or abandoned: decided already; only its slot was waiting
            self._on_late_end(attempt)
        elif not ok:
            self._attempt_ended(attempt, None, value)
        elif _maybe_awaitable(value):  # a sync wrapper that returned a coroutine
            task = attempt.call = self.loop.create_task(self._run(attempt, value))
            self.tasks[task] = attempt
            task.add_done_callback(self._task_done)
        else:
            self._attempt_ended(attempt, value, None)

    def _call_done(self, attempt: Attempt, future: asyncio.Future) -> None:
        if future.cancelled():
            self._attempt_ended(attempt, None, self._timeout_error(attempt), cancelled=True)
        elif future.exception() is not None:
            self._attempt_ended(attempt, None, future.exception())
        elif _maybe_awaitable(future.result()):  # a sync wrapper that returned a coroutine
            task = attempt.call = self.loop.create_task(self._run(attempt, future.result()))
            self.tasks[task] = attempt
            task.add_done_callback(self._task_done)
        else:
            self._attempt_ended(attempt, future.result(), None)

    async def _run(self, attempt: Attempt, awaitable) -> None:
        attempt.unstarted = None
        try:
            value = await awaitable
            if _maybe_awaitable(value):
                value = await value
        except asyncio.CancelledError:
            # Not re-raised: the task ends quietly. A timeout becomes the attempt's error; any other
            # cancel came from whoever settled the sample (abandon, close).
            self._attempt_ended(attempt, None, self._timeout_error(attempt), cancelled=True)
        except BaseException as exc:  # noqa: BLE001 - every failure of the user's call is an outcome
            self._attempt_ended(attempt, None, exc)
        else:
            self._attempt_ended(attempt, value, None)

    def _task_done(self, task: asyncio.Task) -> None:
        attempt = self.tasks.pop(task, None)
        if attempt is not None and attempt.unstarted is not None:
            # Cancelled before its first step: ``_run`` never ran, so nothing else reports its end.
            attempt.unstarted.close()
            attempt.unstarted = None
            self._attempt_ended(attempt, None, self._timeout_error(attempt), cancelled=True)

    def _timeout_error(self, attempt: Attempt) -> TimeoutError | None:
        return TimeoutError(f"request_timeout ({self.timeout}s)") if attempt.timed_out else None

    def _expire_timeouts(self) -> None:
        """The FIFO of attempt deadlines: time out the due attempts still running, drop finished ones."""
        self._timeout_timer = None
        now = self.loop.time()
        queue = self._timeouts
        while queue:
            at, attempt = queue[0]
            if attempt.finished or attempt.timed_out:
                queue.popleft()
            elif at <= now:
                queue.popleft()
                self._on_timeout(attempt)
            else:
                break
        if len(queue) > 2 * self.slots.in_flight + 1024:  # finished ones behind a slow head: compact
            self._timeouts = queue = deque(entry for entry in queue if not entry[1].finished)
        if queue:
            self._timeout_timer = self.loop.call_at(queue[0][0], self._expire_timeouts)

    def _forget_finished_timeouts(self) -> None:
        """Finished attempts leave the FIFO of attempt deadlines as they finish, not when their
        timeout would have been due: each entry holds its sample (its item, its ticket), and a fast
        reward finishes hundreds of thousands of requests within the default 120 s (RSS grew by
        530 MB over three 100k tickets). The head goes at once (answers mostly come in start
        order); entries finished behind a slow head are compacted away once they outnumber the
        live ones (at most one per attempt in flight), so each entry is visited O(1) times. In
        place: ``_expire_timeouts`` may be walking the same deque when a timeout ends an attempt."""
        queue = self._timeouts
        while queue and queue[0][1].finished:
            queue.popleft()
        if len(queue) > 2 * self.slots.in_flight + 1024:
            live = [entry for entry in queue if not entry[1].finished]
            queue.clear()
            queue.extend(live)

    def _on_timeout(self, attempt: Attempt) -> None:
        attempt.timed_out = True
        self._give_up(attempt)

    def _give_up(self, attempt: Attempt) -> None:
        """Cancel a running call (timeout, abandon) and start its hung-call watchdog (once)."""
        attempt.given_up = True
        if attempt.timer is None and attempt.holds_slot:
            attempt.timer = self.loop.call_at(self.loop.time() + self.hung_grace, self._on_hung, attempt)
        if attempt.call is not None:
            attempt.call.cancel()
        elif self._reported and attempt.timed_out and not attempt.finished:
            # A thread cannot be cancelled: the sample moves on now; the slot waits for its end.
            self._attempt_ended(attempt, None, self._timeout_error(attempt), cancelled=True)

    def _on_hung(self, attempt: Attempt) -> None:
        """``hung_grace`` after a timeout or cancel, the call has not ended: give its slot back."""
        attempt.timer = None
        if not attempt.holds_slot:
            return
        if not attempt.finished:  # an async reward that ignored its cancellation: finish it from here
            self._attempt_ended(attempt, None, TimeoutError("request_timeout (the call ignored its cancellation)"), hung=True)
        attempt.hung = True
        self.hung_now += 1
        self.metrics.hung_calls += 1
        self.calls.replace_hung_thread(+1)
        _log.warning(
            "%s: the reward call has not returned %ss after it was given up (timeout or cancel); its "
            "slot is freed and it is counted as hung (%d now)", attempt.sample.where(), self.hung_grace, self.hung_now,
        )
        self._release(attempt)
        if self.hung_now > self.max_hung_calls:
            self.on_systemic_failure(
                f"{self.hung_now} reward calls never returned after being given up (max_hung_calls="
                f"{self.max_hung_calls}): the reward blocks forever on some inputs or ignores cancellation; "
                "give its own I/O a timeout (or use executor: process, whose hung calls are killed)"
            )

    def _on_late_end(self, attempt: Attempt) -> None:
        """A thread call that was given up has really ended now."""
        if attempt.timer is not None:
            attempt.timer.cancel()
            attempt.timer = None
        if attempt.hung:
            attempt.hung = False
            self.hung_now -= 1
            self.calls.replace_hung_thread(-1)
        self._release(attempt)

    def _release(self, attempt: Attempt) -> None:
        if attempt.holds_slot:
            attempt.holds_slot = False
            # The attempt is over for good: it lets go of its sample, so neither an entry left in
            # the FIFO of timeouts nor the sample's own reference back (a cycle the collector would
            # have to find) keeps the sample, or its ticket, alive.
            attempt.sample = None
            self.slots.in_flight -= 1  # its slot back (the cap is the pipeline's own meter)
            self.pump()

    def _attempt_ended(
        self, attempt: Attempt, value: Any, error: BaseException | None, *, cancelled: bool = False, hung: bool = False,
    ) -> None:
        """The one place an attempt's result is turned into what happens next. ``cancelled``: the
        wait was cancelled (by the timeout, ``abandon`` or close); ``hung``: called by the watchdog."""
        if attempt.hung and not hung:  # a call declared hung has ended after all
            attempt.hung = False
            self.hung_now -= 1
        # The slot stays with a thread that was given up but may still be running: it is freed when
        # the thread returns (``_on_late_end``) or by the watchdog. Every other call is over now.
        still_running = cancelled and self.calls.outlives_cancel
        if not still_running and not hung and attempt.timer is not None:
            attempt.timer.cancel()
            attempt.timer = None
        if not attempt.finished:
            attempt.finished = True
            if self._timeouts:
                self._forget_finished_timeouts()
            reported = self._decide(attempt, value, error, cancelled)
            if self.budgeted or reported is not None:  # nothing to do for an unbudgeted, unreported call
                self._spent(attempt.sample, reported, error)
        # Last: freeing the slot pumps the queue, which must see what this answer taught the flow control.
        if not still_running and not hung:
            self._release(attempt)

    def _decide(self, attempt: Attempt, value: Any, error: BaseException | None, cancelled: bool) -> Usage | None:
        """What happens next; returns the usage the answer reported, if any."""
        sample = attempt.sample
        reported = None
        now = self.loop.time()
        if cancelled and not attempt.timed_out:
            self.flow.on_abandoned()  # closed under it: the engine answers for the sample
            return
        if error is None and not attempt.timed_out:
            self.flow.on_answer(now, attempt.epoch, sent_at=attempt.sent_at)
            try:
                outcome: Outcome = sample.scored(value)
                if isinstance(outcome, Scored) and outcome.extra and USAGE_KEY in outcome.extra:
                    reported = take_usage(outcome.extra)  # the judge's reported usage, as two integer keys (cost.py)
            except Exception as exc:  # noqa: BLE001 - e.g. 10**400 raises OverflowError in float()
                outcome = Failed("invalid", str(exc) if isinstance(exc, RewardFunctionError)
                                 else f"{sample.where()} returned an unusable score: {type(exc).__name__}: {exc}",
                                 sample.attempts + 1)
            self._finish(sample, outcome)
            return reported
        if error is None:
            error = TimeoutError(f"request_timeout ({self.timeout}s)")
        info = classify(error)
        self.metrics.attempt_errors_by_kind[info.kind] += 1
        if info.throttled:
            self.metrics.throttled += 1
            sample.throttles += 1
        if info.throttled and self.flow.settings.enabled:
            self.flow.on_answer(now, attempt.epoch, sent_at=attempt.sent_at, throttled=True, retry_after=info.retry_after)
            if self.max_throttled_s is not None and self.flow.throttled_for(now) > self.max_throttled_s:
                message = (
                    f"every answer for {self.flow.throttled_for(now):.0f}s was a throttle ({info.kind}; "
                    f"max_throttled_s={self.max_throttled_s}): the service is refusing this agent (quota "
                    f"used up? wrong tier?). Last: {type(error).__name__}: {error}"
                )
                if self.on_throttled_out is not None:
                    sample.state = DONE  # handed over: the fallback moves it on
                    self.on_throttled_out(sample, message)
                else:
                    self.on_systemic_failure(message)
                return
            sample.state = QUEUED
            # flow control, not failure: first in line once the pause ends (ranked: at its own rank)
            self.queue.appendleft(sample)
            return
        self.flow.on_answer(now, attempt.epoch, sent_at=attempt.sent_at)
        if self.on_attempt_error is not None:  # a judge list's breaker counts attempts (engine/fallback.py)
            self.on_attempt_error(sample, info.kind, error)
        sample.attempts += 1
        delay = self.retry.next_delay(sample.attempts, info.retry_after) if info.retryable else None
        if delay is None:
            tries = f" after {sample.attempts} attempts" if sample.attempts > 1 else ""
            self._finish(sample, Failed(info.kind, f"{sample.where()} failed{tries}: {type(error).__name__}: {error}", sample.attempts))
            return
        self.metrics.retries += 1
        sample.state = WAITING
        sample.timer = self.loop.call_at(now + delay, self._retry_now, sample)

    def _spent(self, sample: Sample, reported: Usage | None, error: BaseException | None) -> None:
        """Charge an ended attempt: the usage its answer reported, else its reservation; a throttle
        is not charged."""
        throttled = error is not None and classify(error).throttled
        self.spend.release(sample, reported, charge=not throttled)

    def _retry_now(self, sample: Sample) -> None:
        sample.timer = None
        if sample.state == WAITING:
            sample.state = QUEUED
            self.queue.append(sample)  # at the back (ranked: at its own rank)
            self.pump()

    def _finish(self, sample: Sample, outcome: Outcome) -> None:
        sample.state = DONE
        if sample.cache_key is not None:
            self._release_followers(sample, outcome)
        self.on_outcome(sample, outcome)

    # -- the cache ----------------------------------------------------------------------------------
    def _enqueue_cached(self, sample: Sample) -> None:
        key = request_key(sample.item)
        found = self.cache.lookup(key, sample)
        if found is True:
            self.metrics.cache_hits += 1
            return  # follows an identical request in flight
        if found is not None:
            self.metrics.cache_hits += 1
            sample.state = DONE
            self.loop.call_soon(self.on_outcome, sample, Scored(found.score, found.extra, 0, cached=True))
            return
        self.metrics.cache_misses += 1
        sample.cache_key = key
        self.queue.append(sample)

    def _release_followers(self, leader: Sample, outcome: Outcome | None) -> None:
        key, leader.cache_key = leader.cache_key, None
        followers = [f for f in self.cache.finish(key, outcome) if f.state == QUEUED]
        if isinstance(outcome, Scored):
            for follower in followers:
                follower.state = DONE
                self.on_outcome(follower, Scored(outcome.score, outcome.extra, 0, cached=True))
        elif followers:  # the leader failed or was abandoned: the followers are scored on their own
            for follower in followers:
                self._enqueue_cached(follower)
            self.pump()

    # -- shutdown -----------------------------------------------------------------------------------
    async def aclose(self, timeout: float) -> int:
        """Stop admitting, cancel every running attempt, wait up to ``timeout`` s for them to end.
        Returns how many did not (async rewards that ignore cancellation): they are left behind."""
        self._closed = True
        for timer in (self._wake, self._timeout_timer):
            if timer is not None:
                timer.cancel()
        for task in list(self.tasks):
            task.cancel()
        stuck = 0
        if self.tasks:  # a cancelled call ends within milliseconds; one that ignores it is left behind
            _, pending = await asyncio.wait(list(self.tasks), timeout=min(timeout, 2.0))
            stuck = len(pending)
        await self.calls.aclose()
        return stuck

    def statistics(self) -> PipelineStatistics:
        return PipelineStatistics(
            in_flight=self.slots.in_flight,
            peak_in_flight=self.slots.peak,
            queued=sum(1 for s in self.queue if s.state == QUEUED),
            hung_now=self.hung_now,
            threads=self.calls.threads(),
        )
