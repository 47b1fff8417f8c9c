"""One training step under the strategies, for both of verl's trainers.

The v0 trainer (``DataProto``, rows are positions) and the v1 trainer (``KVBatchMeta`` in
TransferQueue, rows are keys) each supply a small ``TrainerOps`` adapter that calls verl's own
step functions; the control flow lives here once:

- ``Lookahead``: the batches generated ahead (``off_policy_steps``), each with its reward tickets
  and the dataloader state from before it was drawn (what a checkpoint must record).
- ``StepScheduler.train``: a generated batch's policy inputs are already computed (old/ref
  log-probs, values: the whole batch, while its rewards are in flight). Then mini-batch by
  mini-batch, as the rewards arrive: scores attached, advantages for the groups that just became
  complete (whole groups, each once), then the worker updates that mini-batch unlocks
  (``plan.schedule_updates``: epoch 1 piece by piece, the critic on whole critic mini-batches,
  epochs 2..E over the whole batch as verl runs them). Mini-batches found scored already when the
  one before them is ready share that one's scores write, advantage call and update call
  (``plan.merge_update_calls``: the same optimizer steps, one call's fixed cost). The KL
  controller moves once per step.

Without the pipeline, or for a batch whose groups have several sizes (v1), the step takes every
reward and runs verl's one whole-batch update: exactly the stock step.
"""

from __future__ import annotations

from collections import deque
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Optional, Protocol

import numpy as np

from verl_async_rm.cost import usage_metrics
from verl_async_rm.masking import DROPPED_GROUPS_METRIC, MASKED_SAMPLES_METRIC, decide
from verl_async_rm.strategies.kl import DeferredKL
from verl_async_rm.strategies.plan import MiniBatchPlan, StrategyConfig, UpdateCall, merge_update_calls, schedule_updates
from verl_async_rm.strategies.rewards import BatchRewards, PendingRewards, ScoredRows
from verl_async_rm.strategies.timing import latency_metrics
from verl_async_rm.strategies.workers import LOADS_METRIC, OFFLOADS_METRIC


@dataclass
class GeneratedBatch:
    batch: Any
    rewards: PendingRewards
    epoch: int
    loader_state: Optional[dict]  # the dataloader's state before this batch was drawn: resuming there regenerates it
    weights_step: int  # the global step whose weights generated it (staleness = trainer step - 1 - this)
    positions: Optional[dict] = None  # group -> the prompt's position in the drawn batch (the pool's checkpoints)
    # verl's metrics of this batch's generation that its training step logs (v0: _balance_batch's global_seqlen/*)
    metrics: dict = field(default_factory=dict)


class Lookahead:
    """Batches generated (and submitted for scoring) before the step that trains on them."""

    def __init__(self, off_policy_steps: int):
        self.depth = off_policy_steps
        self.queue: deque[GeneratedBatch] = deque()

    def top_up(self, next_step: int, last_step: int, generate: Callable[[], Optional[GeneratedBatch]]) -> int:
        """Generate until the batch for ``next_step`` and the ``depth`` after it (never past
        ``last_step``) are in hand; returns how many were generated (``generate`` returns None when
        the data ran out)."""
        made = 0
        while len(self.queue) <= self.depth and next_step + len(self.queue) <= last_step:
            generated = generate()
            if generated is None:
                break
            self.queue.append(generated)
            made += 1
        return made

    def pop(self) -> Optional[GeneratedBatch]:
        return self.queue.popleft() if self.queue else None

    def resume_state(self) -> Optional[dict]:
        """The loader state a checkpoint taken now must record: from before the first batch still
        ahead (None: nothing ahead, the loader's own state is right)."""
        return self.queue[0].loader_state if self.queue else None

    def abandon(self, rewards: BatchRewards) -> None:
        """Batches generated but never trained on (the loop ended early): stop scoring them."""
        while self.queue:
            rewards.cancel(self.queue.popleft().rewards)


class TrainerOps(Protocol):
    """verl's step functions, on one trainer's batch type. ``rows=None`` means the whole batch in
    verl's order."""

    def rows(self, batch) -> list: ...

    def pipelineable(self, batch, pending: PendingRewards) -> bool: ...

    def attach(self, batch, scored: ScoredRows) -> None:
        """These rows' scores: in the batch by the advantage call over them (v1 writes them with it)."""

    def mask(self, batch, rows: list) -> None:
        """failure_policy=mask: these rows train on nothing (zero loss mask, zero advantages/returns)."""

    def advantages(self, batch, rows: Optional[list], kl: DeferredKL) -> dict: ...

    def update(self, batch, call: UpdateCall, rows: Optional[list]) -> dict: ...


class MetricMerger:
    """Worker metrics of several update calls, reduced as one call over all of them would be:
    per-micro-batch lists are concatenated (and ``verl.utils.metric.Metric``s extended), scalars
    (already reduced per call, v1) weighted by the samples the call trained on."""

    def __init__(self):
        self.lists: dict[str, Any] = {}
        self.scalars: dict[str, list[tuple[float, float]]] = {}
        self.counts: dict[str, int] = {}

    def add(self, metrics: dict, weight: float) -> None:
        for key, value in metrics.items():
            if key.endswith(LOADS_METRIC) or key.endswith(OFFLOADS_METRIC):
                counted = value if isinstance(value, (int, float)) else float(np.sum(value))
                self.counts[key] = self.counts.get(key, 0) + int(counted)
            elif isinstance(value, list):
                self.lists.setdefault(key, []).extend(value)
            elif hasattr(value, "extend") and hasattr(value, "aggregate"):  # verl's Metric
                if key in self.lists:
                    self.lists[key].extend(value)
                else:
                    self.lists[key] = value
            else:
                self.scalars.setdefault(key, []).append((float(value), float(weight)))

    def reduce(self, reduce_lists: Callable[[dict], dict]) -> dict:
        out = reduce_lists(dict(self.lists))
        for key, pairs in self.scalars.items():
            values = np.array([v for v, _ in pairs])
            weights = np.array([w for _, w in pairs])
            if "max" in key:
                out[key] = float(values.max())
            elif "min" in key:
                out[key] = float(values.min())
            else:
                out[key] = float(np.average(values, weights=weights)) if weights.sum() > 0 else float(values.mean())
        for key, count in self.counts.items():
            role = key.split("/")[0]
            name = "loads" if key.endswith(LOADS_METRIC) else "offloads"
            out[f"async_reward/{role}_{name}"] = count
        return out


class StepScheduler:
    def __init__(
        self,
        strategy: StrategyConfig,
        plan: MiniBatchPlan,
        rewards: BatchRewards,
        *,
        use_critic: bool,
        reduce_lists: Callable[[dict], dict],
        timer: Callable[..., Any] = lambda name, timing_raw, **_: nullcontext(),
    ):
        self.strategy = strategy
        self.plan = plan
        self.rewards = rewards
        self.use_critic = use_critic
        self.reduce_lists = reduce_lists
        self.timer = timer

    def _whole_batch(self) -> MiniBatchPlan:
        return MiniBatchPlan(self.plan.samples_per_mini_batch * self.plan.mini_batches, 1, 1,
                             self.plan.actor_epochs, self.plan.critic_epochs)

    def train(self, ops: TrainerOps, batch, pending: Optional[PendingRewards], *, update_actor: bool, timing_raw: dict,
              kl_controller: Any = None, scored: Optional[ScoredRows] = None, samples: Optional[dict] = None) -> dict:
        """Score, advantage and update one generated batch; returns the step's metrics. ``scored``:
        every row's score already in hand (the staleness pool's batches): one whole-batch update;
        ``samples`` then names each row's sample (request), as ``pending`` does otherwise."""
        pipelined = scored is None and self.plan.mini_batches > 1 and ops.pipelineable(batch, pending)
        if pipelined and not self.strategy.split_scored_batches:
            scored = self.rewards.take_if_all_scored(pending)
            pipelined = scored is None  # all in already: nothing to overlap, one whole-batch update
        plan = self.plan if pipelined else self._whole_batch()
        schedule = schedule_updates(plan, use_critic=self.use_critic, update_actor=update_actor)
        kl = DeferredKL(kl_controller) if kl_controller is not None else None
        order = ops.rows(batch)
        if scored is not None:
            group_of_row = dict(zip(scored.rows, scored.row_groups))
        else:
            group_of_row = {row: pending.group_of[r] for r, rows in enumerate(pending.rows_of) for row in rows}
        rows_of_group: dict[Any, list] = {}
        for row in order:
            if row in group_of_row:
                rows_of_group.setdefault(group_of_row[row], []).append(row)
        merger = MetricMerger()
        metrics: dict = {}
        taken: set = set()  # groups whose scores a mini-batch has taken
        masked: set = set()
        pieces: list[list] = []
        held = ScoredRows.empty(self.rewards.fixed_keys)  # index order: groups taken off the tickets, not yet a mini-batch's
        # mini-batches taken but not yet attached: merged ones (below) share one scores write, one
        # advantage call and one update call
        unattached = ScoredRows.empty(self.rewards.fixed_keys)
        merge = pipelined and self.plan.merge_ready
        ready_next = None  # (scored, piece): the next mini-batch, found scored already (merge)
        deferred: list[UpdateCall] = []  # calls held back to share one call with the next mini-batch's
        update_calls = 0
        for part in range(plan.mini_batches):
            with self.timer("reward_wait", timing_raw, color="yellow"):
                if ready_next is not None:
                    (scored, piece), ready_next = ready_next, None
                elif not pipelined:
                    scored, piece = (scored if scored is not None else self.rewards.take(pending)), None
                elif self.strategy.mini_batch_order == "completion":
                    scored = self.rewards.take(pending, plan.samples_per_mini_batch)
                    piece = list(scored.rows)
                else:
                    scored, piece, held = self._take_index_piece(pending, plan, part, order, group_of_row, held, taken)
            taken.update(scored.groups)
            unattached.extend(scored)
            pieces.append(piece)
            deferred += schedule.after_piece(part)
            if merge and part + 1 < plan.mini_batches:
                # The next mini-batch scored already: nothing to overlap between the two, so their
                # updates go as one call (plan.merge_update_calls), after one scores write and one
                # advantage call for both (each such call has a fixed cost: a TransferQueue round
                # trip on v1; advantages are per group, so the split does not change them).
                found = self._ready_piece(pending, plan, part + 1, order, group_of_row, held, taken)
                if found is not None:
                    scored_next, piece_next, held = found
                    ready_next = (scored_next, piece_next)
                    continue
            with self.timer("reward_attach", timing_raw, color="yellow"):
                ops.attach(batch, unattached)
                masked |= self._mask(ops, batch, unattached, pending, metrics, samples)
            with self.timer("adv", timing_raw, color="brown"):
                rows = None if piece is None else [row for g in unattached.groups for row in rows_of_group[g]]
                if masked:  # advantages of the usable rows alone: group statistics without the masked ones
                    rows = [row for row in (order if rows is None else rows) if row not in masked]
                metrics.update(ops.advantages(batch, rows, kl))
            unattached = ScoredRows.empty(self.rewards.fixed_keys)
            for call in (merge_update_calls(deferred) if merge and deferred else deferred):
                call_rows = None if not pipelined else [row for p in call.pieces for row in pieces[p]]
                self._update(ops, batch, call, call_rows, merger, timing_raw)
                update_calls += 1
            deferred = []
        for call in schedule.later_epochs():
            self._update(ops, batch, call, None, merger, timing_raw)
            update_calls += 1
        metrics.update(merger.reduce(self.reduce_lists))
        if kl is not None:
            metrics.update(kl.flush())
        metrics["async_reward/pipelined"] = float(pipelined)
        metrics["async_reward/update_calls"] = update_calls  # every role and epoch; merged calls count once
        return metrics

    def _mask(self, ops: TrainerOps, batch, scored: ScoredRows, pending: Optional[PendingRewards], metrics: dict,
              samples: Optional[dict] = None) -> set:
        """failure_policy=mask: mask the failed rows of these whole groups, and every row of a group
        left with fewer than min_group_success usable samples (see verl_async_rm/masking.py)."""
        agent = self.rewards.settings.agent
        if not agent.failure.masks_loss:
            return set()
        # a sample (one reward request) may stand for several rows (v1: a session's outputs); without
        # the pending tickets or ``samples`` (rows scored elsewhere) each row counts as its own sample
        if samples is not None:
            sample_of_row = samples
        else:
            sample_of_row = {row: r for r, rows in enumerate(pending.rows_of) for row in rows} if pending is not None else {}
        decision = decide(scored.rows, scored.row_groups, [sample_of_row.get(row, row) for row in scored.rows],
                          scored.extra_info["reward_failed"], agent.min_group_success)
        metrics[MASKED_SAMPLES_METRIC] = metrics.get(MASKED_SAMPLES_METRIC, 0) + decision.masked_samples
        metrics[DROPPED_GROUPS_METRIC] = metrics.get(DROPPED_GROUPS_METRIC, 0) + decision.dropped_groups
        if decision.any:
            ops.mask(batch, list(decision.masked_rows))
        return set(decision.masked_rows)

    def _ready_piece(self, pending, plan, part, order, group_of_row, held, taken):
        """Mini-batch ``part`` if every group it needs is scored already, without waiting: (its
        scores, its rows, the groups held for later), or None (groups scored meanwhile stay held)."""
        if self.strategy.mini_batch_order == "completion":
            scored = self.rewards.take_ready(pending, plan.samples_per_mini_batch)
            return None if scored is None else (scored, list(scored.rows), held)
        size = plan.samples_per_mini_batch
        needed = {group_of_row[row] for row in order[part * size : (part + 1) * size]} - taken
        while not needed <= set(held.groups):
            group = self.rewards.take_group(pending, timeout=0)
            if group is None:
                return None
            held.extend(group)
        return self._take_index_piece(pending, plan, part, order, group_of_row, held, taken)

    def _take_index_piece(self, pending, plan, part, order, group_of_row, held, taken):
        """verl's own mini-batch ``part``: rows [part*size, (part+1)*size) of the batch order. Takes
        groups one at a time (they finish in any order) until every group the rows touch is scored;
        returns (the newly needed groups' scores, the piece's rows, the groups held for later)."""
        size = plan.samples_per_mini_batch
        piece = order[part * size : (part + 1) * size]
        needed = {group_of_row[row] for row in piece}
        while not needed <= set(held.groups) | taken:
            group = self.rewards.take(pending, pending.group_size)
            if not group.rows:
                raise RuntimeError(f"the rewards ran out before groups {sorted(map(str, needed))[:3]} of mini-batch {part}")
            held.extend(group)
        scored, held = held.split(needed - taken)
        return scored, piece, held

    def _update(self, ops: TrainerOps, batch, call: UpdateCall, rows, merger: MetricMerger, timing_raw: dict) -> None:
        with self.timer(f"update_{call.role}", timing_raw, color="pink" if call.role == "critic" else "red"):
            weight = (len(rows) if rows is not None else self.plan.samples_per_mini_batch * self.plan.mini_batches)
            merger.add(ops.update(batch, call, rows), weight * call.epochs)

    def reward_metrics(self, generated: GeneratedBatch, global_steps: int) -> dict:
        rewards = generated.rewards
        return {
            **rewards.timing.metrics(),
            **latency_metrics(rewards.latencies),
            "async_reward/staleness": global_steps - 1 - generated.weights_step,
            # the pool's per-sample names, for one metric across modes (every sample of a batch alike here)
            "async_rm/staleness/mean": float(global_steps - 1 - generated.weights_step),
            "async_rm/staleness/max": float(global_steps - 1 - generated.weights_step),
            "async_reward/groups_per_mini_batch": self.plan.samples_per_mini_batch / max(1, rewards.group_size),
            "async_reward/failed": rewards.failed,
            **usage_metrics(rewards.usage, self.rewards.total_usage, self.rewards.prices),
        }


def drawn_batches(loader, first_epoch: int, total_epochs: int) -> Iterator[tuple[int, dict, dict]]:
    """(epoch, batch, loader state before the draw) for every batch from ``first_epoch`` on."""
    for epoch in range(first_epoch, total_epochs):
        iterator = iter(loader)
        while True:
            state = loader.state_dict()  # before the draw: see strategies/checkpoint.py
            try:
                batch = next(iterator)
            except StopIteration:
                break
            yield epoch, batch, state
