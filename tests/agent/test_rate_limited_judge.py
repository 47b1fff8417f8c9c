"""Issue 11 item 13: a real rate limiter against the agent's defaults, over real HTTP.

The judge server answers as real APIs do: a token bucket ("30 requests per 10 s": capacity 30,
refill 3/s) refusing with 429 + Retry-After = the time until a token exists, and 429 storms. The
client is the real ``openai.AsyncOpenAI`` inside the example ``JudgeReward``; the server's
per-request log and the agent's own (requests sent after it saw a 429) are the referees. The
benchmark (bench/backpressure.py) runs the same functions at the issue's sizes.
"""

from __future__ import annotations

import pytest

from bench.backpressure import storm_run, token_bucket_run
from tests.helpers.harness import unformatted_logs  # noqa: F401 - autouse fixture

pytestmark = [pytest.mark.local, pytest.mark.slow]


@pytest.mark.timeout(240)
def test_item13_token_bucket_judge_with_default_settings():
    # The issue ran 200 samples (110 lost at the time). 100 reproduce it and cost ~25 s rather
    # than ~60 s: (100 - 30) / 3 s at the server's limit.
    figures = token_bucket_run(samples=100)
    assert figures["lost"] == 0 and figures["scores_right"]
    if figures["goodput"] < 0.9:
        # Goodput is counted against the server's clock: a client starved of CPU by a busy neighbour
        # (another test process; measured 0.82 beside six busy loops) leaves tokens unused that the agent
        # did not decline. Such a dip is not repeatable; an agent that pauses too long fails both runs.
        first = figures
        figures = token_bucket_run(samples=100)
        assert figures["lost"] == 0 and figures["scores_right"]
        assert figures["goodput"] >= 0.9, (first, figures)
    # "After the first 429": what the agent sends once it has seen one. Requests already on their
    # way when it came back (the opening burst of 100 into a bucket of 30) cannot be recalled.
    assert figures["requests_sent_after_it"] >= 50 and figures["refused_after_the_agent_saw_a_429"] < 0.10, figures


@pytest.mark.timeout(240)
def test_item13_storm_pauses_the_agent_then_full_cap_again():
    figures = storm_run(samples=400, cap=16, latency=0.5, storm_s=20.0, retry_after=2.0, lead_in=3.0)
    windows = figures["requests_per_retry_after_window"]
    # The first window may hold requests already on their way when the first 429 came back.
    assert windows[0] <= figures["cap"] and max(windows[1:]) <= 1, figures
    assert figures["full_cap_again_after_s"] is not None and figures["full_cap_again_after_s"] <= 5.0, figures
    assert figures["lost"] == 0 and figures["storm_started_before_first_429"], figures
