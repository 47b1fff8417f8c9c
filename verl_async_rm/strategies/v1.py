"""The strategies on verl's v1 trainer, as a trainer mode: ``trainer.v1.trainer_mode=async_reward``.

verl's own ``PPOTrainer.fit`` runs the loop; this mode's ``step`` runs the shared ``StepScheduler``
on v1's TransferQueue batches (``KVBatchMeta``, rows are trajectory keys): generation runs without
in-loop rewards; the moment a batch is sampled from the replay buffer its sessions go to the agent
(one request per session, on the session's final output, as verl scores them; the score is copied
to the session's other outputs); old/ref log-probs and values are computed for the whole batch;
then each mini-batch of whole, scored groups gets ``rm_scores``, its advantages and its updates.
A batch whose groups have several sizes (failed sessions, per-prompt ``__rollout_n__``) or several
outputs per session is trained whole, exactly as verl trains it (``async_reward/pipelined`` = 0).
With ``off_policy_steps=1`` the next batch is generated and submitted before training on this one.

Underneath it keeps verl's "sync" mode semantics (replay buffer, batch sizes, checkpoints): other mode
names change those, and "colocate_async" would sleep the replicas mid-step. See docs/design/v1-trainer.md.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Optional, Sequence

import ray
import torch
from tensordict import TensorDict

import transfer_queue as tq
from transfer_queue import KVBatchMeta
from verl import DataProto
from verl.trainer.ppo.utils import Role
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync
from verl.utils import tensordict_utils as tu
from verl.utils.debug import marked_timer
from verl.utils.metric import reduce_metrics
from verl_async_rm import verl_internals
from verl_async_rm.drift import DriftMonitor
from verl_async_rm.integration.decode import requests_from_token_lists, session_reward_columns, sessions_of
from verl_async_rm.integration.group_sizes import sessions_per_prompt
from verl_async_rm.integration.settings import read_run_settings
from verl_async_rm.masking import (
    ADVANTAGE_COLUMN,
    LOSS_MASK_TOKENS_COLUMN,
    LOSS_TOKENS_COLUMN,
)
from verl_async_rm.strategies.checkpoint import loader_state_reported_as
from verl_async_rm.strategies.heap import freeze_trainer_and_workers
from verl_async_rm.strategies.kl import DeferredKL
from verl_async_rm.strategies.plan import (
    MAX_OFF_POLICY_STEPS,
    V1_MODE,
    UpdateCall,
    plan_mini_batches,
)
from verl_async_rm.strategies.pool_driver import PoolDriver, choose_lookahead, due_wait_hint
from verl_async_rm.strategies.reward_workers import without_reward_loop_workers
from verl_async_rm.strategies.rewards import BatchRewards, OpenStream, PendingRewards, ScoredRows
from verl_async_rm.strategies.scheduler import GeneratedBatch, Lookahead, StepScheduler
from verl_async_rm.strategies.staleness_pool import auto_staleness_bound, short_of_supply, supply_lookahead
from verl_async_rm.strategies.streaming import PROMPT_KEY, TICKET_KEY, V1_MANAGER_CLASS, v1_index
from verl_async_rm.strategies.v1_scores_io import advantage_call_with_scores, fields_of, score_rows
from verl_async_rm.strategies.workers import (
    AsyncRewardActorRolloutRefWorker,
    AsyncRewardTrainingWorker,
    update_flags,
)

MODE = V1_MODE
STALENESS_FIELD = "async_rm_staleness"  # per sample: trainer step - 1 - the step of the weights that generated it
POOL_STATE_FILE = "async_rm_pool.json"  # in the checkpoint folder: prompts of regenerated batches already trained
CORRECTION_PREFIX = "rollout_corr/"
CORRECTION_FIELDS = ("old_log_probs", "rollout_log_probs", "response_mask")  # what the correction statistics read
KL_METRICS = ("actor/reward_kl_penalty", "actor/reward_kl_penalty_coeff")
VALIDATION_PARTITION = "val"  # verl's v1 _validate samples its batches from this replay-buffer partition


class _WithoutStreamingRewards:
    """verl's RewardLoopManager with its worker handles hidden: the agent loop then skips rewards,
    and validation scores through ``_compute_reward_colocate`` (ours). The handles attribute is a
    read-only property, hence a proxy rather than an assignment."""

    reward_loop_worker_handles = None

    def __init__(self, inner):
        self._inner = inner

    def __getattr__(self, name):
        return getattr(self._inner, name)


def _real_keys(batch: KVBatchMeta) -> list:
    """The batch's trajectory keys without the replay buffer's padding rows."""
    return [k for k, tag in zip(batch.keys, batch.tags) if not tag.get("is_padding", False)]


class V1Ops:
    """verl's v1 step functions on ``KVBatchMeta`` rows (trajectory keys in the balanced order)."""

    def __init__(self, trainer: "AsyncRewardTrainer", expected_rows: int):
        self.trainer = trainer
        self.expected_rows = expected_rows
        self.masked_rows: set = set()
        self.unwritten: dict = {}  # row -> score: attached, not yet in TransferQueue (attach)
        self.reads: list[tuple[list, TensorDict]] = []  # (rows, CORRECTION_FIELDS verl's advantage call read for them)

    def _piece(self, batch: KVBatchMeta, rows: Optional[list], extra: Optional[dict] = None) -> KVBatchMeta:
        keys = batch.keys if rows is None else rows
        tags = dict(zip(batch.keys, batch.tags))
        return KVBatchMeta(partition_id=batch.partition_id, keys=list(keys), tags=[tags[k] for k in keys],
                           extra_info={**batch.extra_info, **(extra or {})})

    def rows(self, batch: KVBatchMeta) -> list:
        return list(batch.keys)

    def pipelineable(self, batch: KVBatchMeta, pending: PendingRewards) -> bool:
        padding = any(tag.get("is_padding", False) for tag in batch.tags)
        return pending.regular and not padding and len(batch) == self.expected_rows

    def attach(self, batch: KVBatchMeta, scored: ScoredRows) -> None:
        """``rm_scores``, each row's score on its last response token as verl's agent loop puts it:
        held until the advantage call over these rows writes them with its output (v1_scores_io.py:
        one TransferQueue write, not two); masked rows' go with their mask."""
        self.unwritten.update(zip(scored.rows, scored.scores))

    def mask(self, batch: KVBatchMeta, rows: list) -> None:
        """failure_policy=mask: zero ``response_mask`` and ``loss_mask`` (verl's engine counts a
        mini-batch's tokens from the latter, its losses read the former), advantages and returns of
        these rows in TransferQueue; the other rows' advantages are computed without them."""
        # the mask is decided on the rows just attached, so every masked row's score is in hand
        self.trainer._put_masked(batch.partition_id, rows, {row: self.unwritten.pop(row) for row in rows})
        self.masked_rows.update(rows)

    def advantages(self, batch: KVBatchMeta, rows: Optional[list], kl: Optional[DeferredKL]) -> dict:
        trainer = self.trainer
        metrics: dict = {}
        piece = self._piece(batch, rows)
        if rows is not None and not rows:
            self._write_unwritten(batch)
            return metrics  # every group of this mini-batch got its advantages with an earlier one
        scores = {key: self.unwritten[key] for key in piece.keys if key in self.unwritten}
        if len(scores) < len(piece.keys):
            # rows scored before (verl's replay-buffer padding carries zero scores of its own): the
            # scores in hand go first, verl's call reads every row's from TransferQueue
            self._write_unwritten(batch)
            scores = {}

        def compute() -> None:
            if kl is None:
                trainer._compute_advantage(piece, metrics=metrics)
                return
            controller, trainer.kl_ctrl_in_reward = trainer.kl_ctrl_in_reward, kl  # one beta per step; see kl.py
            try:
                trainer._compute_advantage(piece, metrics=metrics)
            finally:
                trainer.kl_ctrl_in_reward = controller

        if scores:
            read = advantage_call_with_scores(compute, scores, trainer._staleness_field())
            if rows is not None and all(name in read.keys() for name in CORRECTION_FIELDS):
                # kept for the batch's correction statistics (a piece's are dropped): these fields alone,
                # not the whole read, so the driver holds no more of the batch than it must
                self.reads.append((list(piece.keys), TensorDict({name: read[name] for name in CORRECTION_FIELDS},
                                                                batch_size=len(piece.keys))))
            for key in piece.keys:
                del self.unwritten[key]
        else:
            compute()
        self._write_unwritten(batch)  # none left in practice: every scored row is in a call or masked
        # the KL statistics come from kl.flush; rollout-correction statistics are the whole batch's:
        # verl's own when this call is the whole batch, else AsyncRewardTrainer._correction_metrics
        return {k: v for k, v in metrics.items()
                if not (rows is not None and k.startswith(CORRECTION_PREFIX)) and k not in KL_METRICS}

    def _write_unwritten(self, batch: KVBatchMeta) -> None:
        if self.unwritten:
            rows = list(self.unwritten)
            self.trainer._put_scores(batch, ScoredRows(rows, [self.unwritten[r] for r in rows], {}, [None] * len(rows)))
            self.unwritten.clear()

    def update(self, batch: KVBatchMeta, call: UpdateCall, rows: Optional[list]) -> dict:
        piece = self._piece(batch, rows, update_flags(call))
        metrics: dict = {}
        if call.role == "critic":
            self.trainer._update_critic(piece, metrics=metrics)
        else:
            self.trainer._update_actor(piece, metrics=metrics)
        return metrics


class AsyncRewardTrainer(PPOTrainerSync):
    # -- verl plumbing ---------------------------------------------------------------------------
    def _build_replay_buffer(self):
        # In verl's __init__, before any worker: refuse here what cannot run (verl's own entry point
        # reaches this mode without our main_ppo's checks).
        verl_internals.require_all("the trainer strategies (v1)")  # before any worker: a moved internal is refused here
        self.run_settings = read_run_settings(self.config)  # read and checked once in this process
        self.strategy = self.run_settings.strategy
        shape = self.run_settings.shape
        if self.strategy.enabled:  # verl's stock entry point reaches here without main_ppo's prepare
            without_reward_loop_workers(self.config)
        self.plan = plan_mini_batches(self.strategy, shape)
        if self.strategy.stream_rewards:
            chosen = self.config.actor_rollout_ref.rollout.agent.get("agent_loop_manager_class")
            if chosen != V1_MANAGER_CLASS:
                raise ValueError(
                    f"stream_rewards=true needs actor_rollout_ref.rollout.agent.agent_loop_manager_class={V1_MANAGER_CLASS} "
                    f"(got {chosen}): its workers add each sample to the step's ticket. `python -m verl_async_rm.main_ppo` "
                    "sets it; or set stream_rewards=false"
                )
        self._stream_next_batch = False
        self._staleness_of_row: dict = {}  # the rows being trained -> staleness (written by _put_scores)
        self._open_stream: Optional[tuple[OpenStream, dict]] = None
        self._last_positions: dict = {}  # uid -> position of the last drawn training batch
        self._pool: Optional[PoolDriver] = None
        self._pool_resume: list = []  # resume: the batches live at the checkpoint ({"born", "trained"})
        self._resumed_bound = 0  # resume, max_staleness=auto: the bound in force at the checkpoint
        self._generated_for = 0  # the pool: the last step a batch was generated for
        self._measured: dict = {"latency": [], "compute": []}  # off_policy_steps=auto
        self._supply_depth = 0  # the pool with auto: batches of supply beyond this step's
        self._due_wait_hinted = False  # the pool under on_stale=wait: pool_driver.due_wait_hint, printed once a run
        self._heap_metrics: dict = {}  # on_train_begin: strategies/heap.py
        self.drift: DriftMonitor | None = None  # reward.async_agent.drift_check: on_init_end
        self.trainer_mode = "sync"  # our name selects this class; every other check sees "sync"
        return super()._build_replay_buffer()

    def _init_resource_pool_mgr(self):
        super()._init_resource_pool_mgr()
        for role in (Role.ActorRollout, Role.ActorRolloutRef):
            if role in self.role_worker_mapping:
                self.role_worker_mapping[role] = ray.remote(AsyncRewardActorRolloutRefWorker)
        if Role.Critic in self.role_worker_mapping:
            self.role_worker_mapping[Role.Critic] = ray.remote(AsyncRewardTrainingWorker)

    def on_init_end(self):
        self.reward_loop_manager = _WithoutStreamingRewards(self.reward_loop_manager)
        self.rewards = BatchRewards(self.run_settings.agent, self.tokenizer)
        self.scheduler = StepScheduler(self.strategy, self.plan, self.rewards, use_critic=self.use_critic,
                                       reduce_lists=reduce_metrics, timer=marked_timer)
        self.lookahead = Lookahead(self.strategy.off_policy_steps)
        if self.run_settings.agent.drift_check is not None:
            self.drift = DriftMonitor.build(self.run_settings.agent.drift_check)
        super().on_init_end()

    def on_train_begin(self):
        super().on_train_begin()
        # after validation, before step 1: strategies/heap.py
        self._heap_metrics = freeze_trainer_and_workers(self.actor_rollout_wg, self.critic_wg if self.use_critic else None)

    # -- rewards through the agent ---------------------------------------------------------------
    def _submit(self, batch: KVBatchMeta, validation: bool = False) -> PendingRewards:
        """One request per session (its final output), scoring every output of the session."""
        sessions = sessions_of(_real_keys(batch))
        finals = [s.final_key for s in sessions]
        data = tq.kv_batch_get(keys=finals, partition_id=batch.partition_id)  # every field: some are optional
        key = self.rewards.settings.reward_fn_key
        # the same columns and decoding as the agent-loop workers' (streaming.py)
        columns = session_reward_columns(lambda name: tu.get(data, name) if name in data.keys() else None, key)
        requests = requests_from_token_lists([t.tolist() for t in data["prompts"].unbind()],
                                             [t.tolist() for t in data["responses"].unbind()], columns, self.tokenizer, key)
        for request, session in zip(requests, sessions, strict=True):
            request["uid"] = session.uid  # the group, whatever the dataset's uid column says
        return self.rewards.submit(requests, rows_of=[s.keys for s in sessions], validation=validation)

    # -- score while generating (streaming.py) ---------------------------------------------------
    def _submit_batch_to_rollout(self, batch: TensorDict) -> int:
        """verl's, with the step's ticket opened first and named in the prompts (training batches
        drawn by ``_generate`` only)."""
        uids = [str(uid) for uid in batch["uid"]]
        self._last_positions = {uid: i for i, uid in enumerate(uids)}
        if self._stream_next_batch:
            self._stream_next_batch = False
            rollout = self.config.actor_rollout_ref.rollout
            explicit = tu.get(batch, "__rollout_n__", default=None)
            sizes = sessions_per_prompt(len(uids), False, None if explicit is None else list(explicit), rollout.n, rollout.val_kwargs.n)
            stream = self.rewards.open_stream(dict(zip(uids, sizes)))
            tu.assign_non_tensor_data(batch, TICKET_KEY, stream.ticket)
            tu.assign_non_tensor_stack(batch, PROMPT_KEY, list(range(len(uids))))
            self._open_stream = (stream, {uid: i for i, uid in enumerate(uids)})
        return super()._submit_batch_to_rollout(batch)

    def _close_stream(self, batch: KVBatchMeta) -> PendingRewards:
        stream, prompt_of = self._open_stream
        self._open_stream = None
        sessions = sessions_of(_real_keys(batch))
        indices = [v1_index(prompt_of[s.uid], int(s.session)) for s in sessions]
        return self.rewards.close_stream(stream, {i: s.keys for i, s in zip(indices, sessions)},
                                         {i: s.uid for i, s in zip(indices, sessions)})

    def _put_scores(self, batch: KVBatchMeta, scored: ScoredRows, with_extra_info: bool = False) -> None:
        """One TransferQueue write per call (a round trip costs milliseconds a step, the price stock
        verl does not pay): the scores, and the rows' staleness where the step recorded it."""
        if not scored.rows:
            return
        partition_id = batch.partition_id
        tags = dict(zip(batch.keys, batch.tags))
        lengths = [tags.get(row, {}).get("response_len") for row in scored.rows]  # verl's agent loop tags each row
        if any(length is None for length in lengths):
            lengths = tq.kv_batch_get(keys=scored.rows, partition_id=partition_id,
                                      select_fields=["responses"])["responses"].offsets().diff().tolist()
        fields = {"rm_scores": score_rows(lengths, scored.scores), **{
            name: build(list(scored.rows)) for name, build in self._staleness_field().items()}}
        if with_extra_info:
            # verl's v1 validation reads reward extra info only from extra_fields["reward_extra_info"]
            current = tu.get(tq.kv_batch_get(keys=scored.rows, partition_id=partition_id, select_fields=["extra_fields"]), "extra_fields")
            fields["extra_fields"] = [
                {**(extra or {}), "reward_extra_info": {k: v[i] for k, v in scored.extra_info.items()}}
                for i, extra in enumerate(current)
            ]
        tq.kv_batch_put(keys=scored.rows, partition_id=partition_id, fields=tu.get_tensordict(fields))

    def _staleness_field(self) -> dict:
        """The rows' staleness column, written with their scores (name -> rows -> tensor), when the
        step recorded it."""
        if not self._staleness_of_row:
            return {}
        return {STALENESS_FIELD: lambda rows: torch.tensor([self._staleness_of_row[row] for row in rows], dtype=torch.int64)}

    def _put_masked(self, partition_id: str, rows: list, scores: dict) -> None:
        """Masked rows: zero masks, advantages and returns, with their scores (``scores``: row ->
        score) and staleness in the same write."""
        masks = tq.kv_batch_get(keys=rows, partition_id=partition_id, select_fields=["response_mask", "loss_mask"])
        zeros = [torch.zeros_like(mask) for mask in masks["response_mask"].unbind()]
        fields = {
            "response_mask": torch.nested.as_nested_tensor(zeros, layout=torch.jagged),
            "loss_mask": torch.nested.as_nested_tensor([torch.zeros_like(m) for m in masks["loss_mask"].unbind()], layout=torch.jagged),
        }
        for name in ("advantages", "returns"):
            fields[name] = torch.nested.as_nested_tensor([z.float() for z in zeros], layout=torch.jagged)
        fields["rm_scores"] = score_rows([len(z) for z in zeros], [scores[row] for row in rows])
        fields.update({name: build(rows) for name, build in self._staleness_field().items()})
        tq.kv_batch_put(keys=rows, partition_id=partition_id, fields=tu.get_tensordict(fields))

    def _compute_reward_colocate(self, batch: KVBatchMeta, metrics: dict | None = None) -> KVBatchMeta:
        """Validation (and any whole-batch scoring): through the agent, waiting for every score."""
        pending = self._submit(batch, validation=batch.partition_id == VALIDATION_PARTITION)
        self._put_scores(batch, self.rewards.take(pending), with_extra_info=True)
        return batch

    # -- a step ----------------------------------------------------------------------------------
    def _generate(self, metrics: dict) -> GeneratedBatch:
        loader_state = self.train_dataloader.state_dict()  # before the draw: resuming there regenerates it
        self._stream_next_batch = self.strategy.stream_rewards
        try:
            self._add_batch_to_generate()
            batch, sample_metrics = self.replay_buffer.sample(
                global_steps=self.global_steps, partition_id="train", batch_size=self.config.data.train_batch_size
            )
        except BaseException:
            if self._open_stream is not None:
                self.rewards.abandon_stream(self._open_stream[0])
                self._open_stream = None
            raise
        metrics.update(sample_metrics)
        batch.extra_info["temperature"] = self.config.actor_rollout_ref.rollout.temperature
        rewards = self._close_stream(batch) if self._open_stream is not None else self._submit(batch)
        return GeneratedBatch(batch, rewards, epoch=0, loader_state=loader_state, weights_step=self.global_steps - 1,
                              positions=dict(self._last_positions))

    def step(self, metrics: dict, timing_raw: dict) -> KVBatchMeta:
        # off_policy_steps=auto: a batch generated k steps ahead has k whole steps (generation and
        # training) for its rewards, so the step compute it is weighed against includes generation
        step_started = time.monotonic()
        if self.strategy.pooled:
            batch = self._pooled_step(metrics, timing_raw, step_started)
        else:
            with marked_timer("gen", timing_raw, color="red"):
                self.on_sample_begin()
                self.lookahead.top_up(self.global_steps, self.total_training_steps, lambda: self._generate(metrics))
                self.on_sample_end()  # replicas sleep once, after the step's last generation
            current = self.lookahead.pop()
            stale = self.global_steps - 1 - current.weights_step
            batch = self._train_on(current, metrics, timing_raw, staleness_of_row=dict.fromkeys(current.batch.keys, stale))
            self._measure(current.rewards, time.monotonic() - step_started - current.rewards.timing.blocked)
            metrics.update(self.scheduler.reward_metrics(current, self.global_steps))
        metrics.update(self._auto_lookahead())
        metrics.update(self._heap_metrics)
        if self.drift is not None:  # async_rm/drift/*: a check runs beside the steps (drift.py)
            metrics.update(self.drift.metrics(self.global_steps, last=self.global_steps >= self.total_training_steps))
        metrics["async_reward/wall_clock"] = time.time()
        return batch

    # -- off_policy_steps=auto ---------------------------------------------------------------------
    def _measure(self, pending: PendingRewards, compute_s: float) -> None:
        self._measured["latency"] = (self._measured["latency"] + list(pending.group_latencies))[-4096:]
        self._measured["compute"] = (self._measured["compute"] + [max(compute_s, 1e-3)])[-16:]

    def _auto_lookahead(self) -> dict:
        """Rule (pool_driver.choose_lookahead): ceil(p90 group latency / median step compute), clamped to
        [0, 1] on v1 (verl's sync replay buffer prefetches one batch at most)."""
        if not self.strategy.auto_off_policy:
            return {}
        # v1's generation-ahead is clamped to 1; the pool's supply is not, but no deeper than the
        # staleness bound lets its groups be trained in time (staleness_pool.py, "Supply")
        rule = choose_lookahead(self._measured["latency"], self._measured["compute"], max_steps=MAX_OFF_POLICY_STEPS)
        chosen = min(rule, 1)
        self._supply_depth = supply_lookahead(rule, chosen, self._staleness_bound())
        if chosen != self.lookahead.depth:
            print(f"[verl_async_rm] off_policy_steps=auto: {self.lookahead.depth} -> {chosen} "
                  f"(reward latency p90 vs step compute measured so far)", flush=True)
            self.lookahead.depth = chosen
        out = {"async_rm/off_policy_steps": float(chosen)}
        if self.strategy.pooled:
            out["async_rm/supply_steps"] = float(self._supply_depth)
        return out

    # -- the staleness pool (pool_driver.py) ------------------------------------------------------
    def _staleness_bound(self) -> int:
        """The bound in force (max_staleness=auto raises it as steps are measured)."""
        return self._pool.pool.max_staleness if self._pool is not None else self.strategy.max_staleness

    def _raise_auto_bound(self) -> None:
        """max_staleness=auto: carry a group as many steps as the ticket deadline may take to settle it
        (staleness_pool.auto_staleness_bound), from the step computes measured so far."""
        before, deadline = self._pool.pool.max_staleness, self.rewards.settings.agent.ticket_deadline
        self._pool.pool.raise_bound(auto_staleness_bound(deadline, self._measured["compute"], before))
        if self._pool.pool.max_staleness != before:
            print(f"[verl_async_rm] max_staleness=auto: {before} -> {self._pool.pool.max_staleness} "
                  f"(ticket_deadline {deadline:g} s over the step compute measured so far)", flush=True)

    def _pooled_step(self, metrics: dict, timing_raw: dict, step_started: float) -> KVBatchMeta:
        def generate(born: int) -> None:
            generated = self._generate(metrics)
            self._pool.add(generated, born=born, position_of=generated.positions)

        with marked_timer("gen", timing_raw, color="red"):
            self.on_sample_begin()
            if self._pool is None:
                live = self._pool_resume  # resume: the batches live at the checkpoint, drawn again first
                self._pool = PoolDriver(self.rewards, int(self.config.data.train_batch_size),
                                        max(self.strategy.max_staleness, self._resumed_bound if self.strategy.auto_staleness else 0),
                                        self.strategy.on_stale, skip={i: set(b["trained"]) for i, b in enumerate(live)})
                for batch in live:
                    generate(int(batch["born"]))
                self._generated_for = max([int(b["born"]) for b in live], default=self.global_steps - 1)
            while self._generated_for < min(self.global_steps + self.lookahead.depth, self.total_training_steps):
                self._generated_for += 1
                generate(self._generated_for)
            # the pool as deep as the auto rule says (v1's one-batch clamp aside) and, under drop, as
            # deep again after drops: a batch more, born at the latest step generated for (staleness_pool.py, "Supply")
            steps_left = self.total_training_steps - self.global_steps + 1
            supply_batches = 0
            supply_depth = max(self.lookahead.depth, self._supply_depth)
            while short_of_supply(len(self._pool.pool.groups), self._pool.pool.train_groups, supply_depth, steps_left,
                                  whole_batches=self.strategy.on_stale == "wait"):
                generate(max(self._generated_for, self.global_steps))
                supply_batches += 1
            metrics["async_rm/supply_batches"] = supply_batches
            self.on_sample_end()

        def generate_more() -> bool:
            """Drops ate the supply (on_stale=drop): one batch more, for this step, by the same weights.
            The replicas slept after this step's generation: wake them as verl does (a weight sync of
            the unchanged weights), generate, and put them back to sleep."""
            self.checkpoint_manager.update_weights(self.global_steps - 1)
            self.on_sample_begin()
            generate(self.global_steps)
            self.on_sample_end()
            return True

        tags = {}  # every live row's replay-buffer tag (a batch this step finishes retires)
        for live in self._pool.live:
            tags.update(zip(live.generated.batch.keys, live.generated.batch.tags))
        with marked_timer("reward_wait", timing_raw, color="yellow"):
            chosen = self._pool.next_step(self.global_steps, generate_more, last_step=self.total_training_steps)
        if self.global_steps >= self.total_training_steps:
            # the supply's depth is left in the pool: this run trains none of it, stop its calls
            chosen.metrics["async_rm/pool_calls_cancelled_at_end"] = self._pool.stop_scoring()
        for live in self._pool.live:  # generate_more may have added one
            tags.update(zip(live.generated.batch.keys, live.generated.batch.tags))
        stale = chosen.dropped_rows + self._pool.skipped_rows
        self._pool.skipped_rows = []
        if stale:
            tq.kv_clear(keys=stale, partition_id="train")
        batch = KVBatchMeta(partition_id="train", keys=list(chosen.rows), tags=[tags[k] for k in chosen.rows],
                            extra_info={"temperature": self.config.actor_rollout_ref.rollout.temperature})
        batch = self._train_on(GeneratedBatch(batch, None, 0, None, self.global_steps - 1), metrics, timing_raw,
                               scored=chosen.scored, staleness_of_row=chosen.staleness_of_row, samples=chosen.sample_of_row)
        compute = time.monotonic() - step_started - chosen.metrics["async_rm/pool_wait_s"]
        self._measured["compute"] = (self._measured["compute"] + [max(compute, 1e-3)])[-16:]
        chosen.metrics["async_rm/max_staleness"] = float(self._pool.pool.max_staleness)  # the bound this step ran under
        # (under max_staleness=auto the bound already follows the deadline: the hint's advice is what it does)
        hint = None if self._due_wait_hinted or self.strategy.on_stale != "wait" or self.strategy.auto_staleness else due_wait_hint(
            chosen.metrics["async_rm/pool_wait_due_s"], compute, self._pool.pool.max_staleness)
        if self.strategy.auto_staleness:
            self._raise_auto_bound()
        if hint:
            self._due_wait_hinted = True
            print(f"[verl_async_rm] step {self.global_steps}: {hint}", flush=True)
        self._measured["latency"] = (self._measured["latency"] + self._pool.new_latencies())[-4096:]
        metrics.update(chosen.metrics)
        return batch

    def _train_on(self, current: GeneratedBatch, metrics: dict, timing_raw: dict, scored: Optional[ScoredRows] = None,
                  staleness_of_row: Optional[dict] = None, samples: Optional[dict] = None) -> KVBatchMeta:
        # each row's staleness goes to TransferQueue with its score (_put_scores): every row of the
        # batch is attached a score once this step
        self._staleness_of_row = staleness_of_row or {}
        batch = self._balance_batch(current.batch, metrics=metrics)
        with marked_timer("old_log_prob", timing_raw, color="blue"):
            batch = self._compute_old_log_prob(batch, metrics=metrics)
        if self.use_reference_policy:
            with marked_timer("ref", timing_raw, color="olive"):
                batch = self._compute_ref_log_prob(batch, metrics=metrics)
        if self.use_critic:
            with marked_timer("values", timing_raw, color="cyan"):
                batch = self._compute_values(batch, metrics=metrics)
        ops = V1Ops(self, expected_rows=self.plan.samples_per_mini_batch * self.plan.mini_batches)
        kl_controller = self.kl_ctrl_in_reward if self.config.algorithm.use_kl_in_reward else None
        try:
            metrics.update(self.scheduler.train(ops, batch, current.rewards, timing_raw=timing_raw, kl_controller=kl_controller,
                                                update_actor=self.config.trainer.critic_warmup <= self.global_steps, scored=scored,
                                                samples=samples))
        finally:
            self._staleness_of_row = {}
        # verl's whole-batch advantage call did not run (advantages came in pieces, or rows were
        # masked): its rollout-correction statistics are computed here, once, over the usable rows
        if not any(key.startswith(CORRECTION_PREFIX) for key in metrics):
            with marked_timer("rollout_corr_metrics", timing_raw, color="brown"):
                metrics.update(self._correction_metrics(batch, without=ops.masked_rows, reads=ops.reads))
        return batch

    def _correction_metrics(self, batch: KVBatchMeta, without: set, reads: Sequence[tuple[list, TensorDict]] = ()) -> dict:
        """Rollout-correction statistics of the whole batch, as verl's whole-batch advantage call
        gives them, when the advantages came in pieces (their per-piece statistics are dropped) or
        without the masked rows (``without``: verl's call then covers the usable rows alone). The
        weights and rejections themselves are per token/sequence, so each mini-batch's equal the
        whole batch's (batch normalisation is refused at start). The rows' fields come from what the
        pieces' advantage calls read (``reads``: v1_scores_io.py) when those cover them, else from
        TransferQueue."""
        correction = self.config.algorithm.get("rollout_correction", None)
        if correction is None or correction.get("bypass_mode", False) or not self.config.actor_rollout_ref.rollout.calculate_log_probs:
            return {}
        from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_and_add_to_batch

        keys = [key for key in batch.keys if key not in without]
        if not keys:
            return {}
        data = fields_of(keys, CORRECTION_FIELDS, reads)
        if data is None:
            data = tq.kv_batch_get(keys=keys, partition_id=batch.partition_id, select_fields=list(CORRECTION_FIELDS))
        probe = DataProto(batch=data.to_padded_tensor())
        _, metrics = compute_rollout_correction_and_add_to_batch(probe, correction)
        return metrics

    # -- the rollout dump --------------------------------------------------------------------------
    def _log_rollout_data(self, batch: KVBatchMeta, timing_raw: dict, rollout_data_dir: str):
        """verl's dump; with failure_policy=mask also what the updates trained on, per row."""
        self._mask_columns = None
        if self.rewards.settings.agent.failure.masks_loss:
            data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id,
                                   select_fields=["response_mask", "loss_mask", "advantages"])
            self._mask_columns = {
                key: {LOSS_TOKENS_COLUMN: int(mask.sum()), LOSS_MASK_TOKENS_COLUMN: int(loss.sum()),
                      ADVANTAGE_COLUMN: float(adv[0]) if len(adv) else 0.0}
                for key, mask, loss, adv in zip(batch.keys, data["response_mask"].unbind(),
                                                data["loss_mask"].unbind(), data["advantages"].unbind())
            }
        return super()._log_rollout_data(batch, timing_raw, rollout_data_dir)

    def _dump_generations(self, inputs, outputs, gts, scores, reward_extra_infos_dict, dump_path):
        columns = getattr(self, "_mask_columns", None)
        if columns and "uid" in reward_extra_infos_dict:  # verl's training dump: rows by trajectory key
            keys = reward_extra_infos_dict["uid"]
            for name in (LOSS_TOKENS_COLUMN, LOSS_MASK_TOKENS_COLUMN, ADVANTAGE_COLUMN):
                reward_extra_infos_dict[name] = [columns[key][name] for key in keys]
            self._mask_columns = None
        return super()._dump_generations(inputs, outputs, gts, scores, reward_extra_infos_dict, dump_path)

    # -- checkpoints -----------------------------------------------------------------------------
    def _save_checkpoint(self):
        """Saved with the dataloader position before the prefetched batch (the pool: before the
        oldest batch with groups not trained yet, plus which of its prompts were): resuming
        regenerates them, so nothing is lost and nothing trained twice."""
        state, trained = self.lookahead.resume_state(), []
        if self._pool is not None:
            state, trained = self._pool.resume_state(state)
        with loader_state_reported_as(self.train_dataloader, state):
            result = super()._save_checkpoint()
        if self._pool is not None:
            with open(os.path.join(self._step_folder(self.global_steps), POOL_STATE_FILE), "w") as f:
                json.dump({"live": trained, "max_staleness": self._pool.pool.max_staleness}, f)
        return result

    def _step_folder(self, step: int) -> str:
        folder = self.config.trainer.default_local_dir
        if not os.path.isabs(folder):
            folder = os.path.join(os.getcwd(), folder)
        return os.path.join(folder, f"global_step_{step}")

    def _load_checkpoint(self):
        result = super()._load_checkpoint()
        if self.strategy.pooled and self.global_steps > 0:
            folder = (self.config.trainer.resume_from_path if self.config.trainer.resume_mode == "resume_path"
                      else self._step_folder(self.global_steps))
            path = os.path.join(folder, POOL_STATE_FILE)
            if os.path.exists(path):
                with open(path) as f:
                    state = json.load(f)
                self._pool_resume = state["live"]
                # the groups live at the checkpoint were promised this bound (max_staleness=auto raised it)
                self._resumed_bound = int(state.get("max_staleness", 0))
        return result


def register_mode(module) -> None:
    """Called when verl imports its v1 trainer package (see integration/register.py)."""
    module.register_trainer(MODE)(AsyncRewardTrainer)


# Imported before verl's v1 package finished loading, the plugin hook skipped us: register now
# (registering the same class again is a no-op in verl).
if "verl.trainer.ppo.v1" in sys.modules:
    register_mode(sys.modules["verl.trainer.ppo.v1"])
