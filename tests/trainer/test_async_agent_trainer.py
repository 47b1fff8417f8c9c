"""verl's stock trainer on CPU with reward.reward_manager.name=async_agent: scores go through the agent."""

from __future__ import annotations

import json

import pytest

from verl_async_rm.cpu_backend.launch import CPURunConfig, prepare_assets, run
from verl_async_rm.cpu_backend.toy_task import score_text

pytestmark = [pytest.mark.trainer, pytest.mark.slow]


@pytest.mark.parametrize("trainer", ["v0", "v1"])
def test_stock_trainer_scores_through_the_agent(tmp_path, trainer):
    cfg = prepare_assets(
        CPURunConfig(
            out_dir=str(tmp_path), trainer=trainer, steps=2, reward_manager="async_agent", val_before_train=True,
            timeout_s=600, extra_overrides=[f"trainer.rollout_data_dir={tmp_path / 'rollouts'}",
                                            "+reward.async_agent.max_concurrency=16"],
        )
    )
    result = run(cfg, progress=False)
    assert result.ok, f"training failed (rc {result.returncode}); log in {tmp_path}"
    rows = [json.loads(line) for path in sorted((tmp_path / "rollouts").glob("*.jsonl")) for line in path.read_text().splitlines()]
    assert len(rows) == 2 * 32
    assert all(row["score"] == pytest.approx(score_text(row["output"], row["gts"]), abs=1e-6) for row in rows)
    assert [step for step, _ in result.series("critic/score/mean")] == [1, 2]
    # reward_failed is a key only the agent adds to the reward's extra info: validation went through it
    [(step, failed)] = result.series("val-aux/verl_async_rm/letter_case/reward_failed/mean@1")
    assert (step, failed) == (0, 0.0)
