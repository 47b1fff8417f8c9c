"""The fault-injection suite: real HTTP, real openai client, a token-bucket limit to discover, 5% 500, 2% hangs,
1% malformed, 1% spurious 429; and the judge-operations faults (issue 45): the shared-limits actor killed
mid-run, a budget near the limit under 2,000 concurrent requests."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from bench.fault_suite import run_budget, run_fault_suite, run_limiter_killed, run_verdict_log_resume_fault
from tests.conftest import ROOT
from verl_async_rm.limits import rate_bound


def check(figures: dict) -> None:
    samples = figures["samples"]
    assert figures["returned"] == samples and figures["lost"] == 0 and figures["duplicated"] == 0
    assert figures["misaligned_scores"] == 0  # every unflagged sample has its own, correct score
    assert figures["wall_s"] < figures["ticket_deadline_s"]
    assert figures["server_peak_concurrency"] <= figures["cap"]
    # The limiter's bound for a window w is rate_bound(rpm, w); counts are taken at the server, so
    # allow 20 ms of loopback delivery jitter at the window's edges.
    rpm = figures["requests_per_minute_limit"]
    assert figures["max_requests_in_1s"] <= rate_bound(rpm, 1.02)
    assert figures["max_requests_in_10s"] <= rate_bound(rpm, 10.02)
    server, agent = figures["faults_injected"], figures["agent_attempt_errors"]
    assert server.get("rate_limited", 0) > 0, "the server's token bucket never refused: the suite would prove nothing"
    for server_kind in ["429", "500", "hang", "malformed"]:
        assert server.get(server_kind, 0) > 0, f"no {server_kind} injected: the suite would prove nothing"
    assert set(agent) == {"http_429", "http_500", "timeout", "malformed"}
    assert agent["http_429"] == figures["throttled"], (agent, figures["throttled"])
    # Each answer the server sent is counted as its own kind at the client, but an answer sent after
    # the client's request_timeout had passed (a loaded machine delays it) is, rightly, a timeout
    # there. So each answered kind is at most the server's count, and the timeouts beyond the hangs
    # are exactly the answers the client did not count: an answer counted as another answered kind,
    # lost, or counted twice still fails.
    answered = {  # server's count, the client's
        "ok": (figures["server_ok"], figures["agent_completed"]),
        "429": (server.get("rate_limited", 0) + server.get("429", 0), agent["http_429"]),
        "500": (server["500"], agent["http_500"]),
        "malformed": (server["malformed"], agent["malformed"]),
    }
    for kind, (sent, counted) in answered.items():
        assert counted <= sent, (kind, server, agent)
    assert agent["timeout"] - server["hang"] == sum(sent - counted for sent, counted in answered.values()), (server, agent)
    assert figures["agent_completed"] + figures["failed_samples_flagged"] == samples
    # 429s are flow control: they are not retries and use up no attempt
    assert figures["retries"] == sum(agent.values()) - agent["http_429"] - figures["failed_samples_flagged"]


@pytest.mark.local
def test_fault_suite_1k(tmp_path):
    """Through the script, as a user runs it (``bench/fault_suite.py --quick --fault agent``: the same
    1,000 samples): its JSON holds the figures checked here (also the script's smoke test, which
    tests/benchmarks/test_benchmarks_run.py ran apart, the same suite a second time)."""
    out = tmp_path / "result.json"
    result = subprocess.run([sys.executable, str(ROOT / "bench" / "fault_suite.py"), "--quick", "--out", str(out), "--fault", "agent"],
                            capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-2000:]
    figures = json.loads(out.with_name("result_quick.json").read_text())
    assert {"lost", "duplicated", "faults_injected", "server_peak_concurrency", "command"} <= set(figures)
    assert figures["samples"] == 1_000
    check(figures)


@pytest.mark.local
@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("VERL_ASYNC_RM_FULL"), reason="set VERL_ASYNC_RM_FULL=1: 2 min, mostly "
                    "waiting on the rate limit (the committed bench/results/fault_suite.json is this run)")
def test_fault_suite_10k():
    check(run_fault_suite(samples=10_000))


@pytest.mark.local
@pytest.mark.slow
def test_verdict_log_resume_after_sigkill_with_a_group_judge():
    """``score`` with a group judge SIGKILLed three times, each kill in a run resumed from the last
    one, then completed: no row lost or scored twice, no group the log held judged again, no run hung."""
    figures = run_verdict_log_resume_fault(groups=32, kill_after=(4, 12, 20))
    assert figures["kills"] == 3 and figures["final_exit_code"] == 0, figures["runs"]
    assert figures["returned"] == figures["samples"] and figures["lost"] == 0 and figures["duplicated"] == 0
    assert figures["misaligned_scores"] == 0
    assert figures["duplicated_group_calls"] == 0 and figures["hung"] == 0
    # every group was judged (the log started empty); what a kill lost is all that was paid twice
    assert figures["group_calls_judged"] - figures["group_calls_lost_to_kills"] == figures["groups"]
    # a kill loses nothing the log held: each resumed run starts from at least what was logged when it struck
    assert [run["groups_in_log_at_start"] >= after for run, after in zip(figures["runs"][1:], (4, 12, 20))] == [True] * 3


def check_nothing_lost(figures: dict) -> None:
    assert (figures["lost"], figures["duplicated"], figures["hung"], figures["misaligned_scores"]) == (0, 0, 0, 0), figures


@pytest.mark.ray
def test_limiter_killed_mid_run(ray_session):
    figures = run_limiter_killed(samples_per_job=1_000, kills=3, kill_every_s=1.0)
    check_nothing_lost(figures)
    assert figures["kills"] == 3 and figures["returned"] == figures["samples"] and figures["failed_samples_flagged"] == 0
    assert all(n >= figures["kills"] for n in figures["shared_reattached"]), figures  # every job re-attached after each kill
    assert figures["shared_local_fallbacks"] == [0, 0]
    assert figures["server_peak_concurrency"] <= figures["cap"]


@pytest.mark.local
@pytest.mark.slow
@pytest.mark.parametrize("token_budget", [60_000, 400_000])
def test_budget_near_the_limit_under_2000_concurrent_requests(token_budget):
    figures = run_budget(token_budget=token_budget)
    check_nothing_lost(figures)
    assert figures["stopped_by_budget"] and figures["refused_by_budget"] > 0  # the budget really was near the limit
    assert figures["returned"] + figures["refused_by_budget"] == figures["samples"]
    assert figures["charged_tokens"] == figures["judge_reported_tokens"]
    assert figures["charged_tokens"] <= figures["token_budget"] + figures["largest_request_true_cost"]
    assert figures["charged_tokens"] <= figures["token_budget"]  # the shipped judge's estimate bounds its prompt
    assert figures["budget_overruns"] == 0
