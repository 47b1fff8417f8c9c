"""The contestants module: one home for what the demo and the end-to-end benchmark run (its regimes,
its modes with their reward managers and stock-command settings), read by both."""

from __future__ import annotations

import pytest

import bench.e2e as e2e
from verl_async_rm_rig import contestants


@pytest.mark.quick
def test_the_benchmark_runs_the_contestants_modules_regimes_and_modes():
    # the same objects, not copies: a regime or a mode changed there changes what both run
    assert e2e.REGIMES is contestants.REGIMES and e2e.MODES is contestants.MODES
    assert e2e.REWARD_MANAGER is contestants.REWARD_MANAGER and e2e.STOCK_COMMAND is contestants.STOCK_COMMAND
    assert e2e.RECOMMENDED == contestants.RECOMMENDED and e2e.SHAPE is contestants.SHAPE
    assert list(contestants.MODES)[:6] == ["baseline", "pipeline", "off_policy", "both", "both_k2", "both_k2_rc"]
    assert contestants.MODES[contestants.VERL_COLOCATE] == contestants.MODES[contestants.AGENT_COLOCATE] == contestants.COLOCATE


@pytest.mark.quick
def test_a_modes_reward_loop_overrides_are_its_managers():
    regime, compute = contestants.REGIMES["judge_real"], 0.8
    verl = contestants.reward_loop_overrides(regime, contestants.VERL_COLOCATE, compute)
    assert verl == ["reward.num_workers=8", *regime.verl_reward_loop(compute)]
    agent = contestants.reward_loop_overrides(regime, contestants.AGENT_COLOCATE, compute)
    assert agent == ["reward.num_workers=8", *contestants.AGENT, *regime.agent(compute)]
    assert contestants.reward_loop_overrides(regime, contestants.STOCK, compute) == [*contestants.AGENT, *regime.agent(compute)]
    assert contestants.reward_manager(contestants.VERL_COLOCATE) == "rate_limited"
    assert contestants.reward_manager(contestants.STOCK) == contestants.reward_manager(contestants.AGENT_COLOCATE) == "async_agent"
    # e2e's settings are the mode's overrides followed by these, after the shape and its validation
    settings = e2e.run_settings(e2e.Run("v1", 0, "judge_real", contestants.VERL_COLOCATE), compute, 0.0)
    assert settings["overrides"] == [*contestants.SHAPE, *e2e.VALIDATION, *contestants.COLOCATE, *verl]


@pytest.mark.quick
def test_a_run_scores_through_its_own_judge_server_or_the_simulated_judge():
    http = contestants.REGIMES["judge_real"].judge(0.8, 0)
    with pytest.raises(RuntimeError, match="judge server"):
        contestants.reward_function(http)
    reward = contestants.reward_function(http, "http://127.0.0.1:9/v1")
    assert reward["reward_name"] == "compute_score_via_judge"
    assert reward["reward_kwargs"] == {"base_url": "http://127.0.0.1:9/v1", "timeout": 2.0}
    simulated = contestants.REGIMES["tail_1x"].judge(0.8, 0)
    assert contestants.reward_function(simulated)["reward_kwargs"] == simulated
    assert contestants.start_judge_server(simulated) is None
