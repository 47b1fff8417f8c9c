"""The GPU experiment scripts (examples/gpu) cannot rot: each script's command line, for each lane,
composes against the installed verl's config through hydra and passes this package's start-time
checks (strategies, settings, the reward built once), all on CPU, without starting anything."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import yaml
from hydra import compose, initialize_config_module

from tests.conftest import ROOT

pytestmark = pytest.mark.local

GPU = ROOT / "examples" / "gpu"
SCRIPTS = {
    "run_qwen2_5_3b_fsdp2.sh": ("Qwen/Qwen2.5-3B-Instruct", "fsdp2"),
    "run_qwen2_7b_fsdp2.sh": ("Qwen/Qwen2-7B-Instruct", "fsdp2"),
    "run_qwen2_5_3b_megatron.sh": ("Qwen/Qwen2.5-3B-Instruct", "megatron"),
    "run_qwen2_7b_megatron.sh": ("Qwen/Qwen2-7B-Instruct", "megatron"),
}
# lane -> (mini_batch_pipeline, off_policy_steps, trainer_mode, reward manager)
LANES = {"baseline": (False, 0, "sync", "async_agent"), "pipeline": (True, 0, "async_reward", "async_agent"),
         # off_policy_steps=1 alone on v1 is verl's colocate_async with the agent (the flag is written off)
         "off_policy": (False, 0, "colocate_async", "async_agent"), "both": (True, 1, "async_reward", "async_agent"),
         "colocate_async": (False, 0, "colocate_async", "rate_limited"),
         "colocate_async_agent": (False, 0, "colocate_async", "async_agent")}


def script_argv(script: str, lane: str, tmp_path, *extra: str) -> list[str]:
    """What the script hands to python: a stand-in interpreter records its arguments."""
    recorder = tmp_path / "python"
    recorder.write_text('#!/bin/sh\nprintf "%s\\0" "$@" > "$ARGV_OUT"\n')
    recorder.chmod(0o755)
    out = tmp_path / "argv"
    env = {**os.environ, "PYTHON": str(recorder), "ARGV_OUT": str(out), "DATA_DIR": "/data/gsm8k"}
    subprocess.run(["bash", str(GPU / script), lane, *extra], check=True, env=env, timeout=60)
    return out.read_text().split("\0")[:-1]


def compose_as_main_ppo(argv: list[str]):
    """What ``python -m verl_async_rm.main_ppo`` composes and checks before Ray starts."""
    from verl_async_rm.main_ppo import CONFIG_NAME, accept_recipe_spellings
    from tests.helpers.harness import prepared

    from hydra._internal.utils import get_args_parser  # hydra.main's own command-line parser

    assert argv[:2] == ["-m", "verl_async_rm.main_ppo"]
    args = get_args_parser().parse_args(accept_recipe_spellings(argv[2:]))  # exits on what hydra.main would refuse
    with initialize_config_module("verl_async_rm.hydra_conf", version_base=None):
        config = compose(args.config_name or CONFIG_NAME, overrides=args.overrides)
    return prepared(config)


@pytest.mark.parametrize("lane", LANES)
@pytest.mark.parametrize("script", SCRIPTS)
def test_each_script_and_lane_composes_and_passes_the_start_checks(script, lane, tmp_path):
    config = compose_as_main_ppo(script_argv(script, lane, tmp_path))
    model, backend = SCRIPTS[script]
    pipeline, off_policy, trainer_mode, manager = LANES[lane]
    assert config.mini_batch_pipeline is pipeline and config.off_policy_steps == off_policy
    assert config.trainer.v1.trainer_mode == trainer_mode  # our strategies on v1 run as the async_reward mode
    if lane == "off_policy":  # one step of staleness at most, by verl's own replay buffer
        assert (config.trainer.v1.sampler.max_off_policy_threshold, config.trainer.v1.sampler.max_off_policy_strategy) == (2, "wait")
    assert config.actor_rollout_ref.model.path == model
    assert config.actor_rollout_ref.actor.strategy == backend
    assert config.actor_rollout_ref.rollout.name == "vllm" and config.algorithm.adv_estimator == "grpo"
    assert config.reward.reward_manager.name == manager
    if manager == "rate_limited":  # verl's own reward loop, given the agent's concurrency
        assert config.reward.max_concurrent == 8192 and config.reward.num_workers == 8
    assert config.reward.custom_reward_function.reward_kwargs == {"latency_lo": 1, "latency_hi": 40}
    assert config.data.train_files == "/data/gsm8k/train.parquet"
    assert config.trainer.n_gpus_per_node == 8 and config.trainer.experiment_name.endswith(lane)
    # verl's mini-batches must divide the batch (the pipeline refuses otherwise): 1024 / 256
    assert config.data.train_batch_size % config.actor_rollout_ref.actor.ppo_mini_batch_size == 0


def test_extra_overrides_win_and_unknown_lanes_are_refused(tmp_path):
    argv = script_argv("run_qwen2_7b_megatron.sh", "both", tmp_path, "trainer.total_training_steps=7",
                       "--cfg", "job", "actor_rollout_ref.rollout.n=8")
    assert argv[2:5] == ["--config-name=async_ppo_megatron_trainer", "--cfg", "job"]  # hydra's options first
    config = compose_as_main_ppo(argv)
    assert config.trainer.total_training_steps == 7 and config.actor_rollout_ref.rollout.n == 8
    bad = subprocess.run(["bash", str(GPU / "run_qwen2_7b_fsdp2.sh"), "fast"], capture_output=True, text=True,
                         env={**os.environ, "PYTHON": "/bin/false"}, timeout=60)
    assert bad.returncode == 2 and "unknown lane 'fast'" in bad.stderr


def test_a_script_through_the_real_entry_point(tmp_path):
    """One script end to end through the real interpreter and hydra (``--cfg job`` prints the config)."""
    env = {**os.environ, "PYTHON": sys.executable, "DATA_DIR": "/data/gsm8k"}
    result = subprocess.run(["bash", str(GPU / "run_qwen2_7b_megatron.sh"), "both", "--cfg", "job"],
                            capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    config = yaml.safe_load(result.stdout)
    assert config["off_policy_steps"] == 1 and config["mini_batch_pipeline"] is True
    assert config["actor_rollout_ref"]["actor"]["megatron"]["pipeline_model_parallel_size"] == 2


def test_prepare_gsm8k_writes_verls_format(tmp_path, gsm8k_path):
    import pandas as pd

    # the test split as it is, and a train split of its first 100 problems (the repository holds only the test split)
    jsonl = tmp_path / "jsonl"
    jsonl.mkdir()
    (jsonl / "test.jsonl").write_text(gsm8k_path.read_text())
    (jsonl / "train.jsonl").write_text("".join(gsm8k_path.read_text().splitlines(keepends=True)[:100]))
    out = tmp_path / "out"
    subprocess.run([sys.executable, str(GPU / "prepare_gsm8k.py"), "--out", str(out), "--jsonl-dir", str(jsonl)],
                   check=True, timeout=120)
    test = pd.read_parquet(out / "test.parquet")
    assert len(test) == 1319 and len(pd.read_parquet(out / "train.parquet")) == 100
    row = test.iloc[0]
    assert row["data_source"] == "openai/gsm8k" and row["reward_model"]["ground_truth"] == "18"
    assert row["prompt"][0]["content"].endswith('output the final answer after "####".')
    from verl_async_rm.user_rewards.gsm8k import compute_score

    solutions = [info["answer"] for info in test["extra_info"]]
    assert all(compute_score("openai/gsm8k", s, t["ground_truth"]) == 1.0
               for s, t in zip(solutions, test["reward_model"], strict=True))
