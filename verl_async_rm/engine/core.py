"""The scoring engine: tickets, the per-sample stream, and what happens to a sample's outcome.
Lives on one event loop and is only touched from it (the facades in ``agent.py`` and
``ray_agent.py`` bring calls to it).

- **One settle path.** Every outcome, from the request pipeline or from a deadline, goes through
  ``_settle``: counted, charged to the failure budgets, recorded in its group; a settled group is
  resolved (failure policy, then the user's group hook, bounded) and delivered: to the ticket's
  ready queue (``take``) or to each member of a streamed group.
- **One deadline mechanism.** ``ticket_deadline`` is a timer per ticket (per member on the stream)
  that settles whatever is unsettled as ``deadline`` failures through ``_settle`` and resolves
  in-flight group hooks without them; the pipeline's attempts are abandoned. So a ticket ends by
  its deadline whatever its samples are doing: queued, running, waiting to retry, paused by a 429.
- **Nothing lost.** ``take`` hands over whole groups only to a taker that receives them: a taker
  that times out or is cancelled at the moment of hand-over puts them back, in order.
- **asyncio, not anyio.** The engine lives where verl and Ray already run asyncio (the actor's own
  loop, verl's reward workers), and its deadlines are timers per ticket and one FIFO of attempt
  timeouts, not nested cancel scopes: anyio's task groups and cancel scopes would add a scope per
  request on the hot path (the zero-latency figures in bench/agent_throughput.py) for structure
  the pipeline's single exit (``_attempt_ended``) already gives. Virtual-time tests use an
  asyncio loop with a virtual clock (looptime) instead of trio's MockClock.
- **Judge operations.** Each outcome settled here is appended to the verdict log, and samples the
  log already holds are answered from it instead of sent (``engine/verdicts.py``); the pipeline
  asks ``engine/spend.py`` before each send, and a spent budget stops everything through
  ``_budget_spent`` (refused samples are ``budget`` failures, never scored).
- **Loud failure.** A ticket fails with ``FailureBudgetExceeded`` past ``max_failure_rate``; the
  whole agent (every ticket, every waiting stream member) past the same rate over its recent
  samples, ``max_hung_calls`` or ``max_throttled_s``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import inspect
import itertools
import logging
import secrets
from collections import OrderedDict, deque
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Hashable, Mapping

from verl_async_rm.cache import ResultCache
from verl_async_rm.config import AgentConfig
from verl_async_rm.engine.budget import RecentFailures, TicketBudget
from verl_async_rm.engine.executors import executor_for
from verl_async_rm.engine.flow import FlowControl, FlowSettings
from verl_async_rm.engine.group_judge import (
    GroupCall, GroupCallOwner, check_group_judge_config, group_executor, group_tokens, member_outcomes,
)
from verl_async_rm.engine.ledger import Group, GroupResult, SettledGroup, StreamGroups, TicketLedger, UniformGroups, stream_key
from verl_async_rm.engine.meters import rate_meters
from verl_async_rm.engine.pipeline import DONE, RequestPipeline, Sample
from verl_async_rm.engine.spend import Spending, budget_estimator
from verl_async_rm.engine.verdicts import VerdictBook
from verl_async_rm.errors import AgentClosed, BudgetExceeded, FailureBudgetExceeded, RewardError, TicketCancelled
from verl_async_rm.failure_policy import resolve_group
from verl_async_rm.items import RewardItem
from verl_async_rm.limits import approx_tokens, checked_estimate
from verl_async_rm.loader import UserReward
from verl_async_rm.metrics import AgentMetrics
from verl_async_rm.outcomes import Failed, Outcome
from verl_async_rm.retry import RetryPolicy
from verl_async_rm.reward_returns import normalize_group_scores

_log = logging.getLogger(__name__)

EXPIRE_SLICE = 2_000  # verdict-log lines written per loop iteration when a deadline expires many at once
REMEMBERED_TICKETS = 100_000  # finished ticket ids remembered (drained: empty chunk; cancelled: error)

Deliver = Callable[[GroupResult | BaseException], None]


class TicketRun:
    """The live state of one submitted batch."""

    def __init__(self, ticket: str, label: str, ledger: TicketLedger, submitted_at: float, budget: TicketBudget):
        self.ticket = ticket
        self.label = label  # the reward's, for error messages
        self.ledger = ledger
        self.samples: dict[int, Sample] = {}
        self.submitted_at = submitted_at
        self.budget = budget
        self.waiters: deque[tuple[int | None, asyncio.Future]] = deque()
        self.in_hand = 0  # takes by callers elsewhere, handed over but not yet confirmed or put back
        self.deliver: Deliver | None = None  # where its resolved groups go (the engine's, bound at submit)
        self.hooks: set[asyncio.Task] = set()
        self.settled_at: dict[int, float] = {}  # settled samples whose group is not ready yet
        self.error: BaseException | None = None
        self.deadline: asyncio.TimerHandle | None = None

    def describe(self, item: RewardItem) -> str:
        uid = "" if item.uid is None else f", uid {item.uid!r}"
        return f"{self.label} on sample {item.index} (ticket {self.ticket}{uid})"


class StreamMember:
    """A sample of the per-sample path: its group, its place in it, and where its answer goes."""

    __slots__ = ("label", "group", "position", "answer", "arrived_at", "deadline", "sample", "serial")

    def __init__(self, label: str, group: Group, position: int, answer: Callable[[object], None], arrived_at: float,
                 serial: str = ""):
        self.label = label  # the reward's, for error messages
        self.group = group
        self.position = position
        self.answer = answer  # answer((score, extra)) or answer(exception)
        self.arrived_at = arrived_at
        self.deadline: asyncio.TimerHandle | None = None
        self.sample: Sample | None = None
        self.serial = serial  # names it in the verdict log (a ticket's samples: ticket and index)

    def describe(self, item: RewardItem) -> str:
        kind, uid = self.group.key[:2]  # a streamed group's key may name its attempt too (stream_key)
        of = f"group {uid!r}" if kind == "uid" else "a sample without uid"
        return f"{self.label} on a sample of {of}"


class ScoringEngine:
    def __init__(
        self,
        reward: UserReward,
        config: AgentConfig,
        *,
        loop: asyncio.AbstractEventLoop,
        token_estimator: Callable[[RewardItem], float] | None = None,
    ):
        self.reward = reward
        self.config = config
        self.loop = loop
        self.id = secrets.token_hex(4)  # ticket ids never repeat across agents (a re-created actor)
        self._ticket_numbers = itertools.count()
        self._stream_numbers = itertools.count()
        self.policy = config.failure
        self.metrics = AgentMetrics()
        # The agent-wide window: twice the cap (a whole in flight that fails at once is not enough).
        self.recent = RecentFailures(max(200, 2 * config.max_concurrency), config.max_failure_rate)
        self.flow = FlowControl(FlowSettings(
            cap=config.max_concurrency, max_pause=config.backoff_max, default_pause=config.backoff_initial,
            enabled=config.adaptive_concurrency,
        ))
        rate_estimator = token_estimator or approx_tokens
        if reward.is_group_judge:  # one request per group (engine/group_judge.py)
            check_group_judge_config(reward, config.executor, config.cache)
            rate_estimator = group_tokens(rate_estimator)
            token_estimator = group_tokens(token_estimator) if token_estimator is not None else None
        # Judge operations: cost and budget (cost.py), the verdict log and resume (verdict_log.py). A
        # budget nothing can estimate is refused here, before any worker starts (engine/spend.py).
        self.spend = Spending(config, budget_estimator(reward, token_estimator, config), on_spent=self._budget_spent)
        if reward.is_group_judge:
            calls = group_executor(reward, config.sync_workers, loop)
        else:
            calls = executor_for(reward, config.executor, config.sync_workers, loop)
        self.verdicts = VerdictBook(reward, config, loop) if config.verdict_log else None
        self.budget_error: BudgetExceeded | None = None
        self._budget_stop: asyncio.Task | None = None
        # The first error that stopped scoring for good (budget spent, failures systematic, closed): a
        # caller with no ticket to fail (verl's per-sample path) asks for it (snapshot's "stopped").
        self.stopped: BaseException | None = None
        # Admission's meters after the concurrency cap and the flow control (engine/meters.py): the
        # rate limits, or the lease that stands for them when shared across jobs, then the budget.
        token_estimate = checked_estimate(rate_estimator, "token_estimator")
        self.shared = None
        if config.shared_limits is not None:  # Ray is imported only then (shared_limits.py)
            from verl_async_rm.shared_limits import SharedLimitsClient

            self.shared = SharedLimitsClient(self.flow, config, loop, token_estimate)
            meters: list = [self.shared]
        else:
            meters = rate_meters(config.requests_per_minute, config.tokens_per_minute, token_estimate)
        if self.spend.limited:
            meters.append(self.spend)
        self.pipeline = RequestPipeline(
            loop=loop,
            calls=calls,
            max_concurrency=config.max_concurrency,
            request_timeout=config.request_timeout,
            retry=RetryPolicy(config.max_attempts, config.backoff_initial, config.backoff_max),
            flow=self.flow,
            metrics=self.metrics,
            on_outcome=self._settle,
            on_systemic_failure=self._systemic_failure,
            max_hung_calls=config.max_hung_calls,
            max_throttled_s=config.max_throttled_s,
            meters=meters,
            cache=ResultCache(config.cache_size) if config.cache else None,
            spend=self.spend,
            answer_early=functools.partial(self.verdicts.answer_from_log, settle=self._settle) if self.verdicts else None,
        )
        if self.shared is not None:
            self.shared.bind(self.pipeline)
        self.tickets: dict[str, TicketRun] = {}
        self.finished: OrderedDict[str, BaseException | None] = OrderedDict()  # None: drained
        self.stream = StreamGroups()
        self.stream_members: dict[Group, list[StreamMember]] = {}
        self.stream_waits: dict[Group, asyncio.TimerHandle] = {}
        self.stream_hooks: set[asyncio.Task] = set()
        self._hook_threads: ThreadPoolExecutor | None = None
        self.closed: BaseException | None = None

    # -- tickets ----------------------------------------------------------------------------------
    def submit(self, items: list[RewardItem], group_size: int | Mapping[Hashable, int]) -> str:
        """Start scoring a batch; returns its ticket at once. Bad input raises here."""
        submitted_at = self.loop.time()  # the deadline counts from here, building the ledger included
        ledger = TicketLedger([(item.index, item.uid) for item in items], group_size)
        run = self._new_ticket(ledger, len(items), submitted_at)
        self._enqueue(run, items)
        if not items and run.deadline is not None:
            run.deadline.cancel()
        return run.ticket

    def open_ticket(self, group_size: int | Mapping[Hashable, int]) -> str:
        """A ticket whose samples come later (``add``, e.g. as each rollout finishes) until ``close``.
        Its groups are handed out as they complete, like any ticket's; ``ticket_deadline`` counts
        from now."""
        run = self._new_ticket(TicketLedger([], group_size, open=True), 0)
        run.budget.open = True  # its failure rate is judged at close (engine/budget.py)
        return run.ticket

    def add(self, ticket: str, items: list[RewardItem]) -> None:
        """More samples of an open ticket; they start scoring at once. Bad input raises here and
        adds nothing."""
        run = self._open_run(ticket)
        self._check_budget()
        run.ledger.add([(item.index, item.uid) for item in items])
        run.budget.total += len(items)
        self._enqueue(run, items)

    def close(self, ticket: str) -> None:
        """No more samples for ``ticket``: a group still short of its size is resolved with the
        members it has (a session that produced fewer outputs), once they are scored."""
        run = self._open_run(ticket)
        for group in run.ledger.close():
            self._on_group_settled(run, group)
        run.budget.open = False  # its whole size is known now: judge its failure rate
        if run.error is None and run.budget.exceeded:
            self._fail_ticket(run, FailureBudgetExceeded(run.budget.describe(run.ticket)))
            return
        if self.reward.is_group_judge:  # groups closed short of their size are judged with what they have
            self._judge_closed_groups(run, list(run.samples.values()))
        self._serve(run)

    def _open_run(self, ticket: str) -> TicketRun:
        run = self._run_of(ticket)
        if run is None or not run.ledger.open:
            raise ValueError(f"ticket {ticket} is not open: samples can be added only between open_ticket and close")
        if run.error is not None:
            raise _copy_error(run)
        return run

    def _new_ticket(self, ledger: TicketLedger, samples: int, now: float | None = None) -> TicketRun:
        if self.closed is not None:
            raise AgentClosed("the reward agent is closed")
        self._check_budget()
        ticket = f"{self.id}-{next(self._ticket_numbers)}"
        now = self.loop.time() if now is None else now
        run = TicketRun(ticket, self.reward.label, ledger, now, TicketBudget(samples, self.config.max_failure_rate))
        run.deliver = functools.partial(self._deliver_to_ticket, run)
        self.tickets[ticket] = run
        if self.config.ticket_deadline is not None:
            run.deadline = self.loop.call_at(now + self.config.ticket_deadline, self._expire_ticket, run)
        return run

    def _enqueue(self, run: TicketRun, items: list[RewardItem]) -> None:
        samples = []
        for item in items:
            sample = run.samples[item.index] = Sample(item, run)
            samples.append(sample)
        self.metrics.submitted += len(samples)
        if self.reward.is_group_judge:
            self._judge_closed_groups(run, samples)
        else:
            self.pipeline.enqueue(samples)

    def _judge_closed_groups(self, run: TicketRun, samples: list[Sample]) -> None:
        """A group judge's call per group of ``samples`` whose membership is final, once."""
        calls = []
        for sample in samples:
            group = run.ledger.group_of(sample.item.index)
            first = run.samples[group.members[0]]
            if group.closed and first.group_call is None and not sample.settled:
                owner = GroupCallOwner(self.reward.label, group.key, len(group.members), run.ticket)
                calls.append(GroupCall([run.samples[i] for i in group.members], owner))
        if calls:
            self.pipeline.enqueue(calls)

    def _run_of(self, ticket: str) -> TicketRun | None:
        run = self.tickets.get(ticket)
        if run is not None:
            return run
        if ticket in self.finished:
            error = self.finished[ticket]
            if error is not None:
                raise type(error)(*error.args)
            return None
        if self.closed is not None:
            raise AgentClosed("the reward agent is closed")
        raise KeyError(f"unknown ticket {ticket!r}: not issued by this agent (agent id {self.id}; a re-created agent "
                       "does not know the tickets of the one before)")

    async def take(
        self, ticket: str, n: int | None = None, timeout: float | None = None, *, confirm: bool = False,
    ) -> list[GroupResult]:
        """Whole groups of ``ticket`` totalling ``n`` samples (all that remain if fewer; all if None),
        as soon as they are ready. A timeout (``TimeoutError``) or cancellation consumes nothing.
        ``confirm``: the caller is elsewhere (another thread or loop) and will ``confirm_taken`` or
        ``put_back``; until then the ticket stays open, so a put-back always finds it."""
        run = self._run_of(ticket)
        if run is None:
            return []
        run.ledger.check_request(n)
        if run.error is not None:
            return self._after_failure(run, n, confirm)
        if not run.waiters:
            groups = run.ledger.take(n)
            if groups is not None:
                self._handed_over(run, confirm)
                return groups
        waiter = self.loop.create_future()
        entry = (n, waiter)
        run.waiters.append(entry)
        try:
            if timeout is None:
                groups = await waiter
            else:
                async with asyncio.timeout(timeout):
                    groups = await waiter
        except (asyncio.CancelledError, TimeoutError) as exc:
            if waiter.done() and not waiter.cancelled() and waiter.exception() is None:
                run.ledger.put_back(waiter.result())  # handed over at the very moment we gave up
                self._serve(run)
            elif entry in run.waiters:
                run.waiters.remove(entry)
            if isinstance(exc, TimeoutError):
                raise TimeoutError(f"get(ticket={ticket}, n={n}) timed out after {timeout}s; nothing was consumed") from None
            raise
        self._handed_over(run, confirm)
        return groups

    def _after_failure(self, run: TicketRun, n: int | None, confirm: bool) -> list[GroupResult]:
        """A failed ticket still hands out the groups that were ready before it failed (scores
        computed are never thrown away), in full chunks of ``n`` only, then raises its error. (Never
        a partial chunk, nor a partial ``get_all``: a caller counting on n samples must not get fewer.)"""
        groups = run.ledger.take(n) if n is not None and _keeps_ready(run.error) else None
        if not groups:
            self._forget_if_emptied(run)
            raise _copy_error(run)
        if confirm:
            run.in_hand += 1
        else:
            self._forget_if_emptied(run)
        return groups

    def _forget_if_emptied(self, run: TicketRun) -> None:
        emptied = not run.ledger.ready_groups or not _keeps_ready(run.error)
        if run.error is not None and emptied and not run.in_hand and self.tickets.get(run.ticket) is run:
            self._forget(run, _copy_error(run))

    def _handed_over(self, run: TicketRun, confirm: bool) -> None:
        if confirm:
            run.in_hand += 1  # until the caller confirms it received them, or puts them back
        else:
            self._retire_if_done(run)
            self._forget_if_emptied(run)

    def confirm_taken(self, ticket: str) -> None:
        """A caller elsewhere received what ``take(confirm=True)`` handed over."""
        run = self.tickets.get(ticket)
        if run is not None:
            run.in_hand -= 1
            self._retire_if_done(run)
            self._forget_if_emptied(run)

    def put_back(self, ticket: str, groups: list[GroupResult]) -> None:
        """What ``take(confirm=True)`` handed over, back in front: its caller left before receiving it
        (a timeout or cancel at that moment, an interrupt)."""
        run = self.tickets.get(ticket)
        if run is not None:
            run.in_hand -= 1
            run.ledger.put_back(groups)
            self._serve(run)

    def cancel(self, ticket: str) -> int:
        """Stop scoring a ticket nobody will read; returns how many of its samples were unsettled."""
        run = self.tickets.get(ticket)
        if run is None:
            if ticket in self.finished:
                return 0  # finished already: drained, failed or cancelled
            self._run_of(ticket)  # unknown: KeyError (closed: AgentClosed)
        return self._fail_ticket(run, TicketCancelled(f"ticket {ticket} was cancelled"))

    def remaining(self, ticket: str) -> int:
        run = self._run_of(ticket)
        return 0 if run is None else run.ledger.remaining_samples

    def _serve(self, run: TicketRun) -> None:
        while run.waiters:
            n, waiter = run.waiters[0]
            if waiter.done():  # the taker gave up before anything was handed over
                run.waiters.popleft()
                continue
            if run.error is not None:
                run.waiters.popleft()
                groups = run.ledger.take(n) if n is not None and _keeps_ready(run.error) else None
                if groups:  # a failed ticket still hands out full chunks of what was ready
                    waiter.set_result(groups)
                else:
                    waiter.set_exception(_copy_error(run))
                continue
            groups = run.ledger.take(n)
            if groups is None:
                return
            run.waiters.popleft()
            waiter.set_result(groups)

    def _retire_if_done(self, run: TicketRun) -> None:
        """Only once every taker has what it took: a ticket must stay findable while a hand-over can
        still be put back."""
        if run.ledger.exhausted and run.error is None and not run.waiters and not run.in_hand \
                and self.tickets.get(run.ticket) is run:
            self._forget(run, None)

    def _forget(self, run: TicketRun, error: BaseException | None) -> None:
        """Retire a ticket; later calls see ``error`` (None: drained, an empty chunk)."""
        del self.tickets[run.ticket]
        if run.deadline is not None:
            run.deadline.cancel()
        # Nothing reads them any more: let go of the samples and of the bound delivery, so the
        # ticket is freed as it retires, not by a later pass of the cyclic collector (RSS would
        # swing by a ticket's worth with its timing). Freed on the next loop turn: a get already
        # waiting to be served goes first.
        samples, run.samples = run.samples, {}
        self.loop.call_soon(samples.clear)
        run.deliver = None
        self.finished[run.ticket] = error
        if len(self.finished) > REMEMBERED_TICKETS:
            self.finished.popitem(last=False)

    def _fail_ticket(self, run: TicketRun, error: BaseException) -> int:
        """The ticket ends with ``error`` for every taker; its unsettled samples are abandoned (and
        counted as cancelled). Returns how many there were."""
        if run.error is not None:
            return 0
        run.error = error
        unsettled = 0
        for sample in run.samples.values():
            if not sample.settled:
                unsettled += 1
                sample.settled = True
                self.pipeline.abandon(sample)
        self.metrics.cancelled += unsettled
        for task in list(run.hooks):
            task.cancel()
        self._serve(run)
        self._forget_if_emptied(run)  # else later gets take the ready groups first
        return unsettled

    def _expire_ticket(self, run: TicketRun) -> None:
        """The ticket's deadline: whatever is pending is settled as one ``deadline`` failure, in one
        step. A step per sample through ``_settle`` (an outcome, a message, the budgets, the group,
        its resolution) made the return grow with the backlog: 9.2 s for a 2 s deadline over 40,000
        queued samples (issue 45 item 8). Here a pending sample costs a flag or two, with no call;
        the counters and budgets take the count; groups none of whose members had settled resolve
        alike, as one ready entry whose results are built as gets hand them out. Only samples that
        had started (running, waiting to retry) and partly settled groups take a step of their own."""
        run.deadline = None
        if run.error is not None:
            return
        if run.ledger.open:  # no more members after the deadline: groups settle with what they have
            for group in run.ledger.close():
                self._on_group_settled(run, group)
        for task in list(run.hooks):  # groups being post-processed: resolved without the hook
            task.cancel()
        pending = [sample for sample in run.samples.values() if not sample.settled]
        if not pending or run.error is not None:
            return
        for sample in pending:
            sample.settled = True
        self.pipeline.abandon_all(pending)
        now = self.loop.time()
        latency = now - run.submitted_at
        failure = Failed("deadline", f"{self.reward.label} on ticket {run.ticket}: unfinished at the ticket deadline "
                                     f"({self.config.ticket_deadline}s)", 0)
        count = len(pending)
        self.metrics.failed += count
        self.metrics.failures_by_kind["deadline"] += count
        if self.verdicts is not None:  # a line per sample: the log's own cost, in slices
            self._log_expired(pending, failure, now)
            if run.error is not None:  # the log cannot be written: everything failed
                return
        self.metrics.latencies.extend(itertools.repeat(latency, count))
        if run.budget.record_failure("deadline", failure.message, count):
            self._fail_ticket(run, FailureBudgetExceeded(run.budget.describe(run.ticket)))
            return
        if self.recent.record_failures(count, "deadline", failure.message):
            self._systemic_failure(self.recent.describe(), budget=True)
            return
        untouched, touched = run.ledger.settle_rest(failure)
        for group in touched:
            for index in group.indices:
                run.settled_at.setdefault(index, latency)
            self._on_group_settled(run, group)
        if not untouched or run.error is not None:
            return
        try:  # what every member of an untouched group becomes (the group hook has no time left)
            resolved = resolve_group(SettledGroup(None, [0], [failure]), self.policy)
        except RewardError as error:
            self._fail_ticket(run, error)
            return
        run.ledger.mark_ready_uniform(UniformGroups(untouched, resolved.scores[0], resolved.extras[0], latency,
                                                    latency, now))
        self._serve(run)

    def _log_expired(self, samples: list[Sample], failure: Failed, now: float, start: int = 0) -> None:
        """The verdict log's line for each sample settled at a deadline, a slice per loop iteration."""
        for sample in samples[start:start + EXPIRE_SLICE]:
            outcome = failure if sample.attempts == failure.attempts else dataclasses.replace(failure, attempts=sample.attempts)
            if self._log_verdict(sample, outcome, now):
                return
        if start + EXPIRE_SLICE < len(samples):
            self.loop.call_soon(self._log_expired, samples, failure, now, start + EXPIRE_SLICE)

    # -- the stream: one sample at a time ------------------------------------------------------------
    def join_group(
        self, item: RewardItem, uid: Hashable | None, group_size: int, group_wait: float | None,
        answer: Callable[[object], None], session: Hashable | None = None, attempt: Hashable | None = None,
    ) -> None:
        """Score ``item`` as a member of group ``uid`` (expected size ``group_size``); ``answer`` gets
        ``(score, extra)`` once the whole group is resolved, or the exception that ended it. A group
        that gets no new member for ``group_wait`` seconds is resolved with the members it has.
        ``session``: which of the group's rollouts this sample is (see ``withdraw_from_group``);
        ``attempt``: which dispatch of the prompt, so that a prompt generated again under the same uid
        forms a group of its own and never mixes with an earlier attempt's members."""
        if self.closed is not None:
            raise AgentClosed("the reward agent is closed")
        self._check_budget()
        if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1:
            raise ValueError(f"group_size must be a positive integer, got {group_size!r}")
        now = self.loop.time()
        key: Hashable = stream_key(uid, attempt) if uid is not None else ("sample", object())
        split_before = self.stream.split_groups
        group, position = self.stream.add(key, group_size if uid is not None else 1, session if uid is not None else None)
        if self.stream.split_groups != split_before:
            self.metrics.split_groups += 1
            _log.warning(
                "group %r got a member after group_wait (%ss) had closed it short of %d samples: the wait is "
                "shorter than the spread of its generation times; it continues as a new group", uid, group_wait, group_size,
            )
        member = StreamMember(self.reward.label, group, position, answer, now, f"{self.id}/s{next(self._stream_numbers)}")
        self.stream_members.setdefault(group, []).append(member)
        wait = self.stream_waits.pop(group, None)
        if wait is not None:
            wait.cancel()
        if not group.closed and group_wait is not None:
            self.stream_waits[group] = self.loop.call_at(now + group_wait, self._close_stream_group, group)
        sample = member.sample = Sample(item, member)
        self.metrics.submitted += 1
        if self.config.ticket_deadline is not None:
            member.deadline = self.loop.call_at(now + self.config.ticket_deadline, self._expire_member, member)
        if not self.reward.is_group_judge:
            self.pipeline.enqueue([sample])
        elif group.closed:
            self._judge_stream_group(group)

    def _judge_stream_group(self, group: Group) -> None:
        samples = [m.sample for m in self.stream_members.get(group, []) if m.sample is not None]
        if samples and samples[0].group_call is None and not all(s.settled for s in samples):
            owner = GroupCallOwner(self.reward.label, group.key, len(samples), None)
            self.pipeline.enqueue([GroupCall(samples, owner)])

    async def score_in_group(self, item: RewardItem, uid: Hashable | None, group_size: int, group_wait: float | None,
                             session: Hashable | None = None, attempt: Hashable | None = None):
        """``join_group`` for a caller on this loop: awaits the answer."""
        future = self.loop.create_future()

        def answer(value: object) -> None:
            if not future.done():
                future.set_exception(value) if isinstance(value, BaseException) else future.set_result(value)

        self.join_group(item, uid, group_size, group_wait, answer, session, attempt)
        return await future

    def withdraw_from_group(self, uid: Hashable, session: Hashable, attempt: Hashable | None = None) -> None:
        """Session ``session`` of group ``uid`` (dispatch ``attempt``) ended without a sample for the
        reward (verl's rollout session failed): the group is whole without it. A group that has every
        other member is resolved now, not when ``group_wait`` runs out."""
        group = self.stream.withdraw(stream_key(uid, attempt), session)
        if group is not None:
            wait = self.stream_waits.pop(group, None)
            if wait is not None:
                wait.cancel()
            self._close_stream_group(group)

    def _close_stream_group(self, group: Group) -> None:
        self.stream_waits.pop(group, None)
        if self.stream.close(group):
            self._resolve_stream_group(group)
        elif self.reward.is_group_judge:
            self._judge_stream_group(group)

    def _expire_member(self, member: StreamMember) -> None:
        member.deadline = None
        sample = member.sample
        if sample is not None and not sample.settled:
            self.pipeline.abandon(sample)
            message = f"unfinished at the deadline ({self.config.ticket_deadline}s after it arrived)"
            self._settle(sample, Failed("deadline", f"{sample.where()} {message}", sample.attempts))

    def _resolve_stream_group(self, group: Group) -> None:
        members = self.stream_members.get(group, [])
        deadline = min((m.arrived_at for m in members), default=self.loop.time()) + (self.config.ticket_deadline or float("inf"))

        def deliver(result: GroupResult | BaseException) -> None:
            self.stream_members.pop(group, None)
            for member in members:
                if member.deadline is not None:
                    member.deadline.cancel()
                if isinstance(result, BaseException):
                    member.answer(result)
                else:
                    at = result.indices.index(member.position)
                    member.answer((result.scores[at], result.extras[at]))

        where = f"{self.reward.label}.post_process_scores on group {group.key[1]!r}"
        self._resolve(group.settled(), deliver, deadline, where, self.stream_hooks,
                      sample_of=lambda position: next(m.sample for m in members if m.position == position))

    # -- settling -----------------------------------------------------------------------------------
    def _settle(self, sample: Sample, outcome: Outcome) -> None:
        """The one settle path: every outcome of every sample, from the pipeline or a deadline.
        Exactly once per sample: a second outcome (a late cached answer after the deadline) is dropped."""
        if sample.settled:
            return
        sample.settled = True
        sample.state = DONE
        if sample.__class__ is GroupCall:  # a group judge's answer: each member settles on its own
            for member, member_outcome in member_outcomes(sample, outcome):
                self._settle(member, member_outcome)
            return
        owner = sample.owner
        now = self.loop.time()
        failed = isinstance(outcome, Failed)
        if failed:
            self.metrics.failed += 1
            self.metrics.failures_by_kind[outcome.kind] += 1
        else:
            self.metrics.completed += 1
        if self.verdicts is not None and self._log_verdict(sample, outcome, now):
            return
        if isinstance(owner, TicketRun):
            if owner.error is not None:
                return
            latency = now - owner.submitted_at
            self.metrics.latencies.append(latency)
            owner.settled_at[sample.item.index] = latency
            if failed and owner.budget.record_failure(outcome.kind, outcome.message):
                self._fail_ticket(owner, FailureBudgetExceeded(owner.budget.describe(owner.ticket)))
                return
            if self._count_recent(failed, outcome):
                return
            group = owner.ledger.settle(sample.item.index, outcome)
            if group is not None:
                self._on_group_settled(owner, group)
            return
        member: StreamMember = owner
        self.metrics.latencies.append(now - member.arrived_at)
        if self._count_recent(failed, outcome):
            return
        if member.group.settle(member.position, outcome):
            self._resolve_stream_group(member.group)

    def _on_group_settled(self, run: TicketRun, group: SettledGroup) -> None:
        where = "" if self.reward.group_hook is None else \
            f"{self.reward.label}.post_process_scores on group {group.key[1]!r} (ticket {run.ticket})"
        deadline = run.submitted_at + (self.config.ticket_deadline or float("inf"))
        self._resolve(group, run.deliver, deadline, where, run.hooks, run, run.samples.__getitem__)

    def _count_recent(self, failed: bool, outcome: Outcome) -> bool:
        kind, message = (outcome.kind, outcome.message) if failed else ("", "")
        if self.recent.record(failed, kind, message):
            self._systemic_failure(self.recent.describe(), budget=True)
            return True
        return False

    def _resolve(
        self, group: SettledGroup, deliver: Deliver, deadline: float, where: str, hooks: set, run: TicketRun | None = None,
        sample_of: Callable[[int], Sample] | None = None,
    ) -> None:
        """Failure policy, then the group hook (bounded by ``hook_timeout`` and the deadline).
        ``sample_of(index)``: the group's samples, for the verdict log when the hook fails them."""
        try:
            result = resolve_group(group, self.policy)
        except RewardError as error:
            deliver(error)
            return
        if self.reward.group_hook is None:
            deliver(result)
            return
        task = self.loop.create_task(self._post_process(result, deliver, deadline, where, run, sample_of))
        hooks.add(task)
        task.add_done_callback(hooks.discard)

    async def _post_process(self, result: GroupResult, deliver: Deliver, deadline: float, where: str, run: TicketRun | None,
                            sample_of: Callable[[int], Sample] | None) -> None:
        reward = self.reward
        budget = deadline - self.loop.time()
        hook_bound = self.config.hook_timeout is not None and self.config.hook_timeout < budget
        if hook_bound:
            budget = self.config.hook_timeout
        if budget <= 0:  # resolved at (or after) the deadline: no time for the hook
            error_text, kind = "resolved without it at the deadline", "deadline"
        else:
            try:
                async with asyncio.timeout(None if budget == float("inf") else budget):
                    if reward.hook_is_async:
                        values = await reward.group_hook(list(result.scores))
                    else:  # once per group, not per sample: the standard pool fits (see thread_bridge for why not there)
                        if self._hook_threads is None:
                            self._hook_threads = ThreadPoolExecutor(8, thread_name_prefix="reward-hook")
                        values = await self.loop.run_in_executor(self._hook_threads, reward.group_hook, list(result.scores))
                    if inspect.isawaitable(values):
                        values = await values
                scores = normalize_group_scores(values, len(result.indices), where)
                deliver(dataclasses.replace(result, scores=scores))
                return
            except asyncio.CancelledError:
                # Only two things cancel a hook: its ticket's deadline (``_expire_ticket``; the ticket
                # has no error then), or the end of whoever waits for the group (its ticket failed or
                # was cancelled, every stream member answered with an error, the agent closed). Then
                # its group goes to nobody: its samples stay as they settled, no failure is counted.
                if run is None or run.error is not None:
                    return
                error_text, kind = "resolved without it at the deadline", "deadline"
            except TimeoutError:
                if hook_bound:
                    error_text, kind = f"timed out (hook_timeout {self.config.hook_timeout}s)", "hook_timeout"
                else:
                    error_text, kind = "resolved without it at the deadline", "deadline"
            except Exception as exc:  # noqa: BLE001 - a broken hook fails its group by the policy
                error_text, kind = f"failed: {type(exc).__name__}: {exc}", "hook_error"
        self.metrics.hook_failures += 1
        failure = Failed(kind, f"{where} {error_text}")
        # A failed hook fails its group's scored samples (the failed ones are counted already): they
        # move from completed to failed, are charged to the budgets like any failure, and the verdict
        # log says so (their judge verdicts stay resumable: the hook runs again on resume).
        newly_failed = [i for i, extra in zip(result.indices, result.extras) if not extra.get("reward_failed")]
        if newly_failed:
            self.metrics.completed -= len(newly_failed)
            self.metrics.failed += len(newly_failed)
            self.metrics.failures_by_kind[kind] += len(newly_failed)
            if self.verdicts is not None and sample_of is not None:
                now = self.loop.time()
                for index in newly_failed:
                    if self._log_verdict(sample_of(index), failure, now, stage="hook"):
                        return
            if run is not None and run.error is None and run.budget.record_failure(kind, failure.message, len(newly_failed)):
                self._fail_ticket(run, FailureBudgetExceeded(run.budget.describe(run.ticket)))
                return
            if any(self._count_recent(True, failure) for _ in range(len(newly_failed))):
                return
        outcomes = [Failed(extra["reward_failure"], extra["reward_error"]) if extra.get("reward_failed") else failure
                    for extra in result.extras]  # a sample that failed on its own keeps its own kind
        try:
            failed = resolve_group(SettledGroup(result.key, result.indices, outcomes), self.policy)
        except RewardError as error:
            deliver(error)
            return
        deliver(failed)

    def _deliver_to_ticket(self, run: TicketRun, result: GroupResult | BaseException) -> None:
        if run.error is not None:
            return
        if isinstance(result, BaseException):
            self._fail_ticket(run, result)
            return
        settled_at, now = run.settled_at, self.loop.time()
        run.ledger.mark_ready(GroupResult(result.key, result.indices, result.scores, result.extras,
                                          [settled_at.pop(i, None) for i in result.indices], now - run.submitted_at, now))
        self._serve(run)

    # -- judge operations: the verdict log and the budget ------------------------------------------------
    def _log_verdict(self, sample: Sample, outcome: Outcome, now: float, stage: str | None = None) -> bool:
        """Append a settled sample to the verdict log; True if the log cannot be written (then
        everything fails loudly: a run that believes it is resumable must be)."""
        owner = sample.owner
        if isinstance(owner, TicketRun):
            latency, ticket, uid = now - owner.submitted_at, owner.ticket, sample.item.uid
            sample_id = f"{ticket}/{sample.item.index}"
        else:
            latency, ticket, uid = now - owner.arrived_at, None, owner.group.key[1] if owner.group.key[0] == "uid" else None
            sample_id = owner.serial
        try:
            self.verdicts.record(sample, outcome, latency, ticket, uid, now, sample_id, stage)
        except Exception as exc:  # noqa: BLE001 - raised here it would leave the sample settled and its group unresolved: a hang
            _log.exception("verdict log: recording %s failed", sample.where())
            self._systemic_failure(f"the verdict log {self.config.verdict_log} cannot record {sample.where()}: "
                                   f"{type(exc).__name__}: {exc}")
            return True
        problem = self.verdicts.failed_writes()
        if problem is not None:
            self._systemic_failure(problem)
            return True
        return False

    def _check_budget(self) -> None:
        if self.budget_error is not None:
            raise BudgetExceeded(str(self.budget_error))

    def _budget_spent(self, sample: Sample) -> None:
        """The next request could cross the budget and nothing in flight can free room: stop. Every
        unsettled sample (queued or waiting to retry: nothing is in flight) is refused as a ``budget``
        failure (counted, logged) and every ticket and stream member fails with ``BudgetExceeded``,
        so no refused sample is ever scored by the failure policy."""
        message = self.spend.stop_message(sample)
        self.budget_error = BudgetExceeded(message)
        refused = [s for run in self.tickets.values() if run.error is None for s in run.samples.values() if not s.settled]
        refused += [m.sample for members in self.stream_members.values() for m in members
                    if m.sample is not None and not m.sample.settled]
        now = self.loop.time()
        for unsettled in refused:
            unsettled.settled = True
            self.pipeline.abandon(unsettled)
            self.metrics.failed += 1
            self.metrics.failures_by_kind["budget"] += 1
            if self.verdicts is not None:
                self._log_verdict(unsettled, Failed("budget", f"{unsettled.where()}: refused, {message}", unsettled.attempts), now)
        _log.error("reward agent: %s; %d samples refused", message, len(refused))
        self.stopped = self.stopped or self.budget_error
        error = BudgetExceeded(f"{message}; {len(refused)} samples refused (failure kind 'budget')")
        # Groups already judged (and paid for) whose group hook is still running are handed out
        # first: failing now would cancel their hooks and drop them, neither returned nor refused.
        hooks = [task for run in self.tickets.values() for task in run.hooks] + list(self.stream_hooks)
        if not hooks:
            self._fail_all(error)
            return

        async def fail_once_hooks_end() -> None:
            await asyncio.wait(hooks)  # each bounded by hook_timeout and the deadline (_post_process)
            self._fail_all(error)

        self._budget_stop = self.loop.create_task(fail_once_hooks_end())  # held: the loop keeps only weak references

    # -- failing everything ---------------------------------------------------------------------------
    def _systemic_failure(self, message: str, budget: bool = False) -> None:
        """Failures are systematic: every open ticket and every waiting stream member gets the error."""
        error = FailureBudgetExceeded(message) if budget else RewardError(message)
        _log.error("reward agent: %s", message)
        self.stopped = self.stopped or error
        self._fail_all(error)

    def _fail_all(self, error: BaseException) -> None:
        for run in list(self.tickets.values()):
            self._fail_ticket(run, error)
        for task in list(self.stream_hooks):
            task.cancel()
        for group, members in list(self.stream_members.items()):
            self.stream_members.pop(group, None)
            wait = self.stream_waits.pop(group, None)
            if wait is not None:
                wait.cancel()
            self.stream.close(group)
            for member in members:
                if member.deadline is not None:
                    member.deadline.cancel()
                if member.sample is not None and not member.sample.settled:
                    member.sample.settled = True
                    self.metrics.cancelled += 1
                    self.pipeline.abandon(member.sample)
                member.answer(error)

    # -- metrics and shutdown -------------------------------------------------------------------------
    def snapshot(self) -> dict:
        now = self.loop.time()
        return self.metrics.snapshot(
            **self.pipeline.snapshot(),
            effective_cap=self.flow.window or self.config.max_concurrency,
            open_tickets=len(self.tickets),
            open_groups=self.stream.open_groups,
            withdrawn_sessions=self.stream.withdrawn_sessions,
            stopped=None if self.stopped is None else f"{type(self.stopped).__name__}: {self.stopped}",
            **self.flow.snapshot(now),
            **self.spend.ledger.snapshot(),
            resumed=self.verdicts.resumed if self.verdicts is not None else 0,
            verdicts_logged=self.verdicts.writer.written if self.verdicts is not None else 0,
            **(self.shared.snapshot() if self.shared is not None else {}),
        )

    async def aclose(self, timeout: float = 10.0) -> int:
        """Fail every waiter (``AgentClosed``), stop every call; returns how many calls ignored their
        cancellation for ``timeout`` seconds (they are left behind, reported by the caller)."""
        if self.closed is not None:
            return 0
        self.closed = AgentClosed("the reward agent was closed")
        self.stopped = self.stopped or self.closed
        self._fail_all(self.closed)
        stuck = await self.pipeline.aclose(timeout)
        if self.shared is not None:
            await self.shared.aclose()
        await self._close_reward()
        if self.verdicts is not None:  # written and fsynced before close returns (a thread: off the loop)
            await self.loop.run_in_executor(None, self.verdicts.close)
        if self._hook_threads is not None:
            self._hook_threads.shutdown(wait=False, cancel_futures=True)  # a hung hook's thread cannot be joined
        return stuck

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
                await asyncio.wait_for(result, 10)
        except Exception:  # noqa: BLE001 - shutdown goes on; the user sees why
            _log.warning("closing %s failed", self.reward.label, exc_info=True)


def _keeps_ready(error: BaseException | None) -> bool:
    """A ticket that failed (budget, raise policy) still hands out what was ready; one cancelled, or
    an agent closed, does not."""
    return not isinstance(error, (TicketCancelled, AgentClosed))


def _copy_error(run: TicketRun) -> BaseException:
    """A fresh exception per raise (one object raised from several waiters would share tracebacks)."""
    error = run.error
    if isinstance(error, RewardError):
        return type(error)(str(error) if str(error).startswith(f"ticket {run.ticket}") else f"ticket {run.ticket}: {error}")
    return type(error)(*error.args)
