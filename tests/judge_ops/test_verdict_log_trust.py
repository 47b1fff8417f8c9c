"""A verdict log you can trust (issue 45, items 1, 2, 14 and the first clause of 9):

- it answers only for the reward that wrote it: another file of the same name, a fixed bug, other
  kwargs or another ``reward_version`` is refused at start with both rewards named, unless the user
  accepts the change;
- a group judge resumes from it (batch and per-sample paths, in any arrival order), and a group
  whose membership changed is judged again, whole;
- a failing group hook is counted once, under its own kind, alike in the metrics, the summary of
  ``verl-async-rm score``, the log and ``verl-async-rm log``; a hook cancelled with its ticket is no
  ``deadline``;
- a judge reporting absurd usage (``10**400`` tokens) fails its sample as ``invalid``: nothing hangs,
  ``metrics()`` keeps working.
"""

from __future__ import annotations

import asyncio
import json
import random
import shutil
from pathlib import Path

import pytest

from verl_async_rm.agent import AsyncRewardAgent, RewardAgent
from verl_async_rm.cli import main
from verl_async_rm.errors import RewardError, TicketCancelled
from verl_async_rm.loader import load_reward
from verl_async_rm.score_file import score_file
from verl_async_rm.verdict_log import RewardChanged, VerdictWriter, read_log
from verl_async_rm.verdict_report import summarize

from tests.helpers.harness import virtual

pytestmark = pytest.mark.quick

COUNTING_REWARD = """
import os

CALLS = []


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    CALLS.append(solution_str)
    return {SCORE}
"""


def write_reward(folder: Path, score: str, name: str = "rewards.py") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(COUNTING_REWARD.replace("{SCORE}", score))
    return path


def rows(n: int, group_size: int = 4) -> list[dict]:
    return [{"solution_str": f"answer {i}", "ground_truth": str(i % 3), "uid": i // group_size,
             "data_source": "t", "extra_info": {"i": i}} for i in range(n)]


def score_with(path: Path, log: Path, items: list[dict], kwargs: dict | None = None, **config) -> tuple[list[float], dict, int]:
    """Score ``items`` with the reward in ``path``; returns the scores, the metrics and how many calls the reward got."""
    reward = load_reward(str(path), "compute_score", kwargs)
    calls = reward.score_fn.__globals__["CALLS"]
    before = len(calls)
    with RewardAgent(reward, {"verdict_log": str(log), "max_concurrency": 8, **config}) as agent:
        chunk = agent.get(agent.submit(items, 4), timeout=60)
        return chunk.scores, agent.metrics(), len(calls) - before


# -- item 1: the log answers only for the reward that wrote it ---------------------------------------------
def test_another_rewards_py_elsewhere_is_refused_at_start_naming_both(tmp_path):
    """The issue's case: a different ``rewards.py`` in another folder, always 0.999, resumed against
    the first one's log. Before: 20/20 answers came from the first reward's log."""
    log = tmp_path / "v.jsonl"
    first = write_reward(tmp_path / "a", "1.0 if solution_str.endswith(ground_truth) else 0.0")
    other = write_reward(tmp_path / "b", "0.999")
    items = rows(20)
    scores, _, calls = score_with(first, log, items)
    assert calls == 20

    with pytest.raises(RewardChanged) as refused:
        score_with(other, log, items)
    message = str(refused.value)
    assert str(first) in message and str(other) in message  # both rewards named, by their files
    assert "20 answers" in message and "accept" in message

    # accepted: every answer is reused (the judge is not called), and the log says who adopted them
    again, metrics, calls = score_with(other, log, items, verdict_log_accept_reward_change=True)
    assert calls == 0 and metrics["resumed"] == 20 and again == scores
    # ... so the same reward resumes from it later without being asked again
    _, metrics, calls = score_with(other, log, items)
    assert calls == 0 and metrics["resumed"] == 20


def test_a_fixed_bug_other_kwargs_or_another_version_is_another_reward(tmp_path):
    log = tmp_path / "v.jsonl"
    reward = write_reward(tmp_path / "r", "0.0  # a bug: always 0")
    items = rows(8)
    score_with(reward, log, items, {"model": "m1"})

    reward.write_text(reward.read_text().replace("0.0  # a bug: always 0", "1.0"))  # the bug fixed, same file
    with pytest.raises(RewardChanged, match="source sha256"):
        score_with(reward, log, items, {"model": "m1"})
    reward.write_text(reward.read_text().replace("1.0", "0.0  # a bug: always 0"))  # back as it was: resumable
    _, metrics, _ = score_with(reward, log, items, {"model": "m1"})
    assert metrics["resumed"] == 8
    with pytest.raises(RewardChanged, match=r'"model": "m2"'):  # other kwargs
        score_with(reward, log, items, {"model": "m2"})
    _, metrics, _ = score_with(reward, log, items, {"model": "m1", "api_key": "rotated"})  # a new key: same reward
    assert metrics["resumed"] == 8

    versioned = tmp_path / "versioned.jsonl"
    score_with(reward, versioned, items, reward_version="v1")
    reward.write_text(reward.read_text() + "\n# a comment the user declares harmless\n")
    _, metrics, calls = score_with(reward, versioned, items, reward_version="v1")  # the version names it, not the hash
    assert metrics["resumed"] == 8 and calls == 0
    with pytest.raises(RewardChanged, match="reward_version 'v2'"):
        score_with(reward, versioned, items, reward_version="v2")


class ModelJudge:
    def __init__(self, model: str):
        self.model = model
        self.client = object()  # not plain: not part of its identity

    async def compute_score(self, data_source, solution_str, ground_truth, extra_info=None):
        return 1.0


def test_an_instance_built_by_the_caller_is_identified_by_its_plain_attributes(tmp_path):
    """Its constructor kwargs are unknown to the agent: a judge built for another model is another reward."""
    log = tmp_path / "v.jsonl"

    def run(judge):
        with RewardAgent(judge, {"verdict_log": str(log)}) as agent:
            agent.get(agent.submit(rows(4), 4), timeout=60)
            return agent.metrics()

    run(ModelJudge("judge-large"))
    assert run(ModelJudge("judge-large"))["resumed"] == 4
    with pytest.raises(RewardChanged, match=r'attributes \{"model": "judge-large"\}.*attributes \{"model": "judge-small"\}'):
        run(ModelJudge("judge-small"))


def test_secrets_in_kwargs_are_not_written_to_the_log(tmp_path):
    log = tmp_path / "v.jsonl"
    reward = write_reward(tmp_path / "r", "1.0")
    kwargs = {"auth_token": "s3cret-token", "base_url": "https://user:pa55@judge.example/v1?key=qu3ry", "model": "m"}
    score_with(reward, log, rows(4), kwargs)
    text = log.read_text()
    assert "s3cret-token" not in text and "pa55" not in text and "qu3ry" not in text
    assert read_log(log).rewards[0]["reward_identity"]["kwargs"]["base_url"] == "https://judge.example/v1"
    with pytest.raises(RewardChanged) as refused:  # another token is another configuration, named without it
        score_with(reward, log, rows(4), {**kwargs, "auth_token": "other-token"})
    assert "s3cret-token" not in str(refused.value) and "other-token" not in str(refused.value)


def test_the_same_code_checked_out_elsewhere_resumes(tmp_path):
    """The identity hashes the code, not where it lies: a job resumed on another node's checkout still resumes."""
    log = tmp_path / "v.jsonl"
    here = write_reward(tmp_path / "checkout1", "0.5")
    there = tmp_path / "checkout2" / "rewards.py"
    there.parent.mkdir()
    shutil.copy(here, there)
    score_with(here, log, rows(8))
    _, metrics, calls = score_with(there, log, rows(8))
    assert calls == 0 and metrics["resumed"] == 8


def test_code_without_a_source_file_needs_a_reward_version_to_resume(tmp_path):
    namespace: dict = {}
    exec(compile("def judge(data_source, solution_str, ground_truth, extra_info=None):\n    return 1.0\n",
                 "<typed at a prompt>", "exec"), namespace)

    def run(log: Path, **config):
        with RewardAgent(namespace["judge"], {"verdict_log": str(log), **config}) as agent:
            agent.get(agent.submit(rows(4), 4), timeout=60)
            return agent.metrics()

    run(tmp_path / "v.jsonl")
    with pytest.raises(RewardChanged, match="no source file.*set reward_version"):
        run(tmp_path / "v.jsonl")
    run(tmp_path / "versioned.jsonl", reward_version="1")
    assert run(tmp_path / "versioned.jsonl", reward_version="1")["resumed"] == 4


def test_a_log_from_before_identities_is_refused_not_silently_resent(tmp_path):
    log = tmp_path / "v.jsonl"
    writer = VerdictWriter(log)
    writer.append({"v": 1, "key": "0" * 64, "score": 1.0, "failure": None})
    writer.close()
    with pytest.raises(RewardChanged, match="before reward identities were recorded"):
        score_with(write_reward(tmp_path / "r", "1.0"), log, rows(4))


def test_score_resume_against_another_reward_exits_2_and_accepts_when_told(tmp_path, capsys):
    first = write_reward(tmp_path / "a", "0.25")
    other = write_reward(tmp_path / "b", "0.999")
    (tmp_path / "in.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows(8)))

    def score(reward: Path, *extra: str) -> int:
        return main(["score", "--input", str(tmp_path / "in.jsonl"), "--reward-file", str(reward), "--group-size", "4",
                     "--output", str(tmp_path / "out.jsonl"), *extra])

    assert score(first) == 0
    capsys.readouterr()
    assert score(other, "--resume") == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "Traceback" not in err and str(first) in err and str(other) in err
    assert "--accept-reward-change" in err
    assert score(other, "--resume", "--accept-reward-change") == 0
    assert [json.loads(line)["score"] for line in (tmp_path / "out.jsonl").read_text().splitlines()] == [0.25] * 8
    assert score(other, "--accept-reward-change") == 2  # only meaningful with --resume


# -- item 2: a group judge resumes ------------------------------------------------------------------------
class RankingJudge:
    """One call per group; each member's score depends on the whole group (its rank in it)."""

    def __init__(self):
        self.calls: list[list[str]] = []

    async def compute_group_score(self, group):
        self.calls.append([m.solution_str for m in group])
        ranked = sorted(m.solution_str for m in group)
        return [{"score": ranked.index(m.solution_str) / len(group), "rank": ranked.index(m.solution_str)} for m in group]


def test_a_group_judge_resumes_from_its_log_on_the_batch_path(tmp_path):
    """Before: the second run's submit raised AttributeError ('GroupRequest' has no 'data_source')."""
    log = tmp_path / "v.jsonl"
    items = rows(32)

    def run(batch):
        judge = RankingJudge()
        with RewardAgent(judge, {"verdict_log": str(log)}) as agent:
            chunk = agent.get(agent.submit(batch, 4), timeout=60)
            return dict(zip(chunk.indices, chunk.scores)), agent.metrics(), judge.calls

    first, _, calls = run(items[:16])  # the run that "crashed" after 4 groups
    assert len(calls) == 4
    whole, metrics, calls = run(items)
    assert len(calls) == 4 and metrics["resumed"] == 16  # only the 4 new groups were judged
    assert all(whole[i] == score for i, score in first.items())
    assert sorted(whole.values()) == sorted(i % 4 / 4 for i in range(32))

    changed = [dict(item) for item in items]
    changed[5]["solution_str"] = "a new answer"  # group 1 now holds another response: judged again, whole
    _, metrics, calls = run(changed)
    assert len(calls) == 1 and sorted(calls[0]) == sorted(["answer 4", "a new answer", "answer 6", "answer 7"])
    assert metrics["resumed"] == 28

    # a kill that landed between a group's records: the members logged do not answer for the group
    lines = log.read_text().splitlines(keepends=True)
    last = json.loads(lines[-1])
    log.write_text("".join(lines[:-1]))
    _, metrics, calls = run(changed)
    assert len(calls) == 1 and len(calls[0]) == 4 and metrics["resumed"] == 28
    assert {item["uid"] for item in changed if item["solution_str"] in calls[0]} == {last["uid"]}


def test_a_group_judge_resumes_on_the_per_sample_path_in_any_arrival_order(tmp_path):
    """verl's reward loop: one sample at a time, members arriving in any order. Before: the last
    member of each group raised AttributeError and the others settled as deadline zeros."""
    log = tmp_path / "v.jsonl"
    items = rows(16)

    async def run(order):
        judge = RankingJudge()
        async with AsyncRewardAgent(judge, {"verdict_log": str(log), "ticket_deadline": 30, "request_timeout": 10}) as agent:
            answers = await asyncio.gather(*(agent.score_in_group(items[i], items[i]["uid"], 4) for i in order))
            return {i: answer for i, answer in zip(order, answers)}, agent.metrics(), judge.calls

    first, _, calls = asyncio.run(run(list(range(16))))
    assert len(calls) == 4 and not any(extra["reward_failed"] for _, extra in first.values())
    for seed in range(5):
        order = list(range(16))
        random.Random(seed).shuffle(order)
        again, metrics, calls = asyncio.run(run(order))
        assert calls == [] and metrics["resumed"] == 16 and metrics["failed"] == 0
        assert again == first  # each member keeps its own verdict, wherever it arrived


# -- item 14: a failing group hook, counted once everywhere ---------------------------------------------------
HOOK_REWARD = """
class HookBroken:
    def compute_score(self, data_source, solution_str, ground_truth, extra_info=None):
        return 1.0

    def post_process_scores(self, scores):
        raise RuntimeError("hook broke")
"""


@pytest.mark.parametrize("max_failure_rate", [0.5, 1.0])
def test_a_failing_group_hook_is_counted_once_alike_in_metrics_summary_and_log(tmp_path, max_failure_rate):
    """The issue's case (48 samples, groups of 4, a hook that raises). Before: summary ``failed 0``
    beside ``{'hook_error': 28, 'deadline': 20}``, and the log said 48 scored 1.0, no failure."""
    reward = tmp_path / "hook.py"
    reward.write_text(HOOK_REWARD)
    (tmp_path / "in.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows(48)))
    log = tmp_path / "v.jsonl"
    summary = score_file(tmp_path / "in.jsonl", str(reward), "HookBroken", group_size=4, progress=False, verdict_log=log,
                         config={"max_failure_rate": max_failure_rate})
    kinds = summary["failures_by_kind"]
    assert set(kinds) == {"hook_error"}  # no "deadline": none was set
    assert summary["failed"] == sum(kinds.values()) > 24
    if max_failure_rate == 1.0:
        assert summary["failed"] == 48 and "error" not in summary
    else:  # the failure budget stopped the ticket; the hooks it cancelled failed nothing
        assert "FailureBudgetExceeded" in summary["error"] and summary["failed"] < 48

    from_log = summarize(read_log(log).records)
    assert from_log["total"]["failed"] == summary["failed"]
    assert from_log["failures_by_kind"] == kinds
    assert from_log["total"]["samples"] == 48 and from_log["total"]["scored"] == 48 - summary["failed"]


def test_a_hook_cancelled_with_its_ticket_is_no_deadline_and_a_hook_past_the_deadline_is(tmp_path):
    class SlowHook:
        async def compute_score(self, data_source, solution_str, ground_truth, extra_info=None):
            return 1.0

        async def post_process_scores(self, scores):
            await asyncio.sleep(100)
            return scores

    async def cancelled():
        async with AsyncRewardAgent(SlowHook(), {"hook_timeout": None}) as agent:
            ticket = agent.submit(rows(8), 4)
            await asyncio.sleep(1)  # scored; both hooks running
            agent.cancel(ticket)
            with pytest.raises(TicketCancelled):
                await agent.get_all(ticket)
            await asyncio.sleep(1)
            return agent.metrics()

    metrics = virtual(cancelled)
    assert metrics["failures_by_kind"] == {} and metrics["failed"] == 0 and metrics["hook_failures"] == 0
    assert metrics["completed"] == 8 and metrics["pending"] == 0

    async def past_the_deadline():
        async with AsyncRewardAgent(SlowHook(), {"hook_timeout": None, "ticket_deadline": 10, "request_timeout": 5,
                                                 "max_failure_rate": 1.0}) as agent:
            chunk = await agent.get_all(agent.submit(rows(8), 4))
            return chunk, agent.metrics()

    chunk, metrics = virtual(past_the_deadline)
    assert chunk.extra_info["reward_failure"] == ["deadline"] * 8
    assert metrics["failures_by_kind"] == {"deadline": 8} and metrics["failed"] == 8 and metrics["completed"] == 0


def test_a_failing_hook_on_the_per_sample_path_is_in_the_log_per_sample(tmp_path):
    class Broken:
        async def compute_score(self, data_source, solution_str, ground_truth, extra_info=None):
            return 1.0

        def post_process_scores(self, scores):
            raise ValueError("no")

    log = tmp_path / "v.jsonl"

    async def run():
        async with AsyncRewardAgent(Broken(), {"verdict_log": str(log), "max_failure_rate": 1.0}) as agent:
            items = rows(8)
            answers = await asyncio.gather(*(agent.score_in_group(item, item["uid"], 4) for item in items))
            return answers, agent.metrics()

    answers, metrics = asyncio.run(run())
    assert [extra["reward_failure"] for _, extra in answers] == ["hook_error"] * 8
    assert metrics["failed"] == 8 == metrics["failures_by_kind"]["hook_error"] and metrics["completed"] == 0
    from_log = summarize(read_log(log).records)
    assert from_log["total"]["samples"] == 8 and from_log["failures_by_kind"] == {"hook_error": 8}


def test_the_log_reader_shows_hook_failures(tmp_path, capsys):
    reward = tmp_path / "hook.py"
    reward.write_text(HOOK_REWARD)
    (tmp_path / "in.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows(8)))
    assert main(["score", "--input", str(tmp_path / "in.jsonl"), "--reward-file", str(reward), "--reward-name",
                 "HookBroken", "--group-size", "4", "--set", "max_failure_rate=1.0", "--output", str(tmp_path / "o.jsonl")]) == 0
    capsys.readouterr()
    assert main(["log", str(tmp_path / "o.jsonl.verdicts.jsonl"), "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["total"]["samples"] == 8 and shown["total"]["failed"] == 8 and shown["failures_by_kind"] == {"hook_error": 8}


# -- item 9, first clause: absurd usage ---------------------------------------------------------------------
@pytest.mark.parametrize("tokens", [10**400, float("inf"), float("nan"), -1, 2**53 + 1],
                         ids=["10**400", "inf", "nan", "negative", "2**53+1"])
def test_absurd_usage_fails_its_sample_and_nothing_hangs(tmp_path, tokens):
    """Before: 10**400 with a verdict log hung past a 3 s deadline, and metrics() raised from then on."""

    async def reward(data_source, solution_str, ground_truth, extra_info=None):
        usage = {"prompt_tokens": tokens, "completion_tokens": 1} if extra_info["i"] % 2 else {"prompt_tokens": 5, "completion_tokens": 1}
        return {"score": 1.0, "usage": usage}

    log = tmp_path / "v.jsonl"

    async def scenario():
        config = {"verdict_log": str(log), "ticket_deadline": 3, "request_timeout": 1, "max_failure_rate": 1.0,
                  "price_input_per_million": 2.0, "price_output_per_million": 8.0}
        async with AsyncRewardAgent(reward, config) as agent:
            start = asyncio.get_running_loop().time()
            chunk = await asyncio.wait_for(agent.get_all(agent.submit(rows(8), 4)), 30)
            elapsed = asyncio.get_running_loop().time() - start
            return chunk, elapsed, agent.metrics()

    chunk, elapsed, metrics = virtual(scenario)
    assert elapsed < 3  # answered at once, not at (or after) the deadline
    assert chunk.extra_info["reward_failure"] == [None, "invalid"] * 4
    assert "usage prompt_tokens must be an integer" in chunk.extra_info["reward_error"][1]
    assert metrics["failures_by_kind"] == {"invalid": 4} and metrics["input_tokens"] == 20
    assert metrics["cost"] == pytest.approx((20 * 2.0 + 4 * 8.0) / 1e6)
    assert [r["failure"] for r in read_log(log).records if r["index"] % 2] == ["invalid"] * 4


def test_a_verdict_that_cannot_be_recorded_fails_loudly_instead_of_hanging(tmp_path, monkeypatch):
    """Whatever breaks while recording a verdict, the ticket ends (with the reason), never hangs."""
    from verl_async_rm.engine.verdicts import VerdictBook

    def broken(self, *args, **kwargs):
        raise OverflowError("int too large to convert to float")

    monkeypatch.setattr(VerdictBook, "record", broken)

    async def reward(data_source, solution_str, ground_truth, extra_info=None):
        return 1.0

    async def scenario():
        async with AsyncRewardAgent(reward, {"verdict_log": str(tmp_path / "v.jsonl"), "ticket_deadline": 3,
                                             "request_timeout": 1}) as agent:
            with pytest.raises(RewardError, match="cannot record .*OverflowError"):
                await asyncio.wait_for(agent.get_all(agent.submit(rows(4), 4)), 30)
            return agent.metrics()

    assert virtual(scenario)["pending"] == 0
