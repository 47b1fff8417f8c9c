"""Bad settings are clear errors when the agent is built; token budgets are enforced."""

from __future__ import annotations

import asyncio

import looptime
import pytest

from verl_async_rm import AgentConfig, RewardAgent
from verl_async_rm.agent import AsyncRewardAgent

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
        ({"admission_order": "lifo"}, "admission_order: Input should be 'fifo' or 'deadline'"),
        ({"max_passover_s": 0}, "max_passover_s: Input should be greater than 0"),
        ({"max_passover_s": float("inf")}, "max_passover_s: Input should be a finite number"),
        ({"max_passover_s": "soon"}, "max_passover_s"),
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


def paced(config, items, token_estimator=None) -> float:
    """Seconds (virtual) to score ``items`` through an agent with ``config``."""

    async def scenario():
        async with AsyncRewardAgent(reward, config, token_estimator=token_estimator) as agent:
            start = asyncio.get_running_loop().time()
            await agent.get_all(agent.submit(items, 1))
            return asyncio.get_running_loop().time() - start

    loop = looptime.new_event_loop()
    try:
        return loop.run_until_complete(scenario())
    finally:
        loop.close()


def test_tokens_per_minute_budget_paces_requests():
    # 6,000 tokens/min: a bucket of 100 tokens draining 98.33/s; four 50-token requests: the first two
    # fit at once, the other two wait for 50 tokens each to drain.
    elapsed = paced({"tokens_per_minute": 6000}, [{"solution_str": "x"}] * 4, token_estimator=lambda item: 50)
    assert elapsed == pytest.approx(100 / 98.3333, rel=1e-3)


def test_requests_per_minute_paces_requests():
    # 600/min: a bucket of 10 draining 9.833/s; 20 requests: 10 at once, 10 more at the drain rate.
    elapsed = paced({"requests_per_minute": 600}, [{"solution_str": "x"}] * 20)
    assert elapsed == pytest.approx(10 / 9.8333, rel=1e-3)


def test_tokens_per_minute_works_from_config_alone():
    """No estimator given: ~4 characters a token. 196-character responses are 50 tokens, so this is
    the first test's pacing, from configuration alone."""
    elapsed = paced({"tokens_per_minute": 6000}, [{"solution_str": "x" * 196}] * 4)
    assert elapsed == pytest.approx(100 / 98.3333, rel=1e-3)


def test_the_hydra_configs_defaults_are_the_settings_own():
    """Defaults are declared once, in the typed settings; the YAML a verl user's `--cfg job` shows must say
    the same (a default changed in one place only would silently differ between entry points)."""
    from importlib.resources import files

    import yaml

    from verl_async_rm.integration import settings
    from verl_async_rm.ray_agent import DEFAULT_ACTOR_NAME
    from verl_async_rm.strategies.plan import StrategyConfig, strategy_from_mapping

    declared = yaml.safe_load(files("verl_async_rm.hydra_conf").joinpath("async_reward_settings.yaml").read_text())
    block = dict(declared["reward"]["async_agent"])
    integration = {key: block.pop(key) for key in ("group_size", "group_wait", "group_timeout", "actor_name", "extra_keys")}
    from verl_async_rm.drift import DEFAULTS as DRIFT_DEFAULTS

    assert block.pop("drift_check") == DRIFT_DEFAULTS  # the drift check's block, off (log: null)
    assert block == AgentConfig().model_dump()  # every field, same default, nothing extra
    assert integration == {"group_size": None, "group_wait": settings.DEFAULT_GROUP_WAIT,
                           "group_timeout": settings.DEFAULT_GROUP_TIMEOUT, "actor_name": DEFAULT_ACTOR_NAME, "extra_keys": []}
    flags = {key: value for key, value in declared.items() if key not in ("reward", "reward_model")}
    assert strategy_from_mapping(flags) == StrategyConfig()
    assert set(flags) == {"mini_batch_pipeline", "update_pipeline", "off_policy_steps", "mini_batch_order",
                          "stream_rewards", "max_staleness", "on_stale"}


# -- a token estimate that is not a finite count of tokens is refused (issue 45 item 9) --------------------
BAD_ESTIMATES = [float("inf"), float("nan"), -1e6, -1, "many", None]


def scored_with_estimator(config, estimate, n=4):
    """(virtual seconds, chunk, calls) for ``n`` samples whose estimate is ``estimate`` for sample 0
    and 50 tokens for the others. Bounded: a hang would be an asyncio TimeoutError, in virtual time."""
    calls = []

    async def counting(data_source, solution_str, ground_truth, extra_info=None):
        calls.append(extra_info["i"])
        return 1.0

    async def scenario():
        async with AsyncRewardAgent(counting, config, token_estimator=lambda item: estimate if item.index == 0 else 50) as agent:
            start = asyncio.get_running_loop().time()
            chunk = await agent.get_all(agent.submit([{"solution_str": "x", "extra_info": {"i": i}} for i in range(n)], 1),
                                        timeout=3600)
            return asyncio.get_running_loop().time() - start, chunk, calls

    loop = looptime.new_event_loop()
    try:
        return loop.run_until_complete(scenario())
    finally:
        loop.close()


@pytest.mark.parametrize("estimate", BAD_ESTIMATES)
def test_a_bad_token_estimate_is_refused_and_tokens_per_minute_still_holds(estimate):
    """Before: NaN or a negative estimate drained the bucket (tokens_per_minute silently off: every
    request at once). Now the sample is refused as ``invalid``, naming token_estimator, never sent,
    and the others are paced exactly as without it: 3 x 50 tokens against a 100-token bucket
    draining 98.33/s, so the third waits 50 tokens' drain."""
    elapsed, chunk, calls = scored_with_estimator({"tokens_per_minute": 6000}, estimate)
    assert sorted(calls) == [1, 2, 3]  # the refused sample never reached the reward
    assert chunk.extra_info["reward_failed"][0] == 1 and chunk.extra_info["reward_failure"][0] == "invalid"
    assert "token_estimator returned" in chunk.extra_info["reward_error"][0]
    assert chunk.scores[1:] == [1.0] * 3
    assert elapsed == pytest.approx(50 / 98.3333, rel=1e-3)


@pytest.mark.parametrize("estimate", BAD_ESTIMATES)
def test_a_bad_token_estimate_against_a_budget_is_refused_not_hung(estimate):
    """Before: ``inf`` raised inside the admission pump and the ticket hung. Now: refused, the rest scored."""
    elapsed, chunk, calls = scored_with_estimator({"token_budget": 10_000, "reserve_output_tokens": 10}, estimate)
    assert sorted(calls) == [1, 2, 3] and chunk.scores[1:] == [1.0] * 3
    assert chunk.extra_info["reward_failure"][0] == "invalid" and "token_estimator returned" in chunk.extra_info["reward_error"][0]


def test_an_estimator_that_is_always_wrong_fails_the_run_loudly():
    from verl_async_rm.errors import FailureBudgetExceeded

    async def scenario():
        async with AsyncRewardAgent(reward, {"tokens_per_minute": 6000}, token_estimator=lambda item: float("nan")) as agent:
            with pytest.raises(FailureBudgetExceeded, match="token_estimator returned nan"):
                await agent.get_all(agent.submit([{"solution_str": "x"}] * 20, 1), timeout=3600)

    loop = looptime.new_event_loop()
    try:
        loop.run_until_complete(scenario())
    finally:
        loop.close()
