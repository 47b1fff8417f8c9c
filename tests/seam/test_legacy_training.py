"""The proof for the legacy spelling on verl's STOCK entry point: ``python -m verl.trainer.main_ppo``
on the CPU backend for 2 steps, given only the legacy selector and the legacy top-level reward
block, trains through this package's agent, which scores every sample."""

from __future__ import annotations

from collections import Counter

import pytest

from tests.conftest import REWARDS
from verl_async_rm_rig.cpu_backend.launch import CPURunConfig, run
from verl_async_rm.ray_agent import DEFAULT_ACTOR_NAME

pytestmark = [pytest.mark.trainer, pytest.mark.slow]


def test_stock_main_ppo_with_the_legacy_override_trains_through_the_agent(tmp_path):
    calls = tmp_path / "calls.tsv"
    steps, prompts, n = 2, 8, 4
    result = run(
        CPURunConfig(
            out_dir=str(tmp_path / "run"), trainer="v1", steps=steps, train_batch_size=prompts, rollout_n=n,
            val_before_train=False, resume=False, entry_module="verl.trainer.main_ppo",
            extra_overrides=[
                "reward_model.reward_manager=async_agent",  # verl's legacy selector, string form
                f"custom_reward_function.path={REWARDS / 'call_log.py'}",  # verl's legacy top-level block
                "custom_reward_function.name=compute_score",
                f"+custom_reward_function.reward_kwargs.call_log={calls}",
            ],
        ),
        progress=False,
    )
    log = open(result.log_path).read()
    assert result.ok, log[-4000:]
    assert "legacy reward config moved: reward_model.reward_manager -> reward.reward_manager.name" in log
    rows = [line.split("\t") for line in calls.read_text().splitlines()]
    # every training sample scored once, by the agent actor (verl's naive manager would score in its
    # reward-loop workers, and with the legacy block ignored would not call this reward at all)
    assert len(rows) == steps * prompts * n
    assert {actor for actor, _, _ in rows} == {DEFAULT_ACTOR_NAME}
    per_prompt = Counter((split, index) for _, split, index in rows)
    assert len(per_prompt) == steps * prompts and set(per_prompt.values()) == {n}
    assert len(result.series("critic/score/mean")) == steps
