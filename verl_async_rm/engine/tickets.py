"""Tickets: a submitted batch's life in the engine, from ``submit`` (or ``open_ticket``/``add``/
``close``) to the hand-over of its last group, a cancel, its deadline, or its failure.

- **Submit** builds the ticket's group ledger (``engine/ledger.py``) and enqueues its samples (a
  group judge: one call per group whose membership is final); bad input raises there, at once. What
  ranks its samples under ``admission_order: deadline`` comes with it: its opening number, whether
  it is validation, the caller's ranks (``TicketRun.admission_rank``, ``engine/admission_order.py``).
- **Settled samples** come from the engine's one settle path (``settled``): charged to the
  ticket's failure budget, recorded in its ledger; a settled group is resolved (failure policy,
  group hook: ``engine/resolution.py``) and lands in the ticket's ready queue.
- **Hand-over without loss.** ``take`` hands out whole groups only to a taker that receives them:
  one that times out or is cancelled at the moment of hand-over puts them back, in order; a caller
  elsewhere (another thread or loop) confirms what it received (``confirm_taken``) or puts it back,
  and until then the ticket stays findable.
- **The deadline** (``ticket_deadline``): one timer per ticket settles whatever is unsettled as
  ``deadline`` failures in one step, however large the backlog (``expire``).
- **Retirement.** A drained, failed or cancelled ticket is forgotten at once (its samples freed);
  its id is remembered, so later calls see an empty chunk or its error.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import Hashable, Mapping, Sequence

from verl_async_rm.engine.admission_order import caller_ranks
from verl_async_rm.engine.budget import TicketBudget
from verl_async_rm.engine.group_judge import GroupCall, GroupCallOwner
from verl_async_rm.engine.ledger import GroupResult, SettledGroup, TicketLedger, UniformGroups
from verl_async_rm.engine.pipeline import Sample
from verl_async_rm.engine.resolution import Deliver
from verl_async_rm.errors import AgentClosed, FailureBudgetExceeded, RewardError, TicketCancelled
from verl_async_rm.failure_policy import resolve_group
from verl_async_rm.items import RewardItem
from verl_async_rm.outcomes import Failed, Outcome

REMEMBERED_TICKETS = 100_000  # finished ticket ids remembered (drained: empty chunk; cancelled: error)


@dataclass(frozen=True)
class TicketStatistics:
    open_tickets: int  # submitted or opened, not yet drained, failed or cancelled


class TicketRun:
    """The live state of one submitted batch."""

    def __init__(self, ticket: str, label: str, ledger: TicketLedger, submitted_at: float, budget: TicketBudget,
                 opening: int, validation: bool = False, ranks: dict[int, int] | None = None):
        self.ticket = ticket
        self.label = label  # the reward's, for error messages
        self.ledger = ledger
        self.opening = opening  # the engine's count of tickets and streamed groups as they opened
        self.validation = validation
        self.ranks = ranks  # the caller's rank of each sample, by index (None: all alike)
        self.samples: dict[int, Sample] = {}
        self.submitted_at = submitted_at
        self.budget = budget
        self.waiters: deque[tuple[int | None, asyncio.Future]] = deque()
        self.in_hand = 0  # takes by callers elsewhere, handed over but not yet confirmed or put back
        self.deliver: Deliver | None = None  # where its resolved groups go (the book's, bound at submit)
        self.hooks: set[asyncio.Task] = set()
        self.settled_at: dict[int, float] = {}  # settled samples whose group is not ready yet
        self.error: BaseException | None = None
        self.deadline: asyncio.TimerHandle | None = None

    def describe(self, item: RewardItem) -> str:
        uid = "" if item.uid is None else f", uid {item.uid!r}"
        return f"{self.label} on sample {item.index} (ticket {self.ticket}{uid})"

    def log_fields(self, item: RewardItem, now: float) -> tuple[float, str | None, Hashable, str]:
        """What the verdict log records of one of its samples: latency, ticket, uid, sample id."""
        return now - self.submitted_at, self.ticket, item.uid, f"{self.ticket}/{item.index}"

    def admission_rank(self, item: RewardItem) -> tuple[bool, int, int, int]:
        """Where one of its samples ranks under ``admission_order: deadline`` (engine/admission_order.py)."""
        rank = self.ranks.get(item.index, 0) if self.ranks else 0
        return not self.validation, self.opening, rank, self.ledger.group_of(item.index).unsettled


class TicketBook:
    """The engine's tickets: ``runs`` (open ones, by id) and ``finished`` (retired ids)."""

    def __init__(self, engine):
        """``engine``: the ``ScoringEngine`` (``engine/core.py``) these tickets are scored by: its
        pipeline, counters, group resolution and judge operations, and its agent-wide stops."""
        self.engine = engine
        self.loop, self.config, self.reward = engine.loop, engine.config, engine.reward
        self.metrics, self.pipeline, self.judge, self.resolution = engine.metrics, engine.pipeline, engine.judge, engine.resolution
        self.count_recent = engine.count_recent
        self.runs: dict[str, TicketRun] = {}
        self.finished: OrderedDict[str, BaseException | None] = OrderedDict()  # None: drained
        self._numbers = itertools.count()

    # -- submit, open, add, close ---------------------------------------------------------------------
    def submit(self, items: list[RewardItem], group_size: int | Mapping[Hashable, int], *, validation: bool = False,
               ranks: Sequence[int] | None = None) -> str:
        """Start scoring a batch; returns its ticket at once. Bad input raises here. ``validation``
        and ``ranks`` (one per item): see ``engine/admission_order.py``."""
        submitted_at = self.loop.time()  # the deadline counts from here, building the ledger included
        ledger = TicketLedger([(item.index, item.uid) for item in items], group_size)
        run = self._new(ledger, len(items), submitted_at, validation, caller_ranks(items, ranks))
        self._enqueue(run, items)
        if not items and run.deadline is not None:
            run.deadline.cancel()
        return run.ticket

    def open(self, group_size: int | Mapping[Hashable, int], *, validation: bool = False) -> str:
        """A ticket whose samples come later (``add``, e.g. as each rollout finishes) until ``close``.
        Its groups are handed out as they complete, like any ticket's; ``ticket_deadline`` counts
        from now, and so does its place in the admission order (older tickets first)."""
        run = self._new(TicketLedger([], group_size, open=True), 0, validation=validation)
        run.budget.open = True  # its failure rate is judged at close (engine/budget.py)
        return run.ticket

    def add(self, ticket: str, items: list[RewardItem]) -> None:
        """More samples of an open ticket; they start scoring at once. Bad input raises here and
        adds nothing."""
        run = self._open_run(ticket)
        self.judge.check_budget()
        run.ledger.add([(item.index, item.uid) for item in items])
        run.budget.total += len(items)
        self._enqueue(run, items)

    def close(self, ticket: str) -> None:
        """No more samples for ``ticket``: a group still short of its size is resolved with the
        members it has (a session that produced fewer outputs), once they are scored."""
        run = self._open_run(ticket)
        for group in run.ledger.close():
            self._group_settled(run, group)
        run.budget.open = False  # its whole size is known now: judge its failure rate
        if run.error is None and run.budget.exceeded:
            self.fail(run, FailureBudgetExceeded(run.budget.describe(run.ticket)))
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

    def _new(self, ledger: TicketLedger, samples: int, now: float | None = None, validation: bool = False,
             ranks: dict[int, int] | None = None) -> TicketRun:
        if self.engine.closed is not None:
            raise AgentClosed("the reward agent is closed")
        self.judge.check_budget()
        if not isinstance(validation, bool):
            raise ValueError(f"validation must be true or false, got {validation!r}")
        ticket = f"{self.engine.id}-{next(self._numbers)}"
        now = self.loop.time() if now is None else now
        run = TicketRun(ticket, self.reward.label, ledger, now, TicketBudget(samples, self.config.max_failure_rate),
                        next(self.engine.openings), validation, ranks)
        run.deliver = functools.partial(self._deliver, run)
        self.runs[ticket] = run
        if self.config.ticket_deadline is not None:
            run.deadline = self.loop.call_at(now + self.config.ticket_deadline, self.expire, run)
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
        run = self.runs.get(ticket)
        if run is not None:
            return run
        if ticket in self.finished:
            error = self.finished[ticket]
            if error is not None:
                raise type(error)(*error.args)
            return None
        if self.engine.closed is not None:
            raise AgentClosed("the reward agent is closed")
        raise KeyError(f"unknown ticket {ticket!r}: not issued by this agent (agent id {self.engine.id}; a re-created "
                       "agent does not know the tickets of the one before)")

    # -- hand-over --------------------------------------------------------------------------------------
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
        if run.error is not None and emptied and not run.in_hand and self.runs.get(run.ticket) is run:
            self._forget(run, _copy_error(run))

    def _handed_over(self, run: TicketRun, confirm: bool) -> None:
        if confirm:
            run.in_hand += 1  # until the caller confirms it received them, or puts them back
        else:
            self._retire_if_done(run)
            self._forget_if_emptied(run)

    def confirm_taken(self, ticket: str) -> None:
        """A caller elsewhere received what ``take(confirm=True)`` handed over."""
        run = self.runs.get(ticket)
        if run is not None:
            run.in_hand -= 1
            self._retire_if_done(run)
            self._forget_if_emptied(run)

    def put_back(self, ticket: str, groups: list[GroupResult]) -> None:
        """What ``take(confirm=True)`` handed over, back in front: its caller left before receiving it
        (a timeout or cancel at that moment, an interrupt)."""
        run = self.runs.get(ticket)
        if run is not None:
            run.in_hand -= 1
            run.ledger.put_back(groups)
            self._serve(run)

    def cancel(self, ticket: str) -> int:
        """Stop scoring a ticket nobody will read; returns how many of its samples were unsettled."""
        run = self.runs.get(ticket)
        if run is None:
            if ticket in self.finished:
                return 0  # finished already: drained, failed or cancelled
            self._run_of(ticket)  # unknown: KeyError (closed: AgentClosed)
        return self.fail(run, TicketCancelled(f"ticket {ticket} was cancelled"))

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

    # -- retirement and failure ---------------------------------------------------------------------
    def _retire_if_done(self, run: TicketRun) -> None:
        """Only once every taker has what it took: a ticket must stay findable while a hand-over can
        still be put back."""
        if run.ledger.exhausted and run.error is None and not run.waiters and not run.in_hand \
                and self.runs.get(run.ticket) is run:
            self._forget(run, None)

    def _forget(self, run: TicketRun, error: BaseException | None) -> None:
        """Retire a ticket; later calls see ``error`` (None: drained, an empty chunk)."""
        del self.runs[run.ticket]
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

    def fail(self, run: TicketRun, error: BaseException) -> int:
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

    def fail_all(self, error: BaseException) -> None:
        for run in list(self.runs.values()):
            self.fail(run, error)

    def charge(self, run: TicketRun, kind: str, message: str, count: int = 1) -> bool:
        """``count`` failed samples against the ticket's failure budget; True (the ticket failed
        with ``FailureBudgetExceeded``) once past it."""
        if run.budget.record_failure(kind, message, count):
            self.fail(run, FailureBudgetExceeded(run.budget.describe(run.ticket)))
            return True
        return False

    def unsettled(self) -> list[Sample]:
        """The samples of every live ticket that have no outcome yet."""
        return [s for run in self.runs.values() if run.error is None for s in run.samples.values() if not s.settled]

    def hook_tasks(self) -> list[asyncio.Task]:
        return [task for run in self.runs.values() for task in run.hooks]

    def statistics(self) -> TicketStatistics:
        return TicketStatistics(len(self.runs))

    # -- settling -----------------------------------------------------------------------------------
    def settled(self, run: TicketRun, sample: Sample, outcome: Outcome, failed: bool, now: float) -> None:
        """A sample of ``run`` has its outcome (the engine's settle path counted and logged it)."""
        if run.error is not None:
            return
        latency = now - run.submitted_at
        self.metrics.latencies.append(latency)
        run.settled_at[sample.item.index] = latency
        if failed and self.charge(run, outcome.kind, outcome.message):
            return
        if self.count_recent(failed, outcome):
            return
        group = run.ledger.settle(sample.item.index, outcome)
        if group is not None:
            self._group_settled(run, group)

    def _group_settled(self, run: TicketRun, group: SettledGroup) -> None:
        where = "" if self.reward.group_hook is None else \
            f"{self.reward.label}.post_process_scores on group {group.key[1]!r} (ticket {run.ticket})"
        deadline = run.submitted_at + (self.config.ticket_deadline or float("inf"))
        self.resolution.resolve(group, run.deliver, deadline, where, run.hooks, run, run.samples.__getitem__)

    def _deliver(self, run: TicketRun, result: GroupResult | BaseException) -> None:
        if run.error is not None:
            return
        if isinstance(result, BaseException):
            self.fail(run, result)
            return
        settled_at, now = run.settled_at, self.loop.time()
        run.ledger.mark_ready(GroupResult(result.key, result.indices, result.scores, result.extras,
                                          [settled_at.pop(i, None) for i in result.indices], now - run.submitted_at, now))
        self._serve(run)

    # -- the deadline -------------------------------------------------------------------------------
    def expire(self, run: TicketRun) -> None:
        """The ticket's deadline: whatever is pending is settled as one ``deadline`` failure, in one
        step. A step per sample through the settle path (an outcome, a message, the budgets, the
        group, its resolution) made the return grow with the backlog: 9.2 s for a 2 s deadline over
        40,000 queued samples (issue 45 item 8). Here a pending sample costs a flag or two, with no
        call; the counters and budgets take the count; groups none of whose members had settled
        resolve alike, as one ready entry whose results are built as gets hand them out. Only
        samples that had started (running, waiting to retry) and partly settled groups take a step
        of their own."""
        run.deadline = None
        if run.error is not None:
            return
        if run.ledger.open:  # no more members after the deadline: groups settle with what they have
            for group in run.ledger.close():
                self._group_settled(run, group)
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
        if self.judge.verdicts is not None:  # a line per sample: the log's own cost, in slices
            self.judge.log_expired(pending, failure, now)
            if run.error is not None:  # the log cannot be written: everything failed
                return
        self.metrics.latencies.extend(itertools.repeat(latency, count))
        if self.charge(run, "deadline", failure.message, count):
            return
        if self.engine.count_recent_failures(count, failure):
            return
        untouched, touched = run.ledger.settle_rest(failure)
        for group in touched:
            for index in group.indices:
                run.settled_at.setdefault(index, latency)
            self._group_settled(run, group)
        if not untouched or run.error is not None:
            return
        try:  # what every member of an untouched group becomes (the group hook has no time left)
            resolved = resolve_group(SettledGroup(None, [0], [failure]), self.resolution.policy)
        except RewardError as error:
            self.fail(run, error)
            return
        run.ledger.mark_ready_uniform(UniformGroups(untouched, resolved.scores[0], resolved.extras[0], latency,
                                                    latency, now))
        self._serve(run)


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
