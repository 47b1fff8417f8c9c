"""A group judge trains on verl's real v0 trainer (CPU backend) with the strategies on (mini-batch
pipeline, one step off-policy): the example ``GroupJudgeReward`` against the loopback judge, one
chat call per GRPO group, through the real ``openai`` client. One run (~1 min)."""

from __future__ import annotations

from collections import defaultdict

import pytest

from tests.helpers.rollout_dump import dump_rows
from verl_async_rm_rig.cpu_backend.launch import CPURunConfig, prepare_assets, run
from verl_async_rm_rig.cpu_backend.toy_task import score_text
from verl_async_rm_rig.judge_server import JudgeServer, JudgeServerConfig, group_prompt

pytestmark = [pytest.mark.trainer, pytest.mark.slow]
STEPS, PROMPTS, N = 4, 8, 4


def toy_ranking_judge(messages: list[dict]) -> str:
    """The toy task's score of every candidate, in order (the candidate block adds one newline each side)."""
    reference, candidates = group_prompt(messages)
    return " ".join(repr(score_text(c[1:-1], reference.strip())) for c in candidates)


def test_a_group_judge_trains_with_the_pipeline_and_off_policy_on(tmp_path):
    with JudgeServer(JudgeServerConfig(judge=toy_ranking_judge, latency=(0.01, 0.05), rate_500=0.05)) as server:
        cfg = CPURunConfig(
            out_dir=str(tmp_path), trainer="v0", steps=STEPS, entry_module="verl_async_rm.main_ppo",
            reward_manager="async_agent", val_before_train=False,
            reward_path="pkg://verl_async_rm.user_rewards.group_judge", reward_name="GroupJudgeReward",
            reward_kwargs={"base_url": server.base_url, "model": "judge-stub"}, timeout_s=600,
            extra_overrides=["mini_batch_pipeline=true", "off_policy_steps=1",
                             "actor_rollout_ref.actor.ppo_mini_batch_size=2",  # 4 mini-batches per step
                             "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
                             f"trainer.rollout_data_dir={tmp_path / 'rollouts'}"],
        )
        prepare_assets(cfg)
        result = run(cfg, progress=False)
        stats = server.stats()
    assert result.ok, f"training failed (rc {result.returncode}); log in {tmp_path}"
    steps = {int(p.stem): dump_rows(p) for p in sorted((tmp_path / "rollouts").glob("*.jsonl"))}
    assert sorted(steps) == list(range(1, STEPS + 1))
    for step, rows in steps.items():
        groups = defaultdict(list)
        for row in rows:
            groups[row.get("uid", row["input"])].append(row)
        assert len(rows) == PROMPTS * N and {len(g) for g in groups.values()} == {N}
        for row in rows:  # every sample trained with its own response's verdict from its group's call
            assert row["score"] == pytest.approx(score_text(row["output"], row["gts"]), abs=1e-6)
    # One request per group (8 per step), plus the retries of injected 500s: never one per sample.
    assert stats.outcomes["ok"] == STEPS * PROMPTS
    assert stats.requests == stats.outcomes["ok"] + stats.outcomes["500"]
