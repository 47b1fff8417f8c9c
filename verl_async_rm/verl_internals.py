"""Every verl 0.9.1 internal this package touches that is not a documented, stable API: private
methods and attributes of verl's trainers and workers we call or override, module globals we patch
or register into, helpers whose signature we rely on. One list, checked against the installed verl
(presence, and the parameters we pass or override) by ``tests/seam/test_verl_internals.py`` and by
:func:`require_all` when a run starts (the trainer strategies' trainers, the ``async_agent`` manager,
the group-size agent-loop managers), so a verl patch release that moved one is refused at start, by
name, not hours in at first use.

Each entry: (module, dotted attribute, parameters the code relies on (present, in this order) or
None, who relies on it).
Light to import (no verl import): ``missing()`` does the checking.
"""

from __future__ import annotations

import functools
import importlib
import inspect
from typing import Optional, Sequence

V0_TRAINER = "verl.trainer.ppo.ray_trainer"
V1_TRAINER = "verl.trainer.ppo.v1.trainer_base"

INTERNALS: tuple[tuple[str, str, Optional[tuple[str, ...]], str], ...] = (
    # -- v0 trainer: strategies/v0.py (fit's loop around our step body; the step's verl functions) --
    (V0_TRAINER, "RayPPOTrainer.fit", ("self",), "v0.py overrides it"),
    (V0_TRAINER, "RayPPOTrainer._validate", ("self", "merged"), "v0.py calls it"),
    (V0_TRAINER, "RayPPOTrainer._load_checkpoint", ("self",), "v0.py"),
    (V0_TRAINER, "RayPPOTrainer._save_checkpoint", ("self",), "v0.py overrides it (loader state)"),
    (V0_TRAINER, "RayPPOTrainer._get_gen_batch", ("self", "batch"), "v0.py"),
    (V0_TRAINER, "RayPPOTrainer._balance_batch", ("self", "batch", "metrics", "logging_prefix", "keep_minibatch"), "v0.py"),
    (V0_TRAINER, "RayPPOTrainer._compute_old_log_prob", ("self", "batch"), "v0.py"),
    (V0_TRAINER, "RayPPOTrainer._compute_ref_log_prob", ("self", "batch"), "v0.py"),
    (V0_TRAINER, "RayPPOTrainer._compute_values", ("self", "batch"), "v0.py"),
    (V0_TRAINER, "RayPPOTrainer._update_actor", ("self", "batch"), "v0.py, once per update call"),
    (V0_TRAINER, "RayPPOTrainer._update_critic", ("self", "batch"), "v0.py, once per update call"),
    (V0_TRAINER, "RayPPOTrainer._log_rollout_data", ("self", "batch", "reward_extra_infos_dict", "timing_raw", "rollout_data_dir"), "v0.py"),
    (V0_TRAINER, "RayPPOTrainer._init_dump_executor", ("self",), "v0.py"),
    (V0_TRAINER, "RayPPOTrainer._shutdown_dump_executor", ("self",), "v0.py"),
    (V0_TRAINER, "RayPPOTrainer._start_profiling", ("self", "do_profile"), "v0.py"),
    (V0_TRAINER, "RayPPOTrainer._stop_profiling", ("self", "do_profile", "run_command"), "v0.py"),
    (V0_TRAINER, "apply_kl_penalty", ("data", "kl_ctrl", "kl_penalty"), "v0.py (with strategies/kl.py's controller)"),
    (V0_TRAINER, "compute_advantage", ("data", "adv_estimator", "gamma", "lam", "num_repeat", "norm_adv_by_std_in_grpo", "config"), "v0.py"),
    (V0_TRAINER, "compute_response_mask", ("data",), "v0.py"),
    (V0_TRAINER, "compute_spec_decode_metrics", None, "v0.py"),
    ("verl.trainer.ppo.rollout_corr_helper", "compute_rollout_correction_and_add_to_batch", ("batch", "rollout_corr_config"), "v0.py, v1.py"),
    ("verl.trainer.ppo.rollout_corr_helper", "apply_bypass_mode", ("batch", "rollout_corr_config", "policy_loss_config"), "v0.py"),
    ("verl.utils.checkpoint.checkpoint_manager", "should_save_ckpt_esi", ("max_steps_duration", "redundant_time"), "v0.py"),
    ("verl.utils.skip.skip_manager", "SkipManager.set_step", None, "v0.py"),
    ("verl.utils.debug.metrics", "calculate_debug_metrics", ("data",), "v0.py"),
    ("verl.checkpoint_engine.base", "CheckpointEngineManager.sleep_replicas", ("self",), "v0.py, once per step"),
    ("verl.checkpoint_engine.base", "CheckpointEngineManager.update_weights", ("self", "global_steps"), "v0.py"),
    # -- v0 task runner: strategies/v0_runner.py ------------------------------------------------------
    ("verl.trainer.main_ppo_v0", "TaskRunner", None, "v0_runner.py borrows its run()"),
    ("verl.trainer.main_ppo_v0", "BaseTaskRunner.add_actor_rollout_worker", ("self", "config"), "v0_runner.py"),
    ("verl.trainer.main_ppo_v0", "BaseTaskRunner.add_critic_worker", ("self", "config"), "v0_runner.py"),
    ("verl.trainer.main_ppo_v0", "RayPPOTrainer", None, "v0_runner.py swaps it in its actor process"),
    # -- v1 trainer: strategies/v1.py -------------------------------------------------------------------
    ("verl.trainer.ppo.v1", "register_trainer", ("name",), "v1.py registers the async_reward mode"),
    ("verl.trainer.ppo.v1.trainer_sync", "PPOTrainerSync", None, "v1.py subclasses it"),
    (V1_TRAINER, "PPOTrainer._build_replay_buffer", ("self",), "v1.py overrides it"),
    (V1_TRAINER, "PPOTrainer._init_resource_pool_mgr", ("self",), "v1.py overrides it (worker classes)"),
    (V1_TRAINER, "PPOTrainer._add_batch_to_generate", ("self",), "v1.py"),
    (V1_TRAINER, "PPOTrainer._balance_batch", ("self", "batch", "metrics", "logging_prefix", "keep_minibatch"), "v1.py"),
    (V1_TRAINER, "PPOTrainer._compute_old_log_prob", ("self", "batch", "metrics"), "v1.py"),
    (V1_TRAINER, "PPOTrainer._compute_ref_log_prob", ("self", "batch", "metrics"), "v1.py"),
    (V1_TRAINER, "PPOTrainer._compute_values", ("self", "batch", "metrics"), "v1.py"),
    (V1_TRAINER, "PPOTrainer._compute_advantage", ("self", "batch", "metrics"), "v1.py, per mini-batch"),
    (V1_TRAINER, "tq", None, "v1_scores_io.py: the module global _compute_advantage reads and writes through, "
                             "replaced for one call (its scores read served, its write carrying them)"),
    (V1_TRAINER, "PPOTrainer._update_actor", ("self", "batch", "metrics"), "v1.py, per update call"),
    (V1_TRAINER, "PPOTrainer._update_critic", ("self", "batch", "metrics"), "v1.py, per update call"),
    (V1_TRAINER, "PPOTrainer._compute_reward_colocate", ("self", "batch", "metrics"), "v1.py overrides it (validation)"),
    (V1_TRAINER, "PPOTrainer._lengths_to_mask", ("lengths", "width"), "v1.py"),
    (V1_TRAINER, "PPOTrainer._save_checkpoint", ("self",), "v1.py overrides it (loader state)"),
    (V1_TRAINER, "PPOTrainer._validate", ("self",), "its reward extra info: v1.py writes extra_fields for it"),
    (V1_TRAINER, "PPOTrainer.step", ("self", "metrics", "timing_raw"), "v1.py overrides it"),
    (V1_TRAINER, "PPOTrainer.on_init_end", ("self",), "v1.py overrides it"),
    ("verl.trainer.ppo.v1.agent_loop_tq", "AgentLoopManagerTQ.generate_sequences", ("self", "prompts"), "integration/group_size_v1.py"),
    ("verl.trainer.ppo.v1.agent_loop_tq", "AgentLoopWorkerTQ.__ray_actor_class__._run_prompt",
     ("self", "prompt", "sampling_params", "trajectory", "trace"), "group_size_v1.py overrides it (each dispatch's attempt)"),
    ("verl.trainer.ppo.v1.agent_loop_tq", "AgentLoopWorkerTQ.__ray_actor_class__._run_agent_loop",
     ("self", "sampling_params", "trajectory", "agent_name", "trace", "kwargs"),
     "group_size_v1.py overrides it (a failed session withdrawn)"),
    # -- workers: strategies/workers.py ------------------------------------------------------------------
    ("verl.workers.engine_workers", "ActorRolloutRefWorker.update_actor", ("self", "data"), "workers.py overrides it"),
    ("verl.workers.engine_workers", "TrainingWorker.train_mini_batch", ("self", "data"), "workers.py overrides it"),
    ("verl.workers.engine.base", "BaseEngine.lr_scheduler_step", ("self",), "workers.py shadows it per call"),
    ("verl.workers.engine.base", "BaseEngine.to", ("self", "device", "model", "optimizer", "grad"), "workers.py counts and calls it"),
    ("verl.workers.engine.base", "BaseEngine.train_mode", None, "workers.py wraps it per call (load/offload count)"),
    ("verl.workers.engine.base", "BaseEngine.is_param_offload_enabled", None, "workers.py"),
    ("verl.workers.engine.base", "BaseEngine.is_optimizer_offload_enabled", None, "workers.py"),
    ("verl.workers.engine.base", "BaseEngineCtx._context_switch", ("self", "device"), "workers.py does its moves itself"),
    ("verl.single_controller.base.decorator", "make_nd_compute_dataproto_dispatch_fn", ("mesh_name",), "workers.py"),
    # -- agent loops and reward managers: strategies/agent_loop.py, integration/* -------------------------
    ("verl.experimental.agent_loop.agent_loop", "AgentLoopManager.generate_sequences", ("self", "prompts"), "agent_loop.py, group_size_v0.py"),
    ("verl.experimental.agent_loop.agent_loop", "AgentLoopManager.__init__",
     ("self", "config", "llm_client", "teacher_client", "reward_loop_worker_handles"), "agent_loop.py"),
    ("verl.experimental.agent_loop.agent_loop", "AgentLoopWorker._compute_score", ("self", "outputs", "kwargs"),
     "group_sizes.py: prompt columns reach run_single"),
    ("verl.experimental.agent_loop.agent_loop", "AgentLoopWorker._postprocess", ("self", "inputs", "input_non_tensor_batch", "validate"),
     "agent_loop.py: extra-field columns"),
    ("verl.experimental.reward_loop.reward_manager.base", "RewardManagerBase.assemble_rm_scores", ("data", "scores"), "agent_loop.py"),
    # -- score while generating: strategies/streaming.py, streaming_v1.py, v1.py -----------------------
    ("verl.experimental.agent_loop.agent_loop", "AgentLoopWorker.generate_sequences", ("self", "batch"), "streaming.py overrides it"),
    ("verl.experimental.agent_loop.agent_loop", "AgentLoopWorker._agent_loop_postprocess", ("self", "output", "validate", "kwargs"),
     "streaming.py overrides it (the per-sample hook)"),
    ("verl.experimental.agent_loop.agent_loop", "AgentLoopManager._init_agent_loop_workers", ("self",),
     "streaming: agent_loop_workers_class is read here"),
    ("verl.trainer.ppo.v1.agent_loop_tq", "AgentLoopWorkerTQ.__ray_actor_class__", None, "streaming_v1.py subclasses it"),
    ("verl.trainer.ppo.v1.agent_loop_tq", "AgentLoopWorkerTQ.__ray_actor_class__._agent_loop_postprocess",
     ("self", "output", "validate", "kwargs"), "streaming_v1.py overrides it"),
    (V1_TRAINER, "PPOTrainer._submit_batch_to_rollout", ("self", "batch"), "v1.py overrides it (opens the step's ticket)"),
    ("verl.experimental.reward_loop.reward_manager.base", "RewardManagerBase.run_single", ("self", "data"), "reward_manager.py"),
    ("verl.experimental.reward_loop.reward_manager.registry", "register", None, "integration/register.py"),
    ("verl.workers.reward_manager.registry", "register", None, "integration/register.py"),
    ("verl.protocol", "pad_dataproto_to_divisor", ("data", "size_divisor"), "decode.real_length_of_padded undoes it"),
    ("verl.trainer.ppo.core_algos", "ADV_ESTIMATOR_REGISTRY", None, "plan.py classifies every estimator"),
    ("verl.trainer.ppo.core_algos", "AdaptiveKLController.update", ("self", "current_kl", "n_steps"), "kl.py"),
    # -- failure_policy=mask: masking.py (what it relies on), strategies/v1.py ---------------------------
    ("verl.trainer.ppo.core_algos", "agg_loss",
     ("loss_mat", "loss_mask", "loss_agg_mode", "dp_size", "batch_num_tokens", "global_batch_size"),
     "masking.py: token modes divide by the mask's tokens, seq-mean modes by global_batch_size"),
    ("verl.workers.utils.losses", "ppo_loss", ("config", "model_output", "data"), "masking.py, tests/seam/test_masking_verl.py"),
    ("verl.workers.utils.losses", "value_loss", ("config", "model_output", "data"), "masking.py: the critic's loss, same mask"),
    ("verl.workers.utils.padding", "left_right_2_no_padding", ("data",), "masking.py: v0's loss_mask is its response_mask"),
    (V1_TRAINER, "PPOTrainer._log_rollout_data", ("self", "batch", "timing_raw", "rollout_data_dir"), "v1.py overrides it (mask columns)"),
    (V1_TRAINER, "PPOTrainer._dump_generations",
     ("self", "inputs", "outputs", "gts", "scores", "reward_extra_infos_dict", "dump_path"), "v1.py overrides it (mask columns)"),
    # -- our entry point: main_ppo.py (verl's driver, for the v0 strategies' TaskRunner) ------------------
    ("verl.trainer.main_ppo", "run_ppo", ("config", "task_runner_class"), "main_ppo.run (v0 strategies)"),
    ("verl.utils.device", "auto_set_device", ("config",), "main_ppo.check_as_verls_driver"),
    ("verl.utils.config", "validate_config", ("config", "use_reference_policy", "use_critic"), "main_ppo.check_as_verls_driver"),
)


# Not verl's, but private all the same: hydra's, used by integration/stock_entry.py (the install
# helper's hook on verl's own entry point). Checked the same way as verl's.
OTHER_INTERNALS: tuple[tuple[str, str, Optional[tuple[str, ...]], str], ...] = (
    ("hydra.plugins.config_source", "ConfigSource._normalize_file_name", ("filename",), "integration/stock_entry.py"),
    ("hydra.plugins.config_source", "ConfigSource._get_header_dict", ("config_text",), "integration/stock_entry.py"),
)

# Instance attributes (set in a verl method, so not on the class): (module, class, attribute, the
# method that sets it, who relies on it). ``ThreadPoolExecutor._shutdown`` is the standard library's,
# read exactly as verl's own fit reads it.
INSTANCE_ATTRIBUTES: tuple[tuple[str, str, str, str, str], ...] = (
    (V0_TRAINER, "RayPPOTrainer", "_dump_executor", "_init_dump_executor", "v0.py"),
    ("concurrent.futures", "ThreadPoolExecutor", "_shutdown", "__init__", "v0.py, as verl's fit"),
    ("verl.trainer.ppo.ray_trainer", "RayPPOTrainer", "kl_ctrl_in_reward", "__init__", "v0.py"),
    (V1_TRAINER, "PPOTrainer", "kl_ctrl_in_reward", "__init__", "v1.py swaps it for one step"),
    (V1_TRAINER, "PPOTrainer", "trainer_mode", "__init__", "v1.py"),
    (V1_TRAINER, "PPOTrainer", "reward_loop_manager", "_setup", "v1.py hides its handles"),
    ("verl.experimental.agent_loop.agent_loop", "AgentLoopManager", "reward_loop_worker_handles", "__init__",
     "group_size_v1.py: none, no scoring in the agent loop"),
    ("verl.experimental.agent_loop.agent_loop", "AgentLoopWorker", "reward_loop_worker_handles", "__init__",
     "group_size_v1.py: none, no scoring in the agent loop"),
)


def _resolve(module_name: str, dotted: str):
    obj = importlib.import_module(module_name)
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj


def missing(internals: Sequence[tuple[str, str, Optional[tuple[str, ...]], str]] = INTERNALS) -> list[str]:
    """What the installed verl lacks or has changed, one line each (empty: all present as expected)."""
    problems = []
    for module_name, dotted, params, user in internals:
        try:
            obj = _resolve(module_name, dotted)
        except (ImportError, AttributeError) as exc:
            problems.append(f"{module_name}.{dotted} is missing ({type(exc).__name__}: {exc}); used by {user}")
            continue
        if params is None:
            continue
        target = getattr(obj, "fget", obj)
        target = getattr(target, "__wrapped__", target)
        try:
            found = tuple(inspect.signature(target).parameters)
        except (TypeError, ValueError):
            continue
        positions = [found.index(name) if name in found else -1 for name in params]
        if -1 in positions or positions != sorted(positions):
            problems.append(f"{module_name}.{dotted} takes {found}, expected {params} among them, in order; used by {user}")
    return problems


def missing_instance_attributes(entries=INSTANCE_ATTRIBUTES) -> list[str]:
    """Instance attributes whose setter no longer assigns them (read from the setter's source)."""
    problems = []
    for module_name, cls, attribute, setter, user in entries:
        try:
            source = inspect.getsource(_resolve(module_name, f"{cls}.{setter}"))
        except (ImportError, AttributeError, OSError, TypeError) as exc:
            problems.append(f"{module_name}.{cls}.{setter} is missing ({exc}); used by {user}")
            continue
        if f"self.{attribute} =" not in source and f"self.{attribute}:" not in source:
            problems.append(f"{module_name}.{cls}.{setter} no longer sets self.{attribute}; used by {user}")
    return problems


@functools.cache
def _problems() -> tuple[str, ...]:
    # once per process: the modules are imported by then (a run's trainer, manager or agent loop), so
    # the check costs a few hundred milliseconds at most
    return (*missing(), *missing(OTHER_INTERNALS), *missing_instance_attributes())


def require_all(feature: str) -> None:
    """Refuse to start ``feature`` on a verl that lacks or changed any internal on the lists, all named."""
    problems = _problems()
    if problems:
        from verl_async_rm.verl_compat import VerlVersionError, verl_version

        raise VerlVersionError(
            f"{feature} cannot run on verl {verl_version()}: it relies on verl internals that this release lacks or "
            "changed:\n  " + "\n  ".join(problems) + "\nInstall a verl this package supports, or report it."
        )
