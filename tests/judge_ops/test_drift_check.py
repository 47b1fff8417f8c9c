"""The drift check in training, its pure logic (verl_async_rm/drift.py): ``reward.async_agent.drift_check``
read into typed settings, each problem named by its key; the calibration set checked at start; the
monitor a trainer calls each step (a check beside the steps, reported at the first step after it
ends, never doubled, the last one waited for; or inside its step). The trainers' seam:
tests/seam/test_drift_check_seam.py."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from tests.judge_ops.test_replay import Past
from verl_async_rm.agent import RewardAgent
from verl_async_rm.config import AgentConfig
from verl_async_rm.drift import (
    DEFAULTS,
    DriftMonitor,
    absolute_paths,
    check_at_start,
    drift_settings_from_mapping,
    load_calibration,
)
from verl_async_rm.integration.settings import settings_from_verl_config
from verl_async_rm.loader import RewardSpec
from verl_async_rm.verdict_log import inputs_path

pytestmark = pytest.mark.quick

RUN_REWARD = RewardSpec("/judges/run_judge.py", "JudgeReward", {"model": "judge-a", "base_url": "http://judge/v1"})


@pytest.fixture
def past(tmp_path) -> Past:
    past = Past(tmp_path)
    past.log.unlink()  # written again, keeping its inputs
    with RewardAgent.from_file(str(tmp_path / "exact.py"), "compute_score",
                               {"verdict_log": str(past.log), "verdict_log_inputs": True}) as agent:
        for step in range(3):
            agent.get_all(agent.submit(past.rows[step * 16:(step + 1) * 16], 4))
    return past


def parse(block, run_agent: dict | None = None, reward: RewardSpec = RUN_REWARD):
    return drift_settings_from_mapping(block, reward, AgentConfig.from_mapping(run_agent or {}))


def test_off_unless_a_log_is_named(past):
    assert parse(None) is None and parse(dict(DEFAULTS)) is None  # our config's declared block: off
    with pytest.raises(ValueError, match=r"drift_check.log is required .*given: every_n_steps"):
        parse({"every_n_steps": 10})


def test_defaults_and_the_runs_own_judge(past):
    run_agent = {"max_concurrency": 7, "verdict_log": str(past.dir / "run.jsonl"), "cache": True, "token_budget": 1000,
                 "verdict_log_inputs": True}
    settings = parse({"log": str(past.log)}, run_agent)
    assert (settings.input, settings.groups, settings.seed, settings.every_n_steps, settings.background) == (None, 16, 0, 50, True)
    assert settings.reward == RUN_REWARD  # the run's own judge, kwargs and all
    # the run's limits, but its own fresh log, no cache, no budget
    assert settings.settings["max_concurrency"] == 7
    assert not {"verdict_log", "cache", "token_budget", "verdict_log_inputs"} & set(settings.settings)
    other = parse({"log": str(past.log), "reward_kwargs": {"model": "judge-b"}, "settings": {"max_concurrency": 2},
                   "every_n_steps": 5, "groups": None, "background": False})
    assert other.reward == RewardSpec(RUN_REWARD.path, RUN_REWARD.name, {"model": "judge-b"})
    assert other.settings["max_concurrency"] == 2 and other.groups is None and other.background is False
    judge = past.dir / "exact.py"
    own = parse({"log": str(past.log), "reward_file": str(judge)})
    assert own.reward == RewardSpec(str(judge), "compute_score", RUN_REWARD.kwargs)


@pytest.mark.parametrize("change, named", [
    ({"log": "{dir}/nope.jsonl"}, "reward.async_agent.drift_check.log '{dir}/nope.jsonl': no such file"),
    ({"log": "{dir}"}, "reward.async_agent.drift_check.log '{dir}' is a directory"),
    ({"input": "{dir}/nope.jsonl"}, "reward.async_agent.drift_check.input '{dir}/nope.jsonl': no such file"),
    ({"every_n_steps": 0}, "reward.async_agent.drift_check.every_n_steps must be a positive integer"),
    ({"every_n_steps": True}, "reward.async_agent.drift_check.every_n_steps must be a positive integer"),
    ({"groups": -1}, "reward.async_agent.drift_check.groups must be a positive integer or null"),
    ({"seed": "x"}, "reward.async_agent.drift_check.seed must be an integer"),
    ({"background": "yes"}, "reward.async_agent.drift_check.background must be true or false"),
    ({"reward_file": "{dir}/nope.py"}, "reward.async_agent.drift_check.reward_file '{dir}/nope.py': no such file"),
    ({"reward_kwargs": [1]}, "reward.async_agent.drift_check.reward_kwargs must be a mapping"),
    ({"settings": {"cache": True}}, "reward.async_agent.drift_check.settings.cache: a drift check keeps its own"),
    ({"settings": {"verdict_log": "x"}}, "reward.async_agent.drift_check.settings.verdict_log"),
    ({"settings": {"max_concurrency": 0}}, "reward.async_agent.drift_check.settings: invalid async reward agent config"),
    ({"every_n_step": 5}, "reward.async_agent.drift_check: unknown key(s) ['every_n_step']"),
])
def test_each_bad_setting_is_refused_naming_its_key(past, change, named):
    """Values when read (in every process); files where the run starts (``check_at_start``): a worker on
    another node need not see them."""
    block = {"log": str(past.log), **{k: v.format(dir=past.dir) if isinstance(v, str) else v for k, v in change.items()}}
    with pytest.raises(ValueError) as error:
        check_at_start(parse(block))
    assert named.format(dir=past.dir) in str(error.value)


def test_a_log_without_kept_inputs_needs_input_naming_the_setting(past):
    inputs_path(past.log).unlink()
    with pytest.raises(ValueError, match=r"drift_check.input is null, and the log .* keeps no inputs .*"
                                         r"reward.async_agent.verdict_log_inputs=true"):
        check_at_start(parse({"log": str(past.log)}))
    with_input = parse({"log": str(past.log), "input": str(past.input), "reward_file": str(past.dir / "exact.py"),
                        "reward_kwargs": {}})
    check_at_start(with_input)
    assert with_input.input == str(past.input)


def test_at_start_the_calibration_loads_and_an_empty_or_unjoinable_one_is_refused_naming_the_key(past):
    settings = parse({"log": str(past.log), "groups": 3, "reward_file": str(past.dir / "exact.py"), "reward_kwargs": {}})
    check_at_start(settings)
    assert load_calibration(settings).groups == 3
    wrong = past.dir / "other.jsonl"
    wrong.write_text('{"solution_str": "x", "ground_truth": "1"}\n')
    with pytest.raises(ValueError, match=r"^reward.async_agent.drift_check.input .*: 12 of the 12 selected samples are not in it"):
        check_at_start(parse({"log": str(past.log), "input": str(wrong), "groups": 3,
                              "reward_file": str(past.dir / "exact.py"), "reward_kwargs": {}}))
    failed = past.dir / "failed.verdicts.jsonl"  # every sample failed: nothing to compare with
    (past.dir / "down.py").write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                                      "    raise RuntimeError('down')\n")
    with RewardAgent.from_file(str(past.dir / "down.py"), "compute_score",
                               {"verdict_log": str(failed), "verdict_log_inputs": True, "max_attempts": 1,
                                "max_failure_rate": 1.0}) as agent:
        agent.get_all(agent.submit(past.rows[:4], 4))
    with pytest.raises(ValueError, match=r"^reward.async_agent.drift_check.log .*: no sample selected"):
        check_at_start(parse({"log": str(failed), "reward_file": str(past.dir / "exact.py"), "reward_kwargs": {}}))
    with pytest.raises(ValueError, match=r"^reward.async_agent.drift_check.reward_file \(the run's "
                                         r"reward.custom_reward_function.path\) '/judges/run_judge.py': no such file"):
        check_at_start(parse({"log": str(past.log)}))  # the run's judge file does not exist here
    (past.dir / "broken.py").write_text("import nowhere_to_be_found\n")
    with pytest.raises(ValueError, match=r"^reward.async_agent.drift_check: its judge .*broken.py"):
        check_at_start(parse({"log": str(past.log), "reward_file": str(past.dir / "broken.py")}))


def test_read_from_verls_config_with_the_runs_reward_and_paths_made_absolute(past, monkeypatch):
    config = OmegaConf.create({
        "reward": {"custom_reward_function": {"path": str(past.dir / "exact.py"), "name": "compute_score"},
                   "async_agent": {"max_concurrency": 9, "drift_check": {"log": str(past.log), "every_n_steps": 3}}}})
    settings = settings_from_verl_config(config)
    assert settings.agent.max_concurrency == 9 and "drift_check" not in settings.agent.model_dump()
    assert settings.drift_check.reward == settings.reward and settings.drift_check.every_n_steps == 3
    assert settings_from_verl_config(OmegaConf.create({})).drift_check is None
    monkeypatch.chdir(past.dir)
    assert absolute_paths({"log": "old.verdicts.jsonl", "input": None, "reward_file": "pkg://a.b", "groups": 2}) == \
        {"log": os.path.join(str(past.dir), "old.verdicts.jsonl"), "input": None, "reward_file": "pkg://a.b", "groups": 2}


# -- the monitor ---------------------------------------------------------------------------------------------
class GatedCheck:
    """A check that runs until the test lets it finish (``release``), recording the steps it ran at."""

    def __init__(self, every: int, gated: bool = True):
        self.every, self.ran, self.gates = every, [], {}
        self.gated = gated

    def __call__(self, step: int) -> dict:
        if step % self.every:
            return {}
        self.ran.append(step)
        gate = self.gates.setdefault(step, threading.Event())
        if self.gated:
            assert gate.wait(10)
        return {"async_rm/drift/spearman": 1.0 - step / 100}

    def release(self, step: int) -> None:
        self.gates.setdefault(step, threading.Event()).set()


def test_in_the_background_a_check_is_reported_at_the_first_step_after_it_ends_never_doubled():
    check = GatedCheck(every=2)
    monitor = DriftMonitor(check, every_n_steps=2)
    assert monitor.metrics(1) == {} and monitor.metrics(2) == {}  # started at 2, the step goes on
    assert monitor.metrics(3) == {}  # still running
    assert monitor.metrics(4) == {} and monitor.skipped == 1  # due again while running: skipped, not doubled
    check.release(2)
    monitor.wait(10)
    reported = monitor.metrics(5)
    assert reported["async_rm/drift/spearman"] == pytest.approx(0.98) and reported["async_rm/drift/step"] == 2
    assert reported["async_rm/drift/skipped"] == 1 and reported["async_rm/drift/seconds"] >= 0
    assert monitor.metrics(6) == {} and check.ran == [2, 6]
    check.release(6)
    # the last step waits for the running check: the last result is not lost
    last = monitor.metrics(7, last=True)
    assert last["async_rm/drift/step"] == 6 and last["async_rm/drift/spearman"] == pytest.approx(0.94)


def test_inside_the_step_a_check_is_that_steps_and_a_failing_check_never_stops_training():
    monitor = DriftMonitor(GatedCheck(every=3, gated=False), every_n_steps=3, background=False)
    assert [bool(monitor.metrics(s)) for s in range(1, 7)] == [False, False, True, False, False, True]
    assert monitor.metrics(6)["async_rm/drift/step"] == 6

    def broken(step):
        raise RuntimeError("judge file vanished")

    failing = DriftMonitor(broken, every_n_steps=1)
    failing.metrics(1)
    failing.wait(10)
    assert failing.metrics(2) == {"async_rm/drift/errors": 1.0}
    assert DriftMonitor(broken, every_n_steps=1, background=False).metrics(1) == {"async_rm/drift/errors": 1.0}


def test_a_monitor_built_from_settings_asks_the_judge_and_reports_verl_metrics(past):
    settings = parse({"log": str(past.log), "groups": 2, "every_n_steps": 2, "background": False,
                      "reward_file": str(past.dir / "exact.py"), "reward_kwargs": {}})
    monitor = DriftMonitor.build(settings, workdir=str(past.dir))
    assert monitor.metrics(1) == {}
    metrics = monitor.metrics(2)
    assert metrics["async_rm/drift/spearman"] == pytest.approx(1) and metrics["async_rm/drift/not_compared"] == 0
    assert all(isinstance(v, float) for v in metrics.values())
    assert not list(Path(past.dir).glob("drift-check-*"))  # each check's own verdict log is removed with it
