"""failure_policy=mask, the pure part: which rows are masked (failed samples, groups below
min_group_success), the counts, and the start-time refusals of configs it cannot honour exactly.
The masked advantages and loss on verl's real functions: tests/seam/test_masking_verl.py; on verl's real
trainers: tests/strategies/test_strategies.py."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from omegaconf import OmegaConf

from verl_async_rm.config import AgentConfig
from verl_async_rm.engine.ledger import SettledGroup
from verl_async_rm.failure_policy import Mask, failure_policy, resolve_group
from verl_async_rm.integration.settings import read_run_settings
from verl_async_rm.masking import (
    MASKABLE_ESTIMATORS,
    MaskShape,
    check_masking,
    decide,
)
from verl_async_rm.outcomes import Failed, Scored

pytestmark = pytest.mark.quick


@st.composite
def batches(draw):
    """Whole groups of samples; a sample spans 1..3 rows (v1: a session's outputs), rows shuffled."""
    groups = draw(st.integers(1, 6))
    rows, row_groups, row_samples, row_failed = [], [], [], []
    sample = 0
    for group in range(groups):
        for _ in range(draw(st.integers(1, 5))):
            failed = draw(st.booleans())
            for _ in range(draw(st.integers(1, 3))):
                rows.append(len(rows))
                row_groups.append(f"g{group}")
                row_samples.append(sample)
                row_failed.append(int(failed))
            sample += 1
    order = draw(st.permutations(range(len(rows))))
    pick = lambda values: [values[i] for i in order]  # noqa: E731
    return pick(rows), pick(row_groups), pick(row_samples), pick(row_failed)


@settings(max_examples=100, deadline=None)
@given(batches(), st.integers(1, 4))
def test_failed_rows_and_whole_groups_below_the_minimum_are_masked_and_counted(batch, minimum):
    rows, groups, samples, failed = batch
    decision = decide(rows, groups, samples, failed, minimum)
    masked = set(decision.masked_rows)
    usable = {g: {s for s, gg, f in zip(samples, groups, failed) if gg == g and not f} for g in set(groups)}
    dropped = {g for g, members in usable.items() if len(members) < minimum}
    for row, group, bad in zip(rows, groups, failed):
        # masked exactly when its reward failed or its group has too few usable samples
        assert (row in masked) == bool(bad or group in dropped)
    assert list(decision.masked_rows) == [r for r in rows if r in masked]  # the order given
    assert decision.dropped_groups == len(dropped)
    assert decision.failed_samples == len({s for s, f in zip(samples, failed) if f})
    assert decision.masked_samples == len({s for r, s in zip(rows, samples) if r in masked})
    assert decision.any == bool(masked)


@given(batches())
def test_nothing_failed_and_minimum_one_masks_nothing(batch):
    rows, groups, samples, _ = batch
    decision = decide(rows, groups, samples, [0] * len(rows), 1)
    assert decision.masked_rows == () and decision.masked_samples == decision.dropped_groups == 0


def test_decide_refuses_misaligned_or_contradictory_input():
    with pytest.raises(ValueError, match="aligned"):
        decide([0, 1], ["a"], [0, 1], [0, 0], 1)
    with pytest.raises(ValueError, match="both failed and scored"):
        decide([0, 1], ["a", "a"], [7, 7], [0, 1], 1)  # one sample's rows must agree
    with pytest.raises(ValueError, match="min_group_success"):
        decide([0], ["a"], [0], [0], 0)


def test_mask_policy_answers_like_neutral_and_flags_the_failed_sample():
    group = SettledGroup("u", [0, 1, 2], [Scored(1.0), Failed("error", "boom"), Scored(0.0)])
    result = resolve_group(group, failure_policy("mask"))
    assert result.scores == [1.0, 0.5, 0.0]
    assert [e["reward_failed"] for e in result.extras] == [0, 1, 0]
    assert result.extras[1]["reward_failure"] == "error"
    assert failure_policy("mask", neutral_value=0.25) == Mask(0.25)
    assert AgentConfig(failure_policy="mask").min_group_success == 2
    with pytest.raises(ValueError):
        AgentConfig(failure_policy="mask", min_group_success=0)


# -- start-time checks -------------------------------------------------------------------------------

OK = MaskShape(masks_loss=True, min_group_success=2, strategies=True, adv_estimator="grpo", rollout_n=4)


def refusal(**changes) -> str:
    with pytest.raises(ValueError) as info:
        check_masking(MaskShape(**{**OK.__dict__, **changes}))
    return str(info.value)


def test_what_mask_accepts():
    check_masking(OK)
    for estimator in sorted(MASKABLE_ESTIMATORS):
        check_masking(MaskShape(**{**OK.__dict__, "adv_estimator": estimator}))
    check_masking(MaskShape(**{**OK.__dict__, "actor_loss_agg_mode": "token-sum"}))
    check_masking(MaskShape(**{**OK.__dict__, "adv_estimator": "gae", "use_critic": True, "min_group_success": 1}))
    check_masking(MaskShape(masks_loss=False, strategies=False, actor_loss_agg_mode="seq-mean-token-mean"))


def test_what_mask_refuses_at_start_with_the_reason():
    assert "needs the trainer strategies" in refusal(strategies=False)
    assert "cannot be masked" in refusal(adv_estimator="remax")
    assert "cannot be masked" in refusal(adv_estimator="my_custom_estimator")
    for mode in ("seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"):
        assert "still count the masked samples" in refusal(actor_loss_agg_mode=mode)
    assert "critic.loss_agg_mode" in refusal(adv_estimator="gae", use_critic=True, critic_loss_agg_mode="seq-mean-token-mean")
    assert "every group would be dropped" in refusal(min_group_success=5)
    assert "no baseline" in refusal(min_group_success=1)


def test_the_check_reads_verls_config_and_the_agents_settings_once():
    config = OmegaConf.create({
        "reward": {"async_agent": {"failure_policy": "mask", "min_group_success": 3}},
        "algorithm": {"adv_estimator": "rloo"},
        "actor_rollout_ref": {"rollout": {"n": 8}, "actor": {"loss_agg_mode": "token-sum", "ppo_mini_batch_size": 8}},
        "data": {"train_batch_size": 8},
        "mini_batch_pipeline": True,
    })
    shape = read_run_settings(config).mask
    assert shape == MaskShape(True, 3, True, "rloo", 8, "token-sum", False, "token-sum")
    check_masking(shape)
    config.mini_batch_pipeline = False
    with pytest.raises(ValueError, match="needs the trainer strategies"):
        read_run_settings(config)
    config.off_policy_steps = 1
    read_run_settings(config)
    config.critic = {"enable": True, "loss_agg_mode": "seq-mean-token-sum"}
    with pytest.raises(ValueError, match="critic.loss_agg_mode"):
        read_run_settings(config)
    # every other policy leaves the loss alone, so nothing about the shape is checked
    config.reward.async_agent.failure_policy = "neutral"
    assert not read_run_settings(config).mask.masks_loss
