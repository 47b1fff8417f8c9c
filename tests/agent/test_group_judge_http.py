"""The example group judge (verl_async_rm/user_rewards/group_judge.py) over real HTTP: the loopback
judge's ranking mode through the real ``openai`` client. (Not quick: ~2 s, mostly importing openai.)"""

from __future__ import annotations

import pytest

from verl_async_rm.agent import RewardAgent

pytestmark = pytest.mark.local


def test_example_group_judge_against_the_loopback_judge_through_the_real_openai_client():
    """verl_async_rm/user_rewards/group_judge.py: one HTTP request per group (plus its retries of
    injected 500s and malformed replies), each member scored by its own answer."""
    from verl_async_rm_rig.judge_server import JudgeServer, JudgeServerConfig

    batch = [{"solution_str": f"so the answer is {i % 3}", "ground_truth": uid % 3, "uid": uid}
             for uid in range(6) for i in range(4)]
    with JudgeServer(JudgeServerConfig(rate_500=0.2, rate_malformed=0.2, seed=3)) as server:
        kwargs = {"base_url": server.base_url, "model": "judge-stub"}
        with RewardAgent.from_file("verl_async_rm/user_rewards/group_judge.py", "GroupJudgeReward", reward_kwargs=kwargs,
                                   config={"max_attempts": 8, "backoff_initial": 0.01, "backoff_max": 0.02}) as agent:
            chunk = agent.get_all(agent.submit(batch, group_size=4))
            metrics = agent.metrics()
        stats = server.stats()
    assert chunk.scores == [float(i % 3 == uid % 3) for uid in range(6) for i in range(4)]
    assert stats.outcomes["ok"] == 6 and stats.requests == 6 + metrics["retries"] > 6
    assert set(chunk.extra_info["judge_reply"]) == {"1 0 0 1", "0 1 0 0", "0 0 1 0"}
