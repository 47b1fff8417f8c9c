"""The strategies on verl's v1 trainer, as a trainer mode: ``trainer.v1.trainer_mode=async_reward``.

Same semantics as ``v0.py``, on v1's TransferQueue batches (``KVBatchMeta``): generation runs without
in-loop rewards; the moment a batch is fully generated, its samples go to the agent as one ticket;
old/ref log-probs and values are computed for the whole batch; then each mini-batch of whole, scored
groups gets ``rm_scores`` written back to TransferQueue, its advantages and one critic/actor update
(with ``mini_batch_pipeline``), or the whole batch at once (without). With ``off_policy_steps=1`` the
next batch is generated and submitted before training on the current one.

Underneath it keeps verl's "sync" mode semantics (replay buffer, batch sizes, checkpoints): other mode
names change those, and "colocate_async" would sleep the replicas mid-step. See docs/v1-trainer-notes.md.
"""

from __future__ import annotations

import sys
import time

import ray
import torch
from tensordict import TensorDict

import transfer_queue as tq
from transfer_queue import KVBatchMeta
from verl import DataProto
from verl.trainer.ppo.utils import Role
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync
from verl.trainer.ppo.v1.utils import MetricsAggregator
from verl.utils import tensordict_utils as tu
from verl.utils.debug import marked_timer
from verl_async_rm.strategies.checkpoint import loader_state_reported_as
from verl_async_rm.strategies.plan import plan_mini_batches, strategy_from_mapping
from verl_async_rm.strategies.rewards import BatchRewards, PendingRewards, object_array
from verl_async_rm.strategies.timing import latency_metrics
from verl_async_rm.strategies.workers import (
    STEP_LR_KEY,
    AsyncRewardActorRolloutRefWorker,
    AsyncRewardTrainingWorker,
)

MODE = "async_reward"


class _WithoutStreamingRewards:
    """verl's RewardLoopManager with its worker handles hidden: the agent loop then skips rewards,
    and validation scores through ``_compute_reward_colocate`` (ours). The handles attribute is a
    read-only property, hence a proxy rather than an assignment."""

    reward_loop_worker_handles = None

    def __init__(self, inner):
        self._inner = inner

    def __getattr__(self, name):
        return getattr(self._inner, name)


class AsyncRewardTrainer(PPOTrainerSync):
    # -- verl plumbing ---------------------------------------------------------------------------
    def _build_replay_buffer(self):
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
        self.strategy = strategy_from_mapping(self.config)
        actor = self.config.actor_rollout_ref.actor
        self.plan = plan_mini_batches(
            self.strategy, train_batch_size=self.config.data.train_batch_size,
            ppo_mini_batch_size=actor.ppo_mini_batch_size, rollout_n=self.config.actor_rollout_ref.rollout.n,
            adv_estimator=self.config.algorithm.adv_estimator, use_critic=self.use_critic,
        )
        self.reward_loop_manager = _WithoutStreamingRewards(self.reward_loop_manager)
        self.rewards = BatchRewards(self.config, self.tokenizer)
        self._prefetched: tuple[KVBatchMeta, PendingRewards, int] | None = None
        self._loader_state_before_prefetch = None
        super().on_init_end()

    # -- rewards through the agent ---------------------------------------------------------------
    def _as_dataproto(self, batch: KVBatchMeta) -> DataProto:
        """The generated samples as the padded DataProto our decoder reads (as verl's own
        ``_compute_reward_colocate`` rebuilds it)."""
        key = self.rewards.settings.reward_fn_key
        fields = ["prompts", "responses", "uid", "reward_model", "extra_info", key]
        data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=fields)
        pad = self.tokenizer.pad_token_id
        prompts, responses = data["prompts"].to_padded_tensor(padding=pad), data["responses"].to_padded_tensor(padding=pad)
        mask = torch.cat(
            [self._lengths_to_mask(data["prompts"].offsets().diff(), prompts.size(1)),
             self._lengths_to_mask(data["responses"].offsets().diff(), responses.size(1))], dim=1,
        )
        non_tensor = {}
        for name in fields[2:]:
            if name in data.keys():
                non_tensor[name] = object_array(data[name])
        tensors = TensorDict({"prompts": prompts, "responses": responses, "attention_mask": mask}, batch_size=len(batch))
        return DataProto(batch=tensors, non_tensor_batch=non_tensor)

    def _submit(self, batch: KVBatchMeta) -> PendingRewards:
        real = [i for i, tag in enumerate(batch.tags) if not tag.get("is_padding", False)]
        view = KVBatchMeta(partition_id=batch.partition_id, keys=[batch.keys[i] for i in real], tags=[batch.tags[i] for i in real])
        return self.rewards.submit(self._as_dataproto(view), keys=view.keys)

    def _take(self, pending: PendingRewards, samples: int | None, partition_id: str) -> list[str]:
        chunk = self.rewards.take(pending, samples)
        keys = [pending.keys[i] for i in chunk.indices]
        lengths = tq.kv_batch_get(keys=keys, partition_id=partition_id, select_fields=["responses"])["responses"].offsets().diff()
        rows = []
        for length, score in zip(lengths.tolist(), chunk.scores):
            row = torch.zeros(length, dtype=torch.float32)
            if length:
                row[-1] = score  # the score on the last response token, as verl's agent loop puts it
            rows.append(row)
        scores = torch.nested.as_nested_tensor(rows, layout=torch.jagged)
        tq.kv_batch_put(keys=keys, partition_id=partition_id, fields=tu.get_tensordict({"rm_scores": scores}))
        return keys

    def _compute_reward_colocate(self, batch: KVBatchMeta, metrics: dict | None = None) -> KVBatchMeta:
        """Validation (and any whole-batch scoring): through the agent, waiting for every score."""
        pending = self._submit(batch)
        self._take(pending, None, batch.partition_id)
        return batch

    # -- a step ----------------------------------------------------------------------------------
    def _generate(self, metrics: dict) -> tuple[KVBatchMeta, PendingRewards, int]:
        self._add_batch_to_generate()
        batch, sample_metrics = self.replay_buffer.sample(
            global_steps=self.global_steps, partition_id="train", batch_size=self.config.data.train_batch_size
        )
        metrics.update(sample_metrics)
        batch.extra_info["temperature"] = self.config.actor_rollout_ref.rollout.temperature
        return batch, self._submit(batch), self.global_steps - 1

    def step(self, metrics: dict, timing_raw: dict) -> KVBatchMeta:
        with marked_timer("gen", timing_raw, color="red"):
            self.on_sample_begin()
            if self._prefetched is None:  # first step, or the first after a resume
                self._prefetched = self._generate(metrics)
            (batch, pending, weights_step), self._prefetched = self._prefetched, None
            self._loader_state_before_prefetch = None
            if self.strategy.off_policy_steps and self.global_steps < self.total_training_steps:
                self._loader_state_before_prefetch = self.train_dataloader.state_dict()
                self._prefetched = self._generate({})  # with the current weights, before training on `batch`
            self.on_sample_end()  # replicas sleep once, after the step's last generation
        batch = self._train_on(batch, pending, metrics, timing_raw)
        metrics.update(
            {
                **pending.timing.metrics(),
                **latency_metrics(pending.latencies),
                "async_reward/staleness": self.global_steps - 1 - weights_step,
                "async_reward/groups_per_mini_batch": self.plan.samples_per_mini_batch / pending.group_size,
                "async_reward/failed": pending.failed,
                "async_reward/wall_clock": time.time(),
            }
        )
        return batch

    def _train_on(self, batch: KVBatchMeta, pending: PendingRewards, metrics: dict, timing_raw: dict) -> KVBatchMeta:
        batch = self._balance_batch(batch, metrics=metrics)
        with marked_timer("old_log_prob", timing_raw, color="blue"):
            batch = self._compute_old_log_prob(batch, metrics=metrics)
        if self.use_reference_policy:
            with marked_timer("ref", timing_raw, color="olive"):
                batch = self._compute_ref_log_prob(batch, metrics=metrics)
        if self.use_critic:
            with marked_timer("values", timing_raw, color="cyan"):
                batch = self._compute_values(batch, metrics=metrics)
        tags = dict(zip(batch.keys, batch.tags))
        padding = [k for k, tag in tags.items() if tag.get("is_padding", False)]
        parts = self.plan.mini_batches
        aggregator = MetricsAggregator()
        update_actor = self.config.trainer.critic_warmup <= self.global_steps
        for part in range(parts):
            last = part == parts - 1
            with marked_timer("reward_wait", timing_raw, color="yellow"):
                keys = self._take(pending, None if last else self.plan.samples_per_mini_batch, batch.partition_id)
            keys += padding if last else []  # padding rows ride with the last mini-batch
            piece = KVBatchMeta(partition_id=batch.partition_id, keys=keys, tags=[tags[k] for k in keys],
                                extra_info=dict(batch.extra_info))
            piece_metrics: dict = {}
            with marked_timer("adv", timing_raw, color="brown"):
                self._compute_advantage(piece, metrics=piece_metrics)  # writes advantages to TransferQueue
            piece.extra_info[STEP_LR_KEY] = last  # the LR scheduler steps once per training step
            if self.use_critic:
                with marked_timer("update_critic", timing_raw, color="pink"):
                    self._update_critic(piece, metrics=piece_metrics)
            if update_actor:
                with marked_timer("update_actor", timing_raw, color="red"):
                    self._update_actor(piece, metrics=piece_metrics)
            aggregator.add_step_metrics(piece_metrics, sample_count=len(keys))
        metrics.update(aggregator.get_aggregated_metrics())
        return batch

    # -- checkpoints -----------------------------------------------------------------------------
    def _save_checkpoint(self):
        """Saved with the dataloader position before the prefetched batch: resuming regenerates it."""
        with loader_state_reported_as(self.train_dataloader, self._loader_state_before_prefetch):
            return super()._save_checkpoint()


def register_mode(module) -> None:
    """Called when verl imports its v1 trainer package (see integration/register.py)."""
    module.register_trainer(MODE)(AsyncRewardTrainer)


# Imported before verl's v1 package finished loading, the plugin hook skipped us: register now
# (registering the same class again is a no-op in verl).
if "verl.trainer.ppo.v1" in sys.modules:
    register_mode(sys.modules["verl.trainer.ppo.v1"])
