"""The strategies on verl's v0 trainer (``trainer.use_v1=False``, ``RayPPOTrainer``).

``fit`` is verl 0.9.1's ``RayPPOTrainer.fit`` with its step body replaced: the loop around it
(checkpoint load, validation, profiling, metrics, logging, ``on_batch_end``, the end of training) is
verl's, call for call; ``tests/test_seam_v0_loop.py`` compares the two functions' calls so the copy
cannot drift silently. The step body is the shared ``StepScheduler``:
- with ``off_policy_steps = k``, the next k batches are generated (and their rewards submitted)
  before the current one is trained on, all with the current weights;
- the replicas sleep once per step, after generation, whether or not this step generated (the last
  k steps do not), so training never runs beside awake replicas;
- with ``mini_batch_pipeline``, old/ref log-probs, values and rollout correction are computed for
  the whole batch while its rewards are in flight, then each mini-batch of whole, scored groups gets
  its advantages and updates critic and actor at once.
Both off, the stock trainer runs unchanged.
"""

from __future__ import annotations

import time
import uuid
from pprint import pprint
from typing import Any, Optional

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
from verl.trainer.ppo.ray_trainer import (
    AdvantageEstimator,
    RayPPOTrainer,
    apply_kl_penalty,
    compute_advantage,
    compute_response_mask,
    compute_spec_decode_metrics,
)
from verl.utils.checkpoint.checkpoint_manager import should_save_ckpt_esi
from verl.utils.debug import marked_timer
from verl.utils.metric import reduce_metrics
from verl.utils.skip.skip_manager import SkipManager
from verl.utils.tracking import Tracking
from verl_async_rm.drift import DriftMonitor
from verl_async_rm.integration.decode import decode_requests, valid_response_lengths
from verl_async_rm.masking import ADVANTAGE_COLUMN, LOSS_TOKENS_COLUMN
from verl_async_rm.strategies.agent_loop import TOOL_FIELDS_KEY
from verl_async_rm.strategies.checkpoint import loader_state_reported_as
from verl_async_rm.strategies.heap import freeze_trainer_and_workers
from verl_async_rm.strategies.kl import DeferredKL
from verl_async_rm import verl_internals
from verl_async_rm.integration.settings import read_run_settings
from verl_async_rm.strategies.plan import UpdateCall, plan_mini_batches
from verl_async_rm.strategies.rewards import BatchRewards, PendingRewards, ScoredRows, object_array
from verl_async_rm.strategies.scheduler import GeneratedBatch, Lookahead, StepScheduler, drawn_batches
from verl_async_rm.strategies.streaming import ROW_KEY, TICKET_KEY

STALENESS_COLUMN = "async_rm_staleness"
from verl_async_rm.strategies.workers import update_flags

def images_seqlens(batch: DataProto) -> list:
    """verl's per-batch list of image sequence lengths (empty for text-only batches)."""
    lengths = []
    for inputs in batch.non_tensor_batch.get("multi_modal_inputs", []):
        if inputs is not None and "image_grid_thw" in inputs.keys():
            lengths.extend(inputs["images_seqlens"].tolist())
    return lengths


class V0Ops:
    """verl's v0 step functions on ``DataProto`` rows (positions in the balanced batch)."""

    def __init__(self, trainer: "AsyncRewardRayPPOTrainer", expected_rows: int):
        self.trainer = trainer
        self.expected_rows = expected_rows
        self.correction: Optional[tuple[torch.Tensor, Optional[torch.Tensor]]] = None  # (response_mask, IS weights)

    def rows(self, batch: DataProto) -> list:
        return list(range(len(batch)))

    def pipelineable(self, batch: DataProto, pending: PendingRewards) -> bool:
        return pending.regular and len(batch) == self.expected_rows

    def attach(self, batch: DataProto, scored: ScoredRows) -> None:
        """Scores on each row's last valid response token (``token_level_scores``), extra info
        beside the rows, in one fixed set of columns for the whole batch."""
        if "token_level_scores" not in batch.batch.keys():
            batch.batch["token_level_scores"] = torch.zeros_like(batch.batch["responses"], dtype=torch.float32)
            for key in scored.extra_info:
                batch.non_tensor_batch[key] = object_array([None] * len(batch))
        if not scored.rows:
            return
        rows = torch.as_tensor(scored.rows, dtype=torch.long)
        lengths = valid_response_lengths(batch)[rows]
        batch.batch["token_level_scores"][rows, lengths - 1] = torch.as_tensor(scored.scores, dtype=torch.float32)
        for key, values in scored.extra_info.items():
            batch.non_tensor_batch[key][scored.rows] = object_array(values)

    def mask(self, batch: DataProto, rows: list) -> None:
        """failure_policy=mask: the rows leave the loss and its token count (verl's engine counts the
        mini-batch's tokens from ``response_mask``), with zero advantages, returns and rewards; the
        other rows' advantages are then computed without them (``StepScheduler._mask``)."""
        index = torch.as_tensor(rows, dtype=torch.long)
        batch.batch["response_mask"][index] = 0
        for key in ("advantages", "returns", "token_level_rewards"):
            if key not in batch.batch.keys():
                batch.batch[key] = torch.zeros_like(batch.batch["response_mask"], dtype=torch.float32)
            batch.batch[key][index] = 0
        if self.correction is not None:  # the whole-batch rollout-correction mask, applied per mini-batch
            self.correction[0][index] = 0

    def advantages(self, batch: DataProto, rows: Optional[list], kl: Optional[DeferredKL]) -> dict:
        """KL-in-reward, rollout correction and advantages for whole groups, as verl's loop does them."""
        trainer, algorithm = self.trainer, self.trainer.config.algorithm
        if rows is not None and not rows:
            return {}  # every group of this mini-batch got its advantages with an earlier one
        target = batch if rows is None else batch.select_idxs(rows)
        if algorithm.use_kl_in_reward:
            target, _ = apply_kl_penalty(target, kl_ctrl=kl, kl_penalty=algorithm.kl_penalty)  # metrics: kl.flush()
        else:
            target.batch["token_level_rewards"] = target.batch["token_level_scores"]
        if self.correction is not None:  # computed on the whole batch (policy_inputs); applied after KL, as verl
            mask, weights = self.correction
            index = slice(None) if rows is None else torch.as_tensor(rows, dtype=torch.long)
            target.batch["response_mask"] = mask[index]
            if weights is not None:
                target.batch["rollout_is_weights"] = weights[index]
        target = compute_advantage(
            target,
            adv_estimator=algorithm.adv_estimator,
            gamma=algorithm.gamma,
            lam=algorithm.lam,
            num_repeat=trainer.config.actor_rollout_ref.rollout.n,
            norm_adv_by_std_in_grpo=algorithm.get("norm_adv_by_std_in_grpo", True),
            config=algorithm,
        )
        if rows is not None:
            index = torch.as_tensor(rows, dtype=torch.long)
            for key in ("advantages", "returns", "token_level_rewards", "response_mask", "rollout_is_weights"):
                if key in target.batch.keys():
                    if key not in batch.batch.keys():
                        batch.batch[key] = torch.zeros_like(target.batch[key][:1]).expand(len(batch), *target.batch[key].shape[1:]).clone()
                    batch.batch[key][index] = target.batch[key]
        return {}

    def update(self, batch: DataProto, call: UpdateCall, rows: Optional[list]) -> dict:
        if rows is None:
            piece = batch
        else:
            piece = batch.select_idxs(rows)
            # select_idxs shares meta_info: the slice gets its own, with per-slice values
            piece.meta_info = {
                **batch.meta_info,
                "global_token_num": [batch.meta_info["global_token_num"][i] for i in rows],
                "images_seqlens": images_seqlens(piece),
            }
        flags = update_flags(call)
        piece.meta_info.update(flags)
        try:
            output = self.trainer._update_critic(piece) if call.role == "critic" else self.trainer._update_actor(piece)
        finally:
            for key in flags:
                piece.meta_info.pop(key, None)
        return output.meta_info["metrics"]


class AsyncRewardRayPPOTrainer(RayPPOTrainer):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # read and checked once in this process (also reached through verl's own entry point)
        verl_internals.require_all("the trainer strategies (v0)")
        self.run_settings = read_run_settings(self.config)
        self.strategy = self.run_settings.strategy
        self.plan = plan_mini_batches(self.strategy, self.run_settings.shape)
        self.rewards: BatchRewards | None = None
        self.scheduler: StepScheduler | None = None
        self._resume_loader_state = None
        self._heap_metrics: dict = {}  # fit, before step 1: strategies/heap.py
        self.drift: DriftMonitor | None = None  # reward.async_agent.drift_check: init_workers

    def init_workers(self):
        super().init_workers()
        if self.strategy.enabled:
            if self.run_settings.agent.drift_check is not None:
                self.drift = DriftMonitor.build(self.run_settings.agent.drift_check)
            self.rewards = BatchRewards(self.run_settings.agent, self.tokenizer)
            self.scheduler = StepScheduler(
                self.strategy, self.plan, self.rewards, use_critic=self.use_critic,
                reduce_lists=reduce_metrics, timer=marked_timer,
            )

    # -- checkpoints ------------------------------------------------------------------------------
    def _save_checkpoint(self):
        with loader_state_reported_as(self.train_dataloader, self._resume_loader_state):
            return super()._save_checkpoint()

    # -- the loop: verl's fit, with the step body from the scheduler ------------------------------
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
            assert val_metrics, f"{val_metrics=}"
            pprint(f"Initial validation metrics: {val_metrics}")
            logger.log(data=val_metrics, step=self.global_steps)
            if self.config.trainer.get("val_only", False):
                self._shutdown_dump_executor()
                return

        progress_bar = tqdm(total=self.total_training_steps, initial=self.global_steps, desc="Training Progress")
        self.global_steps += 1
        last_val_metrics = None
        self.max_steps_duration = 0
        SkipManager.set_step(self.global_steps)
        profiler = self.config.global_profiler
        prev_step_profile = False
        curr_step_profile = self.global_steps in profiler.steps if profiler.steps is not None else False
        draws = drawn_batches(self.train_dataloader, current_epoch, self.config.trainer.total_epochs)
        lookahead = Lookahead(self.strategy.off_policy_steps)
        # after validation, before step 1: strategies/heap.py
        self._heap_metrics = freeze_trainer_and_workers(self.actor_rollout_wg, self.critic_wg if self.use_critic else None)

        while self.global_steps <= self.total_training_steps:
            if hasattr(self.actor_rollout_wg, "async_calls_finalize_fn_exec"):
                self.actor_rollout_wg.async_calls_finalize_fn_exec(blocking=False)
            metrics: dict[str, Any] = {}
            timing_raw: dict[str, float] = {}
            with marked_timer("start_profile", timing_raw):
                self._start_profiling(
                    not prev_step_profile and curr_step_profile if profiler.profile_continuous_steps else curr_step_profile
                )
            is_last_step = self.global_steps >= self.total_training_steps
            with marked_timer("step", timing_raw):
                with marked_timer("gen", timing_raw, color="red"):
                    lookahead.top_up(self.global_steps, self.total_training_steps,
                                     lambda: self._generate(draws, timing_raw, curr_step_profile))
                    # Once per step, generated or not: the last k steps generate nothing, and their
                    # replicas, woken by the previous step's weight update, must not train beside us.
                    self.checkpoint_manager.sleep_replicas()
                current = lookahead.pop()
                if current is None:
                    break  # the data ran out before total_training_steps
                self._resume_loader_state = lookahead.resume_state()
                batch = self._train_step(current, metrics, timing_raw, is_last_step)

            if self.config.trainer.test_freq > 0 and (is_last_step or self.global_steps % self.config.trainer.test_freq == 0):
                with marked_timer("testing", timing_raw, color="green"):
                    val_metrics: dict = self._validate()
                    if is_last_step:
                        last_val_metrics = val_metrics
                metrics.update(val_metrics)

            with marked_timer("stop_profile", timing_raw):
                next_step_profile = self.global_steps + 1 in profiler.steps if profiler.steps is not None else False
                run_finish_command = bool(
                    curr_step_profile and profiler.steps and (self.global_steps == max(profiler.steps) or is_last_step)
                )
                self._stop_profiling(
                    curr_step_profile and not next_step_profile if profiler.profile_continuous_steps else curr_step_profile,
                    run_command=run_finish_command,
                )
                prev_step_profile = curr_step_profile
                curr_step_profile = next_step_profile

            self.max_steps_duration = max(self.max_steps_duration, timing_raw["step"])
            metrics.update({"training/global_step": self.global_steps, "training/epoch": current.epoch})
            metrics.update(compute_data_metrics(batch=batch, use_critic=self.use_critic))
            metrics.update(self._gdpo_metrics(batch))
            metrics.update(compute_timing_metrics(batch=batch, timing_raw=timing_raw))
            n_gpus = self.resource_pool_manager.get_n_gpus()
            metrics.update(compute_throughout_metrics(batch=batch, timing_raw=timing_raw, n_gpus=n_gpus))
            metrics.update(compute_variance_proxy_metrics(batch=batch, gradient_norm=metrics.get("actor/grad_norm", None)))
            metrics.update(
                compute_spec_decode_metrics(
                    batch.non_tensor_batch.get("spec_num_draft_tokens", None),
                    batch.non_tensor_batch.get("spec_num_accepted_tokens", None),
                    batch.non_tensor_batch.get("spec_num_verify_steps", None),
                )
            )
            logger.log(data=metrics, step=self.global_steps)
            progress_bar.update(1)
            self.global_steps += 1
            SkipManager.set_step(self.global_steps)

            if is_last_step:
                if hasattr(self.actor_rollout_wg, "async_calls_finalize_fn_exec"):
                    self.actor_rollout_wg.async_calls_finalize_fn_exec(blocking=True)
                lookahead.abandon(self.rewards)
                self._shutdown_dump_executor()
                pprint(f"Final validation metrics: {last_val_metrics}")
                progress_bar.close()
                return
            if hasattr(self.train_dataset, "on_batch_end"):
                self.train_dataset.on_batch_end(batch=batch)  # the dataset may change after each batch

        lookahead.abandon(self.rewards)
        self._shutdown_dump_executor()

    def _gdpo_metrics(self, batch: DataProto) -> dict:
        """verl's per-component reward metrics for GDPO."""
        metrics = {}
        keys = self.config.algorithm.get("gdpo_reward_keys", None)
        if keys and self.config.algorithm.adv_estimator in ("gdpo", AdvantageEstimator.GDPO):
            for key in keys:
                if key in batch.non_tensor_batch:
                    values = np.asarray(batch.non_tensor_batch[key], dtype=np.float32)
                    metrics[f"gdpo/{key}/mean"] = float(np.mean(values))
                    metrics[f"gdpo/{key}/std"] = float(np.std(values))
                    metrics[f"gdpo/{key}/max"] = float(np.max(values))
                    metrics[f"gdpo/{key}/min"] = float(np.min(values))
        return metrics

    # -- generation -------------------------------------------------------------------------------
    def _generate(self, draws, timing_raw: dict, profile: bool) -> Optional[GeneratedBatch]:
        drawn = next(draws, None)
        if drawn is None:
            return None
        epoch, batch_dict, loader_state = drawn
        batch = DataProto.from_single_dict(batch_dict)
        batch.meta_info["temperature"] = self.config.actor_rollout_ref.rollout.temperature
        batch.non_tensor_batch["uid"] = np.array([str(uuid.uuid4()) for _ in range(len(batch.batch))], dtype=object)
        gen_batch = self._get_gen_batch(batch)
        gen_batch.meta_info["global_steps"] = self.global_steps
        rollout_n = self.config.actor_rollout_ref.rollout.n
        gen_batch = gen_batch.repeat(repeat_times=rollout_n, interleave=True)
        stream = None
        if self.strategy.stream_rewards:  # each sample is added to this ticket as its rollout finishes
            stream = self.rewards.open_stream(rollout_n)
            gen_batch.meta_info[TICKET_KEY] = stream.ticket
            gen_batch.non_tensor_batch[ROW_KEY] = np.arange(len(gen_batch), dtype=np.int64)
        if profile:
            self.llm_server_manager.start_profile()
        try:
            output = self.async_rollout_manager.generate_sequences(gen_batch)
        except BaseException:
            if stream is not None:
                self.rewards.abandon_stream(stream)
            raise
        if profile:
            self.llm_server_manager.stop_profile()
        timing_raw.update(output.meta_info.pop("timing", {}))
        tool_fields = output.meta_info.pop(TOOL_FIELDS_KEY, [])
        batch = batch.repeat(repeat_times=rollout_n, interleave=True).union(output)
        if "response_mask" not in batch.batch.keys():
            batch.batch["response_mask"] = compute_response_mask(batch)
        generation_metrics: dict = {}  # logged by the step that trains this batch, as verl's step logs them
        if self.config.trainer.balance_batch:
            self._balance_batch(batch, metrics=generation_metrics)  # before submitting: rows refer to this order
        batch.meta_info["global_token_num"] = torch.sum(batch.batch["attention_mask"], dim=-1).tolist()
        batch.meta_info["images_seqlens"] = images_seqlens(batch)
        with marked_timer("reward_submit", timing_raw, color="yellow"):
            if stream is not None:
                # the sample of generation row r is index r of the ticket; balancing moved the rows
                sources = batch.non_tensor_batch.pop(ROW_KEY)
                uids = batch.non_tensor_batch["uid"]
                rewards = self.rewards.close_stream(stream, {int(r): (i,) for i, r in enumerate(sources)},
                                                    {int(r): uids[i] for i, r in enumerate(sources)})
            else:
                requests = decode_requests(batch, self.tokenizer, self.rewards.settings.reward_fn_key, tool_fields)
                # verl's own mini-batches, in row order: the agent may send the first one's groups first
                in_row_order = self.strategy.mini_batch_pipeline and self.strategy.mini_batch_order == "index"
                rewards = self.rewards.submit(
                    requests, rows_per_mini_batch=self.plan.samples_per_mini_batch if in_row_order else None)
        return GeneratedBatch(batch, rewards, epoch, loader_state, weights_step=self.global_steps - 1,
                              metrics=generation_metrics)

    # -- one step ---------------------------------------------------------------------------------
    def _train_step(self, current: GeneratedBatch, metrics: dict, timing_raw: dict, is_last_step: bool) -> DataProto:
        batch = current.batch
        # per sample: policy updates between the weights that generated it and the ones it trains
        batch.non_tensor_batch[STALENESS_COLUMN] = object_array([self.global_steps - 1 - current.weights_step] * len(batch))
        ops = V0Ops(self, expected_rows=self.plan.samples_per_mini_batch * self.plan.mini_batches)
        metrics.update(current.metrics)  # its generation's: global_seqlen/* (verl's _balance_batch)
        self._compute_policy_inputs(batch, ops, metrics, timing_raw)
        update_actor = self.config.trainer.critic_warmup <= self.global_steps
        kl_controller = self.kl_ctrl_in_reward if self.config.algorithm.use_kl_in_reward else None
        metrics.update(self.scheduler.train(ops, batch, current.rewards, update_actor=update_actor,
                                            timing_raw=timing_raw, kl_controller=kl_controller))
        self._save_and_sync(update_actor, is_last_step, timing_raw)
        metrics.update(self.scheduler.reward_metrics(current, self.global_steps))
        metrics.update(self._heap_metrics)
        if self.drift is not None:  # async_rm/drift/*: a check runs beside the steps (drift.py)
            metrics.update(self.drift.metrics(self.global_steps, last=is_last_step))
        metrics["async_reward/wall_clock"] = time.time()
        rollout_data_dir = self.config.trainer.get("rollout_data_dir", None)
        if rollout_data_dir:
            extra = {key: batch.non_tensor_batch[key] for key in self.rewards.fixed_keys}
            if self.rewards.settings.agent.failure.masks_loss:
                # what the updates trained on: a masked row has no loss tokens and a zero advantage
                extra[LOSS_TOKENS_COLUMN] = batch.batch["response_mask"].sum(-1).tolist()
                extra[ADVANTAGE_COLUMN] = batch.batch["advantages"][:, 0].tolist()
            self._log_rollout_data(batch, {"uid": batch.non_tensor_batch["uid"], **extra}, timing_raw, rollout_data_dir)
        return batch

    def _compute_policy_inputs(self, batch: DataProto, ops: V0Ops, metrics: dict, timing_raw: dict) -> None:
        """Old log-probs (pi_old, the same for every mini-batch), reference log-probs, values and
        rollout correction, for the whole batch, while its rewards are in flight. As verl's loop."""
        rollout_corr = self.config.algorithm.get("rollout_correction", None)
        bypass = rollout_corr and rollout_corr.get("bypass_mode", False)
        if bypass:
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
                if "routed_experts" in batch.batch and "routed_experts" in old_log_prob.batch:
                    raise ValueError(
                        "Detected conflicting router replay configuration: router_replay.mode='R2' and "
                        "enable_rollout_routing_replay=True cannot be enabled simultaneously."
                    )
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
        if rollout_corr is not None and "rollout_log_probs" in batch.batch.keys() and not bypass:
            # Reads only log-probs and the mask, never rewards: computed once for the whole batch (its
            # statistics are the batch's), applied to each mini-batch after its KL penalty.
            from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_and_add_to_batch

            probe = DataProto(batch=batch.batch.select("old_log_probs", "rollout_log_probs", "response_mask").clone())
            probe, correction_metrics = compute_rollout_correction_and_add_to_batch(probe, rollout_corr)
            ops.correction = (probe.batch["response_mask"], probe.batch.get("rollout_is_weights", None))
            metrics.update(correction_metrics)

    def _save_and_sync(self, updated_actor: bool, is_last_step: bool, timing_raw: dict) -> None:
        if not updated_actor:  # critic warm-up: only wake the rollout replicas
            self.checkpoint_manager.update_weights(self.global_steps)
            return
        esi_expiring = should_save_ckpt_esi(
            max_steps_duration=self.max_steps_duration, redundant_time=self.config.trainer.esi_redundant_time
        )
        save_freq = self.config.trainer.save_freq
        if save_freq > 0 and (is_last_step or self.global_steps % save_freq == 0 or esi_expiring):
            if esi_expiring:
                print("Force saving checkpoint: ESI instance expiration approaching.")
            with marked_timer("save_checkpoint", timing_raw, color="green"):
                self._save_checkpoint()
        with marked_timer("update_weights", timing_raw, color="red"):
            self.checkpoint_manager.update_weights(self.global_steps)
