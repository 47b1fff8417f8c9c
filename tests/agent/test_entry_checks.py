"""The agent's entry checks (issue 45, item 10): input the engine cannot use is refused where it
enters, by name, or fails its own sample at once, not later and elsewhere as a bare TypeError, a
PicklingError per sample, or retries of a request that was never sent."""

from __future__ import annotations

import asyncio
import json

import pytest

from verl_async_rm.agent import AsyncRewardAgent, RewardAgent
from verl_async_rm_rig.judge_server import JudgeServer, JudgeServerConfig
from verl_async_rm.user_rewards.llm_judge import JudgeReward


def _identity(data_source, solution_str, ground_truth, extra_info=None):
    return 1.0


@pytest.mark.quick
def test_a_reward_that_cannot_be_pickled_is_refused_at_build_with_the_process_executor():
    def nested(data_source, solution_str, ground_truth, extra_info=None):
        return 1.0

    for reward in (lambda data_source, solution_str, ground_truth, extra_info=None: 1.0, nested):
        with pytest.raises(ValueError, match=r"executor='process' sends the reward to worker processes, and .* cannot "
                                             r"be pickled .*use executor='thread'"):
            RewardAgent(reward, {"executor": "process"})
    with RewardAgent(nested, {"executor": "thread"}) as agent:  # the same reward is fine on threads
        assert agent.get(agent.submit([{"solution_str": "x"}])).scores == [1.0]


@pytest.mark.quick
def test_a_list_as_uid_is_refused_by_name_on_both_paths():
    with RewardAgent(_identity) as agent, pytest.raises(
        ValueError, match=r"batch item 1 has a uid of type list \(\[1, 2\]\): a uid names its group"
    ):
        agent.submit([{"solution_str": "a", "uid": "g"}, {"solution_str": "b", "uid": [1, 2]}], group_size=2)

    async def per_sample():
        async with AsyncRewardAgent(_identity) as agent:
            with pytest.raises(ValueError, match=r"score_in_group has a uid of type list"):
                await agent.score_in_group({"solution_str": "a"}, uid=["g"], group_size=1)
            return await agent.score_in_group({"solution_str": "a"}, uid=("g", 1), group_size=1)  # a tuple is fine

    assert asyncio.run(per_sample())[0] == 1.0


@pytest.mark.quick
def test_metrics_called_inside_an_async_reward_answers():
    seen = []
    holder = {}

    async def reward(data_source, solution_str, ground_truth, extra_info=None):
        seen.append(holder["agent"].metrics()["submitted"])
        return 1.0

    with RewardAgent(reward) as agent:
        holder["agent"] = agent
        chunk = agent.get(agent.submit([{"solution_str": "a"}, {"solution_str": "b"}]), timeout=60)
    assert chunk.scores == [1.0, 1.0] and not any(chunk.extra_info["reward_failed"]) and seen == [2, 2]


@pytest.mark.local
@pytest.mark.parametrize("verdict_log", [False, True], ids=["no-log", "verdict-log"])
def test_a_lone_surrogate_fails_its_sample_as_invalid_at_once_never_sent(tmp_path, verdict_log):
    """Through the real openai client and the loopback judge: before, 3 "malformed" attempts of a
    request that could never be encoded (and, with a verdict log, a hang: its key could not be
    hashed)."""
    items = [{"solution_str": "so 1", "ground_truth": "1", "uid": 0} for _ in range(4)]
    items[1]["solution_str"] = "cut inside an emoji \ud83d"
    items[2]["ground_truth"] = "\udc00"
    config = {"max_failure_rate": 1.0, "backoff_initial": 0.01}
    if verdict_log:
        config["verdict_log"] = str(tmp_path / "v.jsonl")
    with JudgeServer(JudgeServerConfig()) as server:
        with RewardAgent(JudgeReward(base_url=server.base_url, api_key="k", model="judge-stub"), config) as agent:
            chunk = agent.get(agent.submit(items, group_size=4), timeout=60)
            metrics = agent.metrics()
        sent = server.stats().requests
    failed = chunk.extra_info["reward_failed"]
    assert failed == [False, True, True, False] and sent == 2
    assert metrics["failures_by_kind"] == {"invalid": 2} and metrics["retries"] == 0
    errors = chunk.extra_info["reward_error"]
    assert "was not sent: solution_str is not valid Unicode: a lone surrogate '\\ud83d' at character 20" in errors[1]
    assert "was not sent: ground_truth is not valid Unicode" in errors[2]
    if verdict_log:
        logged = [json.loads(line) for line in (tmp_path / "v.jsonl").read_text().splitlines()]
        verdicts = [r for r in logged if "failure" in r]  # the log also holds the reward's identity record
        assert sorted((r["index"], r["failure"], r["attempts"]) for r in verdicts if r["failure"]) == [(1, "invalid", 0), (2, "invalid", 0)]


@pytest.mark.quick
def test_a_group_judge_with_a_lone_surrogate_in_a_member_is_not_called_for_that_group():
    calls = []

    class Judge:
        def compute_group_score(self, group):
            calls.append([m.index for m in group])
            return [1.0] * len(group)

    items = [{"solution_str": "ok", "uid": g} for g in (0, 0, 1, 1)]
    items[3]["solution_str"] = "\ud800"
    with RewardAgent(Judge(), {"max_failure_rate": 1.0}) as agent:
        chunk = agent.get(agent.submit(items, group_size=2), timeout=60)
    assert calls == [[0, 1]] and chunk.extra_info["reward_failed"] == [False, False, True, True]
    assert all("sample 3: solution_str is not valid Unicode" in chunk.extra_info["reward_error"][i] for i in (2, 3))
