"""Judge fallback: an ordered list of judges (``AgentConfig.judges``), each with its own request
pipeline, and a router (``JudgeChain``) that stands where the engine's one pipeline stands without a
list (it has the pipeline's verbs: ``enqueue``, ``abandon``, ``abandon_all``, ``statistics``,
``aclose``). Without ``judges`` none of this is built: the engine's path is today's, unchanged.

Each judge is the same reward called with the judge's ``kwargs`` merged over the reward's own (a
hosted model, then a self-hosted one: another ``base_url``/``model``/``api_key``), under its own
limits, flow control, retries and budget: a pipeline of its own (``pipeline.py``), so a 429 storm
at one judge pauses that judge only.

Routing, one sample at a time:
- a sample goes to the first judge that is **up**;
- a judge goes **down** when more than its ``max_failure_rate`` of its last ``failure_window``
  attempts there failed (errors and timeouts; throttles are flow control), when its budget is spent (for good: a budget does not
  refill), or when every answer for ``switch_after_throttled_s`` was a 429/503. Its queued
  samples move to the next judge at once; a sample waiting to retry there moves when its wait ends;
  a sample in flight there finishes there (its answer counts: it was never sent twice);
- a sample that failed all its attempts at a judge moves to the next judge (with fresh attempts),
  whether or not that judge is down: another judge may well answer it. Only at the **last** judge
  does a failure settle the sample by the failure policy. The last judge is never "down": it is
  where samples end, and its loud failures are the agent's (``max_failure_rate`` over the agent's
  window, ``max_throttled_s``, its budget: ``BudgetExceeded``): all judges down = the loud failure;
- ``retry_after_s`` after going down, a judge is **probed**: one sample (the next one routed, or
  one taken from the queue of a later judge) is sent to it. An answer brings it back to first
  place (the queued samples of later judges move back to it); a failure keeps it down for another
  ``retry_after_s``.

No sample is scored twice: a sample is in one judge's pipeline at a time; it moves only once that
pipeline is done with it (its attempt ended, or it was still queued: taken out of the queue), on
the next loop turn (so the old pipeline finishes its book-keeping of the attempt, its budget
reservation, first), and never once it is settled. An abandoned attempt (deadline, cancel) is
abandoned in the pipeline that holds it, so a late answer is dropped there as without a list.

Calibration (``calibration_share``): a share of the samples the first judge scores (chosen by a
hash of the request, so the same ones in every run) is also sent to the second judge as a *shadow*
request: it never settles anything (its owner is a ``Shadow``, not a ticket or stream member), it
never moves on (a failure, a down or spent judge drops it, counted), and it ranks after every
training sample. Each answered pair is counted per step (the primary's ticket; the per-sample path
is one step, ``stream``): ``calibration/*`` metrics give the pairs, the share that agree (the same
score) and the mean absolute difference, overall and for the latest step with pairs.

Recording: a scored sample's extra info gets ``judge_index`` (the judge's place in the list, a
number: verl's ``reward_extra_info`` wants one value per sample); the verdict log record gets
``judge`` (its name); ``metrics()`` gets ``judge/<name>/requests|scored|failures|moved_out|
input_tokens|output_tokens|cost|up`` per judge. Each switch and each return is logged once, with
its reason (WARNING, INFO).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import zlib
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from verl_async_rm.cost import CostStatistics
from verl_async_rm.engine.admission_order import RankedQueue
from verl_async_rm.engine.budget import RecentFailures
from verl_async_rm.engine.executors import executor_for
from verl_async_rm.engine.flow import FlowControl, FlowSettings
from verl_async_rm.engine.meters import rate_meters
from verl_async_rm.engine.pipeline import DONE, QUEUED, PipelineStatistics, RequestPipeline, Sample
from verl_async_rm.engine.spend import Spending, budget_estimator
from verl_async_rm.loader import UserReward, wrap_reward
from verl_async_rm.outcomes import Outcome, Scored
from verl_async_rm.retry import RetryPolicy

if TYPE_CHECKING:
    from verl_async_rm.config import AgentConfig, JudgeConfig

_log = logging.getLogger(__name__)

UP, DOWN, PROBING = "up", "down", "probing"
JUDGE_INDEX_KEY = "judge_index"
_LIMITS = ("max_concurrency", "requests_per_minute", "tokens_per_minute", "token_budget", "money_budget",
           "price_input_per_million", "price_output_per_million")


def judge_reward(reward: UserReward, judge: JudgeConfig) -> UserReward:
    """The reward as this judge calls it: its kwargs merged over the reward's. A class reward gets an
    instance of its own (its client holds the judge's URL and key); an instance built by the caller
    cannot take kwargs, so a judge list with kwargs refuses it."""
    if not judge.kwargs:
        return reward
    if reward.is_group_judge:
        raise ValueError("judges: a group judge (compute_group_score) is not supported with a judge list")
    if reward.kwargs is None:
        raise ValueError(f"judges: {reward.label} is an instance built by the caller: judge {judge.name!r} cannot "
                         "apply its kwargs to it; pass the reward's class or function (or load it by path)")
    merged = {**reward.kwargs, **judge.kwargs}
    target = type(reward.instance) if reward.instance is not None else reward.score_fn
    # The spec too: process workers load the reward from it, with its kwargs.
    spec = dataclasses.replace(reward.spec, kwargs=merged) if reward.spec is not None else None
    return wrap_reward(target, merged, spec=spec)


def judge_config(config: AgentConfig, judge: JudgeConfig) -> AgentConfig:
    """The agent's settings with this judge's limits over them (unvalidated copy: each was validated)."""
    update: dict[str, Any] = {name: getattr(judge, name) for name in _LIMITS if getattr(judge, name) is not None}
    return config.model_copy(update={**update, "judges": None})


class Gate:
    """A meter of each judge's pipeline: it lets a sample start only while its judge takes samples
    (up, or the one probe while probing); otherwise the queue is handed to the chain to move on.
    Counts the requests sent to its judge (``take``)."""

    reserves = False

    def __init__(self, chain: JudgeChain, judge: JudgeState):
        self.chain, self.judge = chain, judge

    def wait(self, sample: Sample, now: float) -> float | None:
        judge = self.judge
        if judge.status == UP or judge.last or judge.probe is sample:
            return 0.0
        self.chain.schedule_drain(judge)
        return None

    def take(self, sample: Sample, now: float) -> None:
        self.judge.requests += 1


@dataclass
class JudgeState:
    index: int
    name: str
    config: Any  # JudgeConfig
    last: bool
    pipeline: RequestPipeline = None
    spend: Spending = None
    reward: UserReward = None
    breaker: RecentFailures = None
    status: str = UP
    probe: Sample | None = None  # the one sample sent to probe a down judge
    timer: asyncio.TimerHandle | None = None
    down_reason: str = ""
    requests: int = 0
    scored: int = 0
    failures: int = 0  # samples that failed all their attempts here (moved on, or settled at the last)
    moved_out: int = 0
    switches: int = 0
    returns: int = 0


class Shadow:
    """The owner of a calibration request: the sample the first judge scored, its score and step.
    Never settled; named in error messages after its primary."""

    __slots__ = ("primary", "score", "step", "opening")

    def __init__(self, primary: Any, score: float, step: str, opening: int):
        self.primary, self.score, self.step, self.opening = primary, score, step, opening

    def describe(self, item) -> str:
        return f"calibration request for {self.primary.describe(item)}"

    def admission_rank(self, item) -> tuple[bool, int, int, int]:
        """After every training sample (ranked as validation), by its primary's opening."""
        return True, self.opening, 0, 0


@dataclass
class Calibration:
    """The pairs (first judge, second judge) of the calibration requests, per step. Bounded: the
    steps kept are the most recent ``MAX_STEPS``."""

    share: float
    pairs: int = 0
    agreed: int = 0
    abs_diff: float = 0.0
    skipped: int = 0  # selected, but the second judge was not up (or the request was dropped)
    failed: int = 0  # the second judge failed the request
    steps: dict = dataclasses.field(default_factory=dict)  # step -> [pairs, agreed, abs_diff]
    last_step: str | None = None

    MAX_STEPS = 1000

    def selected(self, item) -> bool:
        """The same samples in every run: a hash of the request, not a random draw."""
        key = f"{item.data_source!r}\x00{item.solution_str!r}\x00{item.ground_truth!r}".encode()
        return zlib.crc32(key) < self.share * 2**32

    def record(self, step: str, first: float, second: float) -> None:
        diff = abs(first - second)
        agreed = diff <= 1e-9
        self.pairs += 1
        self.agreed += agreed
        self.abs_diff += diff
        figures = self.steps.get(step)
        if figures is None:
            if len(self.steps) >= self.MAX_STEPS:
                del self.steps[next(iter(self.steps))]
            figures = self.steps[step] = [0, 0, 0.0]
        figures[0] += 1
        figures[1] += agreed
        figures[2] += diff
        self.last_step = step

    def metrics(self) -> dict:
        nan = float("nan")
        out = {
            "calibration/pairs": self.pairs, "calibration/agreement": self.agreed / self.pairs if self.pairs else nan,
            "calibration/mean_abs_diff": self.abs_diff / self.pairs if self.pairs else nan,
            "calibration/skipped": self.skipped, "calibration/failed": self.failed,
        }
        last = self.steps.get(self.last_step) if self.last_step is not None else None
        out["calibration/last_step"] = self.last_step
        out["calibration/last_step_pairs"] = last[0] if last else 0
        out["calibration/last_step_agreement"] = last[1] / last[0] if last else nan
        return out

    def step_agreement(self) -> dict[str, dict]:
        """Per step: pairs, agreement, mean absolute difference."""
        return {step: {"pairs": p, "agreement": a / p, "mean_abs_diff": d / p} for step, (p, a, d) in self.steps.items()}


@dataclass(frozen=True)
class JudgeEvent:
    t: float  # the loop's time
    judge: str
    event: str  # "down" or "up"
    reason: str


class JudgeChain:
    """The router over the judges' pipelines (see the module's docstring)."""

    def __init__(self, engine, reward: UserReward, config: AgentConfig, token_estimate: Callable,
                 token_estimator: Callable | None):
        self.engine = engine
        self.loop = loop = engine.loop
        if reward.is_group_judge:
            raise ValueError("judges: a group judge (compute_group_score) is not supported with a judge list: its "
                             "requests are whole groups, and a group split across judges would mix their verdicts")
        self.judges: list[JudgeState] = []
        self.events: deque[JudgeEvent] = deque(maxlen=1000)
        self._drains: set[int] = set()
        count = len(config.judges)
        for index, judge in enumerate(config.judges):
            state = JudgeState(index, judge.name, judge, last=index == count - 1)
            own = judge_config(config, judge)
            state.reward = judge_reward(reward, judge)
            state.spend = Spending(own, budget_estimator(state.reward, token_estimator, own),
                                   on_spent=lambda sample, state=state: self.budget_spent(state, sample))
            state.breaker = RecentFailures(judge.failure_window, judge.max_failure_rate)
            flow = FlowControl(FlowSettings(cap=own.max_concurrency, max_pause=own.backoff_max,
                                            default_pause=own.backoff_initial, enabled=own.adaptive_concurrency))
            meters: list = [Gate(self, state), *rate_meters(own.requests_per_minute, own.tokens_per_minute, token_estimate)]
            if state.spend.limited:
                meters.append(state.spend)
            state.pipeline = RequestPipeline(
                loop=loop,
                calls=executor_for(state.reward, own.executor, own.sync_workers, loop),
                max_concurrency=own.max_concurrency,
                request_timeout=own.request_timeout,
                retry=RetryPolicy(own.max_attempts, own.backoff_initial, own.backoff_max),
                flow=flow,
                metrics=engine.metrics,
                on_outcome=lambda sample, outcome, state=state: self.outcome(state, sample, outcome),
                on_systemic_failure=engine.systemic_failure,  # hung calls: the agent's, loudly
                max_hung_calls=own.max_hung_calls,
                max_throttled_s=config.max_throttled_s if state.last else judge.switch_after_throttled_s,
                on_throttled_out=None if state.last else (lambda s, m, state=state: self.throttled_out(state, s, m)),
                on_attempt_error=None if state.last else (lambda s, kind, e, state=state: self.attempt_failed(state, s, kind, e)),
                meters=meters,
                spend=state.spend,
                queue=self._new_queue(),
            )
            self.judges.append(state)
        self.first = self.judges[0]
        self.flow = self.first.pipeline.flow
        self.answer_early = None  # the verdict log's, set by the engine
        self.calibration = Calibration(config.calibration_share) if config.calibration_share > 0 else None

    def _new_queue(self):
        config = self.engine.config
        return RankedQueue(self.loop.time, config.max_passover_s) if config.admission_order == "deadline" else None

    # -- the pipeline's verbs ------------------------------------------------------------------------
    def enqueue(self, samples: list[Sample]) -> None:
        for sample in samples:
            sample.judge = 0
        if self.answer_early is not None:
            samples = self.answer_early(samples)
        self.route(samples, 0)

    def route(self, samples: list[Sample], start: int) -> None:
        """Each sample to the first judge from ``start`` on that takes it: up, or probing with no probe
        out (it becomes the probe); the last judge if none."""
        by_judge: dict[int, list[Sample]] = {}
        for sample in samples:
            target = self._target(sample, start)
            sample.judge = target.index
            by_judge.setdefault(target.index, []).append(sample)
        for index, group in by_judge.items():
            self.judges[index].pipeline.enqueue(group)

    def _target(self, sample: Sample, start: int) -> JudgeState:
        for judge in self.judges[start:]:
            if judge.status == UP or judge.last:
                return judge
            if judge.status == PROBING and judge.probe is None:
                judge.probe = sample
                return judge
        return self.judges[-1]

    def abandon(self, sample: Sample) -> None:
        judge = self.judges[getattr(sample, "judge", 0)]
        if judge.probe is sample:  # its answer will never come: probe with another sample
            judge.probe = None
        judge.pipeline.abandon(sample)

    def abandon_all(self, samples: list[Sample]) -> None:
        by_judge: dict[int, list[Sample]] = {}
        for sample in samples:
            index = getattr(sample, "judge", 0)
            if self.judges[index].probe is sample:
                self.judges[index].probe = None
            by_judge.setdefault(index, []).append(sample)
        for index, group in by_judge.items():
            self.judges[index].pipeline.abandon_all(group)

    @property
    def in_flight(self) -> int:
        return sum(judge.pipeline.in_flight for judge in self.judges)

    @property
    def queue(self) -> list:
        return [sample for judge in self.judges for sample in judge.pipeline.queue]

    def pump(self) -> None:
        for judge in self.judges:
            judge.pipeline.pump()

    async def aclose(self, timeout: float) -> int:
        for judge in self.judges:
            if judge.timer is not None:
                judge.timer.cancel()
        stuck = 0
        for judge in self.judges:
            stuck += await judge.pipeline.aclose(timeout)
        for judge in self.judges:
            await self._close_reward(judge)
        return stuck

    async def _close_reward(self, judge: JudgeState) -> None:
        """A judge's own reward instance (its kwargs made one) releases its client (the engine closes
        the reward it was given)."""
        instance = judge.reward.instance
        if instance is None or instance is self.engine.reward.instance:
            return
        closer = getattr(instance, "aclose", None) or getattr(instance, "close", None)
        if callable(closer):
            try:
                result = closer()
                if asyncio.iscoroutine(result):
                    await asyncio.wait_for(result, 10)
            except Exception:  # noqa: BLE001 - shutdown goes on
                _log.warning("closing judge %s's reward failed", judge.name, exc_info=True)

    # -- outcomes --------------------------------------------------------------------------------------
    def outcome(self, judge: JudgeState, sample: Sample, outcome: Outcome) -> None:
        """A judge's pipeline is done with ``sample``: scored (settled, with the judge's index), or
        failed (settled at the last judge, else moved on)."""
        if sample.settled:
            return
        if sample.owner.__class__ is Shadow:
            self._shadow_done(sample, outcome)
            return
        if isinstance(outcome, Scored):
            judge.scored += 1
            if not judge.last:
                judge.breaker.record(False)
            if judge.probe is sample:
                judge.probe = None
                self._up(judge, "its probe was answered")
            if not outcome.cached:
                outcome.extra = {**outcome.extra, JUDGE_INDEX_KEY: judge.index}
            self.engine.settle(sample, outcome)
            if self.calibration is not None and judge.index == 0 and not outcome.cached:
                self._calibrate(sample, outcome.score)
            return
        if outcome.attempts == 0 or judge.last:  # never sent (unsendable), or nowhere left to go
            if outcome.attempts:
                judge.failures += 1
            if judge.probe is sample:
                judge.probe = None
            self.engine.settle(sample, outcome)
            return
        judge.failures += 1
        if judge.probe is sample:
            judge.probe = None
            self._down(judge, f"its probe failed: {outcome.message}")
        self._move(judge, sample, judge.index + 1)

    def attempt_failed(self, judge: JudgeState, sample: Sample, kind: str, error: BaseException) -> None:
        """An attempt at ``judge`` failed (not a throttle): its breaker counts attempts, not samples,
        so an outage is seen within ``failure_window`` attempts, whatever the retry waits. A probe's
        first failed attempt keeps its judge down (the probe sample then moves on when its retry
        wait ends: the gate hands it over)."""
        message = f"{sample.where()}: {type(error).__name__}: {error}"
        if judge.probe is sample:
            judge.probe = None
            self._down(judge, f"its probe failed: {message}")
        elif judge.breaker.record(True, kind, message) and judge.status == UP:
            self._down(judge, judge.breaker.describe().replace("samples failed", "attempts failed", 1))

    def throttled_out(self, judge: JudgeState, sample: Sample, message: str) -> None:
        """Every answer of ``judge`` for ``switch_after_throttled_s`` was a throttle: it is down."""
        if sample.owner.__class__ is Shadow:
            self.calibration.skipped += 1
            if judge.status != DOWN:
                self._down(judge, message)
            return
        if judge.probe is sample:
            judge.probe = None
        if judge.status != DOWN:
            self._down(judge, message)
        self._move(judge, sample, judge.index + 1)

    def budget_spent(self, judge: JudgeState, sample: Sample) -> None:
        """``judge``'s budget cannot take the next request: it is down for good (a budget does not
        refill); at the last judge this is the agent's loud ``BudgetExceeded``."""
        if judge.last:
            if sample.owner.__class__ is Shadow:  # calibration does not stop the run: its request is dropped
                sample.state = DONE
                self.calibration.skipped += 1
                self.loop.call_soon(judge.pipeline.pump)
                return
            self.engine.judge.budget_spent(sample, spend=judge.spend)
            return
        if judge.status != DOWN or judge.timer is not None:
            self._down(judge, judge.spend.stop_message(sample), probe=False)
        self.schedule_drain(judge)

    def _move(self, judge: JudgeState, sample: Sample, start: int) -> None:
        """``sample`` leaves ``judge`` (its attempt there is over): routed again on the next loop turn."""
        judge.moved_out += 1
        sample.state = DONE  # in no pipeline until it is routed
        self.loop.call_soon(self._reroute, sample, start)

    def _reroute(self, sample: Sample, start: int) -> None:
        if sample.settled:  # a deadline, a cancel or close settled it meanwhile
            return
        _fresh(sample)
        self.route([sample], start)

    # -- switching ---------------------------------------------------------------------------------------
    def _down(self, judge: JudgeState, reason: str, probe: bool = True) -> None:
        now = self.loop.time()
        if judge.status == UP:
            judge.switches += 1
            following = self.judges[judge.index + 1].name
            _log.warning("judge fallback: judge %r is down, its samples move to %r (then on down the list): %s",
                         judge.name, following, reason)
            self.events.append(JudgeEvent(now, judge.name, "down", reason))
        judge.status = DOWN
        judge.down_reason = reason
        judge.probe = None
        if judge.timer is not None:
            judge.timer.cancel()
            judge.timer = None
        if probe:
            judge.timer = self.loop.call_at(now + judge.config.retry_after_s, self._probe, judge)
        self.schedule_drain(judge)

    def _up(self, judge: JudgeState, reason: str) -> None:
        if judge.status == UP:
            return
        judge.status = UP
        judge.returns += 1
        judge.breaker = RecentFailures(judge.config.failure_window, judge.config.max_failure_rate)
        _log.info("judge fallback: judge %r is back (%s): samples go to it first again", judge.name, reason)
        self.events.append(JudgeEvent(self.loop.time(), judge.name, "up", reason))
        # The queued samples of the judges after it come back to it (none has been sent).
        for later in self.judges[judge.index + 1:]:
            moved = self._take_queue(later)
            if moved:
                self.route(moved, 0)

    def _probe(self, judge: JudgeState) -> None:
        """``retry_after_s`` after going down: one sample goes to ``judge``; taken from a later
        judge's queue if one waits there, else the next one routed."""
        judge.timer = None
        if judge.status != DOWN:
            return
        judge.status = PROBING
        judge.probe = None
        for later in self.judges[judge.index + 1:]:
            waiting = self._take_queue(later)
            if waiting:
                self.route(waiting, 0)  # the first becomes the probe, the others go back where they were
                return

    def schedule_drain(self, judge: JudgeState) -> None:
        """Move ``judge``'s queue on, on the next loop turn (never from inside its pump)."""
        if judge.index not in self._drains:
            self._drains.add(judge.index)
            self.loop.call_soon(self._drain, judge)

    def _drain(self, judge: JudgeState) -> None:
        self._drains.discard(judge.index)
        if judge.status == UP or judge.last:
            judge.pipeline.pump()
            return
        moved = self._take_queue(judge)
        probe = judge.probe
        if probe is not None and probe in moved:  # the probe stays (its judge waits for it)
            moved.remove(probe)
            probe.state = QUEUED
            judge.pipeline.queue.append(probe)
            judge.pipeline.pump()
        if moved:
            judge.moved_out += len(moved)
            self.route(moved, judge.index + 1)

    def _take_queue(self, judge: JudgeState) -> list[Sample]:
        """Every queued sample of ``judge``'s pipeline, taken out of it: its queue is replaced by an
        empty one (so none of them can start there any more). Calibration requests never move: they
        stay queued while their judge takes samples, else they are dropped."""
        pipeline = judge.pipeline
        taken = [sample for sample in pipeline.queue if sample.state == QUEUED]
        queue = self._new_queue()
        pipeline.queue = deque() if queue is None else queue
        if self.calibration is not None:
            shadows = [sample for sample in taken if sample.owner.__class__ is Shadow]
            if shadows:
                taken = [sample for sample in taken if sample.owner.__class__ is not Shadow]
                if judge.status == UP or judge.last:
                    pipeline.queue.extend(shadows)
                    self.loop.call_soon(pipeline.pump)
                else:
                    for shadow in shadows:
                        shadow.state = DONE
                    self.calibration.skipped += len(shadows)
        for sample in taken:
            _fresh(sample)
        return taken

    # -- calibration ---------------------------------------------------------------------------------------
    def _calibrate(self, sample: Sample, score: float) -> None:
        """A sample the first judge scored: if it is selected, the second judge scores it too."""
        calibration = self.calibration
        if not calibration.selected(sample.item):
            return
        second = self.judges[1]
        if second.status != UP and not second.last:
            calibration.skipped += 1
            return
        owner = sample.owner
        step = getattr(owner, "ticket", None) or "stream"
        shadow = Sample(sample.item, Shadow(owner, score, step, owner.opening))
        shadow.judge = second.index
        second.pipeline.enqueue([shadow])

    def _shadow_done(self, sample: Sample, outcome: Outcome) -> None:
        owner = sample.owner
        if isinstance(outcome, Scored):
            self.calibration.record(owner.step, owner.score, outcome.score)
        else:
            self.calibration.failed += 1

    # -- statistics ----------------------------------------------------------------------------------------
    def statistics(self) -> PipelineStatistics:
        parts = [judge.pipeline.statistics() for judge in self.judges]
        threads = [part.threads for part in parts if part.threads is not None]
        return PipelineStatistics(
            in_flight=sum(p.in_flight for p in parts), peak_in_flight=sum(p.peak_in_flight for p in parts),
            queued=sum(p.queued for p in parts), hung_now=sum(p.hung_now for p in parts),
            threads=sum(threads) if threads else None,
        )

    def cost(self) -> CostStatistics:
        """The judges' cost figures, summed."""
        parts = [judge.spend.ledger.statistics() for judge in self.judges]
        return CostStatistics(**{field.name: sum(getattr(p, field.name) for p in parts)
                                 for field in dataclasses.fields(CostStatistics)})

    def judge_metrics(self) -> dict:
        out: dict = {} if self.calibration is None else self.calibration.metrics()
        for judge in self.judges:
            cost = judge.spend.ledger.statistics()
            prefix = f"judge/{judge.name}/"
            out.update({
                prefix + "requests": judge.requests, prefix + "scored": judge.scored,
                prefix + "failures": judge.failures, prefix + "moved_out": judge.moved_out,
                prefix + "input_tokens": cost.input_tokens + cost.estimated_input_tokens,
                prefix + "output_tokens": cost.output_tokens + cost.estimated_output_tokens,
                prefix + "cost": cost.cost + cost.estimated_cost,
                prefix + "up": int(judge.status == UP), prefix + "switches": judge.switches,
                prefix + "returns": judge.returns,
            })
        return out


def _fresh(sample: Sample) -> None:
    """A sample about to be routed again: queued, with fresh attempts (each judge its own
    ``max_attempts``); its estimate of input tokens is kept (the same prompt)."""
    sample.state = QUEUED
    sample.attempts = 0
    sample.attempt = None
    sample.timer = None
    sample.reservation = None
