"""Issue 11 item 13: a real rate limiter against the agent's defaults, over real HTTP.

The judge server answers as real APIs do: a token bucket ("30 requests per 10 s": capacity 30,
refill 3/s) refusing with 429 + Retry-After = the time until a token exists, and 429 storms. The
client is the real ``openai.AsyncOpenAI`` inside ``user_rewards/llm_judge.py``'s ``JudgeReward``; the
server's per-request log is the referee (goodput, share refused after the first 429, probes per
Retry-After window, concurrency reached after a storm).
"""

from __future__ import annotations

import time

import openai
import pytest

from tests.harness import bounded, close_quietly, unformatted_logs  # noqa: F401 - autouse fixture
from verl_async_rm.user_rewards.llm_judge import JudgeReward
from verl_async_rm import RewardAgent
from verl_async_rm.judge_server import JudgeServer, JudgeServerConfig

pytestmark = pytest.mark.slow


class SeenByTheAgent(JudgeReward):
    """JudgeReward that logs, per request, when the agent sent it, when its answer came back and
    whether it was a 429: the agent's side of the exchange, to set against the server's."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.log: list[tuple[float, float, bool]] = []  # (sent, answered, throttled)

    async def compute_score(self, *args, **kwargs):
        sent = time.monotonic()
        try:
            return await super().compute_score(*args, **kwargs)
        except openai.RateLimitError:
            self.log.append((sent, time.monotonic(), True))
            raise
        finally:
            if not self.log or self.log[-1][0] != sent:
                self.log.append((sent, time.monotonic(), False))


def judge_items(n: int) -> list[dict]:
    return [{"solution_str": f"#### {i % 3}", "ground_truth": str(i % 3)} for i in range(n)]


@pytest.mark.timeout(240)
def test_item13_token_bucket_judge_with_default_settings():
    capacity, refill = 30, 3.0  # "30 requests per 10 s"
    # The issue ran 200 samples (110 lost). 100 reproduce it (66 of 100 lost at the time of the
    # issue) and cost ~25 s rather than ~60 s once fixed: (100 - 30) / 3 s at the server's limit.
    samples = 100
    config = JudgeServerConfig(bucket_capacity=capacity, bucket_refill_per_s=refill, latency=(0.02, 0.1))
    with JudgeServer(config) as server:
        judge = SeenByTheAgent(base_url=server.base_url, api_key="k", model="m")
        agent = RewardAgent(judge)  # DEFAULT settings: no requests_per_minute configured
        try:
            ticket = agent.submit(judge_items(samples), 1)
            ideal = (samples - capacity) / refill
            chunk = bounded(lambda: agent.get_all(ticket, timeout=3 * ideal + 60), 3 * ideal + 70, "get_all")
        finally:
            close_quietly(agent)
        stats = server.stats()
    failed = sum(chunk.extra_info["reward_failed"])
    kinds = {k for k in chunk.extra_info.get("reward_failure", []) if k}
    assert failed == 0, f"{failed} of {samples} samples lost to the rate limiter ({kinds}); server saw {dict(stats.outcomes)}"
    assert chunk.scores == [1.0] * samples
    ok = [r.arrived for r in stats.records if r.outcome == "ok"]
    first = min(r.arrived for r in stats.records)
    allowance = capacity + refill * (ok[-1] - first)  # the most the server could have accepted meanwhile
    goodput = len(ok) / allowance
    assert goodput >= 0.9, f"goodput {goodput:.0%} of the server's limit ({len(ok)} ok in {ok[-1] - first:.1f}s)"
    # "After the first 429": what the agent sends once it has seen one. Requests already on their
    # way when it came back (the opening burst of 100 into a bucket of 30) cannot be recalled.
    seen_at = min(answered for _, answered, throttled in judge.log if throttled)
    later = [throttled for sent, _, throttled in judge.log if sent > seen_at]
    assert later and sum(later) / len(later) < 0.10, (
        f"{sum(later)} of the {len(later)} requests sent after the agent saw its first 429 were refused too"
    )


@pytest.mark.timeout(240)
def test_item13_storm_pauses_the_agent_then_full_cap_again():
    cap, latency = 16, 0.5  # 32 requests/s when the cap is full
    storm_s, retry_after, lead_in = 20.0, 2.0, 3.0  # the 20 s storm
    samples = 400  # ~3 s of work before the storm, ~9 s after it at the full cap
    with JudgeServer(JudgeServerConfig(latency=latency)) as server:
        judge = JudgeReward(base_url=server.base_url, api_key="k", model="m")
        agent = RewardAgent(judge, {"max_concurrency": cap})  # otherwise the defaults
        try:
            ticket = agent.submit(judge_items(samples), 1)
            storm_start, storm_end = server.start_storm(storm_s, retry_after_s=retry_after, delay_s=lead_in)
            chunk = bounded(lambda: agent.get_all(ticket, timeout=storm_s + 60), storm_s + 70, "get_all")
        finally:
            close_quietly(agent)
        stats = server.stats()
    first_429 = min(r.arrived for r in stats.records if r.outcome == "storm")
    windows = stats.arrivals_per_window(first_429, storm_end, retry_after)
    # The first window may hold requests already on their way when the first 429 came back.
    assert windows[0] <= cap and max(windows[1:]) <= 1, (
        f"probes per {retry_after:g} s window during the storm: {windows} (at most one each after the first)"
    )
    reached = stats.peak_in_flight_between(storm_end, storm_end + 5.0)
    assert reached >= cap, f"{reached} requests at once in the 5 s after the storm; the cap is {cap}"
    failed = sum(chunk.extra_info["reward_failed"])
    assert failed == 0, f"{failed} of {samples} samples failed: a 429 storm is flow control, not failure"
    assert storm_start < first_429 < storm_end
