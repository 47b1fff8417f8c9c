"""Judge fallback (``judges``: engine/fallback.py), tried to break.

Quick tier, in process (a fake judge per name, whose faults the test switches): the settings are
checked at build; a judge that flaps up and down (Hypothesis: any schedule) loses no sample and
scores none twice; a judge's budget moves its samples on and is never crossed; all judges down is
the loud failure; a deadline during a move settles each sample once; off is today's behaviour.

Local tier, two loopback judges through the real openai client: an outage of judge 1 mid-run, a
429 storm on it longer than ``switch_after_throttled_s``, its token budget hit mid-run: 0 lost, 0
duplicated (the servers' "ok" answers sum to the samples), the switch and the return logged once,
every verdict naming its judge.
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import threading
import time

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from verl_async_rm.agent import RewardAgent
from verl_async_rm.config import AgentConfig
from verl_async_rm.errors import FailureBudgetExceeded, RewardError
from verl_async_rm.verdict_log import read_log

FAST = {"backoff_initial": 0.001, "backoff_max": 0.002, "max_attempts": 2, "failure_policy": "fill", "fill_value": -1.0}


class Throttled(Exception):
    status_code = 429


class FakeJudges:
    """One reward function standing for every judge (its ``who`` kwarg names the judge): a judge in
    ``down`` raises a connection error, one in ``throttled`` a 429; every call and every answer is
    counted per (judge, sample)."""

    def __init__(self, latency: float = 0.0005):
        self.down: set[str] = set()
        self.throttled: set[str] = set()
        self.calls: collections.Counter = collections.Counter()
        self.answers: collections.Counter = collections.Counter()  # (judge, solution) -> scored answers
        self.lock = threading.Lock()
        self.latency = latency

    async def compute_score(self, data_source, solution_str, ground_truth, extra_info=None, who="?"):
        await asyncio.sleep(self.latency)
        with self.lock:
            self.calls[who] += 1
            if who in self.down:
                raise ConnectionError(f"{who} is down")
            if who in self.throttled:
                raise Throttled(f"{who}: 429")
            self.answers[(who, solution_str)] += 1
        return {"score": 1.0, "usage": {"prompt_tokens": 10, "completion_tokens": 2}}

    def reward(self):
        fake = self

        async def compute_score(data_source, solution_str, ground_truth, extra_info=None, who="?"):
            return await fake.compute_score(data_source, solution_str, ground_truth, extra_info, who)

        compute_score.estimate_input_tokens = lambda *args, **kwargs: 10
        return compute_score

    def scored_per_sample(self) -> collections.Counter:
        per_sample: collections.Counter = collections.Counter()
        for (_, solution), count in self.answers.items():
            per_sample[solution] += count
        return per_sample


def judges(*names: str, **each) -> list[dict]:
    return [{"name": name, "kwargs": {"who": name}, **each} for name in names]


def items(n: int, start: int = 0) -> list[dict]:
    return [{"solution_str": f"s{i}", "ground_truth": "1"} for i in range(start, start + n)]


# -- the settings ------------------------------------------------------------------------------------
@pytest.mark.quick
def test_the_judge_settings_are_checked_at_build_with_clear_errors():
    def refused(values: dict, words: str) -> None:
        with pytest.raises(ValueError, match=words):
            AgentConfig.from_mapping(values)

    refused({"judges": [{"name": "a"}, {"name": "a"}]}, "duplicate names")
    refused({"judges": [{"name": "a", "base_url": "x"}]}, "base_url")  # unknown key: must go under kwargs
    refused({"judges": [{"name": "a b"}]}, "name")
    refused({"judges": [{"name": "a"}], "cache": True}, "cache is not supported")
    refused({"judges": [{"name": "a"}], "token_budget": 100}, "its own token_budget")
    refused({"judges": [{"name": "a", "money_budget": 1.0}]}, "money_budget needs prices")
    refused({"judges": [{"name": "a", "switch_after_throttled_s": 0}]}, "switch_after_throttled_s")
    assert AgentConfig.from_mapping({"judges": [{"name": "a", "money_budget": 1.0}], "price_input_per_million": 1}).judges
    assert AgentConfig.from_mapping({"judges": []}).judges == ()  # empty: off

    class GroupJudge:
        def compute_group_score(self, group):
            return [1.0] * len(group)

    with pytest.raises(ValueError, match="group judge"):
        RewardAgent(GroupJudge, {"judges": judges("a", "b")})

    class Instance:
        def compute_score(self, data_source, solution_str, ground_truth, extra_info=None, who=None):
            return 1.0

    with pytest.raises(ValueError, match="instance built by the caller"):
        RewardAgent(Instance(), {"judges": judges("a", "b")})


@pytest.mark.quick
def test_off_is_todays_behaviour_no_judge_keys_anywhere():
    fake = FakeJudges()
    with RewardAgent(fake.reward(), {**FAST}, reward_kwargs={"who": "solo"}) as agent:
        chunk = agent.get(agent.submit(items(20)))
        metrics = agent.metrics()
    assert chunk.scores == [1.0] * 20 and "judge_index" not in chunk.extra_info
    assert not [key for key in metrics if key.startswith("judge/")]


@pytest.mark.quick
def test_a_judge_that_is_down_moves_its_samples_on_and_comes_back_after_a_probe(caplog):
    fake = FakeJudges()
    fake.down.add("a")
    config = {**FAST, "max_concurrency": 4, "judges": judges("a", "b", failure_window=6, retry_after_s=0.05)}
    with caplog.at_level(logging.INFO, logger="verl_async_rm.engine.fallback"):
        with RewardAgent(fake.reward(), config) as agent:
            first = agent.get(agent.submit(items(60)))
            fake.down.clear()
            time.sleep(0.1)  # past retry_after_s: the next sample probes a
            second = agent.get(agent.submit(items(60, 60)))
            metrics = agent.metrics()
    assert first.scores == [1.0] * 60 and second.scores == [1.0] * 60  # 0 lost, none failed
    assert max(fake.scored_per_sample().values()) == 1 and len(fake.scored_per_sample()) == 120  # none twice
    assert set(first.extra_info["judge_index"]) == {1}
    assert second.extra_info["judge_index"].count(0) > 30  # back in first place
    assert metrics["judge/a/switches"] == 1 and metrics["judge/a/returns"] == 1 and metrics["judge/a/up"] == 1
    assert metrics["judge/b/scored"] + metrics["judge/a/scored"] == 120
    assert metrics["judge/a/requests"] == fake.calls["a"] and metrics["judge/b/requests"] == fake.calls["b"]
    downs = [r for r in caplog.records if "is down" in r.getMessage()]
    backs = [r for r in caplog.records if "is back" in r.getMessage()]
    assert len(downs) == 1 and downs[0].levelno == logging.WARNING and "failed" in downs[0].getMessage()
    assert len(backs) == 1 and backs[0].levelno == logging.INFO


@pytest.mark.quick
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(schedule=st.lists(st.tuples(st.sampled_from(["down", "up", "throttle"]), st.integers(0, 6)), min_size=1, max_size=8),
       concurrency=st.sampled_from([1, 3, 16]), calibration=st.sampled_from([0.0, 0.5]))
def test_a_flapping_judge_loses_no_sample_and_scores_none_twice(schedule, concurrency, calibration):
    """Judge a goes down, throttles and comes back at any moments (a schedule of steps of ~1 ms);
    b is always up: every sample is scored, exactly once (with calibration, a selected sample a
    scored is also answered by b, on purpose, and never settled twice)."""
    from verl_async_rm.engine.fallback import Calibration

    fake = FakeJudges()
    config = {**FAST, "max_concurrency": concurrency, "max_failure_rate": 1.0, "calibration_share": calibration,
              "judges": judges("a", "b", failure_window=3, retry_after_s=0.002, switch_after_throttled_s=0.002)}
    with RewardAgent(fake.reward(), config) as agent:
        ticket = agent.submit(items(80))
        for state, steps in schedule:
            fake.down.discard("a"), fake.throttled.discard("a")
            if state == "down":
                fake.down.add("a")
            elif state == "throttle":
                fake.throttled.add("a")
            time.sleep(steps * 0.001)
        fake.down.clear(), fake.throttled.clear()
        chunk = agent.get(ticket, timeout=30)
        metrics = agent.metrics()
    assert chunk.scores == [1.0] * 80
    per_sample = fake.scored_per_sample()
    twice = {f"s{i}" for i in range(80) if calibration and Calibration(calibration).selected(SimpleItem(f"s{i}"))}
    assert len(per_sample) == 80 and all(count == 1 for s, count in per_sample.items() if s not in twice)
    assert all(fake.answers[("a", s)] <= 1 and fake.answers[("b", s)] <= 1 for s in per_sample)
    assert metrics["completed"] == 80 and metrics["failed"] == 0 and metrics["pending"] == 0
    assert metrics["judge/a/scored"] + metrics["judge/b/scored"] == 80


@pytest.mark.quick
def test_the_per_sample_path_falls_back_too_each_member_answered_once():
    """verl's per-sample path (``ascore_in_group``): members arrive one by one while judge a is down."""
    fake = FakeJudges()
    fake.down.add("a")
    config = {**FAST, "max_concurrency": 4, "judges": judges("a", "b", failure_window=4, retry_after_s=60)}
    with RewardAgent(fake.reward(), config) as agent:
        async def main():
            async def member(group, k):
                await asyncio.sleep(0.001 * k)
                return await agent.ascore_in_group({"solution_str": f"s{group}-{k}", "ground_truth": "1"}, f"u{group}", 4)

            return await asyncio.gather(*(member(g, k) for g in range(15) for k in range(4)))

        answers = asyncio.run(main())
        metrics = agent.metrics()
    assert [score for score, _ in answers] == [1.0] * 60 and {extra["judge_index"] for _, extra in answers} <= {0, 1}
    assert len(fake.scored_per_sample()) == 60 and max(fake.scored_per_sample().values()) == 1
    assert metrics["judge/a/up"] == 0 and metrics["judge/b/scored"] == 60


@pytest.mark.quick
def test_all_judges_down_is_the_loud_failure():
    fake = FakeJudges()
    fake.down.update({"a", "b"})
    config = {**FAST, "max_concurrency": 8, "judges": judges("a", "b", failure_window=4)}
    with RewardAgent(fake.reward(), config) as agent:
        with pytest.raises(FailureBudgetExceeded, match="b is down"):
            agent.get(agent.submit(items(300)), timeout=30)
    assert fake.calls["b"] > 0


@pytest.mark.quick
def test_a_spent_judge_budget_moves_its_samples_on_and_is_never_crossed():
    fake = FakeJudges()
    # 12 tokens a request (10 in, 2 out), 1024 output tokens reserved: a's budget holds 3 at most.
    config = {**FAST, "max_concurrency": 8, "reserve_output_tokens": 2,
              "judges": [{"name": "a", "kwargs": {"who": "a"}, "token_budget": 40}, {"name": "b", "kwargs": {"who": "b"}}]}
    with RewardAgent(fake.reward(), config) as agent:
        chunk = agent.get(agent.submit(items(50)), timeout=30)
        metrics = agent.metrics()
    assert chunk.scores == [1.0] * 50 and metrics["failed"] == 0
    assert fake.calls["a"] == 3 and metrics["judge/a/input_tokens"] + metrics["judge/a/output_tokens"] <= 40
    assert metrics["judge/a/up"] == 0 and metrics["judge/b/scored"] == 47
    assert max(fake.scored_per_sample().values()) == 1


@pytest.mark.quick
def test_the_last_judges_budget_spent_is_the_loud_budget_error():
    from verl_async_rm.errors import BudgetExceeded

    fake = FakeJudges()
    config = {**FAST, "max_concurrency": 2, "reserve_output_tokens": 2,
              "judges": [{"name": "a", "kwargs": {"who": "a"}, "token_budget": 24},
                         {"name": "b", "kwargs": {"who": "b"}, "token_budget": 24}]}
    with RewardAgent(fake.reward(), config) as agent:
        with pytest.raises(BudgetExceeded):
            agent.get(agent.submit(items(20)), timeout=30)
    assert fake.calls["a"] == 2 and fake.calls["b"] == 2


@pytest.mark.quick
def test_a_deadline_while_samples_move_settles_each_once():
    fake = FakeJudges(latency=0.01)
    fake.down.add("a")
    config = {**FAST, "max_concurrency": 2, "ticket_deadline": 0.15, "request_timeout": 0.1, "max_failure_rate": 1.0,
              "judges": judges("a", "b", failure_window=50)}
    with RewardAgent(fake.reward(), config) as agent:
        chunk = agent.get(agent.submit(items(100)), timeout=30)
        time.sleep(0.1)  # late answers and moves after the deadline change nothing
        metrics = agent.metrics()
    assert len(chunk.scores) == 100 and metrics["completed"] + metrics["failed"] == 100 and metrics["pending"] == 0
    assert set(chunk.extra_info["reward_failure"]) >= {"deadline"}
    assert max(fake.scored_per_sample().values(), default=1) == 1


@pytest.mark.quick
def test_the_verdict_log_names_each_verdicts_judge_and_a_resume_answers_from_it(tmp_path):
    log = tmp_path / "verdicts.jsonl"
    fake = FakeJudges()
    fake.down.add("a")
    config = {**FAST, "verdict_log": str(log), "price_input_per_million": 1.0,
              "judges": [{"name": "a", "kwargs": {"who": "a"}, "failure_window": 4, "retry_after_s": 60},
                         {"name": "b", "kwargs": {"who": "b"}, "price_input_per_million": 1_000_000}]}
    with RewardAgent(fake.reward(), config) as agent:
        agent.get(agent.submit(items(30)))
        metrics = agent.metrics()
    records = read_log(str(log)).records
    assert len(records) == 30 and {r["judge"] for r in records} == {"b"}
    assert all(r["extra"]["judge_index"] == 1 for r in records)
    assert {r["cost"] for r in records} == {10.0} and metrics["judge/b/cost"] == metrics["cost"] == 300.0  # b's own price
    calls = dict(fake.calls)
    with RewardAgent(fake.reward(), config) as agent:  # resumed: answered from the log, not sent
        chunk = agent.get(agent.submit(items(30)))
    assert chunk.scores == [1.0] * 30 and dict(fake.calls) == calls and set(chunk.extra_info["judge_index"]) == {1}


# -- calibration ---------------------------------------------------------------------------------------------
class DisagreeingJudges(FakeJudges):
    """Judge b gives 0.0 to the samples whose number is a multiple of 4, else agrees with a (1.0)."""

    async def compute_score(self, data_source, solution_str, ground_truth, extra_info=None, who="?"):
        answer = await super().compute_score(data_source, solution_str, ground_truth, extra_info, who)
        if who == "b" and int(solution_str[1:]) % 4 == 0:
            return {**answer, "score": 0.0}
        return answer


@pytest.mark.quick
def test_calibration_scores_a_share_twice_on_purpose_reports_agreement_per_step_and_settles_nothing_twice():
    from verl_async_rm.engine.fallback import Calibration

    fake = DisagreeingJudges()
    config = {**FAST, "calibration_share": 0.5, "judges": judges("a", "b")}
    with pytest.raises(ValueError, match="calibration_share needs judges"):
        AgentConfig.from_mapping({"calibration_share": 0.5})
    selected = [i for i in range(400) if Calibration(0.5).selected(SimpleItem(f"s{i}"))]
    assert 120 < len(selected) < 280  # about half, the same ones in every run
    with RewardAgent(fake.reward(), config) as agent:
        first = agent.get(agent.submit(items(200)))
        second = agent.get(agent.submit(items(200, 200)))
        deadline = time.monotonic() + 10
        while agent.metrics()["calibration/pairs"] < len(selected) and time.monotonic() < deadline:
            time.sleep(0.01)  # the shadows of the last samples are answered after them
        metrics = agent.metrics()
    assert first.scores + second.scores == [1.0] * 400 and set(first.extra_info["judge_index"]) == {0}  # a's scores settle
    assert metrics["completed"] == 400 and metrics["submitted"] == 400  # the shadows are no samples of the run
    assert fake.calls["b"] == metrics["calibration/pairs"] == len(selected) and metrics["calibration/failed"] == 0
    disagree = sum(1 for i in selected if i % 4 == 0)
    assert metrics["calibration/agreement"] == pytest.approx(1 - disagree / len(selected))
    assert metrics["calibration/mean_abs_diff"] == pytest.approx(disagree / len(selected))
    last = [i for i in selected if i >= 200]
    assert metrics["calibration/last_step_pairs"] == len(last)
    assert metrics["calibration/last_step_agreement"] == pytest.approx(1 - sum(1 for i in last if i % 4 == 0) / len(last))


class SimpleItem:
    def __init__(self, solution_str: str):
        self.data_source, self.solution_str, self.ground_truth = "", solution_str, "1"


@pytest.mark.quick
def test_a_failing_second_judge_fails_calibration_only_never_the_run():
    fake = FakeJudges()
    fake.down.add("b")
    config = {**FAST, "calibration_share": 1.0, "max_concurrency": 8, "judges": judges("a", "b")}
    with RewardAgent(fake.reward(), config) as agent:
        chunk = agent.get(agent.submit(items(300)))
        deadline = time.monotonic() + 10
        while agent.metrics()["calibration/failed"] < 300 and time.monotonic() < deadline:
            time.sleep(0.01)
        metrics = agent.metrics()
    assert chunk.scores == [1.0] * 300 and metrics["failed"] == 0 and metrics["stopped"] is None
    assert metrics["calibration/failed"] == 300 and metrics["calibration/pairs"] == 0


# -- two loopback judges, the real openai client ----------------------------------------------------------
def _two_judges(server_a, server_b, **a_settings) -> list[dict]:
    return [{"name": "hosted", "kwargs": {"base_url": server_a.base_url}, **a_settings},
            {"name": "selfhosted", "kwargs": {"base_url": server_b.base_url}}]


def _run_loopback(config_a: dict, fault, n: int, a_settings: dict, tmp_path, agent_settings=None, usage=None,
                  latency_b=(0.01, 0.03)):
    from verl_async_rm.user_rewards.llm_judge import JudgeReward
    from verl_async_rm_rig.judge_server import JudgeServer, JudgeServerConfig

    log = tmp_path / "verdicts.jsonl"
    data = [{"solution_str": f"the answer is {i % 5}", "ground_truth": str(i % 3)} for i in range(n)]
    with JudgeServer(JudgeServerConfig(latency=(0.01, 0.03), usage=usage, **config_a)) as a, \
            JudgeServer(JudgeServerConfig(latency=latency_b, seed=1, usage=usage)) as b:
        config = {"max_concurrency": 8, "max_attempts": 2, "backoff_initial": 0.01, "backoff_max": 0.05,
                  "verdict_log": str(log), "judges": _two_judges(a, b, **a_settings), **(agent_settings or {})}
        with RewardAgent(JudgeReward, config, reward_kwargs={"model": "judge-stub", "base_url": a.base_url}) as agent:
            fault(a)
            chunk = agent.get(agent.submit(data), timeout=120)
            metrics = agent.metrics()
        served_a, served_b = a.stats(), b.stats()
    expected = [1.0 if i % 5 == i % 3 else 0.0 for i in range(n)]
    assert chunk.scores == expected  # 0 lost, 0 failed, each judged right
    assert served_a.outcomes["ok"] + served_b.outcomes["ok"] == n  # none scored twice
    assert metrics["judge/hosted/scored"] == served_a.outcomes["ok"] and metrics["judge/selfhosted/scored"] == served_b.outcomes["ok"]
    records = read_log(str(log)).records
    assert len(records) == n and len({r["sample"] for r in records}) == n
    by_judge = collections.Counter(r["judge"] for r in records)
    assert (by_judge["hosted"], by_judge["selfhosted"]) == (served_a.outcomes["ok"], served_b.outcomes["ok"])
    assert [r["extra"]["judge_index"] for r in sorted(records, key=lambda r: r["index"])] == chunk.extra_info["judge_index"]
    return metrics, served_a, served_b, chunk


def after_answers(server, answered: int, fault) -> None:
    """``fault(server)`` once the server has answered ``answered`` requests: mid-run by progress, not
    by the clock, so a slow machine cannot move the fault before the first answer or after the last."""
    def watch():
        while server.stats().outcomes["ok"] < answered:
            time.sleep(0.005)
        fault(server)

    threading.Thread(target=watch, daemon=True).start()


@pytest.mark.local
def test_an_outage_of_the_first_judge_mid_run_switches_and_returns(tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="verl_async_rm.engine.fallback"):
        metrics, served_a, served_b, chunk = _run_loopback(
            {}, lambda a: after_answers(a, 50, lambda server: server.start_outage(0.8)), 500,
            {"failure_window": 8, "retry_after_s": 0.3}, tmp_path,
            latency_b=(0.05, 0.1),  # the self-hosted judge is slower: samples are still queued when the first returns
        )
    assert served_a.outcomes["outage"] > 0 and served_b.outcomes["ok"] > 0 and served_a.outcomes["ok"] > 0
    assert metrics["judge/hosted/switches"] >= 1 and metrics["judge/hosted/returns"] >= 1 and metrics["judge/hosted/up"] == 1
    messages = [r.getMessage() for r in caplog.records]
    assert any("'hosted' is down" in m and "500" in m for m in messages) and any("'hosted' is back" in m for m in messages)
    # after the return, the hosted judge scores again: the last samples are its own
    assert chunk.extra_info["judge_index"][-50:].count(0) > 25


@pytest.mark.local
def test_a_429_storm_longer_than_switch_after_throttled_s_moves_the_samples(tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="verl_async_rm.engine.fallback"):
        metrics, served_a, served_b, _ = _run_loopback(
            {}, lambda a: after_answers(a, 50, lambda server: server.start_storm(30.0, retry_after_s=0.1)), 400,
            {"switch_after_throttled_s": 0.5, "retry_after_s": 60}, tmp_path,
        )
    assert served_a.outcomes["storm"] > 0 and served_b.outcomes["ok"] > 100
    assert metrics["judge/hosted/up"] == 0 and metrics["failed"] == 0
    assert any("'hosted' is down" in r.getMessage() and "throttle" in r.getMessage() for r in caplog.records)


@pytest.mark.local
def test_the_first_judges_token_budget_hit_mid_run_moves_the_rest_and_is_not_crossed(tmp_path):
    from verl_async_rm.user_rewards.llm_judge import estimate_input_tokens

    # Each request reports its whole reservation (the judge prompt's bound, 16 output tokens): the
    # budget holds 60 requests exactly.
    per_request = estimate_input_tokens(None, "the answer is 0", "0") + 16
    budget = 60 * per_request
    metrics, served_a, served_b, _ = _run_loopback(
        {}, lambda a: None, 300, {"token_budget": budget}, tmp_path, {"reserve_output_tokens": 16},
        usage=lambda messages, reply: (per_request - 16, 16),
    )
    used = served_a.prompt_tokens_served + served_a.completion_tokens_served
    assert used == budget and served_a.outcomes["ok"] == 60 and served_b.outcomes["ok"] == 240
    assert metrics["judge/hosted/up"] == 0


# -- the guide's example ------------------------------------------------------------------------------------
def _guide_section() -> str:
    from tests.conftest import ROOT

    return (ROOT / "docs" / "guide" / "judge-operations.md").read_text().split("## Judge fallback", 1)[1].split("\n## ", 1)[0]


@pytest.mark.quick
def test_the_guides_verl_config_of_two_judges_is_valid():
    import yaml

    block = _guide_section().split("```yaml\n", 1)[1].split("```", 1)[0]
    config = AgentConfig.from_mapping(yaml.safe_load(block)["reward"]["async_agent"])
    assert [judge.name for judge in config.judges] == ["hosted", "selfhosted"] and config.judges[0].money_budget == 50
    # as verl hands it over: an OmegaConf block, read by the seam's settings
    from omegaconf import OmegaConf

    from verl_async_rm.integration.settings import settings_from_verl_config

    settings = settings_from_verl_config(OmegaConf.create(yaml.safe_load(block)))
    assert settings.agent == config and settings.agent.judges[1].kwargs["api_key"] == "EMPTY"


@pytest.mark.local
def test_the_guides_fallback_example_runs_as_written(tmp_path, monkeypatch, capsys):
    """The guide's commands, with the servers started in process from the same arguments (ports
    replaced by free ones) and the CLI called as ``verl-async-rm`` would."""
    import dataclasses
    import shlex

    from tests.conftest import ROOT
    from verl_async_rm.cli import main
    from verl_async_rm_rig.judge_server import JudgeServer, parse_config

    block = _guide_section().split("```bash\n", 1)[1].split("```", 1)[0]
    commands = [line.split("  #")[0].strip().rstrip("&").strip()
                for line in block.replace("\\\n", " ").splitlines() if line.strip() and not line.startswith("#")]
    servers = [shlex.split(c) for c in commands if c.startswith("python -m verl_async_rm_rig.judge_server")]
    ours = [c for c in commands if c.startswith("verl-async-rm ")]
    assert len(servers) == 2 and len(ours) == 1 and "--outage" in servers[0]
    configs = [parse_config(spec[3:]) for spec in servers]
    monkeypatch.chdir(tmp_path)
    with JudgeServer(dataclasses.replace(configs[0], port=0)) as hosted, \
            JudgeServer(dataclasses.replace(configs[1], port=0)) as selfhosted:
        command = ours[0]
        for server, config in zip((hosted, selfhosted), configs):
            command = command.replace(f"127.0.0.1:{config.port}", f"127.0.0.1:{server.port}")
        command = command.replace("bench/results/", f"{ROOT}/bench/results/")
        assert main(shlex.split(command)[1:]) == 0, capsys.readouterr().err
        served = {"hosted": hosted.stats().outcomes, "selfhosted": selfhosted.stats().outcomes}
    summary = json.loads((tmp_path / "fallback_summary.json").read_text())
    assert summary["samples"] == summary["scored"] == 1024 and summary["failed"] == 0
    assert served["hosted"]["outage"] > 0 and served["selfhosted"]["ok"] > 0
    judges = summary["judges"]
    calibrated = summary["calibration"]["pairs"]  # the second verdicts, asked on purpose
    assert judges["hosted"]["scored"] + judges["selfhosted"]["scored"] == 1024
    assert served["hosted"]["ok"] + served["selfhosted"]["ok"] - 1024 in range(calibrated, calibrated + 17)
    assert judges["hosted"]["switches"] >= 1
    rows = [json.loads(line) for line in (tmp_path / "fallback.jsonl").read_text().splitlines()]
    assert {row["reward_extra_info"]["judge_index"] for row in rows} == {0, 1}
    calibration = summary["calibration"]  # a tenth of hosted's samples, judged again by selfhosted, alike
    assert calibration["pairs"] > 10 and calibration["agreement"] == 1.0 and calibration["failed"] == 0


@pytest.mark.local
@pytest.mark.parametrize("executor", ["thread", "process"])
def test_each_judge_calls_the_reward_with_its_own_kwargs_on_every_executor(tmp_path, executor):
    """A sync reward loaded from a file: threads call it in process, worker processes load it from
    its spec; either way each judge's kwargs reach it."""
    reward_file = tmp_path / "who.py"
    reward_file.write_text(
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None, who='nobody', down=()):\n"
        "    if who in down:\n"
        "        raise ConnectionError(who + ' is down')\n"
        "    return {'score': 1.0, 'who': who}\n"
    )
    config = {**FAST, "executor": executor, "max_concurrency": 2,
              "judges": [{"name": "a", "kwargs": {"who": "a", "down": ["a"]}, "failure_window": 4, "retry_after_s": 60},
                         {"name": "b", "kwargs": {"who": "b"}}]}
    with RewardAgent.from_file(str(reward_file), "compute_score", config, reward_kwargs={"who": "agent"}) as agent:
        chunk = agent.get(agent.submit(items(12)), timeout=120)
    assert chunk.scores == [1.0] * 12 and set(chunk.extra_info["who"]) == {"b"} and set(chunk.extra_info["judge_index"]) == {1}
