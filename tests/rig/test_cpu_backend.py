"""verl's real GRPO trainer on CPU through verl_async_rm_rig.cpu_backend.

The trainer tests run verl's own ``python -m verl.trainer.main_ppo`` (v0) as a subprocess of the
launcher, in a fresh Ray cluster (``ray_init.address=local``), with a timeout; the launcher kills
the process tree it started. Measured on the 2-core CI box: the 6-step run ~60 s, the resume ~55 s
(both in the rig's one queue of trainers, tests/helpers/rig_runs.py, beside test_cpu_async_trainer.py's).
The v1 trainer on the backend, learning over 16 steps and resume with a batch in flight are in
test_strategies.py (whose baselines are verl's stock trainers).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from verl_async_rm_rig.cpu_backend.launch import CPURunConfig, build_overrides

PROBS_DIFF = "training/rollout_probs_diff_max"
VAL_KEY = "val-core/verl_async_rm/letter_case/acc/mean@1"


def _train_steps(result) -> list[int]:
    return [m["data"]["training/global_step"] for m in result.metrics if "training/global_step" in m["data"]]


def _assert_ok(result) -> None:
    if not result.ok:
        with open(result.log_path) as f:
            tail = "".join(f.readlines()[-60:])
        pytest.fail(f"trainer exited rc={result.returncode}; log {result.log_path}:\n{tail}")


# --------------------------------------------------------------------------------------------------
# fast checks (no trainer)
# --------------------------------------------------------------------------------------------------


@pytest.mark.quick
def test_toy_reward_scores_case_fraction():
    from verl_async_rm_rig.cpu_backend.toy_task import compute_score, make_rows

    assert compute_score("s", "abcdefgh", "lower") == 1.0
    assert compute_score("s", "ABCDefgh", "upper") == 0.5
    assert compute_score("s", "ab", "lower") == 2 / 8  # short answers cannot score high
    rows = make_rows(4, "train", seed=0)
    assert [r["reward_model"]["ground_truth"] for r in rows] == ["lower", "upper", "lower", "upper"]


@pytest.mark.local
def test_batched_sampler_logprobs_match_a_full_forward(tmp_path):
    import torch
    from transformers import AutoModelForCausalLM

    from verl_async_rm_rig.cpu_backend.server import sample_batch
    from verl_async_rm_rig.cpu_backend.tiny_model import build_tiny_model

    model = AutoModelForCausalLM.from_pretrained(build_tiny_model(str(tmp_path / "m")), attn_implementation="eager")
    prompts = [[1, 87, 85, 201], [1, 87, 85, 259, 201, 288, 282, 297]]  # different lengths: left padding
    out = sample_batch(
        model.eval(), prompts, [6, 6], temperature=1.0, top_p=1.0, top_k=-1,
        eos_ids=set(), ignore_eos=True, generator=torch.Generator().manual_seed(0), pad_id=0,
    )  # fmt: skip
    for prompt, (ids, lps, _) in zip(prompts, out, strict=True):
        with torch.no_grad():
            logits = model(torch.tensor([prompt + ids])).logits[0, len(prompt) - 1 : -1]
        ref = torch.log_softmax(logits, -1).gather(-1, torch.tensor(ids)[:, None]).squeeze(-1)
        assert torch.allclose(ref, torch.tensor(lps), atol=1e-5)


@pytest.mark.local
def test_overrides_compose_against_verls_config(tmp_path):  # not quick: a ~6 s subprocess
    """Caller's reward file/kwargs/manager and extra overrides reach verl's config (hydra --cfg job)."""
    import yaml

    cfg = CPURunConfig(
        out_dir=str(tmp_path),
        model_dir=str(tmp_path / "model"),
        train_file="t.parquet",
        val_file="v.parquet",
        reward_path="/x/my_reward.py",
        reward_name="score_fn",
        reward_kwargs={"min_chars": 4, "tag": "a,b"},
        reward_manager="naive",
        extra_overrides=["trainer.test_freq=3"],
        v1_poll_interval_s=0.05,
    )
    ov = build_overrides(cfg)
    cmd = [sys.executable, "-m", "verl.trainer.main_ppo", "--cfg", "job", *ov]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    conf = yaml.safe_load(proc.stdout)
    assert conf["reward"]["custom_reward_function"] == {
        "path": "/x/my_reward.py",
        "name": "score_fn",
        "reward_kwargs": {"min_chars": 4, "tag": "a,b"},
    }
    assert conf["reward"]["reward_manager"]["name"] == "naive"
    assert conf["trainer"]["test_freq"] == 3
    assert conf["actor_rollout_ref"]["rollout"]["name"] == "hf_cpu"
    assert conf["ray_kwargs"]["ray_init"]["address"] == "local"
    sampler = conf["trainer"]["v1"]["sampler"]
    assert sampler["custom_sampler"]["name"] == "FastPollReplayBuffer"
    assert sampler["sampler_kwargs"] == {"poll_interval": 0.05, "train_batch_size": 8}


# --------------------------------------------------------------------------------------------------
# the real trainer
# --------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def v0_run(rig_runs):
    """The 6-step run (tests/helpers/rig_runs.py, in the rig's one queue of trainers)."""
    return rig_runs["v0"]


@pytest.mark.trainer
@pytest.mark.slow
def test_v0_grpo_steps_with_validation_checkpoint_and_synced_weights(v0_run):
    cfg, result = v0_run
    _assert_ok(result)
    assert _train_steps(result) == list(range(1, 7))
    assert [s for s, _ in result.series(VAL_KEY)] == [0, 3, 6]  # val_before_train and test_freq=3
    assert max(v for _, v in result.series(PROBS_DIFF)) < 1e-4  # rollout and trainer agree: weights synced
    assert os.path.isdir(os.path.join(cfg.out_dir, "checkpoints", "global_step_6", "actor"))


@pytest.mark.trainer
@pytest.mark.slow
def test_v0_resume_without_weight_sync_shows_the_gap(v0_run, rig_runs):
    """Resume from step 6 with sync off: the trained actor vs the initial rollout weights."""
    cfg, first = v0_run
    _assert_ok(first)
    synced_max = max(v for _, v in first.series(PROBS_DIFF))
    resumed_cfg, result = rig_runs["v0_resumed"]
    assert (resumed_cfg.out_dir, resumed_cfg.steps, resumed_cfg.weight_sync) == (cfg.out_dir, 7, False)
    assert result is not None, "not started: the run it resumes failed"
    _assert_ok(result)
    assert _train_steps(result) == [7]
    gap = max(v for _, v in result.series(PROBS_DIFF))
    assert gap > 1e-3 and gap > 1000 * synced_max, (gap, synced_max)
