"""The scoring engine: lives on the agent's event loop and is only ever touched from it.

One asyncio task per sample; a sample's life: cache lookup -> rate limits -> concurrency slot ->
user call under a timeout -> retries with backoff -> settled. A group is resolved (failure policy,
then the user's group hook) when its last sample settles, and handed to waiting ``take`` calls
in completion order. Nothing polls: every wake-up is caused by an event.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import inspect
import logging
import sys
import time
from collections import OrderedDict, deque
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from typing import Callable, Hashable

from verl_async_rm import process_worker
from verl_async_rm.cache import ResultCache, request_key
from verl_async_rm.config import AgentConfig
from verl_async_rm.groups import GroupResult, SettledGroup, TicketLedger, assemble_chunk
from verl_async_rm.limits import ConcurrencyLimiter, strict_rate_limiter
from verl_async_rm.loader import UserReward
from verl_async_rm.metrics import AgentMetrics
from verl_async_rm.normalize import normalize_group_scores, normalize_score
from verl_async_rm.outcome import (
    Failed, Outcome, RewardError, RewardFunctionError, RewardItem, Scored, ScoredChunk, TicketCancelled,
)
from verl_async_rm.policy import resolve_group
from verl_async_rm.retry import Backoff, classify
from verl_async_rm.thread_bridge import ThreadBridge

_log = logging.getLogger(__name__)

if sys.version_info >= (3, 11):

    async def _with_timeout(awaitable, seconds: float | None):
        if seconds is None:
            return await awaitable
        async with asyncio.timeout(seconds):  # cheaper than wait_for: no extra task per call
            return await awaitable

else:  # pragma: no cover - Python 3.10

    async def _with_timeout(awaitable, seconds: float | None):
        return await asyncio.wait_for(awaitable, seconds)


class _TicketRun:
    """The live state of one submitted batch."""

    def __init__(self, ticket: int, ledger: TicketLedger, items: list[RewardItem], deadline: float | None):
        self.ticket = ticket
        self.ledger = ledger
        self.items = {item.index: item for item in items}
        self.tasks: dict[int, asyncio.Task] = {}
        self.hook_tasks: set[asyncio.Task] = set()
        self.waiters: deque[tuple[int | None, asyncio.Future]] = deque()
        self.error: BaseException | None = None
        self.submitted_at = time.monotonic()
        self.latencies: dict[int, float] = {}  # settled samples not yet in a ready group
        self.deadline = deadline
        self.deadline_handle: asyncio.TimerHandle | None = None


class _StreamGroup:
    """A group assembled one sample at a time (verl's per-sample ``run_single`` path): every sample
    starts scoring on arrival; the group is resolved once it is closed (``group_size`` members, or
    ``group_wait`` seconds without a new one) and all its members are settled."""

    def __init__(self, key: Hashable, group_size: int):
        self.key = key
        self.group_size = group_size
        self.members: list[RewardItem] = []  # arrival order: the order the group hook sees
        self.arrived: list[float] = []
        self.outcomes: dict[int, Outcome] = {}
        self.answers: list[asyncio.Future] = []
        self.closed = False
        self.wait_handle: asyncio.TimerHandle | None = None

    @property
    def complete(self) -> bool:
        return self.closed and len(self.outcomes) == len(self.members)


class ScoringEngine:
    def __init__(self, reward: UserReward, config: AgentConfig, token_estimator: Callable[[RewardItem], int] | None):
        self.reward = reward
        self.config = config
        self.token_estimator = token_estimator
        self.limiter = ConcurrencyLimiter(config.max_concurrency, adaptive=config.adaptive_concurrency)
        self.rpm = strict_rate_limiter(config.requests_per_minute) if config.requests_per_minute else None
        self.tpm = strict_rate_limiter(config.tokens_per_minute) if config.tokens_per_minute else None
        self.backoff = Backoff(config.backoff_initial, config.backoff_max)
        self.cache = ResultCache(config.cache_size) if config.cache else None
        self.metrics = AgentMetrics()
        self.tickets: dict[int, _TicketRun] = {}
        self.drained: set[int] = set()
        self.cancelled: set[int] = set()
        self.streams: dict[Hashable, _StreamGroup] = {}
        self.closed_early: OrderedDict[Hashable, None] = OrderedDict()  # groups closed by group_wait, recent
        self.stream_tasks: set[asyncio.Task] = set()
        self.closed = False
        sync_hook = reward.group_hook is not None and not reward.hook_is_async
        self.threads = ThreadPoolExecutor(config.sync_workers, thread_name_prefix="reward-hook") if sync_hook else None
        self.bridge: ThreadBridge | None = None  # sync scores' threads; made on the loop, at the first call
        self.processes = None
        if not reward.score_is_async and config.executor == "process":
            init = (process_worker.load, (reward.spec,)) if reward.spec else (None, ())
            self.processes = ProcessPoolExecutor(config.sync_workers, initializer=init[0], initargs=init[1])

    # -- tickets ----------------------------------------------------------------------------------
    def start_ticket(self, ticket: int, ledger: TicketLedger, items: list[RewardItem]) -> None:
        loop = asyncio.get_running_loop()
        run = _TicketRun(ticket, ledger, items, self.config.ticket_deadline)
        self.tickets[ticket] = run
        self.metrics.submitted += len(items)
        if self.closed:
            run.error = RuntimeError("the reward agent is closed")
            return
        for item in items:
            run.tasks[item.index] = loop.create_task(self._run_sample(run, item))
        if run.deadline is not None:
            run.deadline_handle = loop.call_later(run.deadline, self._expire, run)
        self._retire_if_done(run)

    async def take(self, ticket: int, n: int | None) -> ScoredChunk:
        run = self.tickets.get(ticket)
        if run is None:
            if ticket in self.drained:
                return ScoredChunk.empty()
            if ticket in self.cancelled:
                raise TicketCancelled(f"ticket {ticket} was cancelled")
            raise KeyError(f"unknown ticket {ticket!r}")
        run.ledger.check_request(n)
        if run.error is not None:
            raise self._ticket_error(run)
        waiter = asyncio.get_running_loop().create_future()
        run.waiters.append((n, waiter))
        self._serve(run)
        return await waiter

    def cancel(self, ticket: int) -> int:
        """Stop scoring a ticket nobody will read; returns how many of its samples were unsettled.
        Their calls are cancelled (a sync call already running in a thread finishes, unread), and
        pending and later takes fail with TicketCancelled."""
        run = self.tickets.get(ticket)
        if run is None:
            if ticket in self.drained or ticket in self.cancelled:
                return 0
            raise KeyError(f"unknown ticket {ticket!r}")
        unsettled = len(run.ledger.unsettled_indices())
        self.metrics.cancelled += unsettled
        self._fail_ticket(run, TicketCancelled(f"ticket {ticket} was cancelled"))
        del self.tickets[ticket]
        self.cancelled.add(ticket)
        return unsettled

    def remaining(self, ticket: int) -> int:
        run = self.tickets.get(ticket)
        return 0 if run is None else run.ledger.remaining_samples

    # -- streaming groups (one sample at a time) -----------------------------------------------------
    async def score_in_group(
        self, item: RewardItem, uid: Hashable | None, group_size: int, group_wait: float | None
    ) -> tuple[float, dict]:
        """Score one sample as a member of the group ``uid``; answer when the whole group is resolved.
        Without a uid the sample is a group of one."""
        if self.closed:
            raise RuntimeError("the reward agent is closed")
        loop = asyncio.get_running_loop()
        key: Hashable = ("uid", uid) if uid is not None else ("sample", object())
        size = group_size if uid is not None else 1
        group = self.streams.get(key)
        if (group is not None and group.closed) or (group is None and key in self.closed_early):
            # A member after the group was closed by group_wait: it starts a new group (never lost,
            # never waiting forever); the hook then sees the group in two parts.
            self.metrics.split_groups += 1
            _log.warning(
                "group %r got a member after group_wait (%ss) had closed it short of %d samples: the "
                "wait is shorter than the spread of its generation times; it continues as a new group",
                uid, group_wait, size,
            )
            group = None
            self.closed_early.pop(key, None)
        if group is None:
            group = self.streams[key] = _StreamGroup(key, size)
        position = len(group.members)
        group.members.append(item)
        group.arrived.append(time.monotonic())
        answer = loop.create_future()
        group.answers.append(answer)
        self.metrics.submitted += 1
        if group.wait_handle is not None:
            group.wait_handle.cancel()
            group.wait_handle = None
        if len(group.members) == size:
            group.closed = True
        elif group_wait is not None:
            group.wait_handle = loop.call_later(group_wait, self._close_stream_group, group)
        task = loop.create_task(self._stream_sample(group, position, item))
        self.stream_tasks.add(task)
        task.add_done_callback(self.stream_tasks.discard)
        return await answer

    async def _stream_sample(self, group: _StreamGroup, position: int, item: RewardItem) -> None:
        where = lambda: f"{self.reward.label} on a sample of group {group.key[1]!r}"  # noqa: E731
        scoring = self._score_cached(item, where)
        try:
            deadline = self.config.ticket_deadline
            outcome = await (_with_timeout(scoring, deadline) if deadline is not None else scoring)
        except (TimeoutError, asyncio.TimeoutError):  # distinct classes before Python 3.11
            outcome = Failed("deadline", f"{where()} unfinished at the deadline ({self.config.ticket_deadline}s)")
        self.metrics.latencies.append(time.monotonic() - group.arrived[position])
        if isinstance(outcome, Scored):
            self.metrics.completed += 1
        else:
            self.metrics.failed += 1
            self.metrics.failures_by_kind[outcome.kind] += 1
        group.outcomes[position] = outcome
        if group.complete:
            await self._resolve_stream_group(group)

    def _close_stream_group(self, group: _StreamGroup) -> None:
        """No new member for ``group_wait`` seconds: the group is what has arrived."""
        group.closed = True
        group.wait_handle = None
        self.closed_early[group.key] = None
        if len(self.closed_early) > 100_000:
            self.closed_early.popitem(last=False)
        if group.complete:
            task = asyncio.get_running_loop().create_task(self._resolve_stream_group(group))
            self.stream_tasks.add(task)
            task.add_done_callback(self.stream_tasks.discard)

    async def _resolve_stream_group(self, group: _StreamGroup) -> None:
        if self.streams.get(group.key) is group:
            del self.streams[group.key]
        positions = list(range(len(group.members)))
        settled = SettledGroup(group.key, positions, [group.outcomes[p] for p in positions])
        try:
            result = self._resolve_by_policy(settled)
            where = f"{self.reward.label}.post_process_scores on group {group.key[1]!r}"
            result = await self._apply_hook(result, where)
        except RewardError as error:
            for answer in group.answers:
                if not answer.done():
                    answer.set_exception(error)
            return
        for answer, score, extra in zip(group.answers, result.scores, result.extras):
            if not answer.done():
                answer.set_result((score, extra))

    # -- one sample ---------------------------------------------------------------------------------
    def _where(self, run: _TicketRun, item: RewardItem) -> str:
        uid = "" if item.uid is None else f", uid {item.uid!r}"
        return f"{self.reward.label} on sample {item.index} (ticket {run.ticket}{uid})"

    async def _run_sample(self, run: _TicketRun, item: RewardItem) -> None:
        try:
            outcome = await self._score_cached(item, lambda: self._where(run, item))
        except asyncio.CancelledError:
            return  # cancelled by the deadline, the raise policy or close(): they settle it
        self._settle(run, item.index, outcome)

    async def _score_cached(self, item: RewardItem, where: Callable[[], str]) -> Outcome:
        if self.cache is None:
            return await self._score(item, where)
        key = request_key(item)
        found = self.cache.lookup(key)
        if isinstance(found, Scored):
            self.metrics.cache_hits += 1
            return Scored(found.score, found.extra, 0, cached=True)
        if found is not None:  # an identical request is in flight: share its result
            shared = await asyncio.shield(found)
            if shared is not None:
                self.metrics.cache_hits += 1
                return shared
        self.metrics.cache_misses += 1
        self.cache.begin(key)
        outcome = None
        try:
            outcome = await self._score(item, where)
            return outcome
        finally:
            self.cache.finish(key, outcome)  # None (cancelled) makes waiting duplicates compute their own

    async def _score(self, item: RewardItem, where: Callable[[], str]) -> Outcome:
        # The attempt loop is ours (tenacity supplies the jittered backoff) because each attempt must
        # give its concurrency slot back while it sleeps and report 429s to the adaptive limiter.
        attempt = 0
        while True:
            attempt += 1
            # Slot first, rate token last: a token taken earlier could be spent after a wait for a
            # slot, and requests released together would then leave in a burst above the rate.
            sequence = await self.limiter.acquire()
            try:
                await self._admit_rate(item)
                value = await _with_timeout(self._invoke(item), self.config.request_timeout)
            except asyncio.CancelledError:
                self.limiter.release()
                raise
            except Exception as exc:  # noqa: BLE001 - every failure is classified and reported
                self.limiter.release()
                info = classify(exc)
                self.metrics.attempt_errors_by_kind[info.kind] += 1
                if info.throttled:
                    self.metrics.throttled += 1
                    self.limiter.on_throttle(sequence)
                if not info.retryable or attempt >= self.config.max_attempts:
                    tries = f" after {attempt} attempts" if attempt > 1 else ""
                    message = f"{where()} failed{tries}: {type(exc).__name__}: {exc}"
                    return Failed(info.kind, message, exc, attempt)
                self.metrics.retries += 1
                await asyncio.sleep(self.backoff.delay(attempt, info.retry_after))
                continue
            self.limiter.release()
            self.limiter.on_success()
            try:
                score, extra = normalize_score(value, where)
            except RewardFunctionError as exc:
                return Failed("invalid", str(exc), exc, attempt)
            return Scored(score, extra, attempt)

    async def _admit_rate(self, item: RewardItem) -> None:
        if self.rpm is not None:
            await self.rpm.acquire()
        if self.tpm is not None and self.token_estimator is not None:
            await self.tpm.acquire(min(float(self.token_estimator(item)), self.tpm.max_rate))

    async def _invoke(self, item: RewardItem):
        reward = self.reward
        fields = {
            "data_source": item.data_source,
            "solution_str": item.solution_str,
            "ground_truth": item.ground_truth,
            "extra_info": item.extra_info,
        }
        if reward.score_is_async:
            value = await reward.score_fn(**fields, **reward.call_kwargs)
        else:
            if self.processes is not None:
                if reward.spec is not None:
                    call = functools.partial(process_worker.score, fields)  # the worker adds its kwargs
                else:
                    call = functools.partial(reward.score_fn, **fields, **reward.call_kwargs)
                value = await asyncio.get_running_loop().run_in_executor(self.processes, call)
            else:
                if self.bridge is None:
                    self.bridge = ThreadBridge(asyncio.get_running_loop(), self.config.sync_workers)
                value = await self.bridge.run(functools.partial(reward.score_fn, **fields, **reward.call_kwargs))
        if inspect.isawaitable(value):  # a sync wrapper that returned a coroutine
            value = await value
        return value

    # -- settling and groups ------------------------------------------------------------------------
    def _settle(self, run: _TicketRun, index: int, outcome: Outcome) -> None:
        if run.error is not None or run.ledger.is_settled(index):
            return
        latency = time.monotonic() - run.submitted_at
        self.metrics.latencies.append(latency)
        run.latencies[index] = latency
        if isinstance(outcome, Scored):
            self.metrics.completed += 1
        else:
            self.metrics.failed += 1
            self.metrics.failures_by_kind[outcome.kind] += 1
        run.tasks.pop(index, None)
        group = run.ledger.settle(index, outcome)
        if group is not None:
            self._resolve(run, group)

    def _resolve(self, run: _TicketRun, group: SettledGroup) -> None:
        try:
            result = self._resolve_by_policy(group)
        except RewardError as exc:
            self._fail_ticket(run, exc)
            return
        if self.reward.group_hook is None:
            self._ready(run, result)
            return
        task = asyncio.get_running_loop().create_task(self._post_process(run, result))
        run.hook_tasks.add(task)
        task.add_done_callback(run.hook_tasks.discard)

    async def _post_process(self, run: _TicketRun, result: GroupResult) -> None:
        where = f"{self.reward.label}.post_process_scores on group {result.key[1]!r} (ticket {run.ticket})"
        try:
            result = await self._apply_hook(result, where)
        except RewardError as error:
            self._fail_ticket(run, error)
            return
        self._ready(run, result)

    async def _apply_hook(self, result: GroupResult, where: str) -> GroupResult:
        """The user's group hook on a resolved group. A broken hook fails the whole group, by the
        policy (``RewardError`` under 'raise')."""
        reward = self.reward
        if reward.group_hook is None:
            return result
        try:
            if reward.hook_is_async:
                call = reward.group_hook(list(result.scores))
            else:
                call = asyncio.get_running_loop().run_in_executor(self.threads, reward.group_hook, list(result.scores))
            values = await _with_timeout(call, self.config.request_timeout)
            scores = normalize_group_scores(values, len(result.indices), where)
            return GroupResult(result.key, result.indices, scores, result.extras)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - reported through the policy
            self.metrics.failures_by_kind["hook_error"] += 1
            failure = Failed("hook_error", f"{where} failed: {type(exc).__name__}: {exc}", exc)
            return self._resolve_by_policy(SettledGroup(result.key, result.indices, [failure] * len(result.indices)))

    def _resolve_by_policy(self, group: SettledGroup) -> GroupResult:
        return resolve_group(
            group, self.config.failure_policy, fill_value=self.config.fill_value,
            neutral_value=self.config.neutral_value,
        )

    def _ready(self, run: _TicketRun, result: GroupResult) -> None:
        latencies = [run.latencies.pop(i) for i in result.indices]
        now = time.monotonic()
        run.ledger.mark_ready(
            dataclasses.replace(result, latencies=latencies, ready_after=now - run.submitted_at, ready_at=now)
        )
        self._serve(run)

    def _serve(self, run: _TicketRun) -> None:
        while run.waiters:
            n, waiter = run.waiters[0]
            if waiter.done():  # the caller gave up (timeout, cancel): nothing was consumed for it
                run.waiters.popleft()
                continue
            if run.error is not None:
                run.waiters.popleft()
                waiter.set_exception(self._ticket_error(run))
                continue
            groups = run.ledger.take(n)
            if groups is None:
                break
            run.waiters.popleft()
            waiter.set_result(assemble_chunk(groups))
        self._retire_if_done(run)

    def _retire_if_done(self, run: _TicketRun) -> None:
        if run.ledger.exhausted and run.error is None and self.tickets.get(run.ticket) is run:
            del self.tickets[run.ticket]
            self.drained.add(run.ticket)
            if run.deadline_handle is not None:
                run.deadline_handle.cancel()

    def _expire(self, run: _TicketRun) -> None:
        """The ticket's deadline passed: settle whatever is pending by the failure policy."""
        for index in run.ledger.unsettled_indices():
            task = run.tasks.pop(index, None)
            if task is not None:
                task.cancel()
            if run.error is not None:
                return
            item = run.items[index]
            message = f"{self._where(run, item)} unfinished at the ticket deadline ({run.deadline}s)"
            self._settle(run, index, Failed("deadline", message))

    def _fail_ticket(self, run: _TicketRun, error: BaseException) -> None:
        if run.error is not None:
            return
        run.error = error
        for task in [*run.tasks.values(), *run.hook_tasks]:
            task.cancel()
        run.tasks.clear()
        if run.deadline_handle is not None:
            run.deadline_handle.cancel()
        self._serve(run)

    @staticmethod
    def _ticket_error(run: _TicketRun) -> BaseException:
        error = run.error
        if isinstance(error, RewardError):
            fresh = RewardError(f"ticket {run.ticket}: {error}")
            fresh.__cause__ = error.__cause__
            return fresh
        return error

    # -- metrics and shutdown -----------------------------------------------------------------------
    def snapshot(self) -> dict:
        return self.metrics.snapshot(
            in_flight=self.limiter.in_use, peak_in_flight=self.limiter.peak,
            effective_cap=self.limiter.limit, open_tickets=len(self.tickets),
        )

    async def _close_reward(self) -> None:
        """Let a stateful reward release its clients on this loop (an AsyncOpenAI client collected
        after the loop is gone fails with 'Event loop is closed')."""
        instance = self.reward.instance
        closer = getattr(instance, "aclose", None) or getattr(instance, "close", None)
        if not callable(closer):
            return
        try:
            result = closer()
            if inspect.isawaitable(result):
                await result
        except Exception:  # noqa: BLE001 - shutdown goes on; the user sees why
            _log.warning("closing %s failed", self.reward.label, exc_info=True)

    async def aclose(self) -> None:
        self.closed = True
        pending: list[asyncio.Task] = []
        for run in list(self.tickets.values()):
            pending += [*run.tasks.values(), *run.hook_tasks]
            self._fail_ticket(run, RuntimeError("the reward agent was closed"))
        pending += list(self.stream_tasks)
        for group in self.streams.values():
            if group.wait_handle is not None:
                group.wait_handle.cancel()
            for answer in group.answers:
                if not answer.done():
                    answer.set_exception(RuntimeError("the reward agent was closed"))
        for task in self.stream_tasks:
            task.cancel()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
        await self._close_reward()
        if self.bridge is not None:
            self.bridge.shutdown()  # threads stuck in a hung sync reward cannot be killed: not waited for
        for executor in (self.threads, self.processes):
            if executor is not None:
                # Threads stuck in a hung sync reward cannot be killed; we stop waiting for them.
                executor.shutdown(wait=False, cancel_futures=True)
