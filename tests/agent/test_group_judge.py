"""Group judges (``compute_group_score``): one call per complete group, under the same limits,
retries, deadline and failure policies as per-sample rewards (engine/group_judge.py). Virtual time
(looptime) for the async judges; one thread-executor test in real time."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given
from hypothesis import strategies as st

from verl_async_rm.agent import AsyncRewardAgent, RewardAgent
from verl_async_rm.engine.group_judge import normalize_group_verdicts
from verl_async_rm.errors import FailureBudgetExceeded, RewardFunctionError
from verl_async_rm.loader import wrap_reward

from tests.helpers.harness import virtual

pytestmark = pytest.mark.quick




def items(n, group_size):
    return [{"solution_str": f"s{i}", "ground_truth": i, "uid": i // group_size} for i in range(n)]


class Ranker:
    """Scores each member by its ground truth / 100, one call per group; records every call."""

    def __init__(self, latency=1.0, fail_first=0, exc=ValueError, reply=None):
        self.calls: list[list[int]] = []
        self.latency, self.fail_first, self.exc, self.reply = latency, fail_first, exc, reply
        self.in_flight = self.peak = 0

    async def compute_group_score(self, group):
        self.calls.append([m.index for m in group])
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        try:
            await asyncio.sleep(self.latency)
        finally:
            self.in_flight -= 1
        if len(self.calls) <= self.fail_first:
            raise self.exc("judge down")
        if self.reply is not None:
            return self.reply(group)
        return [{"score": m.ground_truth / 100, "rank": r} for r, m in enumerate(group)]


def test_one_call_per_group_each_member_gets_its_own_score():
    judge = Ranker()

    async def scenario():
        async with AsyncRewardAgent(judge) as agent:
            chunk = await agent.get_all(agent.submit(items(12, 4), group_size=4))
            return chunk, agent.metrics()

    chunk, metrics = virtual(scenario)
    assert sorted(map(sorted, judge.calls)) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    assert chunk.scores == [i / 100 for i in range(12)]
    assert chunk.extra_info["rank"] == [i % 4 for i in range(12)]
    assert metrics["completed"] == 12 and metrics["failed"] == 0


def test_a_group_call_is_one_request_against_the_cap_and_rpm():
    """max_concurrency=2: at most two group calls at once; requests_per_minute=61 (one per second
    after the first second's burst of 1.0) paces calls, not samples: 6 groups of 4 take ~5 s."""
    judge = Ranker(latency=0.1)

    async def scenario():
        async with AsyncRewardAgent(judge, {"max_concurrency": 2, "requests_per_minute": 61}) as agent:
            start = asyncio.get_running_loop().time()
            await agent.get_all(agent.submit(items(24, 4), group_size=4))
            return asyncio.get_running_loop().time() - start

    elapsed = virtual(scenario)
    assert len(judge.calls) == 6 and judge.peak <= 2
    assert 4.5 <= elapsed <= 6.5  # per-sample accounting would take ~23 s


def test_group_tokens_are_the_sum_of_the_members():
    judge = Ranker(latency=0.0)
    sizes: list[float] = []

    def estimate(item):
        sizes.append(1)
        return 10

    async def scenario():
        async with AsyncRewardAgent(judge, {"tokens_per_minute": 10_000}, token_estimator=estimate) as agent:
            await agent.get_all(agent.submit(items(8, 4), group_size=4))

    virtual(scenario)
    assert len(sizes) == 8  # every member estimated once, for its group's call


def test_a_failed_group_call_is_retried_whole_then_fails_every_member_with_its_kind():
    """Two failures then success: retried as a call (3 calls for the group). Always failing: each
    member fails with the call's kind, and the neutral policy gives the group the neutral value."""
    flaky = Ranker(fail_first=2, exc=ConnectionError)

    async def retried():
        async with AsyncRewardAgent(flaky, {"max_attempts": 3, "backoff_initial": 0.1, "backoff_max": 0.2}) as agent:
            return await agent.get_all(agent.submit(items(4, 4), group_size=4))

    chunk = virtual(retried)
    assert len(flaky.calls) == 3 and chunk.scores == [0.0, 0.01, 0.02, 0.03]
    assert chunk.extra_info["rank"] == [0, 1, 2, 3]

    down = Ranker(fail_first=10**6, exc=TimeoutError)

    async def failing():
        async with AsyncRewardAgent(down, {"max_attempts": 2, "backoff_initial": 0.1, "backoff_max": 0.2,
                                           "neutral_value": 0.5, "max_failure_rate": 1.0}) as agent:
            chunk = await agent.get_all(agent.submit(items(8, 4), group_size=4))
            return chunk, agent.metrics()

    chunk, metrics = virtual(failing)
    assert len(down.calls) == 4  # 2 groups x 2 attempts
    assert chunk.scores == [0.5] * 8 and chunk.extra_info["reward_failed"] == [1] * 8
    assert metrics["failures_by_kind"] == {"timeout": 8}


def test_a_wrong_answer_fails_loudly_naming_the_judge():
    """A judge that returns the wrong number of scores: every member 'invalid', and past
    max_failure_rate the ticket fails with the judge's name and what was wrong."""
    judge = Ranker(latency=0.0, reply=lambda group: [1.0] * (len(group) - 1))

    async def scenario():
        async with AsyncRewardAgent(judge) as agent:
            await agent.get_all(agent.submit(items(8, 4), group_size=4))

    with pytest.raises(FailureBudgetExceeded, match=r"5 of 8 samples failed.*invalid x5.*compute_group_score on group 0 \(4 samples.*3 scores for a group of 4"):
        virtual(scenario)


def test_deadline_settles_the_members_and_abandons_the_call():
    judge = Ranker(latency=100.0)

    async def scenario():
        async with AsyncRewardAgent(judge, {"ticket_deadline": 5, "request_timeout": 5, "failure_policy": "fill",
                                            "fill_value": -1.0, "max_failure_rate": 1.0}) as agent:
            start = asyncio.get_running_loop().time()
            chunk = await agent.get_all(agent.submit(items(4, 4), group_size=4))
            await asyncio.sleep(0)
            return chunk, asyncio.get_running_loop().time() - start, agent.metrics()

    chunk, elapsed, metrics = virtual(scenario)
    assert chunk.scores == [-1.0] * 4 and elapsed == pytest.approx(5, abs=0.01)
    assert metrics["failures_by_kind"] == {"deadline": 4} and metrics["in_flight"] == 0


def test_open_ticket_judges_a_group_only_once_complete_and_short_groups_at_close():
    judge = Ranker(latency=0.0)

    async def scenario():
        async with AsyncRewardAgent(judge) as agent:
            ticket = agent.open_ticket(group_size=3)
            agent.add(ticket, items(2, 3))  # group 0: 2 of 3
            await asyncio.sleep(10)
            assert judge.calls == []  # not judged while incomplete
            agent.add(ticket, [{"index": 2, "solution_str": "s2", "ground_truth": 2, "uid": 0},
                               {"index": 3, "solution_str": "s3", "ground_truth": 3, "uid": 1}])
            await asyncio.sleep(10)
            assert judge.calls == [[0, 1, 2]]
            agent.close_ticket(ticket)  # group 1 closed short: judged with its one member
            return await agent.get_all(ticket)

    chunk = virtual(scenario)
    assert judge.calls == [[0, 1, 2], [3]] and chunk.scores == [0.0, 0.01, 0.02, 0.03]


def test_irregular_group_sizes_each_judged_whole():
    judge = Ranker(latency=0.0)
    batch = [{"solution_str": "x", "ground_truth": i, "uid": uid} for i, uid in enumerate("aabbbc")]

    async def scenario():
        async with AsyncRewardAgent(judge) as agent:
            return await agent.get_all(agent.submit(batch, group_size={"a": 2, "b": 3, "c": 1}))

    chunk = virtual(scenario)
    assert sorted(judge.calls) == [[0, 1], [2, 3, 4], [5]] and chunk.scores == [i / 100 for i in range(6)]


def test_per_sample_stream_judges_when_the_group_is_full_or_group_wait_closes_it():
    judge = Ranker(latency=0.0)

    async def scenario():
        async with AsyncRewardAgent(judge) as agent:
            full = [agent.score_in_group({"solution_str": "x", "ground_truth": i}, uid="g", group_size=2, group_wait=60)
                    for i in range(2)]
            short = agent.score_in_group({"solution_str": "x", "ground_truth": 7}, uid="h", group_size=3, group_wait=5)
            return await asyncio.gather(*full, short)

    results = virtual(scenario)
    assert [r[0] for r in results] == [0.0, 0.01, 0.07]
    assert sorted(map(len, judge.calls)) == [1, 2]


def test_thread_executor_for_a_sync_judge():
    class SyncRanker:
        def __init__(self):
            self.calls = 0

        def compute_group_score(self, group):
            self.calls += 1
            return [len(group) * 1.0 for _ in group]

    judge = SyncRanker()
    with RewardAgent(judge) as agent:
        chunk = agent.get_all(agent.submit(items(6, 3), group_size=3))
    assert judge.calls == 2 and chunk.scores == [3.0] * 6


def test_loader_refuses_both_methods_and_accepts_a_group_judge():
    class Both:
        def compute_score(self, data_source, solution_str, ground_truth, extra_info=None):
            return 1.0

        def compute_group_score(self, group):
            return [1.0]

    with pytest.raises(RewardFunctionError, match="defines both compute_score and compute_group_score"):
        wrap_reward(Both)

    class NoGroupArg:
        def compute_group_score(self):
            return []

    with pytest.raises(RewardFunctionError, match=r"cannot be called as compute_group_score\(group\)"):
        wrap_reward(NoGroupArg)
    reward = wrap_reward(Ranker)
    assert reward.is_group_judge and reward.score_is_async and reward.score_fn is None


@pytest.mark.parametrize("config, match", [({"executor": "process"}, "executor='process'"), ({"cache": True}, "cache=True")])
def test_unsupported_settings_refused_at_build(config, match):
    with pytest.raises(ValueError, match=match):
        with RewardAgent(Ranker(), config):
            pass


@given(st.lists(st.one_of(st.floats(allow_nan=False, allow_infinity=False, width=32), st.integers(-5, 5)), max_size=6),
       st.integers(0, 6))
def test_verdicts_accepted_only_with_one_finite_score_per_member(scores, expected):
    if len(scores) != expected:
        with pytest.raises(RewardFunctionError, match=f"returned {len(scores)} scores for a group of {expected}"):
            normalize_group_verdicts(scores, expected, "J")
    else:
        assert normalize_group_verdicts(scores, expected, "J") == [(float(s), {}) for s in scores]


@pytest.mark.parametrize("value, match", [
    ("0.5 1", "returned str"), ({"score": 1}, "returned dict"), (3.0, "returned float"),
    ([1.0, float("nan")], r"\(member 1\) returned a non-finite"), ([1.0, "high"], r"\(member 1\) returned str"),
])
def test_unusable_verdicts_named(value, match):
    with pytest.raises(RewardFunctionError, match=match):
        normalize_group_verdicts(value, 2, "J")

