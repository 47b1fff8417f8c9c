"""The strategies on verl's real trainers (CPU backend; v0, and v1's async_reward mode): sample
accounting, LR, optimizer steps, staleness, and resume from a checkpoint taken with a prefetched
batch in flight.

Each mode runs 4 GRPO steps of 8 prompts x 4 samples, with 4 PPO mini-batches per step, a warm-up
LR schedule (a scheduler stepped once per mini-batch would show), verl's rollout dump and a
checkpoint at steps 2 and 4.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
import torch

from verl_async_rm.cpu_backend.launch import CPURunConfig, prepare_assets, run
from verl_async_rm.cpu_backend.toy_task import score_text

pytestmark = [pytest.mark.trainer, pytest.mark.slow]

STEPS = 4
SHAPE = [
    "actor_rollout_ref.actor.ppo_mini_batch_size=2",  # 8 prompts / 2 = 4 mini-batches per step
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
    "actor_rollout_ref.actor.optim.lr_warmup_steps=3",
]
FLAGS = {
    "baseline": [],
    "pipeline": ["mini_batch_pipeline=true"],
    "off_policy": ["off_policy_steps=1"],
    "both": ["mini_batch_pipeline=true", "off_policy_steps=1"],
}
# (trainer, mode) runs: every mode on v0; the baseline and both strategies on v1 (each v1 run costs
# about a minute of CI, and v1 shares the strategy logic with v0).
RUNS = [("v0", mode) for mode in FLAGS] + [("v1", "baseline"), ("v1", "both")]


def train(out_dir: Path, assets: CPURunConfig, trainer: str, *overrides: str):
    cfg = CPURunConfig(
        out_dir=str(out_dir), trainer=trainer, steps=STEPS, entry_module="verl_async_rm.main_ppo",
        model_dir=assets.model_dir, train_file=assets.train_file, val_file=assets.val_file,
        val_before_train=False, save_freq=2, timeout_s=600,
        extra_overrides=[*SHAPE, f"trainer.rollout_data_dir={out_dir / 'rollouts'}", *overrides],
    )
    result = run(cfg, progress=False)
    assert result.ok, f"training failed (rc {result.returncode}); log in {out_dir}"
    return result


def dumped(out_dir: Path) -> dict[int, list[dict]]:
    return {
        int(path.stem): [json.loads(line) for line in path.read_text().splitlines()]
        for path in sorted((out_dir / "rollouts").glob("*.jsonl"))
    }


def optimizer_steps(out_dir: Path, step: int) -> set[int]:
    state = torch.load(out_dir / "checkpoints" / f"global_step_{step}" / "actor" / "optim_world_size_1_rank_0.pt", weights_only=False)
    return {int(v["step"]) for v in state["state"].values()}


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    return prepare_assets(CPURunConfig(out_dir=str(tmp_path_factory.mktemp("assets"))))


@pytest.fixture(scope="module")
def runs(tmp_path_factory, assets):
    out = {}
    for trainer, mode in RUNS:
        directory = tmp_path_factory.mktemp(f"{trainer}_{mode}")
        out[trainer, mode] = (directory, train(directory, assets, trainer, *FLAGS[mode]))
    return out


@pytest.mark.parametrize("run", RUNS, ids="-".join)
def test_every_sample_trained_once_with_its_own_reward(runs, run):
    trainer, mode = run
    directory, _ = runs[run]
    steps = dumped(directory)
    assert sorted(steps) == list(range(1, STEPS + 1))
    seen_uids: set[str] = set()
    for step, rows in steps.items():
        assert len(rows) == 32, f"step {step}: {len(rows)} samples trained"
        for row in rows:  # the reward trained on is the reward of that very response
            assert row["score"] == pytest.approx(score_text(row["output"], row["gts"]), abs=1e-6)
        if mode != "baseline":
            uids = Counter(row["uid"].split("_")[0] for row in rows)  # v1 keys read "{uid}_{session}_{turn}"
            assert len(uids) == 8 and set(uids.values()) == {4}  # 8 whole groups of 4, each once
            assert not seen_uids & set(uids)  # no batch trained twice
            seen_uids |= set(uids)


STRATEGY_RUNS = [run for run in RUNS if run[1] != "baseline"]


@pytest.mark.parametrize("run", STRATEGY_RUNS, ids="-".join)
def test_lr_and_optimizer_steps_match_the_baseline(runs, run):
    trainer, _ = run
    baseline_dir, baseline = runs[trainer, "baseline"]
    directory, result = runs[run]
    assert [v for _, v in result.series("actor/lr")] == pytest.approx([v for _, v in baseline.series("actor/lr")])
    assert len(set(v for _, v in baseline.series("actor/lr"))) > 1  # the schedule really moves
    for step in (2, 4):
        assert optimizer_steps(directory, step) == optimizer_steps(baseline_dir, step) == {4 * step}


@pytest.mark.parametrize("run", STRATEGY_RUNS, ids="-".join)
def test_staleness_and_reward_timing_metrics(runs, run):
    _, mode = run
    _, result = runs[run]
    expected = [0, 1, 1, 1] if "off_policy_steps=1" in FLAGS[mode] else [0] * STEPS
    assert [v for _, v in result.series("async_reward/staleness")] == expected
    assert [v for _, v in result.series("async_reward/failed")] == [0] * STEPS
    assert all(v >= 0 for _, v in result.series("async_reward/blocked_s"))
    per_mini_batch = 2.0 if "mini_batch_pipeline=true" in FLAGS[mode] else 8.0
    assert [v for _, v in result.series("async_reward/groups_per_mini_batch")] == [per_mini_batch] * STEPS


@pytest.mark.parametrize("run", [("v0", "off_policy"), ("v1", "both")], ids="-".join)
def test_resume_from_a_checkpoint_taken_with_a_batch_in_flight(tmp_path, runs, assets, run):
    """The off-policy run saved at step 2 while batch 3 was already generated and scored; resuming
    there must train exactly the uninterrupted run's batches 3 and 4: none lost, none repeated."""
    trainer, mode = run
    uninterrupted, _ = runs[run]
    checkpoint = uninterrupted / "checkpoints" / "global_step_2"
    train(tmp_path, assets, trainer, *FLAGS[mode], "trainer.resume_mode=resume_path", f"trainer.resume_from_path={checkpoint}")
    resumed, original = dumped(tmp_path), dumped(uninterrupted)
    assert sorted(resumed) == [3, 4]
    for step in (3, 4):
        assert Counter(r["input"] for r in resumed[step]) == Counter(r["input"] for r in original[step])
