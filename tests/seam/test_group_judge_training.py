"""A group judge trains on verl's real v0 trainer (CPU backend) with the strategies on (mini-batch
pipeline, one step off-policy): the example ``GroupJudgeReward`` against the loopback judge, one
chat call per GRPO group, through the real ``openai`` client. One run (~1 min), the ``group_judge`` run of
tests/helpers/verl_modes.py's queue (the session fixture ``verl_modes_runs``), beside the other runs."""

from __future__ import annotations

from collections import defaultdict

import pytest

from tests.helpers.rollout_dump import dump_rows
from tests.helpers.verl_modes import GROUP_JUDGE, GROUP_JUDGE_PROMPTS as PROMPTS, GROUP_JUDGE_STEPS as STEPS
from verl_async_rm_rig.cpu_backend.toy_task import score_text

pytestmark = [pytest.mark.trainer, pytest.mark.slow]
N = 4


def test_a_group_judge_trains_with_the_pipeline_and_off_policy_on(verl_modes_runs):
    tmp_path, result, stats = verl_modes_runs[GROUP_JUDGE]  # trained in the verl_modes queue (tests/helpers/verl_modes.py)
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
