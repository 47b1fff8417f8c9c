"""Judge operations on the engine's side: the verdict log and the judge budget.

- **The verdict log** (``engine/verdicts.py``): every settled sample is appended to it (samples the
  log already holds are answered from it instead of sent: the pipeline's ``answer_early``). A log
  that cannot be written stops everything, loudly: a run that believes it is resumable must be.
- **The budget** (``engine/spend.py``): the pipeline asks ``Spending`` before each send (a meter of
  admission); once the next request could cross the budget and nothing in flight can free room,
  scoring stops here: every unsettled sample is refused as a ``budget`` failure (counted, logged,
  never scored by the failure policy) and every ticket and stream member fails with
  ``BudgetExceeded``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging

from verl_async_rm.engine.spend import Spending
from verl_async_rm.engine.verdicts import VerdictBook, VerdictLogStatistics
from verl_async_rm.errors import BudgetExceeded
from verl_async_rm.outcomes import Failed, Outcome

_log = logging.getLogger(__name__)

EXPIRE_SLICE = 2_000  # verdict-log lines written per loop iteration when a deadline expires many at once


class JudgeOps:
    def __init__(self, engine, spend: Spending, verdicts: VerdictBook | None):
        """``engine``: the ``ScoringEngine`` (``engine/core.py``) whose samples these are: a log that
        cannot be written and a spent budget stop it whole."""
        self.engine = engine
        self.loop = engine.loop
        self.spend = spend
        spend.on_spent = self.budget_spent
        self.verdicts = verdicts
        self.budget_error: BudgetExceeded | None = None
        self._budget_stop: asyncio.Task | None = None

    # -- the verdict log ----------------------------------------------------------------------------
    def log(self, sample, outcome: Outcome, now: float, stage: str | None = None) -> bool:
        """Append a settled sample to the verdict log; True if the log cannot be written (then
        everything fails loudly: a run that believes it is resumable must be)."""
        latency, ticket, uid, sample_id = sample.owner.log_fields(sample.item, now)
        try:
            self.verdicts.record(sample, outcome, latency, ticket, uid, now, sample_id, stage)
        except Exception as exc:  # noqa: BLE001 - raised here it would leave the sample settled and its group unresolved: a hang
            _log.exception("verdict log: recording %s failed", sample.where())
            self.engine.systemic_failure(f"the verdict log {self.engine.config.verdict_log} cannot record "
                                         f"{sample.where()}: {type(exc).__name__}: {exc}")
            return True
        problem = self.verdicts.failed_writes()
        if problem is not None:
            self.engine.systemic_failure(problem)
            return True
        return False

    def log_expired(self, samples: list, failure: Failed, now: float, start: int = 0) -> None:
        """The verdict log's line for each sample settled at a deadline, a slice per loop iteration."""
        for sample in samples[start:start + EXPIRE_SLICE]:
            outcome = failure if sample.attempts == failure.attempts else dataclasses.replace(failure, attempts=sample.attempts)
            if self.log(sample, outcome, now):
                return
        if start + EXPIRE_SLICE < len(samples):
            self.loop.call_soon(self.log_expired, samples, failure, now, start + EXPIRE_SLICE)

    def statistics(self) -> VerdictLogStatistics:
        return self.verdicts.statistics() if self.verdicts is not None else VerdictLogStatistics(0, 0)

    # -- the budget ---------------------------------------------------------------------------------
    def check_budget(self) -> None:
        if self.budget_error is not None:
            raise BudgetExceeded(str(self.budget_error))

    def budget_spent(self, sample, spend: Spending | None = None) -> None:
        """The next request could cross the budget and nothing in flight can free room: stop. Every
        unsettled sample (queued or waiting to retry: nothing is in flight) is refused as a ``budget``
        failure (counted, logged) and every ticket and stream member fails with ``BudgetExceeded``,
        so no refused sample is ever scored by the failure policy."""
        engine = self.engine
        message = (spend or self.spend).stop_message(sample)  # ``spend``: the last judge's of a judge list
        self.budget_error = BudgetExceeded(message)
        refused = engine.unsettled_samples()
        now, metrics = self.loop.time(), engine.metrics
        for unsettled in refused:
            unsettled.settled = True
            engine.pipeline.abandon(unsettled)
            metrics.failed += 1
            metrics.failures_by_kind["budget"] += 1
            if self.verdicts is not None:
                self.log(unsettled, Failed("budget", f"{unsettled.where()}: refused, {message}", unsettled.attempts), now)
        _log.error("reward agent: %s; %d samples refused", message, len(refused))
        engine.stopped = engine.stopped or self.budget_error
        error = BudgetExceeded(f"{message}; {len(refused)} samples refused (failure kind 'budget')")
        # Groups already judged (and paid for) whose group hook is still running are handed out
        # first: failing now would cancel their hooks and drop them, neither returned nor refused.
        hooks = engine.hook_tasks()
        if not hooks:
            engine.fail_all(error)
            return

        async def fail_once_hooks_end() -> None:
            await asyncio.wait(hooks)  # each bounded by hook_timeout and the deadline (engine/resolution.py)
            engine.fail_all(error)

        self._budget_stop = self.loop.create_task(fail_once_hooks_end())  # held: the loop keeps only weak references
