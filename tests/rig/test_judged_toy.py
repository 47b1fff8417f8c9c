"""The toy reward behind the loopback HTTP judge (bench/e2e.py's judge_real regime): the server scores
exactly what the in-process toy reward scores, through the real openai client and the shipped LLM
judge's prompt, and every call (answered, refused, failed, timed out) is logged with the key the
benchmark joins with verl's rollout dump."""

from __future__ import annotations

import asyncio
import json

import openai
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from verl_async_rm.user_rewards.llm_judge import build_messages
from verl_async_rm_rig.cpu_backend import judged_toy
from verl_async_rm_rig.cpu_backend.toy_task import JUDGE_LOG_ENV, score_text
from verl_async_rm_rig.judge_server import JudgeServer, JudgeServerConfig

pytestmark = pytest.mark.timeout(60)


@pytest.mark.quick
@settings(max_examples=100, deadline=None)
@given(response=st.text(), target=st.sampled_from(["lower", "upper"]))
def test_the_servers_rule_is_the_toy_score_of_exactly_the_response(response, target):
    """Any response text (newlines, the template's own tags, nothing at all) is cut from the shipped
    judge prompt byte for byte, so the HTTP judge and the in-process reward never disagree."""
    assert judged_toy.parse_judge_prompt(build_messages(response, target)[1]["content"]) == (response, target)
    assert float(judged_toy.toy_judge(build_messages(response, target))) == score_text(response, target)


@pytest.mark.quick
def test_a_prompt_that_is_not_the_toy_judges_is_a_judge_error():
    with pytest.raises(ValueError):
        judged_toy.toy_judge([{"role": "user", "content": "grade this"}])
    assert judged_toy.parse_judge_prompt("<response>\nx\n</response>") is None


def calls(log) -> list[dict]:
    return [json.loads(line) for line in log.read_text().splitlines()]


@pytest.mark.local
def test_answers_refusals_and_failures_are_scored_or_raised_and_each_call_logged(tmp_path, monkeypatch):
    log = tmp_path / "judge_calls.jsonl"
    monkeypatch.setenv(JUDGE_LOG_ENV, str(log))
    cfg = JudgeServerConfig(judge=judged_toy.toy_judge, bucket_capacity=2, bucket_refill_per_s=0.01, seed=0)

    async def main(base_url):
        ok = [await judged_toy.compute_score_via_judge("toy", text, "lower", {"split": "train"}, base_url=base_url, timeout=5)
              for text in ("abc DEF", "ALL CAPS")]
        with pytest.raises(openai.RateLimitError):  # the bucket is empty: a 429, raised for the caller's policy
            await judged_toy.compute_score_via_judge("toy", "abc", "lower", {"split": "val"}, base_url=base_url, timeout=5)
        return ok

    with JudgeServer(cfg) as server:
        ok = asyncio.run(main(server.base_url))
        outcomes = dict(server.stats().outcomes)
    assert ok == [score_text("abc DEF", "lower"), score_text("ALL CAPS", "lower")] and ok[0] > 0
    assert outcomes["ok"] == 2 and outcomes["rate_limited"] == 1
    logged = calls(log)
    assert [c["outcome"] for c in logged] == ["ok", "ok", "429"]
    assert [c["split"] for c in logged] == ["train", "train", "val"]
    assert logged[0]["key"] == judged_toy.sample_key("abc DEF", "lower") != judged_toy.sample_key("abc DEF", "upper")
    assert all(c["end"] >= c["start"] for c in logged)


@pytest.mark.local
def test_server_errors_hangs_and_a_callers_timeout_are_logged_as_such(tmp_path, monkeypatch):
    log = tmp_path / "judge_calls.jsonl"
    monkeypatch.setenv(JUDGE_LOG_ENV, str(log))

    async def one(base_url, timeout=5.0):
        return await judged_toy.compute_score_via_judge("toy", "abc", "lower", {}, base_url=base_url, timeout=timeout)

    with JudgeServer(JudgeServerConfig(judge=judged_toy.toy_judge, rate_500=1.0)) as server:
        with pytest.raises(openai.InternalServerError):
            asyncio.run(one(server.base_url))
    with JudgeServer(JudgeServerConfig(judge=judged_toy.toy_judge, rate_hang=1.0, hang_seconds=60)) as server:
        with pytest.raises(openai.APITimeoutError):  # the client's own timeout
            asyncio.run(one(server.base_url, timeout=0.2))

        async def cut_short():  # verl's rate_limited manager: asyncio.wait_for around the reward
            await asyncio.wait_for(one(server.base_url), timeout=0.2)

        with pytest.raises(asyncio.TimeoutError):
            asyncio.run(cut_short())
    assert [c["outcome"] for c in calls(log)] == ["500", "timeout", "cancelled"]


@pytest.mark.quick
def test_the_reward_refuses_to_run_without_its_server():
    with pytest.raises(ValueError, match="base_url"):
        asyncio.run(judged_toy.compute_score_via_judge("toy", "abc", "lower"))
