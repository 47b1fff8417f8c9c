"""Strategy flags and mini-batch planning: pure validation."""

from __future__ import annotations

import pytest

from verl_async_rm.strategies.plan import (
    GROUP_EXACT,
    MINI_BATCH_NORMALIZED,
    StrategyConfig,
    plan_mini_batches,
    strategy_from_mapping,
)
from verl_async_rm.strategies.timing import RewardTiming, latency_metrics

pytestmark = pytest.mark.quick
SHAPE = dict(train_batch_size=8, ppo_mini_batch_size=2, rollout_n=4, use_critic=False)


def test_flags_and_the_recipe_spellings():
    assert strategy_from_mapping({}) == StrategyConfig(False, 0)
    assert strategy_from_mapping({"mini_batch_pipeline": True}).mini_batch_pipeline
    assert strategy_from_mapping({"update_pipeline": True}).mini_batch_pipeline  # the recipe's older flag
    assert strategy_from_mapping({"off_policy_steps": 1}) == StrategyConfig(False, 1)
    assert not StrategyConfig().enabled and StrategyConfig(off_policy_steps=2).enabled
    with pytest.raises(ValueError, match="contradicts"):
        strategy_from_mapping({"mini_batch_pipeline": True, "update_pipeline": False})
    for bad in (-1, 5, 1.5, True):
        with pytest.raises(ValueError, match="off_policy_steps"):
            strategy_from_mapping({"off_policy_steps": bad})
    with pytest.raises(ValueError, match="true or false"):
        strategy_from_mapping({"mini_batch_pipeline": "yes"})


@pytest.mark.parametrize("estimator", sorted(GROUP_EXACT | MINI_BATCH_NORMALIZED - {"gae"}))
def test_pipeline_plans_whole_group_mini_batches(estimator):
    plan = plan_mini_batches(StrategyConfig(True), adv_estimator=estimator, **SHAPE)
    assert (plan.samples_per_mini_batch, plan.mini_batches) == (8, 4)


def test_without_the_pipeline_one_update_takes_the_batch():
    plan = plan_mini_batches(StrategyConfig(False, 1), adv_estimator="remax", **SHAPE)
    assert (plan.samples_per_mini_batch, plan.mini_batches) == (32, 1)


@pytest.mark.parametrize(
    "changes, match",
    [
        ({"adv_estimator": "reinforce_plus_plus"}, "needs the whole batch"),
        ({"adv_estimator": "remax"}, "needs the whole batch"),
        ({"adv_estimator": "my_custom"}, "does not know"),
        ({"adv_estimator": "gae"}, "needs a critic"),
        ({"adv_estimator": "grpo", "ppo_mini_batch_size": 3}, "must divide"),
    ],
)
def test_misconfiguration_is_a_clear_error(changes, match):
    shape = {**SHAPE, "adv_estimator": "grpo", **changes}
    with pytest.raises(ValueError, match=match):
        plan_mini_batches(StrategyConfig(True), **shape)


def test_gae_with_a_critic_is_allowed():
    assert plan_mini_batches(StrategyConfig(True), adv_estimator="gae", **{**SHAPE, "use_critic": True}).mini_batches == 4


def test_reward_timing_overlap():
    timing = RewardTiming(submitted_at=10.0, settled_at=[12.0, 14.0], blocked=1.0)
    assert timing.latency == 4.0
    assert timing.metrics()["async_reward/overlap_ratio"] == pytest.approx(0.75)  # 3 of 4 s hidden
    assert RewardTiming(0.0).metrics()["async_reward/overlap_ratio"] == 1.0
    assert latency_metrics([1.0, 2.0, 3.0])["async_reward/latency_max_s"] == 3.0 and latency_metrics([]) == {}
