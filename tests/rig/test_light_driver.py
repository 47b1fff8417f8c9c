"""The light driver (cpu_backend/light_driver.py) does what verl's driver does, without importing verl:
the same ``ray.init`` kwargs, the same environment for Ray's processes, the same TaskRunner class
with the same actor options, checked against the installed verl's own driver; its process imports
neither verl nor torch; and a real v1 run trains through it."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from unittest import mock

import pytest
from hydra import compose, initialize_config_module

from tests.conftest import ROOT
from verl_async_rm_rig.cpu_backend import light_driver
from verl_async_rm_rig.cpu_backend.launch import CPURunConfig, build_env, build_overrides
from verl_async_rm_rig.cpu_backend.names import LIGHT_DRIVER_ENV

STOCK = []
BOTH = ["mini_batch_pipeline=true", "off_policy_steps=1"]
IMPORT_SIDE_EFFECTS = {"TORCH_CUDA_ARCH_LIST"}  # set in os.environ by importing verl (see below)


def launcher_config(tmp_path, trainer: str, strategy: list[str], deterministic: bool = False,
                    ray_address: str | None = None, runtime_env_vars: dict | None = None):
    """What ``python -m verl_async_rm.main_ppo`` composes and prepares for a CPU launcher run."""
    from verl_async_rm.main_ppo import CONFIG_NAME, accept_recipe_spellings, prepare

    cfg = CPURunConfig(out_dir=str(tmp_path), trainer=trainer, model_dir=str(tmp_path / "model"), train_file="t.parquet",
                       val_file="v.parquet", reward_manager="async_agent", deterministic=deterministic,
                       entry_module="verl_async_rm.main_ppo", extra_overrides=strategy, light_driver=True,
                       ray_address=ray_address)
    overrides = build_overrides(cfg, ray_tmp_dir="/tmp/x", runtime_env_vars=runtime_env_vars)
    with initialize_config_module("verl_async_rm.hydra_conf", version_base=None):
        config = compose(CONFIG_NAME, overrides=accept_recipe_spellings(overrides))
    return config, prepare(config)  # the config completed in place, and the run's settings


class _Stop(Exception):
    pass


def verl_driver(config, environ: dict[str, str]):
    """Run our entry point's usual path (verl's driver) up to ``ray.init``: its kwargs, the
    TaskRunner class it was given, and the environment it left for Ray's processes."""
    from verl.trainer import main_ppo as verl_main_ppo

    from verl_async_rm.main_ppo import main

    seen = {}
    real_run_ppo = verl_main_ppo.run_ppo

    def spy_run_ppo(cfg, task_runner_class):
        seen["runner"] = task_runner_class
        return real_run_ppo(cfg, task_runner_class)

    def fake_init(**kwargs):
        seen["kwargs"] = kwargs
        raise _Stop

    with mock.patch.dict(os.environ, environ, clear=True), \
            mock.patch.object(verl_main_ppo, "run_ppo", spy_run_ppo), \
            mock.patch("ray.is_initialized", return_value=False), mock.patch("ray.init", fake_init):
        with pytest.raises(_Stop):
            main.__wrapped__(config)
        seen["environ"] = dict(os.environ)
    return seen


@pytest.mark.local
@pytest.mark.parametrize("deterministic", [False, True])
@pytest.mark.parametrize("strategy", [STOCK, BOTH], ids=["stock", "both"])
@pytest.mark.parametrize("trainer", ["v0", "v1"])
def test_same_ray_init_environment_and_runner_as_verls_driver(tmp_path, trainer, strategy, deterministic):
    import ray

    from verl_async_rm.main_ppo import task_runner

    config, settings = launcher_config(tmp_path, trainer, strategy, deterministic)
    environ = build_env(CPURunConfig(out_dir=str(tmp_path)), metrics_path="/tmp/m.jsonl")  # as the launcher's stock driver
    environ.pop(light_driver.JOB_CONFIG_ENV, None)
    verls = verl_driver(copy.deepcopy(config), environ)

    ours = dict(environ)
    light_driver.prepare_environ(config, ours)
    assert light_driver.ray_init_kwargs(config, ours) == verls["kwargs"]
    # verl's import sets TORCH_CUDA_ARCH_LIST=8.0 on a machine without CUDA (its megatron engine
    # package's import-time hack, not undone when megatron is missing); in verl's driver Ray's
    # processes inherit it, with the light driver each verl process sets it on its own import.
    def without_side_effects(env):
        return {k: v for k, v in env.items() if k not in IMPORT_SIDE_EFFECTS}

    assert without_side_effects(ours) == without_side_effects(verls["environ"])
    runner = verls["runner"]
    assert light_driver.runner_class(task_runner(settings)) is runner.__ray_actor_class__
    assert ray.remote(light_driver.TaskRunnerHost)._default_options == runner._default_options


@pytest.mark.local
def test_a_run_on_a_shared_cluster_connects_as_verls_driver_would(tmp_path):
    # shared_cluster.py: the run is a job on a running cluster; its environment rides in the runtime env
    config, _ = launcher_config(tmp_path, "v0", BOTH, ray_address="192.0.2.2:6380",
                             runtime_env_vars={"VERL_FILE_LOGGER_PATH": "/o/metrics-0.jsonl"})
    environ = build_env(CPURunConfig(out_dir=str(tmp_path)), metrics_path="/tmp/m.jsonl")
    environ.pop(light_driver.JOB_CONFIG_ENV, None)
    verls = verl_driver(copy.deepcopy(config), environ)
    ours = dict(environ)
    light_driver.prepare_environ(config, ours)
    kwargs = light_driver.ray_init_kwargs(config, ours)
    assert kwargs == verls["kwargs"]
    assert kwargs["address"] == "192.0.2.2:6380" and kwargs.get("num_cpus") is None and "num_gpus" not in kwargs
    assert kwargs["runtime_env"]["env_vars"]["VERL_FILE_LOGGER_PATH"] == "/o/metrics-0.jsonl"


@pytest.mark.local
def test_runtime_env_follows_verls_rules_for_variables_already_set():
    """verl drops its defaults that the launching shell already set and forwards the determinism
    variables; and the table of defaults is verl's (on a machine without GPUs)."""
    from verl.trainer import constants_ppo

    assert light_driver.PPO_ENV_VARS == constants_ppo.PPO_RAY_RUNTIME_ENV["env_vars"]
    for environ in ({}, {"NCCL_DEBUG": "INFO", "PYTHONHASHSEED": "3", "VERL_FULL_DETERMINISM": "1"},
                    {light_driver.JOB_CONFIG_ENV: json.dumps({"runtime_env": {"working_dir": "/w"}})}):
        with mock.patch.dict(os.environ, environ, clear=True):
            assert light_driver.default_runtime_env(dict(environ)) == constants_ppo.get_ppo_ray_runtime_env(None)


@pytest.mark.local
def test_verls_config_read_as_files_composes_the_same_config(tmp_path):
    """The light driver's hydra search path (verl's config files, verl not imported) against our
    configs' own ``pkg://verl.trainer.config`` (which imports verl)."""
    from verl_async_rm.main_ppo import CONFIG_NAME, accept_recipe_spellings

    light = CPURunConfig(out_dir=str(tmp_path), trainer="v1", model_dir="/m", train_file="t.parquet", val_file="v.parquet",
                         entry_module="verl_async_rm.main_ppo", light_driver=True)
    overrides = accept_recipe_spellings(build_overrides(light))
    assert overrides[-1] == light_driver.verl_config_searchpath() and overrides[-1].startswith("hydra.searchpath=[file://")
    with initialize_config_module("verl_async_rm.hydra_conf", version_base=None):
        assert compose(CONFIG_NAME, overrides=overrides) == compose(CONFIG_NAME, overrides=overrides[:-1])


@pytest.mark.quick
def test_refuses_the_torch_profiler_and_a_foreign_entry_point(tmp_path):
    from omegaconf import OmegaConf

    with pytest.raises(ValueError, match="torch profiler"):
        light_driver.check_supported(OmegaConf.create({"global_profiler": {"tool": "torch"}}))
    with pytest.raises(ValueError, match="light_driver needs entry_module"):
        build_env(CPURunConfig(out_dir=str(tmp_path), light_driver=True), metrics_path="/tmp/m.jsonl")
    ours = CPURunConfig(out_dir=str(tmp_path), light_driver=True, entry_module="verl_async_rm.main_ppo")
    assert build_env(ours, metrics_path="/tmp/m.jsonl")[LIGHT_DRIVER_ENV] == "1"
    with mock.patch.dict(os.environ, {LIGHT_DRIVER_ENV: "1"}):  # never inherited by a stock-driver run
        assert LIGHT_DRIVER_ENV not in build_env(CPURunConfig(out_dir=str(tmp_path)), "/tmp/m.jsonl")


@pytest.mark.local
def test_the_driver_composes_and_prepares_without_importing_verl_or_torch(tmp_path):
    """Everything the light driver's process does before ``ray.init`` (our entry point's imports,
    hydra, our start-time checks, the reward built once, the kwargs), in a fresh interpreter."""
    script = f"""
import sys
from pathlib import Path
sys.path.insert(0, {str(ROOT)!r})
from tests.rig.test_light_driver import launcher_config, BOTH
from verl_async_rm_rig.cpu_backend import light_driver
for trainer in ("v0", "v1"):
    config, _ = launcher_config(Path({str(tmp_path)!r}), trainer, BOTH)
    environ = {{}}
    light_driver.prepare_environ(config, environ)
    light_driver.ray_init_kwargs(config, environ)
heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("verl", "torch", "transformers", "tensordict"))
print(heavy)
"""
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().splitlines()[-1] == "[]"


@pytest.mark.trainer
@pytest.mark.slow
def test_a_v1_strategy_run_trains_through_the_light_driver(tmp_path):
    """verl's v1 TaskRunner run in the host actor (a strategy's: the demo's own lanes, verl's modes, are
    tests/rig/test_demo.py's)."""
    from verl_async_rm_rig import demo
    from verl_async_rm_rig.cpu_backend.launch import prepare_assets, run

    assets = prepare_assets(CPURunConfig(out_dir=str(tmp_path / "assets")))
    # a simulated judge, uniform in [C/40, C] with C = 0.05 s
    cfg = demo.lane_config(tmp_path / "both", assets, demo.lane_of("both@tail_1x"), 2, 0, 0.05, decode_s=0.0)
    assert cfg.light_driver
    result = run(cfg, progress=False)
    if not result.ok:
        pytest.fail(f"trainer exited rc={result.returncode}; log {result.log_path}:\n{open(result.log_path).read()[-4000:]}")
    assert [m["data"]["training/global_step"] for m in result.metrics if "training/global_step" in m["data"]] == [1, 2]
