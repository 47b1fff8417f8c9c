"""Launcher: verl's own ``main_ppo`` (v0 or v1 trainer) on CPU, as a subprocess, with progress.

``build_overrides()`` returns the hydra override list (settings that make verl 0.9.1 run on CPU,
plus the caller's reward and extra overrides); ``run()`` prepares model/data if needed, runs the
entry module in its own Ray cluster with a timeout, shows per-step progress from verl's metrics
file, and returns the metrics (JSONL written by verl's ``file`` logger). ``start()`` does the same
without waiting, for callers that run several trainers (the demo, with ``start_gate``).

Why a subprocess: main_ppo calls ``ray.init`` itself and owns the process; running it in a child
lets a hang fail by timeout and lets us kill exactly the processes it started.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

from . import ENV_FLAG, TMP_DIR_ENV, router
from .names import DECODE_S_ENV, LIGHT_DRIVER_ENV, NO_WEIGHT_SYNC_ENV, REPLICA_LOG_ENV, ROLLOUT_NAME, WEIGHT_SYNC_S_ENV
from .assets import ASSETS_ENV, asset_paths, build_assets_once
from .finish_marker import FINISHED_ENV
from .processes import kill_tree, reap_leftovers, run_processes, signal_run
from .start_gate import GATE_ENV, open_gate, waiting_marker

DEFAULT_ENTRY = "verl.trainer.main_ppo"
OUR_ENTRY = "verl_async_rm.main_ppo"  # ours: verl's plus our settings and strategies
# ... which the launcher runs through the rig's wrapper of it (entry.py: the light driver, the finish marker)
OUR_ENTRY_AS_LAUNCHED = "verl_async_rm_rig.cpu_backend.entry"


@dataclass
class CPURunConfig:
    out_dir: str
    trainer: str = "v1"  # "v1" (trainer.use_v1=True, verl's default) or "v0" (legacy RayPPOTrainer)
    steps: int = 2
    seed: int = 0
    # model/data: built under out_dir when not given (tiny random Qwen2, toy "letter case" task)
    model_dir: Optional[str] = None
    train_file: Optional[str] = None
    val_file: Optional[str] = None
    # ... or built in this directory when none of the three is given, once among the runs sharing it
    # (assets.py): with light_driver by the run itself, in its TaskRunner process, which imports torch
    # and transformers anyway (the demo: its runs start without waiting for a build); else before the
    # run starts.
    assets_dir: Optional[str] = None
    # GRPO shape: train_batch_size prompts x rollout_n samples per step
    train_batch_size: int = 8
    rollout_n: int = 4
    max_prompt_length: int = 64
    response_length: int = 16
    lr: float = 1e-2  # high for RL, right for an ~80k-param model: the toy reward rises within ~20 steps
    # validation / checkpoints (verl semantics: -1 disables)
    val_before_train: bool = True
    test_freq: int = -1
    save_freq: int = -1
    resume: bool = True  # trainer.resume_mode=auto: continue from the latest checkpoint in out_dir
    # reward: a file/function in verl's custom_reward_function format; default the toy task's
    reward_path: Optional[str] = None
    reward_name: str = "compute_score"
    reward_kwargs: dict[str, Any] = field(default_factory=dict)
    reward_manager: Optional[str] = None  # reward.reward_manager.name (e.g. "naive", "async_agent")
    weight_sync: bool = True  # False: negative control, rollout keeps its initial weights
    # verl's rollout.full_determinism: every sample drawn from its own seeded generator, so two runs
    # of the same config generate the same responses (rollout.py); off by default, as in verl.
    deterministic: bool = False
    extra_overrides: list[str] = field(default_factory=list)  # appended last, so they win
    entry_module: str = DEFAULT_ENTRY  # e.g. "verl_async_rm.main_ppo"
    num_cpus: int = 8  # Ray logical CPUs (verl schedules several CPU actors; 2 real cores are fine)
    timeout_s: Optional[float] = 900.0
    verbose: bool = False  # echo the trainer's output (always written to out_dir/train-N.log)
    extra_env: dict[str, str] = field(default_factory=dict)
    # v1 only: poll TransferQueue every N s instead of verl's fixed 2 s (see v1_sampler.py). None
    # keeps verl's built-in sampler; set e.g. 0.05 when step timings matter (benchmarks).
    v1_poll_interval_s: Optional[float] = None
    # Seconds of simulated decode time per generated token (names.DECODE_S_ENV; 0: the tiny model's own
    # speed). verl's colocate_async aborts the requests still generating at each step's sample: with
    # the tiny model's ~1 ms a token almost none are, with a GPU's 10-50 ms many are.
    decode_s: float = 0.0
    # Seconds of simulated time per weight update (names.WEIGHT_SYNC_S_ENV; 0: the tiny model's ~1 ms).
    weight_sync_s: float = 0.0
    # Wait after the validation before step 1 until RunningTrainer.open_gate() (start_gate.py): lets
    # several runs start up together and then train one at a time (the demo).
    start_gate: bool = False
    # Drive the run without importing verl in the driver process (light_driver.py): ~6 CPU-s less a
    # run, which counts when several runs start together (the demo). Needs entry_module
    # "verl_async_rm.main_ppo"; tests keep verl's own driver.
    light_driver: bool = False
    # Run as a job on this running Ray cluster (shared_cluster.SharedCluster.address) instead of a
    # cluster of its own: several runs then share one set of Ray daemons (the demo). num_cpus is
    # the cluster's business then.
    ray_address: Optional[str] = None


@dataclass
class RunResult:
    returncode: int
    wall_time_s: float
    metrics: list[dict]  # [{"step": int, "data": {...}}, ...] from this run
    metrics_path: str
    log_path: str
    overrides: list[str]
    replica_log_path: str = ""  # the rollout servers' sleep/wake/weight-update transitions (JSONL)
    gate_reached_s: Optional[float] = None  # with a start gate: seconds from launch to waiting at it
    gate_opened_s: Optional[float] = None  # ... and to its opening

    def replica_events(self) -> list[dict]:
        return read_metrics(self.replica_log_path) if self.replica_log_path else []

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    def series(self, key: str) -> list[tuple[int, float]]:
        return [(m["step"], m["data"][key]) for m in self.metrics if key in m["data"]]


def toy_reward_path() -> str:
    from . import toy_task

    return os.path.abspath(toy_task.__file__)


def prepare_assets(cfg: CPURunConfig) -> CPURunConfig:
    """Build the tiny model and the toy dataset if the caller gave none: in ``cfg.assets_dir`` if set
    (once among processes sharing it), else under ``out_dir``."""
    if cfg.assets_dir is not None:
        name_assets(cfg)
        build_assets_once(cfg.assets_dir, cfg.seed)
        return cfg
    from .tiny_model import build_tiny_model
    from .toy_task import write_dataset

    os.makedirs(cfg.out_dir, exist_ok=True)
    if cfg.model_dir is None:
        cfg.model_dir = build_tiny_model(os.path.join(cfg.out_dir, "model"))
    if cfg.train_file is None or cfg.val_file is None:
        train, val = write_dataset(os.path.join(cfg.out_dir, "data"), seed=cfg.seed)
        cfg.train_file = cfg.train_file or train
        cfg.val_file = cfg.val_file or val
    return cfg


def name_assets(cfg: CPURunConfig) -> CPURunConfig:
    """Point model_dir/train_file/val_file into ``cfg.assets_dir``, without building anything."""
    paths = asset_paths(cfg.assets_dir, cfg.seed)
    given = (cfg.model_dir, cfg.train_file, cfg.val_file)
    if given != (None, None, None) and given != (paths.model_dir, paths.train_file, paths.val_file):
        raise ValueError("give assets_dir or model_dir/train_file/val_file, not both")
    cfg.model_dir, cfg.train_file, cfg.val_file = paths.model_dir, paths.train_file, paths.val_file
    return cfg


def builds_assets_in_run(cfg: CPURunConfig) -> bool:
    """The run builds its assets itself (light_driver.TaskRunnerHost), after its verl imports."""
    return cfg.assets_dir is not None and cfg.light_driver


def _hydra_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # quoted, so commas/colons survive hydra's parser
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{_hydra_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_hydra_value(v) for v in value) + "]"
    raise TypeError(f"cannot express {value!r} as a hydra override")


TRAINER_MODE_KEY = "trainer.v1.trainer_mode"
# Why the CPU backend cannot run verl's separate_async (verl 0.9.1, trainer_separate_async.py): it
# asserts a checkpoint engine other than "naive" to carry the weights from the trainer's process to
# rollout replicas in a resource pool of their own (rollout.nnodes/n_gpus_per_node > 0). verl's other
# engines are GPU transports (nccl and hccl on cupy/torch_npu, nixl, mooncake, kimi) or build on one
# (delta_sharded), and the rig's hf_cpu rollout hosts each replica's engine in the trainer worker,
# with one fake GPU for the whole run: no CPU transport, no pool of rollout's own.
SEPARATE_ASYNC_REFUSAL = (
    "trainer.v1.trainer_mode=separate_async cannot run on the CPU backend: verl's separate_async needs a "
    "non-naive checkpoint engine (actor_rollout_ref.rollout.checkpoint_engine.backend: nccl/nixl/mooncake/"
    "hccl/kimi, all GPU transports) to send weights to rollout replicas in a resource pool of their own "
    "(actor_rollout_ref.rollout.nnodes and n_gpus_per_node > 0), and the CPU backend has neither a CPU "
    "weight transport nor a separate rollout pool (its hf_cpu replicas live in the trainer worker, on the "
    "run's one fake GPU). Use trainer.v1.trainer_mode=colocate_async (partial rollouts, verl's async "
    "replay buffer) or sync"
)


def v1_trainer_mode(overrides: list[str]) -> str:
    """The run's ``trainer.v1.trainer_mode`` as hydra will read it from ``overrides`` (the last
    assignment wins; ``+``/``++`` prefixes allowed), verl's default ``sync`` when none sets it."""
    mode = "sync"
    for override in overrides:
        key, sep, value = override.partition("=")
        if sep and key.lstrip("+") == TRAINER_MODE_KEY:
            mode = value.strip().strip("'\"")
    return mode


def fast_poll_sampler(trainer_mode: str) -> str:
    """v1_sampler's class for the mode: verl's sync ReplayBuffer or its ReplayBufferAsync, polling faster."""
    return "FastPollReplayBuffer" if trainer_mode == "sync" else "FastPollReplayBufferAsync"


def build_overrides(cfg: CPURunConfig, ray_tmp_dir: Optional[str] = None, replica_log: Optional[str] = None,
                    runtime_env_vars: Optional[dict[str, str]] = None) -> list[str]:
    """Hydra overrides for verl's ppo_trainer config that make the real trainer run on CPU.

    ``runtime_env_vars``: more variables for the run's Ray runtime env (a run on a shared cluster
    passes its environment this way: :func:`job_runtime_env_vars`)."""
    if cfg.trainer not in ("v0", "v1"):
        raise ValueError(f"trainer must be 'v0' or 'v1', got {cfg.trainer!r}")
    if cfg.model_dir is None or cfg.train_file is None or cfg.val_file is None:
        raise ValueError("call prepare_assets() first or pass model_dir/train_file/val_file")
    micro = cfg.train_batch_size * cfg.rollout_n
    ov = [
        # algorithm: GRPO, no critic, no reference model (no KL) -> one FSDP worker
        "algorithm.adv_estimator=grpo",
        "actor_rollout_ref.actor.use_kl_loss=false",
        "algorithm.use_kl_in_reward=false",
        # data (verl parquet); workers=0: forked loader workers crashed at teardown on CPU
        f"data.train_files={cfg.train_file}",
        f"data.val_files={cfg.val_file}",
        f"data.train_batch_size={cfg.train_batch_size}",
        f"data.max_prompt_length={cfg.max_prompt_length}",
        f"data.max_response_length={cfg.response_length}",
        "data.dataloader_num_workers=0",
        f"data.seed={cfg.seed}",
        # model: local tiny Qwen2, eager attention, padded batches (no flash-attn varlen on CPU)
        f"actor_rollout_ref.model.path={cfg.model_dir}",
        "actor_rollout_ref.model.use_remove_padding=false",
        "actor_rollout_ref.model.enable_gradient_checkpointing=false",
        "+actor_rollout_ref.model.override_config.attn_implementation=eager",
        # actor: FSDP2 in fp32 (CPU bf16 is slow and drifts from the fp32 rollout), no torch.compile
        "actor_rollout_ref.actor.strategy=fsdp2",
        "actor_rollout_ref.actor.use_torch_compile=false",
        "actor_rollout_ref.actor.fsdp_config.use_torch_compile=false",
        "actor_rollout_ref.actor.fsdp_config.model_dtype=fp32",
        "+actor_rollout_ref.actor.fsdp_config.mixed_precision={param_dtype:fp32,reduce_dtype:fp32,buffer_dtype:fp32}",
        f"actor_rollout_ref.actor.optim.lr={cfg.lr}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={cfg.train_batch_size}",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={micro}",
        f"actor_rollout_ref.actor.fsdp_config.seed={cfg.seed}",
        # rollout: HF on CPU, one replica, weight sync through the "naive" checkpoint engine
        f"actor_rollout_ref.rollout.name={ROLLOUT_NAME}",
        f"actor_rollout_ref.rollout.n={cfg.rollout_n}",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={micro}",
        "actor_rollout_ref.rollout.calculate_log_probs=true",
        "actor_rollout_ref.rollout.agent.num_workers=1",
        "actor_rollout_ref.rollout.checkpoint_engine.backend=naive",
        f"actor_rollout_ref.rollout.seed={cfg.seed}",
        # verl's router plugin point: the same routing, in a process that does not import verl (router.py)
        f"actor_rollout_ref.rollout.router_config_path={router.config_path()}",
        # reward
        f"reward.custom_reward_function.path={cfg.reward_path or toy_reward_path()}",
        f"reward.custom_reward_function.name={cfg.reward_name}",
        "reward.num_workers=1",
        # trainer
        f"trainer.use_v1={'true' if cfg.trainer == 'v1' else 'false'}",
        "trainer.device=cpu",
        "trainer.nnodes=1",
        "trainer.n_gpus_per_node=1",
        f"trainer.total_training_steps={cfg.steps}",
        "trainer.total_epochs=1000",
        "trainer.logger=[console,file]",
        "trainer.project_name=verl_async_rm_cpu",
        f"trainer.experiment_name=cpu_{cfg.trainer}",
        f"trainer.default_local_dir={os.path.join(os.path.abspath(cfg.out_dir), 'checkpoints')}",
        f"trainer.val_before_train={'true' if cfg.val_before_train else 'false'}",
        f"trainer.test_freq={cfg.test_freq}",
        f"trainer.save_freq={cfg.save_freq}",
        f"trainer.resume_mode={'auto' if cfg.resume else 'disable'}",
        # v1 stores batches in TransferQueue; 8 storage actors never get scheduled on a small box
        "transfer_queue.backend.SimpleStorage.num_data_storage_units=1",
    ]
    if cfg.ray_address:
        # a job on a running cluster (shared_cluster.py): Ray refuses cluster settings when connecting
        ov.append(f"+ray_kwargs.ray_init.address={_hydra_value(cfg.ray_address)}")
    else:
        # Ray: a fresh local cluster with one fake GPU for verl's placement groups
        ov += ["+ray_kwargs.ray_init.address=local", f"ray_kwargs.ray_init.num_cpus={cfg.num_cpus}",
               "+ray_kwargs.ray_init.num_gpus=1", "+ray_kwargs.ray_init.include_dashboard=false"]
        if ray_tmp_dir:
            ov.append(f"+ray_kwargs.ray_init._temp_dir={ray_tmp_dir}")
    env_vars = {ENV_FLAG: "1", **(runtime_env_vars or {})}
    if ray_tmp_dir:
        env_vars[TMP_DIR_ENV] = ray_tmp_dir
    if replica_log:
        env_vars[REPLICA_LOG_ENV] = replica_log
    if not cfg.weight_sync:
        env_vars[NO_WEIGHT_SYNC_ENV] = "1"
    ov += [f"+ray_kwargs.ray_init.runtime_env.env_vars.{key}={_hydra_value(str(value))}" for key, value in env_vars.items()]
    if cfg.deterministic:
        ov.append("actor_rollout_ref.rollout.full_determinism=true")
    if cfg.reward_kwargs:
        ov.append(f"+reward.custom_reward_function.reward_kwargs={_hydra_value(cfg.reward_kwargs)}")
    if cfg.reward_manager:
        ov.append(f"reward.reward_manager.name={cfg.reward_manager}")
    mode = v1_trainer_mode(cfg.extra_overrides)
    if cfg.trainer == "v1" and mode == "separate_async":
        raise ValueError(SEPARATE_ASYNC_REFUSAL)
    if cfg.v1_poll_interval_s is not None and cfg.trainer == "v1":
        if any("filter_groups" in o for o in cfg.extra_overrides):
            raise ValueError("v1_poll_interval_s replaces verl's sampler and does not support algorithm.filter_groups")
        from . import v1_sampler

        ov += [
            f"trainer.v1.sampler.custom_sampler.path={os.path.abspath(v1_sampler.__file__)}",
            f"trainer.v1.sampler.custom_sampler.name={fast_poll_sampler(mode)}",
            f"+trainer.v1.sampler.sampler_kwargs.poll_interval={cfg.v1_poll_interval_s}",
            f"+trainer.v1.sampler.sampler_kwargs.train_batch_size={cfg.train_batch_size}",
        ]
    if cfg.light_driver:
        from .light_driver import verl_config_searchpath

        ov.append(verl_config_searchpath())
    return ov + list(cfg.extra_overrides)


def base_env(environ: Optional[dict[str, str]] = None) -> dict[str, str]:
    """The environment every CPU run's processes share (a shared cluster's too: its raylet starts
    the workers with it): ``environ`` (default ours) without another cluster's address or a run's
    own settings, plus quiet, offline, single-threaded defaults."""
    env = dict(os.environ if environ is None else environ)
    for run_own in ("RAY_ADDRESS", TMP_DIR_ENV, NO_WEIGHT_SYNC_ENV, LIGHT_DRIVER_ENV, ASSETS_ENV):
        env.pop(run_own, None)  # RAY_ADDRESS: never attach to another cluster (e.g. a test session's)
    env.update(
        {
            ENV_FLAG: "1",
            "RAY_AUTH_MODE": "disabled",
            "RAY_USAGE_STATS_ENABLED": "0",
            "TOKENIZERS_PARALLELISM": "false",
            "OMP_NUM_THREADS": env.get("OMP_NUM_THREADS", "1"),
            # Ray prestarts idle workers when a cluster's first driver connects (two on a 2-core
            # machine), without the job's runtime env; every run's job has one (verl's ray_init and
            # this launcher's env vars), so no task or actor of a run ever takes them (Ray 2.60: an
            # actor of such a job starts a worker of its own beside the two idle ones). Each costs
            # ~0.3 CPU-s and ~80 MB at every run's start-up for nothing. Off for every run (the
            # tests' too), as the demo (demo.RAY_SETTINGS) and bench/e2e.py already had it; a shared
            # cluster gets it as well (SharedCluster starts its daemons with this environment), so
            # its runs match it (job_runtime_env_vars). An environment that sets it keeps its value.
            "RAY_prestart_worker_first_driver": env.get("RAY_prestart_worker_first_driver", "0"),
            "PYTHONUNBUFFERED": "1",
            "HYDRA_FULL_ERROR": "1",
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
        }
    )
    return env


def job_runtime_env_vars(run_env: Mapping[str, str], common_env: Mapping[str, str]) -> dict[str, str]:
    """The variables a run's workers need in their job's runtime env: those its environment sets
    differently from ``common_env``, the environment the shared cluster was started with
    (``launch.base_env()``; its raylet starts every worker with that, not with the run driver's).

    Ray's own settings (``RAY_*``) are read by the cluster's daemons when they start: a run cannot
    change them, so one that differs is refused rather than silently ignored. Nor can a runtime env
    unset a variable: one the cluster has and the run lacks is refused too."""
    ray_settings = sorted(k for k in set(run_env) | set(common_env)
                          if k.startswith("RAY_") and run_env.get(k) != common_env.get(k))
    if ray_settings:
        raise ValueError(f"a run on a shared Ray cluster cannot change Ray's settings {ray_settings}: "
                         "set them on the cluster (SharedCluster(ray_settings=...))")
    unset = sorted(set(common_env) - set(run_env))
    if unset:
        raise ValueError(f"a run on a shared Ray cluster cannot unset {unset}: the cluster's workers have them")
    return {k: v for k, v in run_env.items() if common_env.get(k) != v}


def build_env(cfg: CPURunConfig, metrics_path: str, tmp_dir: Optional[str] = None) -> dict[str, str]:
    env = base_env()
    if tmp_dir:
        env[TMP_DIR_ENV] = tmp_dir
    env["VERL_FILE_LOGGER_PATH"] = metrics_path
    if cfg.decode_s < 0:
        raise ValueError(f"decode_s must be >= 0 seconds per token, got {cfg.decode_s}")
    if cfg.decode_s:
        env[DECODE_S_ENV] = repr(float(cfg.decode_s))
    if cfg.weight_sync_s < 0:
        raise ValueError(f"weight_sync_s must be >= 0 seconds, got {cfg.weight_sync_s}")
    if cfg.weight_sync_s:
        env[WEIGHT_SYNC_S_ENV] = repr(float(cfg.weight_sync_s))
    if not cfg.weight_sync:
        env[NO_WEIGHT_SYNC_ENV] = "1"
    if cfg.light_driver:
        if cfg.entry_module != OUR_ENTRY:
            raise ValueError(f"light_driver needs entry_module={OUR_ENTRY!r}, not {cfg.entry_module!r}")
        env[LIGHT_DRIVER_ENV] = "1"
    if builds_assets_in_run(cfg):
        env[ASSETS_ENV] = json.dumps({"dir": os.path.abspath(cfg.assets_dir), "seed": cfg.seed})
    env.update(cfg.extra_env)
    return env


def _next_run_paths(out_dir: str) -> tuple[str, str]:
    # verl's FileLogger truncates its file; each run (e.g. a resume) gets metrics-N.jsonl/train-N.log.
    i = 0
    while os.path.exists(os.path.join(out_dir, f"metrics-{i}.jsonl")) or os.path.exists(
        os.path.join(out_dir, f"train-{i}.log")
    ):
        i += 1
    return os.path.join(out_dir, f"metrics-{i}.jsonl"), os.path.join(out_dir, f"train-{i}.log")


def read_metrics(path: str) -> list[dict]:
    if not os.path.exists(path):
        return []
    out = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line:
                try:
                    out.append(json.loads(line))
                except json.JSONDecodeError:
                    break  # a line being written
    return out


def read_all_metrics(out_dir: str) -> list[dict]:
    """Every run's metrics in out_dir, in run order (metrics-0.jsonl, metrics-1.jsonl, ...)."""
    out, i = [], 0
    while os.path.exists(os.path.join(out_dir, f"metrics-{i}.jsonl")):
        out.extend(read_metrics(os.path.join(out_dir, f"metrics-{i}.jsonl")))
        i += 1
    return out


REWARD_KEY = "critic/score/mean"


def _describe(entry: dict) -> str:
    data = entry["data"]
    parts = [f"reward={data[REWARD_KEY]:.4g}"] if REWARD_KEY in data else []
    # verl names validation metrics val-core/<data_source>/<metric>/mean@<n>
    parts += [f"val={v:.4g}" for k, v in data.items() if k.startswith("val-core/") and "/mean@" in k][:1]
    for key, label in (("training/rollout_probs_diff_max", "probs_diff_max"), ("timing_s/step", "step_s")):
        if key in data:
            parts.append(f"{label}={data[key]:.4g}")
    return " ".join(parts)


class RunningTrainer:
    """A trainer subprocess started by :func:`start`: poll it, open its start gate, wait for it.

    :func:`run` is ``start(cfg).wait()``. The demo starts several and polls them together."""

    def __init__(self, cfg: CPURunConfig, say=None, bar=None):
        from verl_async_rm.verl_compat import check_installed_version

        check_installed_version()  # fail here, not as a swallowed plugin error inside the trainer
        if cfg.start_gate and not cfg.val_before_train:
            raise ValueError("start_gate needs val_before_train: the gate follows the validation before step 1")
        if builds_assets_in_run(cfg):
            name_assets(cfg)  # the run builds them: a start that waits for no import here
        else:
            prepare_assets(cfg)
        os.makedirs(cfg.out_dir, exist_ok=True)
        self.cfg, self.say, self.bar = cfg, say, bar
        self.metrics_path, self.log_path = _next_run_paths(cfg.out_dir)
        self.replica_log = os.path.abspath(self.metrics_path.replace("metrics-", "replica-"))
        self.gate = (os.path.abspath(self.metrics_path.replace("metrics-", "gate-").replace(".jsonl", ""))
                     if cfg.start_gate else None)
        # Short path: Ray puts unix sockets under it (108-byte limit).
        self.ray_tmp_dir = tempfile.mkdtemp(prefix="vrc", dir="/tmp")
        env = build_env(cfg, self.metrics_path, self.ray_tmp_dir)
        if self.gate:
            env[GATE_ENV] = self.gate
        # the trainer's "training finished" marker: the run ends there, not after Ray's teardown
        self.finished_marker = os.path.abspath(self.metrics_path.replace("metrics-", "finished-").replace(".jsonl", ""))
        env[FINISHED_ENV] = self.finished_marker
        # On a shared cluster the workers are the shared raylet's children: the run's environment
        # reaches them through its runtime env (on a cluster of its own they inherit the driver's).
        job_env = job_runtime_env_vars(env, base_env()) if cfg.ray_address else None
        self.overrides = build_overrides(cfg, ray_tmp_dir=self.ray_tmp_dir, replica_log=self.replica_log,
                                         runtime_env_vars=job_env)
        module = OUR_ENTRY_AS_LAUNCHED if cfg.entry_module == OUR_ENTRY else cfg.entry_module
        cmd = [sys.executable, "-m", module, *self.overrides]
        if say:
            say(f"[cpu-backend] starting {cfg.entry_module} ({cfg.trainer}); Ray + workers take ~1 min; log: {self.log_path}")
        self.start_time = time.monotonic()
        self.gate_reached_s: Optional[float] = None  # seconds from start to the trainer waiting at the gate
        self.gate_opened_s: Optional[float] = None
        self.ended_s: Optional[float] = None
        self.timed_out = False
        self.frozen = False
        self._seen = 0
        self._log = open(self.log_path, "w")
        self._log.write("$ " + " ".join(cmd) + "\n\n")
        self._log.flush()
        self.proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, start_new_session=True, text=True
        )
        self._pump_thread = threading.Thread(target=self._pump, daemon=True)
        self._pump_thread.start()

    def _pump(self) -> None:
        for line in self.proc.stdout:
            self._log.write(line)
            if self.cfg.verbose:
                sys.stderr.write(line)
        self._log.flush()

    def elapsed(self) -> float:
        return time.monotonic() - self.start_time

    def poll(self) -> bool:
        """Report new steps, note the gate and the timeout; True once the trainer has ended."""
        if self.ended_s is not None:
            return True
        rc = self.proc.poll()
        entries = read_metrics(self.metrics_path)
        for entry in entries[self._seen:]:
            if self.say:
                self.say(f"[cpu-backend] step {entry['step']}: {_describe(entry)}")
            if self.bar is not None and "training/global_step" in entry["data"]:
                self.bar.update(1)
        self._seen = len(entries)
        if self.gate and self.gate_reached_s is None and waiting_marker(self.gate).exists():
            self.gate_reached_s = self.elapsed()
        if rc is None and self.cfg.timeout_s is not None and self.elapsed() > self.cfg.timeout_s:
            self.timed_out = True
        if rc is not None or self.timed_out or self.finished:
            self.ended_s = self.elapsed()
            return True
        return False

    @property
    def finished(self) -> bool:
        """The trainer marked its training finished (finish_marker.py): what follows is its teardown,
        which :meth:`close` cuts short."""
        return os.path.exists(self.finished_marker)

    @property
    def at_gate(self) -> bool:
        return self.gate_reached_s is not None and self.gate_opened_s is None

    def processes(self) -> list:
        """The run's live processes (psutil): its driver's tree and its Ray processes wherever they
        are parented (processes.py)."""
        return run_processes(self.proc, self.ray_tmp_dir)

    def freeze(self) -> None:
        """Stop every process of a run waiting at its gate (SIGSTOP) until :meth:`open_gate`.

        Why: a parked run is not idle. Its Ray cluster (GCS, raylet, a dozen workers) keeps part of a
        core busy, so a run that trained while others waited lost CPU by its place in the queue (the
        e2e report's ``queue_bias`` checks it; the demo's first lane took 9.1 s unfrozen, 6.6-6.8 s
        frozen). Frozen, they take nothing."""
        if not self.at_gate:
            raise ValueError("only a run waiting at its start gate can be frozen")
        if not self.frozen:
            self.frozen = True
            signal_run(self.proc, self.ray_tmp_dir, signal.SIGSTOP)

    def thaw(self) -> None:
        if self.frozen:
            signal_run(self.proc, self.ray_tmp_dir, signal.SIGCONT)
            self.frozen = False

    def open_gate(self) -> None:
        if not self.gate:
            raise ValueError("this run has no start gate (CPURunConfig.start_gate)")
        self.thaw()
        open_gate(self.gate)
        self.gate_opened_s = self.elapsed()

    def wait(self, poll_s: float = 0.5) -> RunResult:
        try:
            while not self.poll():
                time.sleep(poll_s)
        finally:
            self.close()
        return self.result()

    def close(self) -> None:
        """End the trainer if it still runs, and clean up everything it started (idempotent)."""
        self.thaw()  # a stopped process would hold SIGTERM until continued
        if self.proc.poll() is None:
            # a finished run is only tearing down: nothing left to save, so no grace period
            kill_tree(self.proc, grace_s=0 if self.finished else 10)
        self._pump_thread.join(timeout=10)
        if not self._log.closed:
            self._log.close()
        reap_leftovers(self.ray_tmp_dir)
        shutil.rmtree(self.ray_tmp_dir, ignore_errors=True)
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        if self.ended_s is None:
            self.ended_s = self.elapsed()

    def result(self) -> RunResult:
        cfg = self.cfg
        rc = self.proc.returncode if not self.timed_out else -9
        if self.finished and not self.timed_out:
            rc = 0  # training finished; the processes were ended during their teardown (close)
        if rc is None:
            rc = -9
        wall = self.ended_s if self.ended_s is not None else self.elapsed()
        if self.say and rc != 0:
            with open(self.log_path) as f:
                lines = f.readlines()
            why = f"rc={rc}, timeout after {cfg.timeout_s:.0f}s" if self.timed_out else f"rc={rc}"
            print(f"[cpu-backend] trainer failed ({why}); log: {self.log_path}", file=sys.stderr)
            # verl swallows plugin import errors (DEBUG log); ours print this marker, e.g. a version mismatch.
            plugin_errors = [line for line in lines if "plugin failed to load" in line]
            print("".join(plugin_errors[:3] + lines[-40:]), file=sys.stderr)
        elif self.say:
            print(f"[cpu-backend] done in {wall:.1f}s; metrics: {self.metrics_path}", file=sys.stderr)
        return RunResult(rc, wall, read_metrics(self.metrics_path), self.metrics_path, self.log_path, self.overrides,
                         self.replica_log, gate_reached_s=self.gate_reached_s, gate_opened_s=self.gate_opened_s)


def start(cfg: CPURunConfig, progress: bool = True) -> RunningTrainer:
    """Start verl's trainer on CPU in a subprocess; returns at once (see :class:`RunningTrainer`)."""
    bar = None
    if progress:
        try:
            from tqdm import tqdm

            bar = tqdm(total=cfg.steps, desc=f"verl {cfg.trainer} on CPU", unit="step", file=sys.stderr)
        except ImportError:
            bar = None
    say = (bar.write if bar is not None else (lambda s: print(s, file=sys.stderr, flush=True))) if progress else None
    try:
        return RunningTrainer(cfg, say=say, bar=bar)
    except BaseException:
        if bar is not None:
            bar.close()
        raise


def park_at_gates(trainers, poll_s: float = 0.2) -> None:
    """Wait until every run of ``trainers`` waits at its start gate (or has ended), freezing each as it
    arrives (:meth:`RunningTrainer.freeze`): the runs still starting get the CPU a parked one would
    take, and the run that trains first shares the machine with none of them."""
    while True:
        for trainer in trainers:
            if trainer.at_gate:
                trainer.freeze()
        if all(trainer.at_gate or trainer.poll() for trainer in trainers):
            break
        time.sleep(poll_s)
    for trainer in trainers:
        if trainer.at_gate:
            trainer.freeze()


def run(cfg: CPURunConfig, progress: bool = True) -> RunResult:
    """Run verl's trainer on CPU; returns the exit code, wall time and this run's metrics."""
    return start(cfg, progress).wait()
