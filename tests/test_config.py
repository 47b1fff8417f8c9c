"""Bad settings are clear errors when the agent is built; token budgets are enforced."""

from __future__ import annotations

import time

import pytest

from verl_async_rm import AgentConfig, RewardAgent

pytestmark = pytest.mark.quick


async def reward(data_source, solution_str, ground_truth, extra_info=None):
    return 1.0


def sync_reward(data_source, solution_str, ground_truth, extra_info=None):
    return 1.0


@pytest.mark.parametrize(
    "settings, match",
    [
        ({"max_concurrency": -1}, "max_concurrency"),
        ({"max_concurrency": 0}, "max_concurrency"),
        ({"failure_policy": "zero"}, "failure_policy"),
        ({"ticket_deadline": 10, "request_timeout": 30}, "shorter than request_timeout"),
        ({"max_attempts": 0}, "max_attempts"),
        ({"backoff_initial": 2, "backoff_max": 1}, "backoff_max"),
        ({"executor": "gpu"}, "executor"),
        ({"requests_per_minute": -5}, "requests_per_minute"),
        ({"request_timeout": 0}, "request_timeout"),
        ({"cache_size": 0}, "cache_size"),
        ({"max_concurency": 8}, "max_concurency"),  # typo: unknown keys are refused
    ],
)
def test_bad_settings_fail_when_the_agent_is_built(settings, match):
    with pytest.raises(ValueError, match=match) as info:
        RewardAgent(reward, settings)
    assert "invalid async reward agent config" in str(info.value)


def test_mismatched_options_fail_when_the_agent_is_built():
    with pytest.raises(ValueError, match="executor='process' is for sync"):
        RewardAgent(reward, {"executor": "process"})


def test_defaults_are_sensible():
    config = AgentConfig()
    assert config.failure_policy == "neutral" and not config.cache and config.adaptive_concurrency
    assert config.sync_workers == config.max_concurrency
    assert AgentConfig(executor="process").sync_workers >= 1
    assert AgentConfig.from_mapping(None) == config


def test_tokens_per_minute_budget_paces_requests():
    # 6,000 tokens/min: a bucket of 100 tokens draining ~98/s; four 50-token requests need ~1 s.
    with RewardAgent(reward, {"tokens_per_minute": 6000}, token_estimator=lambda item: 50) as agent:
        start = time.perf_counter()
        agent.get_all(agent.submit([{"solution_str": "x"}] * 4, 1), timeout=10)
        elapsed = time.perf_counter() - start
    assert 0.9 < elapsed < 2.0


def test_requests_per_minute_paces_requests():
    with RewardAgent(sync_reward, {"requests_per_minute": 600}) as agent:  # bucket of 10, ~9.8/s after
        start = time.perf_counter()
        agent.get_all(agent.submit([{"solution_str": "x"}] * 20, 1), timeout=10)
        elapsed = time.perf_counter() - start
    assert 0.9 < elapsed < 2.0


def test_tokens_per_minute_works_from_config_alone():
    """No estimator given: ~4 characters a token. 196-character responses are ~50 tokens, so with
    6,000 tokens/min (a bucket of 100 draining ~98/s) four of them need ~1 s, as above."""
    with RewardAgent(reward, {"tokens_per_minute": 6000}) as agent:
        start = time.perf_counter()
        agent.get_all(agent.submit([{"solution_str": "x" * 196}] * 4, 1), timeout=10)
        elapsed = time.perf_counter() - start
    assert 0.9 < elapsed < 2.0
