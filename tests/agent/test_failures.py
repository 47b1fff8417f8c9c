"""Retries, Retry-After, deadlines, failure policies, the cache and the adaptive cap."""

from __future__ import annotations

import asyncio
import threading
import time

import openai
import pytest

from verl_async_rm.user_rewards.llm_judge import JudgeReward
from verl_async_rm import RetryableError, RewardAgent, RewardError
from verl_async_rm_rig.judge_server import JudgeServer, JudgeServerConfig



class HttpError(Exception):
    def __init__(self, status, retry_after=None):
        super().__init__(f"HTTP {status}")
        self.status_code = status
        self.headers = {"retry-after": str(retry_after)} if retry_after is not None else {}


class Scripted:
    """Fails each sample with the scripted exceptions, in order, then scores 1.0; records call times."""

    def __init__(self, script):
        self.script = script
        self.calls: dict[int, list[float]] = {}
        self.lock = threading.Lock()

    async def compute_score(self, data_source, solution_str, ground_truth, extra_info=None):
        i = extra_info["i"]
        with self.lock:
            attempt = len(self.calls.setdefault(i, []))
            self.calls[i].append(time.monotonic())
        if attempt < len(self.script):
            raise self.script[attempt]
        return 1.0


def one(n=1, group_size=1):
    return [{"solution_str": "x", "uid": i // group_size, "extra_info": {"i": i}} for i in range(n)]


FAST = {"backoff_initial": 0.01, "backoff_max": 0.05}


@pytest.mark.quick
@pytest.mark.parametrize("error", [HttpError(500), TimeoutError(), ConnectionError(), RetryableError("flaky")])
def test_retryable_failures_are_retried(error):
    reward = Scripted([error, error])
    with RewardAgent(reward, {**FAST, "max_attempts": 3}) as agent:
        chunk = agent.get_all(agent.submit(one(), 1), timeout=10)
        metrics = agent.metrics()
    assert chunk.scores == [1.0] and len(reward.calls[0]) == 3 and metrics["retries"] == 2


@pytest.mark.quick
@pytest.mark.parametrize("status", [429, 503])
def test_throttles_are_flow_control_and_do_not_use_up_attempts(status):
    """Five 429s (or 503s) in a row with max_attempts=2: still scored; they are throttles, not retries."""
    reward = Scripted([HttpError(status, retry_after=0.01)] * 5)
    with RewardAgent(reward, {**FAST, "max_attempts": 2}) as agent:
        chunk = agent.get_all(agent.submit(one(), 1), timeout=10)
        metrics = agent.metrics()
    assert chunk.scores == [1.0] and len(reward.calls[0]) == 6
    assert metrics["throttled"] == 5 and metrics["retries"] == 0 and metrics["failed"] == 0


@pytest.mark.quick
@pytest.mark.parametrize("error", [HttpError(400), HttpError(401), HttpError(403), HttpError(404), ValueError("bug")])
def test_permanent_failures_are_not_retried(error):
    reward = Scripted([error])
    with RewardAgent(reward, {**FAST, "max_attempts": 5, "failure_policy": "fill", "fill_value": -1}) as agent:
        chunk = agent.get_all(agent.submit(one(), 1), timeout=10)
    assert len(reward.calls[0]) == 1
    assert chunk.scores == [-1.0] and chunk.extra_info["reward_failed"] == [1]


@pytest.mark.quick
def test_attempts_are_bounded_and_the_last_error_is_reported():
    reward = Scripted([HttpError(500)] * 10)
    with RewardAgent(reward, {**FAST, "max_attempts": 4, "failure_policy": "raise"}) as agent:
        with pytest.raises(RewardError, match=r"sample 0 .*failed after 4 attempts: HttpError: HTTP 500"):
            agent.get_all(agent.submit(one(), 1), timeout=10)
    assert len(reward.calls[0]) == 4


@pytest.mark.quick
def test_retry_after_pauses_every_request_of_the_agent():
    """A 429 on one sample pauses the others too: nobody sends before its Retry-After."""
    reward = Scripted([HttpError(429, retry_after=0.3)])
    with RewardAgent(reward, {**FAST, "backoff_max": 1.0, "max_concurrency": 8}) as agent:
        agent.get_all(agent.submit(one(1), 1), timeout=10)  # the throttled one
        reward.script = []
        later = agent.submit([{"solution_str": "x", "extra_info": {"i": 10 + i}} for i in range(4)], 1)
        agent.get_all(later, timeout=10)
        metrics = agent.metrics()
    first, second = reward.calls[0]
    assert second - first >= 0.3  # the throttled request waited for Retry-After
    assert metrics["throttled"] == 1 and metrics["retries"] == 0


@pytest.mark.local
def test_real_openai_404_is_not_retried_and_429_is(tmp_path):
    with JudgeServer(JudgeServerConfig(rate_429=1.0, retry_after_s=0.01)) as server:
        wrong_path = JudgeReward(base_url=server.base_url.replace("/v1", "/nope"), api_key="k", model="m")
        with RewardAgent(wrong_path, {**FAST, "max_attempts": 3, "failure_policy": "fill"}) as agent:
            chunk = agent.get_all(agent.submit(one(), 1), timeout=10)
            assert agent.metrics()["attempt_errors_by_kind"] == {"http_404": 1}
        assert isinstance(chunk.extra_info["reward_error"][0], str) and "NotFoundError" in chunk.extra_info["reward_error"][0]
        throttled = JudgeReward(base_url=server.base_url, api_key="k", model="m")
        with RewardAgent(throttled, {**FAST, "max_attempts": 3, "max_throttled_s": 0.5}) as agent:
            with pytest.raises(RewardError, match=r"every answer for \d+s was a throttle \(http_429"):
                agent.get_all(agent.submit(one(), 1), timeout=10)
            assert agent.metrics()["attempt_errors_by_kind"]["http_429"] >= 3
        assert server.stats().outcomes["429"] >= 3


@pytest.mark.quick
def test_deadline_settles_pending_samples_by_the_policy():
    async def slow_for_some(data_source, solution_str, ground_truth, extra_info=None):
        if extra_info["i"] in (1, 5):
            await asyncio.sleep(60)
        return float(extra_info["i"])

    config = {"ticket_deadline": 0.5, "request_timeout": 0.4, "max_attempts": 10, **FAST}
    with RewardAgent(slow_for_some, config) as agent:
        start = time.perf_counter()
        chunk = agent.get_all(agent.submit(one(8, 4), 4), timeout=10)
        elapsed = time.perf_counter() - start
    # Not before the 0.5 s deadline (a loaded machine only delays), and settled by it, not by the retries
    # (10 attempts x 0.4 s request_timeout: 4 s or more); 3.5 s leaves a neighbour-loaded machine room.
    assert 0.4 < elapsed < 3.5
    assert chunk.extra_info["reward_failed"] == [0, 1, 0, 0, 0, 1, 0, 0]
    assert chunk.extra_info["reward_failure"][1] == "deadline" and "deadline" in chunk.extra_info["reward_error"][1]
    assert chunk.scores[1] == pytest.approx((0 + 2 + 3) / 3)  # neutral: the group mean of successes
    assert chunk.scores[5] == pytest.approx((4 + 6 + 7) / 3)


@pytest.mark.quick
def test_all_failed_group_gets_the_neutral_constant():
    reward = Scripted([ValueError("down")])
    with RewardAgent(reward, {"neutral_value": 0.25}) as agent:
        chunk = agent.get_all(agent.submit(one(4, 4), 4), timeout=10)
        metrics = agent.metrics()
    assert chunk.scores == [0.25] * 4 and metrics["failed"] == 4 and metrics["failures_by_kind"] == {"error": 4}


@pytest.mark.quick
def test_policy_runs_before_the_group_hook():
    seen = []

    class Reward:
        async def compute_score(self, data_source, solution_str, ground_truth, extra_info=None):
            if extra_info["i"] == 0:
                raise ValueError("judge down")
            return float(extra_info["i"])

        def post_process_scores(self, scores):
            seen.append(list(scores))
            return [s * 2 for s in scores]

    with RewardAgent(Reward(), {"failure_policy": "fill", "fill_value": -5.0}) as agent:
        chunk = agent.get_all(agent.submit(one(3, 3), 3), timeout=10)
    assert seen == [[-5.0, 1.0, 2.0]]  # the hook saw the policy's fill, not a gap
    assert chunk.scores == [-10.0, 2.0, 4.0] and chunk.extra_info["reward_failed"] == [1, 0, 0]


@pytest.mark.quick
def test_a_broken_hook_fails_its_group_by_the_policy():
    class Reward:
        def compute_score(self, data_source, solution_str, ground_truth, extra_info=None):
            return 1.0

        def post_process_scores(self, scores):
            return scores[:1]  # wrong length

    with RewardAgent(Reward(), {"failure_policy": "fill", "fill_value": 0.0}) as agent:
        chunk = agent.get_all(agent.submit(one(2, 2), 2), timeout=10)
    assert chunk.scores == [0.0, 0.0] and chunk.extra_info["reward_failure"] == ["hook_error"] * 2
    assert "returned 1 scores for a group of 2" in chunk.extra_info["reward_error"][0]


@pytest.mark.quick
def test_cache_scores_identical_requests_once_and_is_bounded():
    calls = []

    async def counted(data_source, solution_str, ground_truth, extra_info=None):
        calls.append(solution_str)
        await asyncio.sleep(0.01)
        return float(len(solution_str))

    batch = [{"solution_str": s, "ground_truth": "g"} for s in ["a", "bb", "a", "a", "bb", "ccc"]]
    with RewardAgent(counted, {"cache": True, "cache_size": 2}) as agent:
        first = agent.get_all(agent.submit(batch, 1), timeout=10)
        assert sorted(calls) == ["a", "bb", "ccc"]  # concurrent duplicates shared one call
        second = agent.get_all(agent.submit(batch[:2], 1), timeout=10)
        metrics = agent.metrics()
    assert first.scores == [1, 2, 1, 1, 2, 3] and second.scores == [1, 2]
    assert metrics["cache_misses"] == 4 and metrics["cache_hits"] == 4  # "a" evicted (size 2), scored again
    assert sorted(calls) == ["a", "a", "bb", "ccc"]


@pytest.mark.quick
def test_cache_is_off_by_default():
    calls = []

    def counted(data_source, solution_str, ground_truth, extra_info=None):
        calls.append(1)
        return 1.0

    with RewardAgent(counted) as agent:
        agent.get_all(agent.submit([{"solution_str": "same"}] * 5, 1), timeout=10)
    assert len(calls) == 5


@pytest.mark.local
def test_judge_class_and_function_against_the_server(monkeypatch):
    with JudgeServer(JudgeServerConfig(latency=(0.0, 0.02))) as server:
        batch = [{"solution_str": f"#### {v}", "ground_truth": "7", "uid": 0} for v in (7, 8, 7, 9)]
        with RewardAgent.from_file("verl_async_rm/user_rewards/llm_judge.py", "JudgeReward",
                                   reward_kwargs={"base_url": server.base_url, "api_key": "k", "model": "m"}) as agent:
            chunk = agent.get_all(agent.submit(batch, 4), timeout=10)
        assert chunk.scores == [1.0, 0.0, 1.0, 0.0] and chunk.extra_info["judge_reply"] == ["1", "0", "1", "0"]
        monkeypatch.setenv("JUDGE_BASE_URL", server.base_url)
        monkeypatch.setenv("JUDGE_API_KEY", "k")
        monkeypatch.setenv("JUDGE_MODEL", "m")
        with RewardAgent.from_file("verl_async_rm/user_rewards/llm_judge.py", "compute_score") as agent:
            chunk = agent.get_all(agent.submit(batch, 4), timeout=10)
        assert chunk.scores == [1.0, 0.0, 1.0, 0.0]
        assert server.stats().outcomes["ok"] == 8


@pytest.mark.local
def test_judge_malformed_replies_are_retried_not_scored():
    with JudgeServer(JudgeServerConfig(rate_malformed=1.0)) as server:
        judge = JudgeReward(base_url=server.base_url, api_key="k", model="m")
        config = {**FAST, "max_attempts": 2, "failure_policy": "fill", "fill_value": 0.5, "max_failure_rate": 1.0}
        with RewardAgent(judge, config) as agent:
            chunk = agent.get_all(agent.submit(one(6), 1), timeout=10)
            metrics = agent.metrics()
    assert chunk.scores == [0.5] * 6 and set(chunk.extra_info["reward_failure"]) == {"malformed"}
    assert metrics["attempt_errors_by_kind"] == {"malformed": 12}


@pytest.mark.quick
def test_judge_group_hook_replaces_unusable_scores_by_the_group_mean():
    hook = JudgeReward.post_process_scores
    assert hook(None, [1.0, float("nan"), -1.0, 0.0]) == [1.0, 0.5, 0.5, 0.0]
    assert hook(None, [-1.0, float("nan")]) == [0.0, 0.0]


@pytest.mark.quick
def test_judge_needs_its_settings(monkeypatch):
    monkeypatch.delenv("JUDGE_MODEL", raising=False)
    with pytest.raises(ValueError, match="needs a model"):
        JudgeReward(base_url="http://127.0.0.1:9/v1")
    assert issubclass(openai.RateLimitError, openai.APIStatusError)
