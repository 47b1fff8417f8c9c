"""The strategies on verl's v0 trainer (``trainer.use_v1=False``, ``RayPPOTrainer``).

``AsyncRewardRayPPOTrainer.fit`` is verl's loop reorganised around one idea: a generated batch's
rewards are an agent ticket submitted the moment generation ends, and the trainer takes them only
when it needs them:
- with ``off_policy_steps = k``, the next k batches are generated (and submitted) before the current
  one is trained on, so their reward latency overlaps this step's compute;
- with ``mini_batch_pipeline``, old/ref log-probs and values are computed for the whole batch while
  its rewards are in flight, then each mini-batch of whole finished groups is scored, gets its
  advantages and updates critic and actor at once.
Both off, the stock trainer runs unchanged. verl's profiling hooks are not reproduced here.
"""

from __future__ import annotations

import time
import uuid
from collections import deque
from dataclasses import dataclass
from pprint import pprint
from typing import Any, Iterator

import numpy as np
import torch
from omegaconf import OmegaConf
from tqdm import tqdm

from verl import DataProto
from verl.trainer.ppo.core_algos import agg_loss
from verl.trainer.ppo.metric_utils import (
    compute_data_metrics,
    compute_throughout_metrics,
    compute_timing_metrics,
    compute_variance_proxy_metrics,
)
from verl.trainer.ppo.ray_trainer import RayPPOTrainer, apply_kl_penalty, compute_advantage, compute_response_mask
from verl.utils.checkpoint.checkpoint_manager import should_save_ckpt_esi
from verl.utils.debug import marked_timer
from verl.utils.metric import reduce_metrics
from verl.utils.skip.skip_manager import SkipManager
from verl.utils.tracking import Tracking
from verl_async_rm.strategies.checkpoint import loader_state_reported_as
from verl_async_rm.strategies.plan import plan_mini_batches, strategy_from_mapping
from verl_async_rm.strategies.rewards import BatchRewards, PendingRewards, attach_rewards
from verl_async_rm.strategies.timing import latency_metrics
from verl_async_rm.strategies.workers import STEP_LR_KEY


@dataclass
class GeneratedBatch:
    batch: DataProto
    rewards: PendingRewards
    epoch: int
    loader_state: dict  # the dataloader's state before this batch was drawn: resuming there regenerates it
    weights_step: int  # the global step whose weights generated it (staleness = trainer step - 1 - this)


def images_seqlens(batch: DataProto) -> list:
    """verl's per-batch list of image sequence lengths (empty for text-only batches)."""
    lengths = []
    for inputs in batch.non_tensor_batch.get("multi_modal_inputs", []):
        if inputs is not None and "image_grid_thw" in inputs.keys():
            lengths.extend(inputs["images_seqlens"].tolist())
    return lengths


def merge_metric_lists(into: dict[str, list], metrics: dict[str, Any]) -> None:
    """Concatenate per-mini-batch metric lists from K update calls, so reducing them gives what one
    call over the whole batch would have reported."""
    for key, value in metrics.items():
        into.setdefault(key, []).extend(value if isinstance(value, list) else [value])


class AsyncRewardRayPPOTrainer(RayPPOTrainer):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.strategy = strategy_from_mapping(self.config)
        actor = self.config.actor_rollout_ref.actor
        self.plan = plan_mini_batches(
            self.strategy,
            train_batch_size=self.config.data.train_batch_size,
            ppo_mini_batch_size=actor.ppo_mini_batch_size,
            rollout_n=self.config.actor_rollout_ref.rollout.n,
            adv_estimator=self.config.algorithm.adv_estimator,
            use_critic=self.use_critic,
        )
        if self.strategy.enabled and str(self.config.algorithm.adv_estimator) in ("remax", "AdvantageEstimator.REMAX"):
            raise ValueError("the async reward strategies do not support adv_estimator=remax (it needs an extra greedy rollout)")
        self.rewards: BatchRewards | None = None

    def init_workers(self):
        super().init_workers()
        if self.strategy.enabled:
            self.rewards = BatchRewards(self.config, self.tokenizer)

    # -- checkpoints ------------------------------------------------------------------------------
    def _save_checkpoint(self):
        with loader_state_reported_as(self.train_dataloader, getattr(self, "_resume_loader_state", None)):
            return super()._save_checkpoint()

    # -- the loop ---------------------------------------------------------------------------------
    def fit(self):
        if not self.strategy.enabled:
            return super().fit()
        if self._dump_executor._shutdown:
            self._init_dump_executor()
        logger = Tracking(
            project_name=self.config.trainer.project_name,
            experiment_name=self.config.trainer.experiment_name,
            default_backend=self.config.trainer.logger,
            config=OmegaConf.to_container(self.config, resolve=True),
        )
        self.global_steps = 0
        self._load_checkpoint()
        self.checkpoint_manager.update_weights(self.global_steps)
        current_epoch = self.global_steps // len(self.train_dataloader)
        SkipManager.init(self.config)

        if self.config.trainer.get("val_before_train", True):
            val_metrics = self._validate()
            pprint(f"Initial validation metrics: {val_metrics}")
            logger.log(data=val_metrics, step=self.global_steps)
            if self.config.trainer.get("val_only", False):
                self._shutdown_dump_executor()
                return

        progress_bar = tqdm(total=self.total_training_steps, initial=self.global_steps, desc="Training Progress")
        self.global_steps += 1
        SkipManager.set_step(self.global_steps)
        self.max_steps_duration = 0
        draws = self._draw_batches(current_epoch)
        ahead: deque[GeneratedBatch] = deque()
        last_val_metrics = None

        while self.global_steps <= self.total_training_steps:
            metrics: dict[str, Any] = {}
            timing_raw: dict[str, float] = {}
            is_last_step = self.global_steps >= self.total_training_steps
            with marked_timer("step", timing_raw):
                self._generate_ahead(ahead, draws, timing_raw)
                if not ahead:
                    break  # the data ran out before total_training_steps
                current = ahead.popleft()
                self._resume_loader_state = ahead[0].loader_state if ahead else None
                batch = self._train_on(current, metrics, timing_raw, is_last_step)

            if self.config.trainer.test_freq > 0 and (is_last_step or self.global_steps % self.config.trainer.test_freq == 0):
                with marked_timer("testing", timing_raw, color="green"):
                    val_metrics = self._validate()
                    if is_last_step:
                        last_val_metrics = val_metrics
                metrics.update(val_metrics)

            self.max_steps_duration = max(self.max_steps_duration, timing_raw["step"])
            metrics.update({"training/global_step": self.global_steps, "training/epoch": current.epoch})
            metrics.update(compute_data_metrics(batch=batch, use_critic=self.use_critic))
            metrics.update(compute_timing_metrics(batch=batch, timing_raw=timing_raw))
            n_gpus = self.resource_pool_manager.get_n_gpus()
            metrics.update(compute_throughout_metrics(batch=batch, timing_raw=timing_raw, n_gpus=n_gpus))
            metrics.update(compute_variance_proxy_metrics(batch=batch, gradient_norm=metrics.get("actor/grad_norm")))
            logger.log(data=metrics, step=self.global_steps)
            progress_bar.update(1)
            self.global_steps += 1
            SkipManager.set_step(self.global_steps)
            if is_last_step:
                break
        self._abandon(ahead)
        self._shutdown_dump_executor()
        pprint(f"Final validation metrics: {last_val_metrics}")
        progress_bar.close()

    def _draw_batches(self, first_epoch: int) -> Iterator[tuple[int, dict, dict]]:
        for epoch in range(first_epoch, self.config.trainer.total_epochs):
            iterator = iter(self.train_dataloader)
            while True:
                state = self.train_dataloader.state_dict()  # before the draw: see strategies/checkpoint.py
                try:
                    batch_dict = next(iterator)
                except StopIteration:
                    break
                yield epoch, batch_dict, state

    def _generate_ahead(self, ahead: deque, draws: Iterator, timing_raw: dict) -> None:
        """Keep ``off_policy_steps`` batches generated beyond the one trained now (never past the
        last step), all with the current weights; the replicas sleep once, after the last one."""
        generated = False
        while len(ahead) <= self.strategy.off_policy_steps and self.global_steps + len(ahead) <= self.total_training_steps:
            drawn = next(draws, None)
            if drawn is None:
                break
            ahead.append(self._generate(*drawn, timing_raw))
            generated = True
        if generated:
            self.checkpoint_manager.sleep_replicas()

    def _generate(self, epoch: int, batch_dict: dict, loader_state: dict, timing_raw: dict) -> GeneratedBatch:
        batch = DataProto.from_single_dict(batch_dict)
        batch.meta_info["temperature"] = self.config.actor_rollout_ref.rollout.temperature
        batch.non_tensor_batch["uid"] = np.array([str(uuid.uuid4()) for _ in range(len(batch.batch))], dtype=object)
        gen_batch = self._get_gen_batch(batch)
        gen_batch.meta_info["global_steps"] = self.global_steps
        rollout_n = self.config.actor_rollout_ref.rollout.n
        gen_batch = gen_batch.repeat(repeat_times=rollout_n, interleave=True)
        with marked_timer("gen", timing_raw, color="red"):
            output = self.async_rollout_manager.generate_sequences(gen_batch)
            timing_raw.update(output.meta_info.pop("timing", {}))
        batch = batch.repeat(repeat_times=rollout_n, interleave=True).union(output)
        if "response_mask" not in batch.batch.keys():
            batch.batch["response_mask"] = compute_response_mask(batch)
        metrics: dict = {}
        if self.config.trainer.balance_batch:
            self._balance_batch(batch, metrics=metrics)  # before submitting: indices refer to this order
        batch.meta_info["global_token_num"] = torch.sum(batch.batch["attention_mask"], dim=-1).tolist()
        batch.meta_info["images_seqlens"] = images_seqlens(batch)
        with marked_timer("reward_submit", timing_raw, color="yellow"):
            rewards = self.rewards.submit(batch)
        return GeneratedBatch(batch, rewards, epoch, loader_state, weights_step=self.global_steps - 1)

    def _abandon(self, ahead: deque) -> None:
        """Batches generated but never trained on (the loop ended early): stop scoring them."""
        while ahead:
            self.rewards.cancel(ahead.popleft().rewards)

    # -- one step ---------------------------------------------------------------------------------
    def _train_on(self, current: GeneratedBatch, metrics: dict, timing_raw: dict, is_last_step: bool) -> DataProto:
        batch = current.batch
        self._compute_policy_inputs(batch, metrics, timing_raw)
        actor_metrics: dict[str, list] = {}
        critic_metrics: dict[str, list] = {}
        update_actor = self.config.trainer.critic_warmup <= self.global_steps
        parts = []
        for part in range(self.plan.mini_batches):
            with marked_timer("reward_wait", timing_raw, color="yellow"):
                chunk = self.rewards.take(current.rewards, self.plan.samples_per_mini_batch)
            piece = batch if self.plan.mini_batches == 1 else batch[chunk.indices]
            if piece is not batch:  # select_idxs shares meta_info: give the slice its own, per-slice values
                piece.meta_info = {
                    **batch.meta_info,
                    "global_token_num": [batch.meta_info["global_token_num"][i] for i in chunk.indices],
                    "images_seqlens": images_seqlens(piece),
                }
            attach_rewards(piece, chunk)
            piece = self._advantages(piece, metrics, timing_raw)
            last = part == self.plan.mini_batches - 1
            piece.meta_info[STEP_LR_KEY] = last  # the LR scheduler steps once per training step
            if self.use_critic:
                with marked_timer("update_critic", timing_raw, color="pink"):
                    merge_metric_lists(critic_metrics, self._update_critic(piece).meta_info["metrics"])
            if update_actor:
                with marked_timer("update_actor", timing_raw, color="red"):
                    merge_metric_lists(actor_metrics, self._update_actor(piece).meta_info["metrics"])
            piece.meta_info.pop(STEP_LR_KEY)
            parts.append(piece)
        if len(parts) > 1:
            token_nums = [n for part in parts for n in part.meta_info.pop("global_token_num")]
            for part in parts:
                part.meta_info.pop("images_seqlens")
            batch = DataProto.concat(parts)
            batch.meta_info["global_token_num"] = token_nums  # per sample, in the concatenated order
            batch.meta_info["images_seqlens"] = images_seqlens(batch)
        metrics.update(reduce_metrics(critic_metrics))
        metrics.update(reduce_metrics(actor_metrics))
        self._save_and_sync(update_actor, is_last_step, timing_raw)
        metrics.update(self._reward_metrics(current))
        rollout_data_dir = self.config.trainer.get("rollout_data_dir", None)
        if rollout_data_dir:
            extra = {k: list(batch.non_tensor_batch[k]) for k in ("uid", "reward_failed") if k in batch.non_tensor_batch}
            self._log_rollout_data(batch, extra, timing_raw, rollout_data_dir)
        return batch

    def _compute_policy_inputs(self, batch: DataProto, metrics: dict, timing_raw: dict) -> None:
        """Old log-probs (pi_old, the same for every mini-batch), reference log-probs and values,
        for the whole batch, while its rewards are in flight. As verl's loop does."""
        rollout_corr = self.config.algorithm.get("rollout_correction", None)
        if rollout_corr and rollout_corr.get("bypass_mode", False):
            from verl.trainer.ppo.rollout_corr_helper import apply_bypass_mode

            apply_bypass_mode(batch=batch, rollout_corr_config=rollout_corr, policy_loss_config=self.config.actor_rollout_ref.actor.policy_loss)
        else:
            with marked_timer("old_log_prob", timing_raw, color="blue"):
                old_log_prob, mfu = self._compute_old_log_prob(batch)
                actor_config = self.config.actor_rollout_ref.actor
                entropy = agg_loss(
                    loss_mat=old_log_prob.batch["entropys"], loss_mask=batch.batch["response_mask"],
                    loss_agg_mode=actor_config.loss_agg_mode, loss_scale_factor=actor_config.loss_scale_factor,
                )
                metrics.update({"actor/entropy": entropy.detach().item(), "perf/mfu/actor_infer": mfu})
                old_log_prob.batch.pop("entropys")
                batch.union(old_log_prob)
                if "rollout_log_probs" in batch.batch.keys():
                    from verl.utils.debug.metrics import calculate_debug_metrics

                    metrics.update(calculate_debug_metrics(batch))
        if self.use_reference_policy:
            with marked_timer("ref", timing_raw, color="olive"):
                batch.union(self._compute_ref_log_prob(batch))
        if self.use_critic:
            with marked_timer("values", timing_raw, color="cyan"):
                batch.union(self._compute_values(batch))

    def _advantages(self, batch: DataProto, metrics: dict, timing_raw: dict) -> DataProto:
        """KL-in-reward, rollout correction and advantages, as verl's loop does them."""
        with marked_timer("adv", timing_raw, color="brown"):
            if self.config.algorithm.use_kl_in_reward:
                batch, kl_metrics = apply_kl_penalty(batch, kl_ctrl=self.kl_ctrl_in_reward, kl_penalty=self.config.algorithm.kl_penalty)
                metrics.update(kl_metrics)
            else:
                batch.batch["token_level_rewards"] = batch.batch["token_level_scores"]
            rollout_corr = self.config.algorithm.get("rollout_correction", None)
            if rollout_corr is not None and "rollout_log_probs" in batch.batch and not rollout_corr.get("bypass_mode", False):
                from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_and_add_to_batch

                batch, is_metrics = compute_rollout_correction_and_add_to_batch(batch, rollout_corr)
                metrics.update(is_metrics)
            return compute_advantage(
                batch,
                adv_estimator=self.config.algorithm.adv_estimator,
                gamma=self.config.algorithm.gamma,
                lam=self.config.algorithm.lam,
                num_repeat=self.config.actor_rollout_ref.rollout.n,
                norm_adv_by_std_in_grpo=self.config.algorithm.get("norm_adv_by_std_in_grpo", True),
                config=self.config.algorithm,
            )

    def _save_and_sync(self, updated_actor: bool, is_last_step: bool, timing_raw: dict) -> None:
        if not updated_actor:  # critic warm-up: only wake the rollout replicas
            self.checkpoint_manager.update_weights(self.global_steps)
            return
        esi_expiring = should_save_ckpt_esi(
            max_steps_duration=self.max_steps_duration, redundant_time=self.config.trainer.esi_redundant_time
        )
        save_freq = self.config.trainer.save_freq
        if save_freq > 0 and (is_last_step or self.global_steps % save_freq == 0 or esi_expiring):
            with marked_timer("save_checkpoint", timing_raw, color="green"):
                self._save_checkpoint()
        with marked_timer("update_weights", timing_raw, color="red"):
            self.checkpoint_manager.update_weights(self.global_steps)

    def _reward_metrics(self, current: GeneratedBatch) -> dict:
        rewards = current.rewards
        return {
            **rewards.timing.metrics(),
            **latency_metrics(rewards.latencies),
            "async_reward/staleness": self.global_steps - 1 - current.weights_step,
            "async_reward/groups_per_mini_batch": self.plan.samples_per_mini_batch / rewards.group_size,
            "async_reward/failed": rewards.failed,
            "async_reward/wall_clock": time.time(),
        }
