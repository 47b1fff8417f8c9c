"""The CPU runs' model and data, built once among processes sharing a directory (cpu_backend/assets.py):
concurrent builders build once, a builder killed mid-build leaves the next one to build, a failed
build leaves no record, seeds kept apart; a run with the light driver is told to build them itself;
a real build leaves torch's generator as it was (the builder may be a run's TaskRunner)."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import time
from pathlib import Path

import pytest

from verl_async_rm_rig.cpu_backend import assets
from verl_async_rm_rig.cpu_backend.assets import ASSETS_ENV, asset_paths, build_assets_once, read_built
from verl_async_rm_rig.cpu_backend.launch import CPURunConfig, build_env, build_overrides, name_assets, prepare_assets

SPAWN = multiprocessing.get_context("spawn")


def _fake_build(assets_dir: str, seed: int, hold_s: float = 0.3) -> None:
    """Counts its calls, holds the lock a while, then writes the three files."""
    with open(os.path.join(assets_dir, "calls"), "a") as f:
        f.write(f"{os.getpid()}\n")
    Path(assets_dir, "building").touch()
    time.sleep(hold_s)
    paths = asset_paths(assets_dir, seed)
    for path in (os.path.join(paths.model_dir, "config.json"), paths.train_file, paths.val_file):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        Path(path).write_text("x")


def _hanging_build(assets_dir: str, seed: int) -> None:
    _fake_build(assets_dir, seed, hold_s=600)


def _call(assets_dir: str, seed: int, build, results) -> None:
    results.put(build_assets_once(assets_dir, seed, build=build))


def _calls(assets_dir) -> list[str]:
    path = Path(assets_dir, "calls")
    return path.read_text().split() if path.exists() else []


@pytest.mark.quick
def test_processes_building_at_once_build_once(tmp_path):
    results = SPAWN.Queue()
    procs = [SPAWN.Process(target=_call, args=(str(tmp_path), 3, _fake_build, results)) for _ in range(4)]
    for proc in procs:
        proc.start()
    records = [results.get(timeout=60) for _ in procs]
    for proc in procs:
        proc.join(timeout=30)
    assert [proc.exitcode for proc in procs] == [0] * 4
    assert len(_calls(tmp_path)) == 1
    assert all(record == records[0] for record in records) and records[0]["seed"] == 3
    assert str(records[0]["pid"]) == _calls(tmp_path)[0] and read_built(str(tmp_path), 3) == records[0]


@pytest.mark.quick
def test_a_builder_killed_while_building_leaves_the_next_to_build(tmp_path):
    results = SPAWN.Queue()
    killed = SPAWN.Process(target=_call, args=(str(tmp_path), 0, _hanging_build, results))
    killed.start()
    deadline = time.monotonic() + 60
    while not Path(tmp_path, "building").exists():
        assert time.monotonic() < deadline and killed.is_alive()
        time.sleep(0.02)
    waiter = SPAWN.Process(target=_call, args=(str(tmp_path), 0, _fake_build, results))
    waiter.start()
    time.sleep(1.0)
    assert waiter.is_alive() and results.empty()  # it waits for the lock: the build is not finished
    os.kill(killed.pid, signal.SIGKILL)
    record = results.get(timeout=60)
    waiter.join(timeout=30)
    assert record["pid"] == waiter.pid and _calls(tmp_path) == [str(killed.pid), str(waiter.pid)]
    assert read_built(str(tmp_path), 0) == record


@pytest.mark.quick
def test_a_failed_build_leaves_no_record_and_the_lock_free(tmp_path):
    def failing(assets_dir, seed):
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        build_assets_once(str(tmp_path), 0, build=failing)
    assert read_built(str(tmp_path), 0) is None
    record = build_assets_once(str(tmp_path), 0, build=lambda d, s: _fake_build(d, s, hold_s=0))
    assert record["pid"] == os.getpid() and len(_calls(tmp_path)) == 1
    # built: later calls return the record without building
    assert build_assets_once(str(tmp_path), 0, build=failing) == record


@pytest.mark.quick
def test_seeds_share_a_directory_apart(tmp_path):
    quick_build = lambda d, s: _fake_build(d, s, hold_s=0)  # noqa: E731
    first, second = build_assets_once(str(tmp_path), 0, quick_build), build_assets_once(str(tmp_path), 1, quick_build)
    assert (first["seed"], second["seed"]) == (0, 1) and len(_calls(tmp_path)) == 2
    zero, one = asset_paths(str(tmp_path), 0), asset_paths(str(tmp_path), 1)
    assert zero.model_dir == one.model_dir and zero.train_file != one.train_file


@pytest.mark.quick
def test_a_light_driver_run_is_told_to_build_its_assets(tmp_path):
    cfg = CPURunConfig(out_dir=str(tmp_path / "run"), seed=5, assets_dir=str(tmp_path / "assets"),
                       light_driver=True, entry_module="verl_async_rm.main_ppo")
    name_assets(cfg)
    paths = asset_paths(str(tmp_path / "assets"), 5)
    assert (cfg.model_dir, cfg.train_file, cfg.val_file) == (paths.model_dir, paths.train_file, paths.val_file)
    assert json.loads(build_env(cfg, "m.jsonl")[ASSETS_ENV]) == {"dir": str(tmp_path / "assets"), "seed": 5}
    overrides = build_overrides(cfg)
    assert f"actor_rollout_ref.model.path={paths.model_dir}" in overrides
    assert f"data.train_files={paths.train_file}" in overrides
    assert not (tmp_path / "assets").exists()  # named, not built
    # verl's own driver has no TaskRunnerHost to build them: they are built before the run, here
    cfg.light_driver = False
    assert ASSETS_ENV not in build_env(cfg, "m.jsonl")


@pytest.mark.quick
def test_without_the_light_driver_the_assets_are_built_before_the_run(tmp_path, monkeypatch):
    from verl_async_rm_rig.cpu_backend import launch

    built = []
    monkeypatch.setattr(launch, "build_assets_once", lambda assets_dir, seed: built.append((assets_dir, seed)))
    cfg = prepare_assets(CPURunConfig(out_dir=str(tmp_path / "run"), seed=4, assets_dir=str(tmp_path / "assets")))
    assert built == [(str(tmp_path / "assets"), 4)] and cfg.model_dir == asset_paths(str(tmp_path / "assets"), 4).model_dir


@pytest.mark.quick
def test_assets_dir_and_explicit_paths_are_refused_together(tmp_path):
    cfg = CPURunConfig(out_dir=str(tmp_path), assets_dir=str(tmp_path / "assets"), model_dir="/models/mine")
    with pytest.raises(ValueError, match="not both"):
        name_assets(cfg)


@pytest.mark.local
def test_a_real_build_in_a_run_keeps_torchs_generator(tmp_path, monkeypatch):
    """What a run's TaskRunner does (light_driver.TaskRunnerHost): build from the environment; the
    model and data load, and torch's global generator continues as if nothing had been built."""
    import pandas as pd
    import torch
    from transformers import AutoConfig, AutoTokenizer

    torch.manual_seed(1234)
    expected = torch.rand(3)
    torch.manual_seed(1234)
    monkeypatch.setenv(ASSETS_ENV, json.dumps({"dir": str(tmp_path), "seed": 2}))
    record = assets.build_if_asked()
    assert torch.equal(torch.rand(3), expected)
    assert record["seed"] == 2 and record == read_built(str(tmp_path), 2)
    paths = asset_paths(str(tmp_path), 2)
    assert AutoConfig.from_pretrained(paths.model_dir).model_type == "qwen2"
    assert AutoTokenizer.from_pretrained(paths.model_dir).eos_token == "<|im_end|>"
    assert (len(pd.read_parquet(paths.train_file)), len(pd.read_parquet(paths.val_file))) == (256, 16)
    # the same as prepare_assets builds for a run of its own (what every benchmark trains)
    own = prepare_assets(CPURunConfig(out_dir=str(tmp_path / "own"), seed=2))
    assert pd.read_parquet(own.train_file).equals(pd.read_parquet(paths.train_file))
    from transformers import AutoModelForCausalLM

    mine = AutoModelForCausalLM.from_pretrained(paths.model_dir).state_dict()
    theirs = AutoModelForCausalLM.from_pretrained(own.model_dir).state_dict()
    assert mine.keys() == theirs.keys() and all(torch.equal(mine[k], theirs[k]) for k in mine)


@pytest.mark.quick
@pytest.mark.parametrize("field", ["decode_s", "weight_sync_s"])
def test_simulated_gpu_times_reach_the_replicas_and_negative_ones_are_refused(tmp_path, field):
    from verl_async_rm_rig.cpu_backend.names import DECODE_S_ENV, WEIGHT_SYNC_S_ENV

    env_key = {"decode_s": DECODE_S_ENV, "weight_sync_s": WEIGHT_SYNC_S_ENV}[field]
    assert env_key not in build_env(CPURunConfig(out_dir=str(tmp_path)), "m.jsonl")  # 0: the tiny model's own pace
    assert float(build_env(CPURunConfig(out_dir=str(tmp_path), **{field: 1.5}), "m.jsonl")[env_key]) == 1.5
    with pytest.raises(ValueError, match=field):
        build_env(CPURunConfig(out_dir=str(tmp_path), **{field: -0.1}), "m.jsonl")
