"""The demo's parts that need no trainer: the start gate (its patch on a trainer class, and the
launcher's start/open/wait around a real subprocess), the judge log read back as calls in flight,
the zero-latency judge, and the CLI's refusals. The demo itself: tests/rig/test_demo.py."""

from __future__ import annotations

import json
import threading
import time
import types

import psutil
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.conftest import ROOT
from verl_async_rm_rig import demo
from verl_async_rm_rig.cpu_backend import start_gate
from verl_async_rm_rig.cpu_backend.launch import CPURunConfig, RunningTrainer, park_at_gates



@pytest.mark.local
def test_the_first_validation_waits_at_the_gate_and_later_ones_do_not(tmp_path, monkeypatch):
    gate = tmp_path / "gate"
    monkeypatch.setenv(start_gate.GATE_ENV, str(gate))
    calls = []

    class Trainer:
        def _validate(self, merged=False):
            calls.append(merged)
            return {"val": 1.0}

    module = types.ModuleType("a_trainer_module")  # not one of verl's: no internal of it to check
    module.Trainer = Trainer
    start_gate._gate_first_validation(module, "Trainer")
    start_gate._gate_first_validation(module, "Trainer")  # idempotent
    trainer, returned = Trainer(), []
    waiter = threading.Thread(target=lambda: returned.append(trainer._validate(merged=True)))
    waiter.start()
    deadline = time.monotonic() + 5
    while not start_gate.waiting_marker(gate).exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.2)
    assert calls == [True] and not returned  # validated, then held at the gate
    opened = time.time()
    start_gate.open_gate(gate)
    waiter.join(timeout=5)
    assert returned == [{"val": 1.0}]
    assert float(start_gate.passed_marker(gate).read_text()) >= opened
    start = time.monotonic()
    assert trainer._validate() == {"val": 1.0} and time.monotonic() - start < 0.5  # no second wait
    assert calls == [True, False]


@pytest.mark.local
def test_a_gated_v1_trainer_stamps_each_steps_start_on_the_wall_clock(tmp_path, monkeypatch):
    """The step clock (bench/e2e.py's loop time from the gate, and its timeline): one line per
    on_step_begin, after the gate's passed marker; patched once however often it is installed; a
    class without the hook (v0's trainer) has no clock."""
    gate = tmp_path / "gate"
    monkeypatch.setenv(start_gate.GATE_ENV, str(gate))
    begun = []

    class V1Trainer:
        def _validate(self):
            return {}

        def on_step_begin(self):
            begun.append(len(start_gate.read_step_clock(gate)))  # the stamp comes first

    class V0Trainer:
        def _validate(self):
            return {}

    module = types.ModuleType("a_trainer_module")
    module.V1Trainer, module.V0Trainer = V1Trainer, V0Trainer
    for _ in range(2):  # idempotent
        start_gate._gate_first_validation(module, "V1Trainer")
        start_gate._gate_first_validation(module, "V0Trainer")
    start_gate.open_gate(gate)
    trainer = V1Trainer()
    trainer._validate()
    passed = float(start_gate.passed_marker(gate).read_text())
    for _ in range(3):
        trainer.on_step_begin()
    starts = start_gate.read_step_clock(gate)
    assert begun == [1, 2, 3] and len(starts) == 3
    assert passed <= starts[0] <= starts[1] <= starts[2] <= time.time()
    assert not hasattr(V0Trainer, "on_step_begin")
    with open(start_gate.step_clock(gate), "a") as f:
        f.write("17")  # a line cut by a killed writer
    assert start_gate.read_step_clock(gate) == starts
    assert start_gate.read_step_clock(tmp_path / "never") == []


@pytest.mark.quick
def test_the_gate_is_installed_only_when_asked(monkeypatch):
    monkeypatch.delenv(start_gate.GATE_ENV, raising=False)
    assert start_gate.install_if_requested() is False


@pytest.mark.quick
def test_wait_at_gate_can_time_out(tmp_path):
    with pytest.raises(TimeoutError, match="stayed closed"):
        start_gate.wait_at_gate(tmp_path / "gate", timeout_s=0.1)


def _fake_cfg(tmp_path, env: dict | None = None, **kw) -> CPURunConfig:
    return CPURunConfig(out_dir=str(tmp_path / "run"), model_dir=str(tmp_path), train_file="t.parquet",
                        val_file="v.parquet", entry_module="tests.helpers.fake_gated_trainer", start_gate=True,
                        timeout_s=60, extra_env={"PYTHONPATH": str(ROOT), **(env or {})}, **kw)


@pytest.mark.local
def test_the_launcher_holds_a_run_at_its_gate_until_opened(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    lane = RunningTrainer(_fake_cfg(tmp_path))
    try:
        deadline = time.monotonic() + 30
        while not lane.at_gate and not lane.poll() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert lane.at_gate and lane.proc.poll() is None
        time.sleep(0.3)
        assert lane.proc.poll() is None and not lane.result().metrics  # still held, nothing trained
        lane.open_gate()
        result = lane.wait(poll_s=0.05)
    finally:
        lane.close()
    assert result.ok and result.series("timing_s/step") == [(1, 0.5)]
    assert 0 < result.gate_reached_s <= result.gate_opened_s <= result.wall_time_s


def _busy_child(lane):
    children = psutil.Process(lane.proc.pid).children()
    assert len(children) == 1
    return children[0]


def _cpu_s(p) -> float:
    t = p.cpu_times()
    return t.user + t.system


@pytest.mark.local
def test_a_run_parked_at_its_gate_is_frozen_until_its_gate_opens(tmp_path, monkeypatch):
    # A parked run's processes must take no CPU from the run that trains (issue 14: the demo's first
    # lane took 9.1 s unfrozen, 6.6-6.8 s frozen); opening the gate resumes them.
    monkeypatch.chdir(ROOT)
    lanes = [RunningTrainer(_fake_cfg(tmp_path / str(i), env={"FAKE_TRAINER_BUSY_CHILD": "1"}))
             for i in range(2)]
    try:
        park_at_gates(lanes, poll_s=0.05)
        assert all(lane.at_gate and lane.frozen for lane in lanes)
        busy = [_busy_child(lane) for lane in lanes]
        # SIGSTOP takes effect when the kernel next schedules the process: on a loaded machine its status
        # may read "running" for a moment after the signal was sent, so wait for it (a run never frozen
        # stays "running" and fails here)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not all(
                p.status() == psutil.STATUS_STOPPED for p in [*busy, *(psutil.Process(lane.proc.pid) for lane in lanes)]):
            time.sleep(0.05)
        assert all(p.status() == psutil.STATUS_STOPPED for p in busy)
        assert all(psutil.Process(lane.proc.pid).status() == psutil.STATUS_STOPPED for lane in lanes)
        before = [_cpu_s(p) for p in busy]
        time.sleep(0.5)
        assert [_cpu_s(p) for p in busy] == before  # frozen: not a tick of CPU
        lanes[0].open_gate()
        deadline = time.monotonic() + 10  # the opened one runs (as soon as a loaded machine gives it a core)
        while time.monotonic() < deadline and _cpu_s(busy[0]) <= before[0] + 0.1:
            time.sleep(0.05)
        assert _cpu_s(busy[0]) > before[0] + 0.1 and _cpu_s(busy[1]) == before[1]  # only the opened one runs
        result = lanes[0].wait(poll_s=0.05)
        assert result.ok and result.series("timing_s/step") == [(1, 0.5)]
        # closing a frozen run ends it at once (a stopped process would hold SIGTERM until continued)
        started = time.monotonic()
        lanes[1].close()
        assert time.monotonic() - started < 5 and not psutil.pid_exists(lanes[1].proc.pid)
        busy[1].wait(timeout=5)  # its child sees the trainer gone and ends
    finally:
        for lane in lanes:
            lane.close()


def _run_through_the_gate(lane):
    deadline = time.monotonic() + 30
    while not lane.at_gate and not lane.poll() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert lane.at_gate
    busy = _busy_child(lane)
    lane.open_gate()
    started = time.monotonic()
    return busy, lane.wait(poll_s=0.05), time.monotonic() - started


@pytest.mark.local
def test_a_run_that_marked_its_training_finished_is_ended_without_waiting_out_its_teardown(tmp_path, monkeypatch):
    # main_ppo marks the training finished once verl's run returned (cpu_backend/finish_marker.py);
    # the launcher then ends the run's processes instead of waiting for its teardown (Ray's: ~3.5 s a run)
    monkeypatch.chdir(ROOT)
    lane = RunningTrainer(_fake_cfg(tmp_path, env={"FAKE_TRAINER_TEARDOWN_S": "120", "FAKE_TRAINER_BUSY_CHILD": "1"}))
    try:
        busy, result, waited = _run_through_the_gate(lane)
    finally:
        lane.close()
    assert result.ok and result.series("timing_s/step") == [(1, 0.5)]
    assert waited < 60  # ended by the launcher during its 120 s teardown...
    assert not psutil.pid_exists(lane.proc.pid) and not psutil.pid_exists(busy.pid)  # ... with all it started, reaped


@pytest.mark.local
def test_a_run_that_fails_before_marking_its_training_finished_is_still_a_failure(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    lane = RunningTrainer(_fake_cfg(tmp_path, env={"FAKE_TRAINER_EXIT": "3", "FAKE_TRAINER_BUSY_CHILD": "1"}))
    try:
        _, result, _ = _run_through_the_gate(lane)
    finally:
        lane.close()
    assert not result.ok and result.returncode == 3 and not lane.finished


@pytest.mark.local
def test_only_a_run_waiting_at_its_gate_can_be_frozen(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    lane = RunningTrainer(_fake_cfg(tmp_path))
    try:
        with pytest.raises(ValueError, match="start gate"):
            lane.freeze()
    finally:
        lane.close()


@pytest.mark.quick
def test_the_gate_needs_a_validation_before_step_one(tmp_path):
    with pytest.raises(ValueError, match="val_before_train"):
        RunningTrainer(_fake_cfg(tmp_path, val_before_train=False))


@pytest.mark.quick
def test_the_judge_log_becomes_loop_relative_calls(tmp_path):
    log = tmp_path / "judge_calls.jsonl"
    log.write_text("\n".join(json.dumps(c) for c in [
        {"start": 90.0, "end": 95.0, "outcome": "ok"},  # validation, before the loop: left out
        {"start": 99.0, "end": 101.0, "outcome": "ok"},  # straddles the gate: starts at 0
        {"start": 102.0, "end": 104.5, "outcome": "fail"},
    ]) + "\n{\"start\": 10")  # a cut line is skipped
    assert demo.read_judge_calls(log, loop_start=100.0) == [(0.0, 1.0), (2.0, 4.5)]
    assert demo.read_judge_calls(tmp_path / "missing.jsonl", 0.0) == []


@pytest.mark.quick
@given(st.lists(st.tuples(st.floats(0, 50), st.floats(0, 10)).map(lambda c: (c[0], c[0] + c[1])), max_size=30),
       st.floats(0, 70))
def test_in_flight_counts_the_calls_covering_each_moment(calls, moment):
    times, counts = demo.in_flight(calls)
    assert times == sorted(times) and times[0] == 0.0
    index = max(i for i, t in enumerate(times) if t <= moment)
    assert counts[index] == sum(1 for s, e in calls if s <= moment < e)


@pytest.mark.quick
def test_the_zero_latency_run_gets_an_instant_judge_of_the_same_model():
    judge = {"latency_model": "lognormal", "latency_p50": 0.3, "latency_p99": 3.0, "hang_prob": 0.01,
             "fail_prob": 0.2}
    instant = demo.instant_judge(judge)
    assert instant["latency_model"] == "lognormal"
    assert (instant["latency_p50"], instant["latency_p99"], instant["hang_prob"], instant["fail_prob"]) == (0, 0, 0, 0)
    model = demo.JudgeModel.from_kwargs(instant)
    assert {model.draw(f"r{i}").latency_s for i in range(50)} == {0.0}


@pytest.mark.quick
def test_the_cli_builds_the_judge_and_refuses_a_bad_one(capsys):
    args = types.SimpleNamespace(latency_model="lognormal", latency_lo=0.05, latency_hi=2.0, latency_p50=0.3,
                                 latency_p99=3.0, hang_prob=0.01, hang_s=None, fail_prob=0.0)
    assert demo.judge_from_args(args) == {"latency_model": "lognormal", "latency_p50": 0.3, "latency_p99": 3.0,
                                          "hang_prob": 0.01, "fail_prob": 0.0}
    for bad in (["--latency-model", "lognormal", "--latency-p50", "2", "--latency-p99", "1"],
                ["--fail-prob", "1.5"], ["--parallel-startups", "0"]):
        with pytest.raises(SystemExit) as exc:
            demo.main(bad)
        assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "latency_p50 <= latency_p99" in err and "fail_prob" in err and "--parallel-startups" in err


@pytest.mark.quick
def test_redraw_draws_the_timeline_from_the_json_alone(tmp_path):
    run = {"step_times": [1.0, 1.2], "phases": {"gen": [0.3, 0.3], "reward_wait": [0.2, 0.0], "update_actor": [0.4, 0.5]},
           "blocked": [0.2, 0.0], "scores": [0.1, 0.2], "judge_calls": [[0.3, 0.9], [0.35, 1.6]],
           "wall": {"startup_s": 50.0}}
    old_run = {k: v for k, v in run.items() if k not in ("judge_calls", "wall")}  # a report from before both
    (tmp_path / "demo.json").write_text(json.dumps({"runs": {"baseline": run, "both": old_run}}))
    assert demo.main(["--redraw", str(tmp_path / "demo.json")]) == 0
    assert (tmp_path / "timeline.png").stat().st_size > 10_000
    results = demo.results_from_report(json.loads((tmp_path / "demo.json").read_text()))
    assert results["baseline"].judge_calls == [(0.3, 0.9), (0.35, 1.6)] and results["both"].judge_calls == []


@pytest.mark.quick
def test_steps_are_drawn_where_the_step_clock_placed_them_and_the_loop_runs_from_the_gate(tmp_path, monkeypatch):
    """A strategy lane sets up for seconds between its gate and step 1: the loop time counts them, and
    the timeline draws its steps there, so its judge calls (at their own times from the gate) line up."""
    import matplotlib.axes

    ModeResult = demo.ModeResult  # noqa: N806
    late = ModeResult("both", [1.0, 1.0], {"gen": [0.2, 0.2], "reward_wait": [0.0, 0.0], "update_actor": [0.5, 0.5]},
                      [0.0, 0.0], [0.1, 0.2], judge_calls=[(0.5, 2.5)], step_starts=[2.0, 3.5])
    unplaced = ModeResult("baseline", [1.0, 1.0], late.phases, [], [0.1, 0.2])
    assert late.loop_time == 4.5 and unplaced.loop_time == 2.0  # from the gate / the steps' sum where no clock
    lefts = []
    barh = matplotlib.axes.Axes.barh
    monkeypatch.setattr(matplotlib.axes.Axes, "barh", lambda self, y, w, **kw: lefts.append((round(y), kw["left"])) or barh(self, y, w, **kw))
    demo.draw_timeline({"baseline": unplaced, "both": late}, tmp_path / "t.png")
    both_lane = [left for lane, left in lefts if lane == 0]  # lanes are drawn bottom-up
    baseline_lane = [left for lane, left in lefts if lane == 1]
    assert min(both_lane) == 2.0 and 3.5 in both_lane and max(both_lane) < 4.5
    assert min(baseline_lane) == 0.0 and 1.0 in baseline_lane
    report = {"runs": {"both": {"step_times": late.step_times, "phases": late.phases, "blocked": [], "scores": late.scores,
                                "step_starts": late.step_starts}}}
    assert demo.results_from_report(report)["both"].step_starts == [2.0, 3.5]


@pytest.mark.quick
@pytest.mark.parametrize("total_gb, available_gb, runs, shared, per_run", [
    (24, 22, 5, 5, 5),  # this project's machines: all five demo lanes start together
    (16, 14, 5, 5, 4),  # a 16 GB laptop: all five on the shared cluster (1.9 GiB a lane measured), not 4 + 1
    (8, 6, 5, 2, 1),    # too little for two with a cluster each: one at a time, never zero
    (6, 3, 5, 1, 1),
    (64, 60, 5, 5, 5),  # never more than there are runs
])
def test_parallel_startups_follow_the_free_memory(monkeypatch, total_gb, available_gb, runs, shared, per_run):
    gib = 2**30
    monkeypatch.setattr(psutil, "virtual_memory", lambda: types.SimpleNamespace(total=total_gb * gib, available=available_gb * gib))
    assert demo.default_parallel_startups(runs) == shared
    assert demo.default_parallel_startups(runs, share_ray=False) == per_run
