"""The trainer's driver without verl's imports, for CPU runs that start several trainers (the demo).

verl's driver (``main_ppo``) imports verl (torch, transformers, tensordict, datasets: ~6 CPU-s here,
~7.5 when five runs start together on 2 cores) to do four small things: fix the device, validate the
config, ``ray.init`` with verl's runtime env, and start a ``TaskRunner`` actor whose ``run`` is the
training. The TaskRunner's process imports verl anyway. So with this driver the driver process only
composes the config (hydra, reading verl's config files without importing verl:
:func:`verl_config_searchpath`) and calls ``ray.init`` with the kwargs verl's ``run_ppo`` would pass
(:func:`ray_init_kwargs`), and one actor, :class:`TaskRunnerHost`, does the rest in its own process:
verl's ``auto_set_device`` and ``validate_config``, then the TaskRunner class's own ``run``, in process.
It also builds the run's model and data when asked (``CPURunConfig.assets_dir``, assets.py).

Only on machines without accelerators, which is where the CPU backend runs: verl's runtime-env rules
that depend on the GPU (Hopper/Ampere with Megatron, ROCm, GB200) cannot apply there, and the torch
profiler's variant is refused. ``tests/rig/test_light_driver.py`` checks the kwargs and the runner class
against what verl's own driver passes, for v0 and v1, stock and strategy runs. Opt in with
``CPURunConfig.light_driver`` (the demo does).
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
from pathlib import Path
from typing import Any, MutableMapping

from omegaconf import DictConfig, OmegaConf

# verl.trainer.constants_ppo.PPO_RAY_RUNTIME_ENV["env_vars"] on a machine without GPUs (its GB200 and
# ROCm additions are empty there). Checked equal to verl's in tests/rig/test_light_driver.py.
PPO_ENV_VARS = {
    "TOKENIZERS_PARALLELISM": "true",
    "NCCL_DEBUG": "WARN",
    "VLLM_LOGGING_LEVEL": "WARN",
    "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "true",
    "VLLM_DISABLE_COMPILE_CACHE": "1",
    "HCCL_HOST_SOCKET_PORT_RANGE": "auto",
    "HCCL_NPU_SOCKET_PORT_RANGE": "auto",
    "HSA_NO_SCRATCH_RECLAIM": "1",
}
ALWAYS_FORWARDED = ("VERL_FULL_DETERMINISM", "VLLM_BATCH_INVARIANT", "VERL_RL_INSIGHT_ENABLE")
FORWARDED_WHEN_SET = ("PYTHONHASHSEED", "CUBLAS_WORKSPACE_CONFIG", "FLASH_ATTENTION_DETERMINISTIC", "NCCL_DETERMINISTIC",
                      "NCCL_ALGO")
JOB_CONFIG_ENV = "RAY_JOB_CONFIG_JSON_ENV_VAR"  # ray._private.runtime_env.constants.RAY_JOB_CONFIG_JSON_ENV_VAR


def verl_config_searchpath() -> str:
    """Hydra override pointing our config at verl's config directory as files. Our configs name it
    ``pkg://verl.trainer.config``, which hydra resolves by importing ``verl`` (whose ``__init__`` imports
    torch, transformers and tensordict); ``find_spec`` of the top-level package locates it unimported.
    The config composed is the same (tests/rig/test_light_driver.py)."""
    spec = importlib.util.find_spec("verl")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("verl is not installed")
    return f"hydra.searchpath=[file://{Path(spec.submodule_search_locations[0]) / 'trainer' / 'config'}]"


def check_supported(config: DictConfig) -> None:
    if OmegaConf.select(config, "global_profiler.tool", default=None) == "torch":
        raise ValueError("the light driver does not run verl's torch profiler setup; run without "
                         "CPURunConfig.light_driver to profile")


def prepare_environ(config: DictConfig, environ: MutableMapping[str, str]) -> None:
    """What verl's ``run_ppo`` sets in the driver's environment before ``ray.init`` (inherited by Ray's
    processes, and read by the runtime env below)."""
    rollout = config.actor_rollout_ref.rollout
    judge_rollout = config.reward.reward_model.rollout
    if rollout.full_determinism or (config.reward.reward_model.enable and judge_rollout.full_determinism):
        environ["VERL_FULL_DETERMINISM"] = "1"
        environ["VLLM_BATCH_INVARIANT"] = "1"
        environ["PYTHONHASHSEED"] = str(rollout.seed)
    loggers = config.trainer.get("logger", [])
    if "rl_insight" in ([loggers] if isinstance(loggers, str) else loggers or []):
        environ["VERL_RL_INSIGHT_ENABLE"] = "1"


def default_runtime_env(environ: MutableMapping[str, str]) -> dict[str, Any]:
    """verl's ``get_ppo_ray_runtime_env`` on a machine without GPUs and without the torch profiler."""
    working_dir = json.loads(environ.get(JOB_CONFIG_ENV, "{}")).get("runtime_env", {}).get("working_dir", None)
    env_vars = {key: value for key, value in PPO_ENV_VARS.items() if environ.get(key) is None}
    env_vars.update({key: environ.get(key, "0") for key in ALWAYS_FORWARDED})
    env_vars.update({key: environ[key] for key in FORWARDED_WHEN_SET if environ.get(key) is not None})
    return {"env_vars": env_vars, **({"working_dir": None} if working_dir is None else {})}


def ray_init_kwargs(config: DictConfig, environ: MutableMapping[str, str]) -> dict[str, Any]:
    """The kwargs verl's ``run_ppo`` passes to ``ray.init`` (after :func:`prepare_environ`)."""
    runtime_env = default_runtime_env(environ)
    if config.transfer_queue.enable:
        runtime_env["env_vars"]["TRANSFER_QUEUE_ENABLE"] = "1"
    ray_init = config.ray_kwargs.get("ray_init", {})
    merged = OmegaConf.merge(runtime_env, ray_init.get("runtime_env", {}))
    return OmegaConf.to_container(OmegaConf.create({**ray_init, "runtime_env": merged}))


class TaskRunnerHost:
    """One Ray actor doing the driver's verl work and the TaskRunner's, in its process (which imports
    verl for the TaskRunner anyway)."""

    def run(self, config: DictConfig, runner: str) -> None:
        from verl_async_rm.main_ppo import check_as_verls_driver

        from . import verl_internals
        from .assets import build_if_asked

        verl_internals.check(verl_internals.LIGHT_DRIVER)  # what this driver reproduces of verl's
        runner_cls = runner_class(runner)  # verl's imports first: then the assets' build adds ~1 s, not torch's import
        build_if_asked()  # CPURunConfig.assets_dir: the first run here builds the model and data, once
        check_as_verls_driver(config)
        runner_cls().run(config)


def runner_class(runner: str) -> type:
    """``"module:Name"`` -> the class; a Ray actor class (``@ray.remote``) -> the class it wraps."""
    module, name = runner.split(":")
    found = getattr(importlib.import_module(module), name)
    return getattr(found, "__ray_actor_class__", found)


def run(config: DictConfig, runner: str, environ: MutableMapping[str, str] = os.environ) -> None:
    """verl's ``run_ppo(config, task_runner_class=<runner>)``, with the runner's class by name."""
    import ray  # here: the launcher imports this module for verl_config_searchpath only

    check_supported(config)
    prepare_environ(config, environ)
    if not ray.is_initialized():
        kwargs = ray_init_kwargs(config, environ)
        print(f"ray init kwargs: {kwargs}")  # as verl's driver prints them
        ray.init(**kwargs)
    host = ray.remote(TaskRunnerHost).remote()
    ray.get(host.run.remote(config, runner))
    timeline = config.ray_kwargs.get("timeline_json_file", None)
    if timeline:
        ray.timeline(filename=timeline)
