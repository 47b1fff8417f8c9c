"""The staleness pool in a trainer: generated batches' groups, harvested from the agent as they are
scored, chosen per step by ``staleness_pool.GroupPool`` (the rules live there, pure). Trainer-agnostic: rows
are whatever the trainer's batches use (v1: TransferQueue keys).

Checkpoints: the groups still in the pool are not saved; their batches are *regenerated* on resume.
``resume_state`` names the dataloader state from before the oldest batch that still has untrained
groups, and, per batch from there on, the step it was generated for and the prompt positions
already trained (or dropped). On resume those batches are drawn and generated again first (the
same prompts: the loader's state is restored; new responses, by the resumed weights) and the listed
positions are left out of the pool, so every prompt's samples are trained exactly once.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Hashable, Optional

from verl_async_rm.strategies.rewards import BatchRewards, ScoredRows
from verl_async_rm.strategies.staleness_pool import GroupPool, auto_lookahead

if TYPE_CHECKING:  # the scheduler imports verl; the driver runs without it (tests/strategies/test_pool_shapes.py)
    from verl_async_rm.strategies.scheduler import GeneratedBatch

POLL_S = 0.02  # waiting for "any group": each open batch is asked in turn with this timeout


@dataclass
class LiveBatch:
    generated: GeneratedBatch
    born: int  # the step it was generated for
    ordinal: int  # batches drawn since the run (or the resume) started
    position_of: dict  # group -> the prompt's position in the drawn batch (stable across a regeneration)
    scored: dict = field(default_factory=dict)  # group -> ScoredRows, harvested, not trained yet
    latencies_reported: int = 0  # of generated.rewards.group_latencies, handed to new_latencies() already
    finished: set = field(default_factory=set)  # prompt positions trained or dropped
    requests_of: dict = field(default_factory=dict)  # group -> its requests (one per session; a request may score several rows)


@dataclass(frozen=True)
class PooledStep:
    rows: list  # the step's rows, group by group, oldest group first
    scored: ScoredRows
    staleness_of_row: dict  # row -> staleness (trainer step - 1 - generating weights' step)
    dropped_rows: list
    metrics: dict
    # row -> the sample (request) it belongs to: a session's outputs share one (v1 multi-output loops), so
    # failure_policy=mask counts a group's usable samples by session, as on a step's own batch
    sample_of_row: dict = field(default_factory=dict)


def due_wait_hint(waited_due_s: float, step_compute_s: float, max_staleness: int) -> Optional[str]:
    """What to tell a user whose step waited for a group at its staleness bound (``on_stale=wait``),
    or None when the wait is small beside the step's compute (a quarter of it: a group scored just
    late is normal; a hang that only the deadline settles is not)."""
    if waited_due_s <= max(0.05, 0.25 * step_compute_s):
        return None
    return (f"a step waited {waited_due_s:.2f} s for a group carried max_staleness={max_staleness} steps (on_stale=wait): "
            "a call that outlives the bound holds the step it comes due in. To hide such calls, raise max_staleness to "
            "at least ticket_deadline / step time (the deadline then settles them first), or set on_stale=drop. "
            "Time waited this way is in async_rm/pool_wait_due_s (shown once a run).")


class PoolDriver:
    def __init__(self, rewards: BatchRewards, train_groups: int, max_staleness: int, on_stale: str,
                 skip: Optional[dict[int, set]] = None):
        """``skip``: on resume, batch ordinal (0 = the first drawn) -> prompt positions trained before."""
        self.rewards = rewards
        self.pool = GroupPool(train_groups, max_staleness, on_stale)
        self.live: list[LiveBatch] = []
        self._ordinal = 0
        self._skip = {int(k): set(v) for k, v in (skip or {}).items()}  # resume: ordinal -> positions trained before
        self.skipped_rows: list = []
        self._latencies: list[float] = []  # of retired batches, not reported yet

    # -- batches in ---------------------------------------------------------------------------------
    def add(self, generated: GeneratedBatch, born: int, position_of: dict) -> None:
        """A generated batch's groups join the pool (those trained before a resume are left out)."""
        live = LiveBatch(generated, born, self._ordinal, dict(position_of))
        skip = self._skip.pop(self._ordinal, set())
        self._ordinal += 1
        pending = generated.rewards
        for r, group in enumerate(pending.group_of):
            live.requests_of.setdefault(group, []).append(r)
        keys, rowless = [], []
        for group, position in live.position_of.items():
            if position in skip:
                live.finished.add(position)
                self.skipped_rows += self._rows(live, group)
                continue
            keys.append((live.ordinal, group))
            if group not in live.requests_of:  # every session of the prompt failed: one of a step's prompts, no rows
                rowless.append(keys[-1])
        self.pool.add(keys, born=born, rowless=rowless)
        self.live.append(live)

    @staticmethod
    def _rows(live: LiveBatch, group) -> list:
        """The group's rows, whatever its size and however many rows each of its requests scores."""
        rows_of = live.generated.rewards.rows_of
        return [row for r in live.requests_of.get(group, ()) for row in rows_of[r]]

    def _batch(self, ordinal: int) -> LiveBatch:
        return next(b for b in self.live if b.ordinal == ordinal)

    # -- scores in ----------------------------------------------------------------------------------
    def _harvest(self, live: LiveBatch, timeout: Optional[float]) -> int:
        """Groups of ``live`` scored so far (waiting up to ``timeout`` for the first); how many."""
        got = 0
        while True:
            scored = self.rewards.take_group(live.generated.rewards, timeout if got == 0 else 0)
            if scored is None:
                return got
            for group in scored.groups:
                taken, _ = scored.split({group})
                key = (live.ordinal, group)
                if key in self.pool.groups:  # else: skipped on resume; its score is not used
                    live.scored[group] = taken
                    self.pool.scored(key)
            got += 1

    def harvest_ready(self) -> None:
        for live in self.live:
            self._harvest(live, 0)

    def _wait(self, key: Optional[Hashable]) -> None:
        if key is not None:  # a due group: block on its batch until it is in
            live = self._batch(key[0])
            while not self.pool.groups[key].ready:
                if not self._harvest(live, None):
                    raise RuntimeError(f"group {key} never came back from the agent")
            return
        while True:  # any group: ask each batch with pending groups in turn
            for live in self.live:
                if any(k[0] == live.ordinal for k in self.pool.pending()) and self._harvest(live, POLL_S):
                    return

    # -- a step -------------------------------------------------------------------------------------
    def next_step(self, step: int, generate_more: Callable[[], bool], last_step: Optional[int] = None) -> PooledStep:
        """The step's groups (waiting only as ``GroupPool.select`` says). ``generate_more()`` adds a
        batch when drops ate the supply (False: no data left, the step trains on what there is).
        ``last_step``: the run's last step (no later step is kept room for)."""
        start = time.monotonic()
        self.harvest_ready()
        dropped: list = []
        waited_due = 0.0  # because of the staleness bound (on_stale=wait): a larger bound or drop avoids it
        while True:
            choice = self.pool.select(step, last_step)
            dropped += list(choice.drop)
            if choice.starved:
                if generate_more():
                    continue
                take = [key for key, g in self.pool.groups.items() if g.ready]
                for key in take:
                    del self.pool.groups[key]
                break
            if not choice.waiting:
                take = list(choice.take)
                break
            began = time.monotonic()
            self._wait(choice.wait_for)
            if choice.wait_for is not None or choice.for_bound:
                waited_due += time.monotonic() - began
        waited = time.monotonic() - start
        scored = ScoredRows.empty(self.rewards.fixed_keys)
        rows, staleness_of_row, dropped_rows, sample_of_row = [], {}, [], {}
        rowless = 0
        for ordinal, group in take:
            live = self._batch(ordinal)
            if group not in live.requests_of:  # a prompt every session of which failed: taken, nothing to train
                live.finished.add(live.position_of[group])
                rowless += 1
                continue
            piece = live.scored.pop(group)
            scored.extend(piece)
            rows += piece.rows
            stale = step - 1 - live.generated.weights_step
            staleness_of_row.update({row: stale for row in piece.rows})
            rows_of = live.generated.rewards.rows_of
            sample_of_row.update({row: (ordinal, r) for r in live.requests_of[group] for row in rows_of[r]})
            live.finished.add(live.position_of[group])
        for ordinal, group in dropped:
            live = self._batch(ordinal)
            live.finished.add(live.position_of[group])
            dropped_rows += self._rows(live, group)
        self._retire()
        values = list(staleness_of_row.values()) or [0]
        metrics = {
            "async_rm/staleness/mean": float(sum(values) / len(values)),
            "async_rm/staleness/max": float(max(values)),
            "async_rm/groups_carried": self.pool.carried,
            "async_rm/groups_dropped_stale": self.pool.dropped,
            "async_rm/pool_wait_s": waited,
            "async_rm/pool_wait_due_s": waited_due,
            "async_rm/pool_groups": len(self.pool.groups),
            "async_rm/pool_prompts_without_rows": rowless,
        }
        return PooledStep(rows, scored, staleness_of_row, dropped_rows, metrics, sample_of_row)

    def _retire(self) -> None:
        """Batches with every group trained or dropped leave; a finished ticket is released."""
        keep = []
        for live in self.live:
            if len(live.finished) == len(live.position_of):
                self._latencies += live.generated.rewards.group_latencies[live.latencies_reported:]
                if live.generated.rewards.remaining:
                    self.rewards.cancel(live.generated.rewards)
            else:
                keep.append(live)
        self.live = keep

    def new_latencies(self) -> list[float]:
        """Per-group reward latencies (the slowest member's) measured since the last call
        (off_policy_steps=auto: a group is usable once its slowest member is scored)."""
        out, self._latencies = self._latencies, []
        for live in self.live:
            out += live.generated.rewards.group_latencies[live.latencies_reported:]
            live.latencies_reported = len(live.generated.rewards.group_latencies)
        return out

    # -- checkpoints --------------------------------------------------------------------------------
    def resume_state(self, queued_loader_state: Optional[dict]) -> tuple[Optional[dict], list[dict]]:
        """(the loader state to save, the live batches from there: the step each was generated for
        and the prompt positions already trained): the oldest live batch's loader state; with none
        live, the batches queued ahead decide (as before). Live batches are consecutive draws (each
        generated batch joins the pool at once), so regenerating from the oldest redraws them all."""
        if not self.live:
            return queued_loader_state, []
        return self.live[0].generated.loader_state, [{"born": b.born, "trained": sorted(b.finished)} for b in self.live]

    def stop_scoring(self) -> int:
        """The run's last step has its groups: none left in the pool will be trained in this run, so
        their calls still out are cancelled (a remote judge bills each, and a hung one would keep
        the agent busy at shut-down); how many. The batches stay live, so a checkpoint taken now
        still has them drawn and generated again on resume (``resume_state``)."""
        return sum(self.rewards.cancel(live.generated.rewards) for live in self.live if live.generated.rewards.remaining)

    def abandon(self) -> None:
        """Cancel every call still out and forget the live batches (nothing of them will be trained)."""
        self.stop_scoring()
        self.live = []


def choose_lookahead(latencies: list[float], compute_s: list[float], max_steps: int) -> int:
    """``off_policy_steps: auto``: p90 of the measured group latencies over the median step compute
    (``staleness_pool.auto_lookahead``; 1 before anything is measured)."""
    import numpy as np

    if not latencies or not compute_s:
        return auto_lookahead(float("nan"), 1.0, max_steps=max_steps)
    return auto_lookahead(float(np.percentile(latencies, 90)), float(np.median(compute_s)), max_steps=max_steps)


__all__ = ["LiveBatch", "PoolDriver", "PooledStep", "choose_lookahead", "Any"]
