"""Groups assembled one sample at a time (verl's run_single path)."""

from __future__ import annotations

import asyncio
import random

import pytest

from verl_async_rm import RewardAgent

pytestmark = pytest.mark.quick


class Reward:
    def __init__(self):
        self.groups = []

    async def compute_score(self, data_source, solution_str, ground_truth, extra_info=None):
        await asyncio.sleep(random.uniform(0, 0.02))
        if solution_str == "fail":
            raise ValueError("judge down")
        return float(solution_str)

    def post_process_scores(self, scores):
        self.groups.append(list(scores))
        return [s + 100 for s in scores]


def run(agent, calls):
    async def main():
        return await asyncio.gather(*calls(agent))

    return asyncio.run(main())


def test_samples_arriving_one_by_one_are_answered_with_their_whole_group():
    reward = Reward()
    with RewardAgent(reward) as agent:

        def calls(agent):
            async def member(uid, value, delay):
                await asyncio.sleep(delay)
                return await agent.ascore_in_group({"solution_str": str(value)}, uid, 4)

            return [member(f"u{g}", g * 10 + k, random.uniform(0, 0.05)) for g in range(5) for k in range(4)]

        answers = run(agent, calls)
    assert [score for score, _ in answers] == [g * 10 + k + 100 for g in range(5) for k in range(4)]
    assert sorted(map(sorted, reward.groups)) == [[g * 10 + k for k in range(4)] for g in range(5)]
    assert all(extra["reward_failed"] == 0 for _, extra in answers)


def test_policy_applies_within_a_streamed_group():
    reward = Reward()
    with RewardAgent(reward, {"failure_policy": "neutral"}) as agent:
        answers = run(agent, lambda a: [a.ascore_in_group({"solution_str": v}, "g", 3) for v in ("2", "fail", "4")])
    assert [s for s, _ in answers] == [102.0, 103.0, 104.0]  # failed one got the mean (3), then the hook
    assert [e["reward_failed"] for _, e in answers] == [0, 1, 0]


def test_no_uid_is_a_group_of_one_and_a_stalled_group_resolves_after_group_wait():
    reward = Reward()
    with RewardAgent(reward) as agent:
        alone = run(agent, lambda a: [a.ascore_in_group({"solution_str": "5"}, None, 8)])
        assert alone[0][0] == 105.0
        partial = run(agent, lambda a: [a.ascore_in_group({"solution_str": "1"}, "v", 4, group_wait=0.2)])
        assert partial[0][0] == 101.0 and reward.groups[-1] == [1.0]


def test_a_late_member_starts_a_new_group_and_is_counted():
    reward = Reward()
    with RewardAgent(reward) as agent:

        def calls(agent):
            async def late():
                await asyncio.sleep(0.3)
                return await agent.ascore_in_group({"solution_str": "2"}, "u", 2, group_wait=0.1)

            return [agent.ascore_in_group({"solution_str": "1"}, "u", 2, group_wait=0.1), late()]

        answers = run(agent, calls)
        assert agent.metrics()["split_groups"] == 1
    assert [s for s, _ in answers] == [101.0, 102.0]
    assert sorted(reward.groups) == [[1.0], [2.0]]


def test_bad_group_size_is_refused():
    with RewardAgent(Reward()) as agent:
        with pytest.raises(ValueError, match="group_size"):
            run(agent, lambda a: [a.ascore_in_group({"solution_str": "1"}, "u", 0)])


def test_a_streamed_sample_past_the_deadline_is_settled_by_the_policy():
    async def hangs(data_source, solution_str, ground_truth, extra_info=None):
        await asyncio.sleep(60)

    with RewardAgent(hangs, {"ticket_deadline": 0.3, "request_timeout": 0.3, "neutral_value": 0.5}) as agent:
        [(score, extra)] = run(agent, lambda a: [a.ascore_in_group({"solution_str": "x"}, None, 1)])
    assert score == 0.5 and extra["reward_failed"] == 1 and extra["reward_failure"] in ("deadline", "timeout")
