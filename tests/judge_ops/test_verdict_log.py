"""The durable verdict log and resume (verl_async_rm/verdict_log.py, engine/verdicts.py, score --resume).

- the log survives a kill mid-write (a torn last line is skipped on read and cut before appending);
- a resumed run sends none of the samples already settled (the loopback judge's request count),
  on the batch path and the per-sample (trainer's reward loop) path; failures are sent again;
- ``verl-async-rm score`` killed mid-way (a real subprocess, SIGINT, SIGTERM and SIGKILL) resumes to
  output identical to an uninterrupted run; Ctrl-C and SIGTERM write the groups scored, and only those;
- ``verl-async-rm log`` reads it back.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from verl_async_rm.agent import AsyncRewardAgent, RewardAgent
from verl_async_rm_rig.demo_data import make_responses, write_jsonl
from verl_async_rm_rig.judge_server import JudgeServer, JudgeServerConfig
from verl_async_rm.user_rewards import llm_judge
from verl_async_rm.user_rewards.llm_judge import JudgeReward
from verl_async_rm.verdict_log import RewardIdentity, VerdictWriter, load_resume_answers, read_log
from verl_async_rm.verdict_report import summarize

JUDGE = llm_judge.__file__


def records(path) -> list[dict]:
    return read_log(path).records


ME = RewardIdentity.of("rewards.py:compute_score", __file__, None, {})


def logged(key: str, score, failure=None, **fields) -> dict:
    """A sample's record as this reward writes it (``key`` doubles as its request)."""
    return {"key": key, "request": key, "reward": ME.id, "score": score, "failure": failure, **fields}


# -- crash safety of the file itself ------------------------------------------------------------------
@pytest.mark.quick
def test_a_torn_last_line_is_skipped_on_read_and_cut_before_appending(tmp_path):
    log = tmp_path / "v.jsonl"
    writer = VerdictWriter(log, fsync_s=0)
    for i in range(3):
        writer.append(logged(f"k{i}", float(i)))
    writer.close()
    with log.open("ab") as f:  # a write killed half-way
        f.write(b'{"key": "k3", "sco')
    result = read_log(log)
    assert [r["key"] for r in result.records] == ["k0", "k1", "k2"] and result.torn_tail
    assert set(load_resume_answers(log, ME).answers) == {"k0", "k1", "k2"}
    writer = VerdictWriter(log)  # appending again: the torn line is cut first, not glued to the next record
    writer.append(logged("k4", 4.0))
    writer.close()
    result = read_log(log)
    assert [r["key"] for r in result.records] == ["k0", "k1", "k2", "k4"] and not result.torn_tail
    with log.open("a") as f:  # damage anywhere else is an error, not skipped
        f.write("not json\n" + json.dumps({"key": "k5"}) + "\n")
    with pytest.raises(ValueError, match=r"v.jsonl:5: not a verdict log record"):
        read_log(log)


@pytest.mark.quick
def test_failures_are_logged_but_not_cached_and_the_last_success_wins(tmp_path):
    log = tmp_path / "v.jsonl"
    writer = VerdictWriter(log)
    writer.append(logged("a", None, "timeout", error="slow"))
    writer.append(logged("b", 0.0, extra={}, attempts=1))
    writer.append(logged("b", 1.0, extra={"judge_reply": "1"}, attempts=2))
    writer.close()
    answers = load_resume_answers(log, ME).answers
    assert set(answers) == {"b"} and answers["b"].score == 1.0 and answers["b"].extra == {"judge_reply": "1"}


# -- done-when (a): a resumed run re-sends 0 settled samples ------------------------------------------
def gsm_items(n: int) -> list[dict]:
    return [{"solution_str": f"so the answer is {i % 5}", "ground_truth": str(i % 3), "uid": i // 4,
             "data_source": "t", "extra_info": {"i": i}} for i in range(n)]


@pytest.mark.local
def test_a_resumed_run_sends_only_what_was_not_settled(tmp_path):
    log = tmp_path / "v.jsonl"
    items = gsm_items(96)
    config = {"max_concurrency": 16, "max_attempts": 1, "max_failure_rate": 1.0, "verdict_log": str(log)}
    with JudgeServer(JudgeServerConfig(rate_500=0.2, seed=3)) as server:
        reward = lambda: JudgeReward(base_url=server.base_url, api_key="k", model="judge-stub")  # noqa: E731
        with RewardAgent(reward(), config) as agent:  # the run that "crashed": it got through 60 samples
            first = agent.get(agent.submit(items[:60], group_size=4))
        settled = [r for r in records(log) if r["failure"] is None]
        failed_first = sum(first.extra_info["reward_failed"])
        assert len(records(log)) == 60 and failed_first > 0 and len(settled) == 60 - failed_first
        before = server.stats().requests
        with RewardAgent(reward(), config) as agent:  # resumed over the whole batch
            second = agent.get(agent.submit(items, group_size=4))
            metrics = agent.metrics()
        sent = server.stats().requests - before
    assert metrics["resumed"] == len(settled)
    assert sent == len(items) - len(settled)  # failed samples are sent again, settled ones never
    again = {i: s for i, s in zip(second.indices, second.scores)}
    for i, score, failed in zip(first.indices, first.scores, first.extra_info["reward_failed"]):
        if not failed:
            assert again[i] == score


@pytest.mark.local
def test_the_per_sample_path_answers_settled_samples_from_the_log(tmp_path):
    """The trainer's reward loop (``score_in_group``, one sample at a time) after a checkpoint resume."""
    log = tmp_path / "v.jsonl"
    items = gsm_items(32)

    async def run(server, subset):
        reward = JudgeReward(base_url=server.base_url, api_key="k", model="judge-stub")
        async with AsyncRewardAgent(reward, {"verdict_log": str(log)}) as agent:
            answers = await asyncio.gather(*(agent.score_in_group(item, item["uid"], 4) for item in subset))
            return answers, agent.metrics()

    with JudgeServer(JudgeServerConfig()) as server:
        first, _ = asyncio.run(run(server, items[:16]))
        before = server.stats().requests
        second, metrics = asyncio.run(run(server, items))
        sent = server.stats().requests - before
    assert sent == 16 and metrics["resumed"] == 16 and second[:16] == first
    assert {r["uid"] for r in records(log)} == set(range(8)) and all(r["ticket"] is None for r in records(log))


# -- done-when (b): a killed score resumes to the uninterrupted output --------------------------------
def score_command(tmp_path: Path, server: JudgeServer, out: str, *extra: str) -> list[str]:
    return [sys.executable, "-m", "verl_async_rm", "score", "--input", str(tmp_path / "in.jsonl"),
            "--reward-file", JUDGE, "--reward-name", "JudgeReward", "--kwarg", f"base_url={server.base_url}",
            "--kwarg", "model=judge-stub", "--kwarg", "api_key=k", "--group-size", "4", "--set", "max_concurrency=4",
            "--set", "verdict_log_fsync_s=0", "--output", str(tmp_path / out), *extra]


def ctrl_c_as_at_a_terminal() -> None:
    """In the child before exec: SIGINT back to its default, so Python turns it into
    KeyboardInterrupt. A suite started as a background job (``cmd &`` in a script, as CI may run
    it) ignores SIGINT, the child inherits that, and Python then leaves Ctrl-C ignored: the "killed"
    run would score to the end (it did, in CI)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def run_until_logged(command: list[str], log: Path, lines: int, sig: int) -> int:
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               preexec_fn=ctrl_c_as_at_a_terminal)
    try:
        deadline = time.monotonic() + 60
        while not (log.exists() and log.read_bytes().count(b"\n") >= lines):
            assert process.poll() is None, process.communicate()
            assert time.monotonic() < deadline, "the run never logged enough verdicts"
            time.sleep(0.02)
        process.send_signal(sig)
        process.communicate(timeout=60)
        return process.returncode
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


@pytest.mark.local
@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL], ids=["SIGINT", "SIGTERM", "SIGKILL"])
def test_a_killed_score_resumes_to_the_output_of_an_uninterrupted_run(tmp_path, sig):
    from verl_async_rm.cli import main

    rows = make_responses(32, 4, seed=1)
    write_jsonl(rows, tmp_path / "in.jsonl")
    # a judge slow enough (128 samples, cap 4: ~5 s) that the signal lands well before the end
    with JudgeServer(JudgeServerConfig(latency=(0.1, 0.2), seed=1)) as server:
        assert main(score_command(tmp_path, server, "whole.jsonl")[3:]) == 0  # the same command, in process

        log = tmp_path / "cut.jsonl.verdicts.jsonl"
        code = run_until_logged(score_command(tmp_path, server, "cut.jsonl"), log, 1 + 40, sig)  # its reward record, 40 verdicts
        settled = {r["key"] for r in records(log) if r["failure"] is None}
        assert 40 <= len(settled) < len(rows)
        if sig != signal.SIGKILL:  # Ctrl-C, or a scheduler's SIGTERM: exit 128 + the signal; the
            # output holds the groups handed over, right, and no other row (a null score is no score)
            assert code == 128 + sig
            kept = [json.loads(line) for line in (tmp_path / "cut.jsonl").read_text().splitlines()]
            whole = [json.loads(line) for line in (tmp_path / "whole.jsonl").read_text().splitlines()]
            assert 4 <= len(kept) < len(rows) and len(kept) % 4 == 0 and all(r["score"] is not None for r in kept)
            assert all(k in whole for k in kept) and [whole.index(k) for k in kept] == sorted(whole.index(k) for k in kept)
        else:
            assert code == -signal.SIGKILL

        before = server.stats().requests
        resumed = subprocess.run(score_command(tmp_path, server, "cut.jsonl", "--resume"), capture_output=True,
                                 text=True, timeout=120)
        sent = server.stats().requests - before
    assert resumed.returncode == 0, resumed.stderr
    assert sent == len(rows) - len(settled)  # the settled ones were answered from the log
    assert (tmp_path / "cut.jsonl").read_text() == (tmp_path / "whole.jsonl").read_text()


# -- the reader -----------------------------------------------------------------------------------------
@pytest.mark.local
def test_the_log_reader_shows_steps_failures_slowest_and_cost(tmp_path):
    log = tmp_path / "v.jsonl"
    config = {"max_attempts": 1, "max_failure_rate": 1.0, "verdict_log": str(log),
              "price_input_per_million": 2.0, "price_output_per_million": 8.0}
    with JudgeServer(JudgeServerConfig(rate_500=0.25, seed=5)) as server:
        with RewardAgent(JudgeReward(base_url=server.base_url, api_key="k", model="judge-stub"), config) as agent:
            agent.get(agent.submit(gsm_items(24), group_size=4))  # step 1
            agent.get(agent.submit(gsm_items(40)[24:], group_size=4))  # step 2
            metrics = agent.metrics()
    summary = summarize(records(log), slowest=3)
    assert [s["samples"] for s in summary["steps"]] == [24, 16]
    assert summary["total"]["failed"] == metrics["failed"] > 0
    assert summary["failures_by_kind"] == metrics["failures_by_kind"]
    assert summary["total"]["input_tokens"] == metrics["input_tokens"]
    assert summary["total"]["cost"] == pytest.approx(metrics["cost"], rel=1e-12)
    slowest = [s["request_s"] for s in summary["slowest"]]
    assert len(slowest) == 3 and slowest == sorted(slowest, reverse=True)
    assert slowest[0] == max(r["request_s"] for r in records(log) if r["request_s"] is not None)

    shown = subprocess.run([sys.executable, "-m", "verl_async_rm", "log", str(log)], capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0, shown.stderr
    text = shown.stdout
    assert "per step:" in text and "http_500" in text and "slowest requests" in text and "verdict=" in text
    as_json = json.loads(subprocess.run([sys.executable, "-m", "verl_async_rm", "log", str(log), "--json"],
                                        capture_output=True, text=True, timeout=60).stdout)
    assert as_json["total"]["samples"] == 40 and not as_json["torn_tail"]


@pytest.mark.quick
def test_score_refuses_resume_without_a_log(tmp_path):
    write_jsonl(make_responses(2, 2, seed=0), tmp_path / "in.jsonl")
    from verl_async_rm.cli import main

    code = main(["score", "--input", str(tmp_path / "in.jsonl"), "--reward-file", JUDGE, "--reward-name", "JudgeReward",
                 "--output", str(tmp_path / "o.jsonl"), "--resume"])
    assert code == 2 and not (tmp_path / "o.jsonl").exists()


@pytest.mark.quick
def test_the_trainer_setting_names_the_log_and_bad_paths_fail_at_start(tmp_path):
    from omegaconf import OmegaConf

    from verl_async_rm.integration.settings import settings_from_verl_config

    def settings(**block):
        return settings_from_verl_config(OmegaConf.create({"reward": {"async_agent": block}}))

    agent = settings(verdict_log=str(tmp_path / "v.jsonl"), token_budget=10_000).agent
    assert agent.verdict_log == str(tmp_path / "v.jsonl") and agent.verdict_log_resume and agent.token_budget == 10_000
    with pytest.raises(ValueError, match=r"reward.async_agent: .*verdict_log .* does not exist"):
        settings(verdict_log=str(tmp_path / "no" / "v.jsonl"))
    with pytest.raises(ValueError, match=r"reward.async_agent: .*money_budget needs"):
        settings(money_budget=1.0)
