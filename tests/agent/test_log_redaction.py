"""Credentials in a judge's ``base_url`` stay out of the HTTP stacks' logs while an agent runs
(issue 45, item 11; ``verl_async_rm/log_redaction.py``)."""

from __future__ import annotations

import logging

import pytest

from verl_async_rm import log_redaction
from verl_async_rm.agent import RewardAgent
from verl_async_rm_rig.judge_server import JudgeServer, JudgeServerConfig
from verl_async_rm.user_rewards.llm_judge import JudgeReward


@pytest.mark.quick
def test_redact_hides_userinfo_and_query_values_and_nothing_else():
    redact = log_redaction.redact
    assert redact('HTTP Request: POST http://alice:s3cret@10.0.0.1:8000/v1/chat/completions "HTTP/1.1 200 OK"') == \
        'HTTP Request: POST http://[REDACTED]@10.0.0.1:8000/v1/chat/completions "HTTP/1.1 200 OK"'
    assert redact("GET https://api.example.com/v1/models?key=AIza123&alt=json#frag") == \
        "GET https://api.example.com/v1/models?key=[REDACTED]&alt=[REDACTED]#frag"
    assert redact("https://host/v1/?api-key=abc/chat/completions 404") == "https://host/v1/?api-key=[REDACTED] 404"
    kept = "POST https://host/users/bob@example.com/v1 and host='127.0.0.1' port=8000"  # an @ in a path is no userinfo
    assert redact(kept) == kept


@pytest.mark.local
def test_credentials_in_base_url_never_reach_the_http_logs(caplog):
    """The real openai client against the loopback judge, logging at DEBUG everywhere: the key in
    the userinfo and in ``?key=`` is in no log line, while the request lines are still there."""
    secrets = ("PASSWORD-4242", "QUERYKEY-4343")
    holders_before = log_redaction.holders()  # another test's agent left open would hold it too
    caplog.set_level(logging.DEBUG)
    items = [{"solution_str": "so 1", "ground_truth": "1", "uid": 0} for _ in range(3)]
    with JudgeServer(JudgeServerConfig()) as server:
        host = server.base_url.split("://", 1)[1]
        for base_url in (f"http://alice:{secrets[0]}@{host}", f"{server.base_url}?key={secrets[1]}"):
            with RewardAgent(JudgeReward(base_url=base_url, api_key="k", model="judge-stub"),
                             {"max_failure_rate": 1.0, "max_attempts": 1}) as agent:
                assert log_redaction.holders() == holders_before + 1
                agent.get(agent.submit(items, group_size=3), timeout=60)
        requests = server.stats().requests
    assert log_redaction.holders() == holders_before  # released at close
    text = "\n".join(record.getMessage() for record in caplog.records)
    assert not any(secret in text for secret in secrets), [line for line in text.splitlines() if "REDACTED" in line]
    request_lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("HTTP Request:")]
    # one line per request, each with its URL redacted (the ?key= form is sent to a path the judge
    # answers 404: openai appends the route after the query; it is logged all the same)
    assert requests >= 3 and len(request_lines) == 6 and all("[REDACTED]" in line for line in request_lines)
    if holders_before == 0:  # the last agent closed: the application's logging is left as it was
        logging.getLogger("httpx").info("after close: http://bob:visible@host/")
        assert "bob:visible" in caplog.records[-1].getMessage()
