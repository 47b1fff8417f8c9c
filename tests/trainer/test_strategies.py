"""The strategies on verl's real trainers (CPU backend; v0, and v1's async_reward mode): sample
accounting, LR, optimizer steps, staleness, learning, GAE with a critic, and resume from a
checkpoint taken with a prefetched batch in flight.

Every run: GRPO on the toy task, 8 prompts x 4 samples per step, 4 PPO mini-batches per step, a
warm-up LR schedule (a scheduler stepped once per mini-batch would show), verl's rollout dump,
rewards through the async_agent manager. v0 runs 16 steps (long enough for the toy reward to rise,
so learning is compared with the baseline's), v1 runs 4. The baselines are verl's stock trainers
(strategies off: ``main_ppo`` hands the config to verl's own ``main``), with validation through the
agent before step 1.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

from verl_async_rm.cpu_backend.launch import CPURunConfig, prepare_assets, run
from verl_async_rm.cpu_backend.toy_task import score_text

pytestmark = [pytest.mark.trainer, pytest.mark.slow]

STEPS = {"v0": 16, "v1": 4}
SHAPE = [
    "actor_rollout_ref.actor.ppo_mini_batch_size=2",  # 8 prompts / 2 = 4 mini-batches per step
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
    "actor_rollout_ref.actor.optim.lr_warmup_steps=3",
]
BOTH = ["mini_batch_pipeline=true", "off_policy_steps=1"]
FLAGS = {
    "baseline": [],
    "pipeline": ["mini_batch_pipeline=true"],
    "off_policy": ["off_policy_steps=1"],
    "both": BOTH,
    # GAE: a critic (the same tiny model with a value head) updated per mini-batch next to the actor
    "gae_both": [*BOTH, "algorithm.adv_estimator=gae", "critic.strategy=fsdp2", "critic.model.use_remove_padding=false",
                 "critic.model.enable_gradient_checkpointing=false", "+critic.model.override_config.attn_implementation=eager",
                 "critic.fsdp.use_torch_compile=false", "critic.fsdp.model_dtype=fp32", "critic.fsdp.seed=0",
                 "+critic.fsdp.mixed_precision={param_dtype:fp32,reduce_dtype:fp32,buffer_dtype:fp32}",
                 "critic.optim.lr=1e-3", "critic.optim.lr_warmup_steps=3", "critic.ppo_micro_batch_size_per_gpu=8"],
}
MODES = ("baseline", "pipeline", "off_policy", "both")
RUNS = [(trainer, mode) for trainer in ("v0", "v1") for mode in MODES] + [("v0", "gae_both")]
STRATEGY_RUNS = [run for run in RUNS if run[1] != "baseline"]
SAVED = {"v0": (14, 16), "v1": (2, 4)}  # checkpoints: save_freq 2 on v1, 14 on v0 (and the last step)
RESUME_FROM = {"v0": 14, "v1": 2}


def train(out_dir: Path, assets: CPURunConfig, trainer: str, mode: str, *overrides: str):
    baseline = mode == "baseline"
    extra = [f"critic.model.path={assets.model_dir}"] if mode.startswith("gae") else []
    cfg = CPURunConfig(
        out_dir=str(out_dir), trainer=trainer, steps=STEPS[trainer], entry_module="verl_async_rm.main_ppo",
        model_dir=assets.model_dir, train_file=assets.train_file, val_file=assets.val_file,
        reward_manager="async_agent", val_before_train=baseline, save_freq=2 if trainer == "v1" else 14,
        timeout_s=600, v1_poll_interval_s=0.05,
        extra_overrides=[*SHAPE, f"trainer.rollout_data_dir={out_dir / 'rollouts'}", *FLAGS[mode], *extra, *overrides],
    )
    result = run(cfg, progress=False)
    assert result.ok, f"training failed (rc {result.returncode}); log in {out_dir}"
    return result


def dumped(out_dir: Path) -> dict[int, list[dict]]:
    return {
        int(path.stem): [json.loads(line) for line in path.read_text().splitlines()]
        for path in sorted((out_dir / "rollouts").glob("*.jsonl"))
    }


def optimizer_steps(out_dir: Path, step: int, role: str = "actor") -> set[int]:
    path = out_dir / "checkpoints" / f"global_step_{step}" / role / "optim_world_size_1_rank_0.pt"
    state = torch.load(path, weights_only=False)
    return {int(v["step"]) for v in state["state"].values()}


def values(result, key: str) -> list[float]:
    return [v for _, v in result.series(key)]


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    return prepare_assets(CPURunConfig(out_dir=str(tmp_path_factory.mktemp("assets"))))


@pytest.fixture(scope="module")
def runs(tmp_path_factory, assets):
    out = {}
    for trainer, mode in RUNS:
        directory = tmp_path_factory.mktemp(f"{trainer}_{mode}")
        out[trainer, mode] = (directory, train(directory, assets, trainer, mode))
    return out


@pytest.mark.parametrize("run", RUNS, ids="-".join)
def test_every_sample_trained_once_with_its_own_reward(runs, run):
    trainer, mode = run
    directory, _ = runs[run]
    steps = dumped(directory)
    assert sorted(steps) == list(range(1, STEPS[trainer] + 1))
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


@pytest.mark.parametrize("trainer", ["v0", "v1"])
def test_stock_baseline_scores_and_validates_through_the_agent(runs, trainer):
    """Strategies off: verl's stock trainer, with the async_agent manager scoring training and validation."""
    _, result = runs[trainer, "baseline"]
    assert [step for step, _ in result.series("critic/score/mean")] == list(range(1, STEPS[trainer] + 1))
    assert not result.series("async_reward/staleness")  # none of the strategies' code ran
    # reward_failed is a key only the agent adds to the reward's extra info: validation went through it
    [(step, failed)] = result.series("val-aux/verl_async_rm/letter_case/reward_failed/mean@1")
    assert (step, failed) == (0, 0.0)
    assert max(values(result, "training/rollout_probs_diff_max")) < 1e-4  # rollout weights synced each step


@pytest.mark.parametrize("run", STRATEGY_RUNS, ids="-".join)
def test_lr_and_optimizer_steps_match_the_baseline(runs, run):
    trainer, _ = run
    baseline_dir, baseline = runs[trainer, "baseline"]
    directory, result = runs[run]
    assert values(result, "actor/lr") == pytest.approx(values(baseline, "actor/lr"))
    assert len(set(values(baseline, "actor/lr"))) > 1  # the schedule really moves
    for step in SAVED[trainer]:
        assert optimizer_steps(directory, step) == optimizer_steps(baseline_dir, step) == {4 * step}


def test_gae_critic_steps_its_schedule_once_per_step_and_optimizer_once_per_mini_batch(runs):
    directory, result = runs["v0", "gae_both"]
    actor_lr, critic_lr = np.array(values(result, "actor/lr")), np.array(values(result, "critic/lr"))
    assert len(critic_lr) == STEPS["v0"]
    # same warm-up (3 steps) on both, so the critic's LR is the actor's scaled by 1e-3 / 1e-2
    assert critic_lr == pytest.approx(actor_lr * 0.1)
    assert all(np.isfinite(values(result, "critic/vf_loss")))
    assert "critic/vf_explained_var" in result.metrics[-1]["data"]
    for step in SAVED["v0"]:
        assert optimizer_steps(directory, step, "critic") == {4 * step}


@pytest.mark.parametrize("run", STRATEGY_RUNS, ids="-".join)
def test_staleness_and_reward_timing_metrics(runs, run):
    trainer, mode = run
    _, result = runs[run]
    steps = STEPS[trainer]
    expected = [0] + [1] * (steps - 1) if "off_policy_steps=1" in FLAGS[mode] else [0] * steps
    assert values(result, "async_reward/staleness") == expected
    assert values(result, "async_reward/failed") == [0] * steps
    assert all(v >= 0 for v in values(result, "async_reward/blocked_s"))
    per_mini_batch = 2.0 if "mini_batch_pipeline=true" in FLAGS[mode] else 8.0
    assert values(result, "async_reward/groups_per_mini_batch") == [per_mini_batch] * steps


def rise(result) -> tuple[float, float]:
    """(first, last): the toy reward averaged over the first and the last 4 steps."""
    scores = values(result, "critic/score/mean")
    return float(np.mean(scores[:4])), float(np.mean(scores[-4:]))


@pytest.mark.parametrize("mode", ["pipeline", "off_policy", "both"])
def test_each_strategy_learns_like_the_baseline(runs, mode):
    """16 steps, one seed: the baseline's toy reward rises; each strategy's rises at least half as
    much. (Over 3 seeds x 3 latency regimes, bench/e2e.py measures the strategy - baseline gap.)"""
    base_first, base_last = rise(runs["v0", "baseline"][1])
    first, last = rise(runs["v0", mode][1])
    assert base_last - base_first > 0.05, (base_first, base_last)
    assert last - first > 0.5 * (base_last - base_first), (mode, first, last, base_first, base_last)


@pytest.mark.parametrize("run", [("v0", "off_policy"), ("v1", "both")], ids="-".join)
def test_resume_from_a_checkpoint_taken_with_a_batch_in_flight(tmp_path, runs, assets, run):
    """The off-policy run saved while the next batch was already generated and scored; resuming
    there must train exactly the uninterrupted run's remaining batches: none lost, none repeated."""
    trainer, mode = run
    uninterrupted, _ = runs[run]
    saved = RESUME_FROM[trainer]
    checkpoint = uninterrupted / "checkpoints" / f"global_step_{saved}"
    train(tmp_path, assets, trainer, mode, "trainer.resume_mode=resume_path", f"trainer.resume_from_path={checkpoint}")
    resumed, original = dumped(tmp_path), dumped(uninterrupted)
    remaining = list(range(saved + 1, STEPS[trainer] + 1))
    assert sorted(resumed) == remaining
    for step in remaining:
        assert Counter(r["input"] for r in resumed[step]) == Counter(r["input"] for r in original[step])
