"""The scoring engine: the wiring of the agent's parts, and the one path a sample's outcome takes.
Lives on one event loop and is only touched from it (the facades in ``agent.py`` and
``ray_agent.py`` bring calls to it).

The parts, each in its own module:
- ``pipeline.py``: a request's life, admission (``meters.py``) to outcome: attempts, timeouts,
  hung calls, retries, 429 flow control (``flow.py``), on the executor chosen (``executors.py``);
- ``tickets.py``: submitted batches, from ``submit`` to the hand-over of their last group;
- ``stream.py``: the per-sample path, one sample at a time, each answered with its group;
- ``resolution.py``: a settled group becomes scores (failure policy, then the group hook);
- ``judge_ops.py``: the verdict log and the judge budget;
- ``admission_order.py``: with ``admission_order: deadline``, the pipeline's queue ranked by what the
  trainer needs first (validation, which the trainer waits for, then older tickets), starvation-free;
- ``ledger.py``, ``budget.py``: groups and failure budgets (pure book-keeping).

What stays here:
- **One settle path.** Every outcome, from the request pipeline or from a deadline, goes through
  ``settle``: counted, appended to the verdict log, handed to its ticket or stream member, which
  charges it to its failure budget and records it in its group; a settled group is resolved and
  delivered: to the ticket's ready queue (``take``) or to each member of a streamed group.
- **One deadline mechanism.** ``ticket_deadline`` is a timer per ticket (per member on the stream)
  that settles whatever is unsettled as ``deadline`` failures and resolves in-flight group hooks
  without them; the pipeline's attempts are abandoned. So a ticket ends by its deadline whatever
  its samples are doing: queued, running, waiting to retry, paused by a 429.
- **Loud failure.** A ticket fails with ``FailureBudgetExceeded`` past ``max_failure_rate``; the
  whole agent (every ticket, every waiting stream member: ``fail_all``) past the same rate over its
  recent samples, ``max_hung_calls`` or ``max_throttled_s`` (``systemic_failure``), a verdict log
  that cannot be written, or a spent judge budget.
- **asyncio, not anyio.** The engine lives where verl and Ray already run asyncio (the actor's own
  loop, verl's reward workers), and its deadlines are timers per ticket and one FIFO of attempt
  timeouts, not nested cancel scopes: anyio's task groups and cancel scopes would add a scope per
  request on the hot path (the zero-latency figures in bench/agent_throughput.py) for structure
  the pipeline's single exit (``_attempt_ended``) already gives. Virtual-time tests use an
  asyncio loop with a virtual clock (looptime) instead of trio's MockClock.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import itertools
import logging
import secrets
from typing import Callable, Hashable, Mapping, Sequence

from verl_async_rm.cache import ResultCache
from verl_async_rm.config import AgentConfig
from verl_async_rm.engine.admission_order import RankedQueue
from verl_async_rm.engine.budget import RecentFailures
from verl_async_rm.engine.executors import executor_for
from verl_async_rm.engine.flow import FlowControl, FlowSettings
from verl_async_rm.engine.group_judge import GroupCall, check_group_judge_config, group_executor, group_tokens, member_outcomes
from verl_async_rm.engine.judge_ops import JudgeOps
from verl_async_rm.engine.ledger import GroupResult
from verl_async_rm.engine.meters import rate_meters
from verl_async_rm.engine.pipeline import DONE, RequestPipeline, Sample
from verl_async_rm.engine.resolution import GroupResolution
from verl_async_rm.engine.spend import Spending, budget_estimator
from verl_async_rm.engine.stream import SampleStream
from verl_async_rm.engine.tickets import TicketBook, TicketRun
from verl_async_rm.engine.verdicts import VerdictBook
from verl_async_rm.errors import AgentClosed, FailureBudgetExceeded, RewardError
from verl_async_rm.items import RewardItem
from verl_async_rm.limits import approx_tokens, checked_estimate
from verl_async_rm.loader import UserReward
from verl_async_rm.metrics import AgentMetrics, AgentStatistics
from verl_async_rm.outcomes import Failed, Outcome
from verl_async_rm.retry import RetryPolicy

_log = logging.getLogger(__name__)


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
        spend = Spending(config, budget_estimator(reward, token_estimator, config))
        if config.judges:
            calls = None  # each judge has its own (engine/fallback.py)
        elif reward.is_group_judge:
            calls = group_executor(reward, config.sync_workers, loop)
        else:
            calls = executor_for(reward, config.executor, config.sync_workers, loop)
        self.judge = JudgeOps(self, spend, VerdictBook(reward, config, loop) if config.verdict_log else None)
        self.spend, self.verdicts = self.judge.spend, self.judge.verdicts
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
        if spend.limited:
            meters.append(spend)
        # Tickets and the stream's groups, numbered as they open: the ranked admission order serves
        # the older first (the step the trainer blocks on next).
        self.openings = itertools.count()
        self.chain = None
        if config.judges:  # an ordered judge list: a pipeline per judge behind a router (engine/fallback.py)
            from verl_async_rm.engine.fallback import JudgeChain

            self.chain = self.pipeline = JudgeChain(self, reward, config, token_estimate, token_estimator)
            self.flow = self.chain.flow  # the first judge's (effective_cap, the flow figures)
            if self.verdicts is not None:
                self.chain.answer_early = functools.partial(self.verdicts.answer_from_log, settle=self.settle)
                self.verdicts.judge_names = [judge.name for judge in config.judges]
                self.verdicts.judge_prices = [judge.spend.ledger.prices for judge in self.chain.judges]
        else:
            self.pipeline = self._one_pipeline(config, calls, meters, spend)
        if self.shared is not None:
            self.shared.bind(self.pipeline)
        self.resolution = GroupResolution(reward, self.policy, config.hook_timeout, loop, self.metrics, self._hook_failed)
        self.book = TicketBook(self)
        self.tickets = self.book.runs  # open tickets, by id
        self.stream = SampleStream(self)
        self.closed: BaseException | None = None

    def _one_pipeline(self, config: AgentConfig, calls, meters: list, spend: Spending) -> RequestPipeline:
        """The request pipeline without a judge list: one judge, the reward as given."""
        loop = self.loop
        return RequestPipeline(
            loop=loop,
            calls=calls,
            max_concurrency=config.max_concurrency,
            request_timeout=config.request_timeout,
            retry=RetryPolicy(config.max_attempts, config.backoff_initial, config.backoff_max),
            flow=self.flow,
            metrics=self.metrics,
            on_outcome=self.settle,
            on_systemic_failure=self.systemic_failure,
            max_hung_calls=config.max_hung_calls,
            max_throttled_s=config.max_throttled_s,
            meters=meters,
            cache=ResultCache(config.cache_size) if config.cache else None,
            spend=spend,
            answer_early=functools.partial(self.verdicts.answer_from_log, settle=self.settle) if self.verdicts else None,
            queue=RankedQueue(loop.time, config.max_passover_s) if config.admission_order == "deadline" else None,
        )

    # -- tickets (tickets.py) -------------------------------------------------------------------------
    def submit(self, items: list[RewardItem], group_size: int | Mapping[Hashable, int], *, validation: bool = False,
               ranks: Sequence[int] | None = None) -> str:
        return self.book.submit(items, group_size, validation=validation, ranks=ranks)

    def open_ticket(self, group_size: int | Mapping[Hashable, int], *, validation: bool = False) -> str:
        return self.book.open(group_size, validation=validation)

    def add(self, ticket: str, items: list[RewardItem]) -> None:
        self.book.add(ticket, items)

    def close(self, ticket: str) -> None:
        self.book.close(ticket)

    async def take(
        self, ticket: str, n: int | None = None, timeout: float | None = None, *, confirm: bool = False,
    ) -> list[GroupResult]:
        return await self.book.take(ticket, n, timeout, confirm=confirm)

    def confirm_taken(self, ticket: str) -> None:
        self.book.confirm_taken(ticket)

    def put_back(self, ticket: str, groups: list[GroupResult]) -> None:
        self.book.put_back(ticket, groups)

    def cancel(self, ticket: str) -> int:
        return self.book.cancel(ticket)

    def remaining(self, ticket: str) -> int:
        return self.book.remaining(ticket)

    # -- the per-sample stream (stream.py) ------------------------------------------------------------
    def join_group(
        self, item: RewardItem, uid: Hashable | None, group_size: int, group_wait: float | None,
        answer: Callable[[object], None], session: Hashable | None = None, attempt: Hashable | None = None,
        validation: bool = False,
    ) -> None:
        self.stream.join(item, uid, group_size, group_wait, answer, session, attempt, validation)

    async def score_in_group(self, item: RewardItem, uid: Hashable | None, group_size: int, group_wait: float | None,
                             session: Hashable | None = None, attempt: Hashable | None = None, validation: bool = False):
        return await self.stream.score(item, uid, group_size, group_wait, session, attempt, validation)

    def withdraw_from_group(self, uid: Hashable, session: Hashable, attempt: Hashable | None = None) -> None:
        self.stream.withdraw(uid, session, attempt)

    # -- settling -----------------------------------------------------------------------------------
    def settle(self, sample: Sample, outcome: Outcome) -> None:
        """The one settle path: every outcome of every sample, from the pipeline or a deadline.
        Exactly once per sample: a second outcome (a late cached answer after the deadline) is dropped."""
        if sample.settled:
            return
        sample.settled = True
        sample.state = DONE
        if sample.__class__ is GroupCall:  # a group judge's answer: each member settles on its own
            for member, member_outcome in member_outcomes(sample, outcome):
                self.settle(member, member_outcome)
            return
        owner = sample.owner
        now = self.loop.time()
        failed = isinstance(outcome, Failed)
        if failed:
            self.metrics.failed += 1
            self.metrics.failures_by_kind[outcome.kind] += 1
        else:
            self.metrics.completed += 1
        if self.verdicts is not None and self.judge.log(sample, outcome, now):
            return
        if isinstance(owner, TicketRun):
            self.book.settled(owner, sample, outcome, failed, now)
        else:
            self.stream.settled(owner, outcome, failed, now)

    def count_recent(self, failed: bool, outcome: Outcome) -> bool:
        """One settled sample in the agent-wide window; True once that stopped everything."""
        kind, message = (outcome.kind, outcome.message) if failed else ("", "")
        if self.recent.record(failed, kind, message):
            self.systemic_failure(self.recent.describe(), budget=True)
            return True
        return False

    def count_recent_failures(self, count: int, failure: Failed) -> bool:
        """``count`` samples failed at once (a deadline over a backlog); True once that stopped everything."""
        if self.recent.record_failures(count, failure.kind, failure.message):
            self.systemic_failure(self.recent.describe(), budget=True)
            return True
        return False

    def _hook_failed(self, failure: Failed, indices: list[int], run: TicketRun | None,
                     sample_of: Callable[[int], Sample] | None) -> bool:
        """A failed group hook failed these scored samples of a group: they move from completed to
        failed, are charged to the budgets like any failure, and the verdict log says so (their judge
        verdicts stay resumable: the hook runs again on resume). True once that stopped the ticket
        or everything."""
        count = len(indices)
        self.metrics.completed -= count
        self.metrics.failed += count
        self.metrics.failures_by_kind[failure.kind] += count
        if self.verdicts is not None and sample_of is not None:
            now = self.loop.time()
            for index in indices:
                if self.judge.log(sample_of(index), failure, now, stage="hook"):
                    return True
        if run is not None and run.error is None and self.book.charge(run, failure.kind, failure.message, count):
            return True
        return any(self.count_recent(True, failure) for _ in range(count))

    # -- failing everything ---------------------------------------------------------------------------
    def systemic_failure(self, message: str, budget: bool = False) -> None:
        """Failures are systematic: every open ticket and every waiting stream member gets the error."""
        error = FailureBudgetExceeded(message) if budget else RewardError(message)
        _log.error("reward agent: %s", message)
        self.stopped = self.stopped or error
        self.fail_all(error)

    def fail_all(self, error: BaseException) -> None:
        self.book.fail_all(error)
        self.stream.fail_all(error)

    def unsettled_samples(self) -> list[Sample]:
        return self.book.unsettled() + self.stream.unsettled()

    def hook_tasks(self) -> list[asyncio.Task]:
        """The group hooks running now, of tickets and of the stream."""
        return self.book.hook_tasks() + list(self.stream.hooks)

    # -- metrics and shutdown -------------------------------------------------------------------------
    def statistics(self) -> AgentStatistics:
        """Each part's frozen statistics, composed."""
        return AgentStatistics(
            samples=self.metrics.statistics(),
            pipeline=self.pipeline.statistics(),
            effective_cap=self.flow.window or self.config.max_concurrency,
            tickets=self.book.statistics(),
            stream=self.stream.statistics(),
            stopped=None if self.stopped is None else f"{type(self.stopped).__name__}: {self.stopped}",
            flow=self.flow.statistics(self.loop.time()),
            cost=self.spend.ledger.statistics() if self.chain is None else self.chain.cost(),
            verdict_log=self.judge.statistics(),
            shared=self.shared.statistics() if self.shared is not None else None,
            judges=self.chain.judge_metrics() if self.chain is not None else None,
        )

    def snapshot(self) -> dict:
        """``statistics()`` as the flat dict ``metrics()`` returns."""
        return self.statistics().as_dict()

    async def aclose(self, timeout: float = 10.0) -> int:
        """Fail every waiter (``AgentClosed``), stop every call; returns how many calls ignored their
        cancellation for ``timeout`` seconds (they are left behind, reported by the caller)."""
        if self.closed is not None:
            return 0
        self.closed = AgentClosed("the reward agent was closed")
        self.stopped = self.stopped or self.closed
        self.fail_all(self.closed)
        stuck = await self.pipeline.aclose(timeout)
        if self.shared is not None:
            await self.shared.aclose()
        await self._close_reward()
        if self.verdicts is not None:  # written and fsynced before close returns (a thread: off the loop)
            await self.loop.run_in_executor(None, self.verdicts.close)
        self.resolution.close()
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
