"""The demo's parts that need no trainer: the start gate (its patch on a trainer class, and the
launcher's start/open/wait around a real subprocess), the lanes (the benchmark's contestants), the
judge log read back as calls in flight and as 429s and failures, the table, the timeline, and the
CLI's refusals. The demo itself: tests/rig/test_demo.py."""

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


# ---------------------------------------------------------------------------------------------- the lanes


@pytest.mark.quick
def test_the_lanes_are_stock_sync_verls_colocate_async_and_the_recommended_configuration_under_judge_real():
    from verl_async_rm_rig import contestants

    lanes = demo.LANES
    assert list(lanes) == demo.DEFAULT_LANES == ["zero_latency", "sync", "colocate_async", "recommended"]
    assert {lane.regime for name, lane in lanes.items() if name != "zero_latency"} == {"judge_real"}
    assert (lanes["zero_latency"].regime, lanes["zero_latency"].mode) == ("zero", contestants.STOCK)
    sync, verl, ours = lanes["sync"], lanes["colocate_async"], lanes["recommended"]
    assert (sync.mode, sync.trainer_mode, sync.reward_manager, sync.reward_workers) == (contestants.STOCK, "sync", "async_agent", 1)
    assert (verl.mode, verl.trainer_mode, verl.reward_manager, verl.reward_workers) == (
        contestants.VERL_COLOCATE, "colocate_async", "rate_limited", 8)
    assert ours.mode == contestants.RECOMMENDED and ours.what.endswith(contestants.RECOMMENDED)
    # verl's rate_limited manager is given the judge's published limit and the request timeout
    overrides = demo.lane_settings(verl, 1.5, 0)["overrides"]
    regime = contestants.REGIMES["judge_real"]
    assert overrides[-len(regime.verl_reward_loop(1.5)):] == regime.verl_reward_loop(1.5)
    assert not [o for o in overrides if "async_agent" in o]


@pytest.mark.quick
def test_a_lane_runs_what_the_benchmark_runs_but_for_its_validation_sampling(monkeypatch):
    """The demo's lanes and bench/e2e.py's runs of the same (regime, mode): the same judge, overrides
    and reward manager; the benchmark adds only its own validation sampling."""
    import bench.e2e as e2e

    monkeypatch.setattr(e2e, "async_fast_poll_supported", lambda: True)
    for lane in demo.LANES.values():
        ours = demo.lane_settings(lane, 1.5, 3)
        theirs = e2e.run_settings(e2e.Run("v1", 3, lane.regime, lane.mode), 1.5, 0.02)
        assert ours["judge"] == theirs["judge"]
        assert ours["overrides"] == [o for o in theirs["overrides"] if o not in e2e.VALIDATION]
        assert ours["reward_manager"] == theirs.get("reward_manager", "async_agent")


@pytest.mark.quick
def test_a_judge_real_lane_scores_through_its_own_server_and_dumps_what_it_trained_on(tmp_path):
    from verl_async_rm_rig.cpu_backend import judged_toy
    from verl_async_rm_rig.cpu_backend.names import PAIRED_DRAWS_ENV

    assets = CPURunConfig(out_dir=str(tmp_path / "assets"), assets_dir=str(tmp_path / "assets"))
    lane = demo.LANES["colocate_async"]
    with pytest.raises(RuntimeError, match="judge server"):
        demo.lane_config(tmp_path / "lane", assets, lane, 2, 0, 1.5)
    cfg = demo.lane_config(tmp_path / "lane", assets, lane, 2, 0, 1.5, base_url="http://127.0.0.1:9/v1", start_gate=True)
    assert cfg.reward_path == judged_toy.__file__ or cfg.reward_path.endswith("judged_toy.py")
    assert cfg.reward_kwargs == {"base_url": "http://127.0.0.1:9/v1", "timeout": 3.75} and cfg.reward_manager == "rate_limited"
    assert f"trainer.rollout_data_dir={(tmp_path / 'lane').absolute() / 'rollouts'}" in cfg.extra_overrides
    assert "trainer.v1.trainer_mode=colocate_async" in cfg.extra_overrides and "reward.num_workers=8" in cfg.extra_overrides
    assert cfg.trainer == "v1" and cfg.decode_s == 0.02 and cfg.v1_poll_interval_s == 0.05 and cfg.light_driver
    assert cfg.extra_env[PAIRED_DRAWS_ENV] == "1" and cfg.extra_env[demo.JUDGE_LOG_ENV].endswith("judge_calls.jsonl")
    bound = demo.lane_config(tmp_path / "zero", assets, demo.LANES["zero_latency"], 2, 0, 1.5)
    assert bound.reward_name == "compute_score_with_latency" and bound.reward_kwargs == {}


@pytest.mark.quick
def test_any_contestant_is_a_lane_and_a_bad_one_is_refused():
    lane = demo.lane_of("both@tail_1x")
    assert (lane.mode, lane.regime, lane.reward_manager) == ("both", "tail_1x", "async_agent")
    assert demo.lane_of("tail_auto").regime == "judge_real"
    for bad in ("nope", "both@nowhere"):
        with pytest.raises(ValueError, match="MODE"):
            demo.lane_of(bad)


@pytest.mark.quick
def test_the_cli_refuses_bad_lanes_and_settings(capsys):
    for bad in (["--lanes", "sync,nope"], ["--lanes", "sync,sync"], ["--parallel-startups", "0"], ["--compute", "0"]):
        with pytest.raises(SystemExit) as exc:
            demo.main(bad)
        assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "--lanes" in err and "distinct" in err and "--parallel-startups" in err and "--compute" in err


# ---------------------------------------------------------------------------------------------- the judge log


@pytest.mark.quick
def test_the_judge_log_gives_the_loops_429s_and_failed_calls_where_they_ended(tmp_path):
    log = tmp_path / "judge_calls.jsonl"
    log.write_text("\n".join(json.dumps(c) for c in [
        {"start": 90.0, "end": 95.0, "outcome": "500"},  # validation's: left out
        {"start": 100.5, "end": 100.6, "outcome": "429"},
        {"start": 100.6, "end": 101.0, "outcome": "ok"},
        {"start": 101.0, "end": 103.5, "outcome": "cancelled"},  # a hang the caller's timeout ended
        {"start": 102.0, "end": 102.2, "outcome": "500"},
        {"start": 102.0, "end": 102.3, "outcome": "timeout"},
        {"start": 102.0, "end": 102.4, "outcome": "fail"},  # the simulated judge's failure
    ]) + "\n")
    calls = demo.read_judge_log(log, loop_start=100.0)
    assert [outcome for *_, outcome in calls] == ["429", "ok", "cancelled", "500", "timeout", "fail"]
    marks = demo.judge_marks(calls)
    assert [(round(t, 3), kind) for t, kind in marks] == [(0.6, "429"), (3.5, "failed"), (2.2, "failed"), (2.3, "failed"),
                                                          (2.4, "failed")]


# ---------------------------------------------------------------------------------------------- the table


def _lane_run(name, mode=None, *, gen=(0.5, 0.5), wait_key=None, wait=None, judge=None, marks=(), dumps=None,
              scores=(0.1, 0.2), regime="judge_real"):
    lane = demo.LANES.get(name) or demo.Lane(name, regime, mode, name)
    timeline = demo.ModeResult(name, [1.0, 1.0], {"gen": list(gen), "reward_wait": [0.0, 0.0], "update_actor": [0.3, 0.3]},
                               [], list(scores), judge_calls=[(0.1, 0.4)], step_starts=[0.5, 1.6], judge_marks=list(marks))
    figures = {"trainer_wait_key": wait_key or "timing_s/gen", "trainer_wait_s": sum(gen) if wait is None else wait,
               "gen_s": sum(gen), "judge_server": judge, "dumps": dumps or {}}
    return demo.LaneRun(lane, timeline, figures)


@pytest.mark.quick
def test_the_table_has_a_row_per_lane_with_what_the_judge_and_the_trainer_saw():
    judge = {"requests_per_trained_sample": 1.3333, "throttled": 59}
    runs = {
        "zero_latency": _lane_run("zero_latency", gen=(0.4, 0.4), judge=None, dumps={"toy_final_true": 0.25}),
        "sync": _lane_run("sync", gen=(1.5, 1.9), judge={"requests_per_trained_sample": 1.03, "throttled": 0},
                          marks=[(0.3, "failed")], dumps={"failed_scored_zero": 0, "toy_final_true": 0.3}),
        "colocate_async": _lane_run("colocate_async", gen=(0.5, 0.1), judge=judge, marks=[(0.2, "429"), (0.3, "failed")],
                                    dumps={"failed_scored_zero": 51, "toy_final_true": 0.11}),
        "both": _lane_run("both", "both", wait_key="timing_s/reward_wait", wait=0.25, judge=judge, scores=(0.2, 0.4, 0.6, 0.8)),
    }
    rows = demo.table(runs)
    assert [row["lane"] for row in rows] == list(runs)
    assert set(rows[0]) >= {"loop_time_s", "reward_wait_exposed_s", "judge_requests_per_sample", "judge_429s",
                            "judge_failed_calls", "trained_failed_zero", "final_toy_reward", "reward_manager", "trainer_mode"}
    by = {row["lane"]: row for row in rows}
    assert by["zero_latency"]["loop_time_s"] == 2.6 and by["zero_latency"]["reward_wait_exposed_s"] == 0.0
    # the stock trainer's rewards wait inside its generation: its timer beyond the bound's
    assert by["sync"]["reward_wait_exposed_s"] == 2.6 and by["sync"]["reward_manager"] == "async_agent"
    # verl's wait for finished groups under the bound's generation: none of it on rewards (at least 0)
    assert by["colocate_async"]["reward_wait_exposed_s"] == 0.0 and by["colocate_async"]["reward_manager"] == "rate_limited"
    assert by["both"]["reward_wait_exposed_s"] == 0.25  # a wait on rewards alone is the figure
    assert (by["colocate_async"]["judge_429s"], by["colocate_async"]["judge_failed_calls"],
            by["colocate_async"]["trained_failed_zero"]) == (59, 1, 51)
    assert by["colocate_async"]["judge_requests_per_sample"] == 1.33 and by["zero_latency"]["judge_429s"] is None
    assert by["sync"]["final_toy_reward"] == 0.3  # the toy task's own score of the trained responses...
    assert by["both"]["final_toy_reward"] == 0.6  # ... else the judged reward of the last 3 steps
    # without the bound, a generation timer says nothing on rewards alone
    assert demo.table({"sync": runs["sync"]})[0]["reward_wait_exposed_s"] is None
    text = demo.markdown_table(rows)
    assert text.count("\n") == 2 + len(rows) and "| 429s |" in text and "`rate_limited` (8 reward-loop workers)" in text
    assert "| `colocate_async`: verl's colocate_async, verl's reward loop | colocate_async, `rate_limited`" in text


@pytest.mark.quick
def test_a_report_from_before_the_lanes_keeps_its_table():
    rows = [{"mode": "zero_latency", "loop_time_s": 7.05, "reduction_vs_baseline": 0.688, "hidden_fraction": None,
             "blocked_on_rewards_per_step_s": None, "final_toy_reward": 0.23},
            {"mode": "baseline", "loop_time_s": 22.6, "reduction_vs_baseline": 0.0, "hidden_fraction": None,
             "blocked_on_rewards_per_step_s": None, "final_toy_reward": 0.296}]
    text = demo.markdown_table(rows)
    assert "| zero latency (the bound) | 7.0 s | 69% | — | — | 0.230 |" in text
    assert "| baseline (stock trainer, rewards in verl's agent loop) | 22.6 s | — | — | — | 0.296 |" in text


@pytest.mark.quick
def test_the_bounds_step_is_checked_against_the_c_the_judge_was_made_of():
    runs = {"zero_latency": _lane_run("zero_latency")}
    runs["zero_latency"].timeline.step_times = [1.0, 1.2, 1.1]
    assert demo.pace_check(runs, 1.0) == {"compute_s": 1.0, "measured_step_s": 1.1, "ratio": 1.1, "off": False,
                                          "tolerance": 1.5}
    assert demo.pace_check(runs, 0.5)["off"] and demo.pace_check(runs, 1.6)["off"] is False
    assert demo.pace_check(runs, 2.5)["off"]
    assert demo.pace_check({"sync": _lane_run("sync")}, 1.0) is None


@pytest.mark.quick
def test_a_lanes_figures_come_from_its_metrics_its_judge_server_and_its_dumps(tmp_path):
    """The stock lane's wait is its generation timer; the judge server's window over the loop counts
    the 429s and requests per trained sample (its monotonic clock placed on the gate's Unix time)."""
    records = []
    now_mono, now_unix = time.monotonic(), time.time()
    loop_start = now_unix - 10.0  # the loop began 10 s ago and ran 2.6 s
    for offset, outcome in [(-1.0, "ok"), (0.5, "ok"), (0.6, "rate_limited"), (1.0, "500"), (2.0, "ok"), (5.0, "ok")]:
        at = now_mono - 10.0 + offset
        records.append(types.SimpleNamespace(arrived=at, outcome=outcome, finished=at + 0.1))
    server = types.SimpleNamespace(stats=lambda: types.SimpleNamespace(records=records), close=lambda: None)
    judge = {"server": {"bucket_capacity": 2, "bucket_refill_per_s": 1.0}}
    (tmp_path / "rollouts").mkdir()
    (tmp_path / "rollouts" / "1.jsonl").write_text(json.dumps({"output": "ab", "gts": "lower", "score": 0.0}) + "\n")
    started = types.SimpleNamespace(lane=demo.LANES["sync"], trainer=types.SimpleNamespace(cfg=types.SimpleNamespace(out_dir=str(tmp_path))),
                                    server=server, settings={"judge": judge})
    metrics = [{"step": s, "data": {"timing_s/gen": g, "timing_s/step": 1.0}} for s, g in ((1, 0.7), (2, 0.8))]
    result = types.SimpleNamespace(series=lambda key: [(m["step"], m["data"][key]) for m in metrics if key in m["data"]])
    timeline = _lane_run("sync").timeline
    figures = demo.lane_figures(started, result, timeline, loop_start, steps=2)
    assert (figures["trainer_wait_key"], figures["trainer_wait_s"]) == ("timing_s/gen", pytest.approx(1.5))
    window = figures["judge_server"]
    assert window["requests"] == 4 and window["throttled"] == 1 and window["requests_per_trained_sample"] == 4 / 64
    assert figures["dumps"]["rows"] == 1


# ---------------------------------------------------------------------------------------------- the timeline


@pytest.mark.quick
def test_the_timeline_marks_each_lanes_429s_and_failed_calls_where_they_ended(tmp_path, monkeypatch):
    import matplotlib.axes
    import matplotlib.figure

    sync = _lane_run("sync", marks=[(1.2, "failed")]).timeline
    verl = _lane_run("colocate_async", marks=[(0.4, "429"), (0.7, "429"), (1.9, "failed")]).timeline
    bound = _lane_run("zero_latency").timeline
    drawn, legends = [], []
    scatter = matplotlib.axes.Axes.scatter
    monkeypatch.setattr(matplotlib.axes.Axes, "scatter",
                        lambda self, x, y, **kw: drawn.append((list(x), [round(v) for v in y], kw["marker"])) or scatter(self, x, y, **kw))
    legend = matplotlib.figure.Figure.legend
    monkeypatch.setattr(matplotlib.figure.Figure, "legend", lambda self, h, labels, **kw: legends.append(labels) or legend(self, h, labels, **kw))
    demo.draw_timeline({"zero_latency": bound, "sync": sync, "colocate_async": verl}, tmp_path / "t.png")
    assert (tmp_path / "t.png").stat().st_size > 10_000
    # lanes are drawn bottom-up: colocate_async at 0, sync at 1; the bound has none
    assert ([0.4, 0.7], [0, 0], "v") in drawn and ([1.9], [0, 0][:1], "x") in drawn and ([1.2], [1], "x") in drawn
    assert len(drawn) == 3
    assert any(label.startswith("429") for label in legends[0]) and any(label.startswith("failed call") for label in legends[0])
    # a report's marks survive the JSON and --redraw
    report = {"runs": {"sync": {"step_times": sync.step_times, "phases": sync.phases, "blocked": [], "scores": sync.scores,
                                "judge_calls": [[0.1, 0.4]], "judge_marks": [[1.2, "failed"]]}}}
    assert demo.results_from_report(report)["sync"].judge_marks == [(1.2, "failed")]


@pytest.mark.quick
def test_lanes_with_verls_reward_loop_weigh_more_when_cutting_the_start_up_groups(monkeypatch):
    gib = 2**30
    monkeypatch.setattr(psutil, "virtual_memory", lambda: types.SimpleNamespace(total=24 * gib, available=22 * gib))
    lanes = [demo.LANES[name] for name in demo.DEFAULT_LANES]
    names = lambda groups: [[lane.name for lane in group] for group in groups]  # noqa: E731
    assert names(demo.startup_groups(lanes)) == [demo.DEFAULT_LANES]  # this project's machines: all four together
    # 8 GiB free of 10: room for 2 standard lanes, and one with 8 reward-loop workers is ~2.1 of them
    monkeypatch.setattr(psutil, "virtual_memory", lambda: types.SimpleNamespace(total=10 * gib, available=8 * gib))
    assert names(demo.startup_groups(lanes)) == [["zero_latency", "sync"], ["colocate_async"], ["recommended"]]
    assert names(demo.startup_groups(lanes, parallel_startups=3)) == [["zero_latency", "sync", "colocate_async"], ["recommended"]]
    assert demo.lane_weight(demo.LANES["colocate_async"]) > 2 and demo.lane_weight(demo.LANES["sync"]) == 1


@pytest.mark.quick
def test_sigterm_ends_the_demo_through_its_clean_up(monkeypatch, tmp_path):
    """A killed demo closes its lanes on the way out (a lane frozen at its gate outlived the demo's
    default SIGTERM death): main installs a handler that raises, so the lanes' finally blocks run."""
    import signal

    installed = {}
    monkeypatch.setattr(signal, "signal", lambda signum, handler: installed.setdefault(signum, handler))
    monkeypatch.setattr(demo, "run_demo", lambda *a, **kw: installed[signal.SIGTERM](signal.SIGTERM, None))
    with pytest.raises(SystemExit) as exc:
        demo.main(["--out", str(tmp_path)])
    assert exc.value.code == 128 + signal.SIGTERM


# ---------------------------------------------------------------------------------------------- the demo's promises


@pytest.mark.quick
def test_every_lane_runs_its_contestants_overrides_and_the_recommended_lane_is_a_contestant():
    """A lane is a contestant of contestants.py, not a look-alike: its overrides are the benchmark's
    shape, its mode's and its reward manager's, in that order, and nothing else; the recommended lane
    runs contestants.RECOMMENDED, one of the configurations the benchmark judges."""
    import bench.e2e as e2e
    from verl_async_rm_rig import contestants

    assert contestants.RECOMMENDED in contestants.MODES and contestants.RECOMMENDED in e2e.CANDIDATES
    assert demo.LANES["recommended"].mode == contestants.RECOMMENDED
    for lane in demo.LANES.values():
        regime = contestants.REGIMES[lane.regime]
        settings = demo.lane_settings(lane, 1.5, 0)
        assert settings["overrides"] == [*contestants.SHAPE, *contestants.MODES[lane.mode],
                                         *contestants.reward_loop_overrides(regime, lane.mode, 1.5)], lane.name
        assert settings["judge"] == regime.judge(1.5, 0)
        assert settings["reward_manager"] == contestants.reward_manager(lane.mode)
    # the recorded definitions say the same (demo.json's "lanes")
    defined = demo.lane_definitions(list(demo.LANES.values()), 1.5, 0)
    assert defined["recommended"]["mode"] == contestants.RECOMMENDED
    assert defined["colocate_async"]["overrides"] == demo.lane_settings(demo.LANES["colocate_async"], 1.5, 0)["overrides"]


@pytest.mark.quick
def test_the_table_shows_every_column_for_every_lane(capsys):
    runs = {name: _lane_run(name, judge=None if name == "zero_latency" else {"requests_per_trained_sample": 1.2, "throttled": 7},
                            marks=[] if name == "zero_latency" else [(0.3, "429"), (0.5, "failed")],
                            dumps={"failed_scored_zero": 2, "toy_final_true": 0.2})
            for name in demo.DEFAULT_LANES}
    rows = demo.table(runs)
    keys = [key for key, _, _ in demo.COLUMNS]
    assert all(set(keys) <= set(row) for row in rows)
    demo.print_table(rows)
    printed = capsys.readouterr().out.splitlines()
    assert len(printed) == 1 + len(rows)
    assert all(title in printed[0] for _, title, _ in demo.COLUMNS)
    for line, row in zip(printed[1:], rows):
        cells = [cell.strip() for cell in line.split(" | ")]
        assert len(cells) == len(keys)
        assert cells == ["-" if row[key] is None else str(row[key]) for key in keys]
    by = {row["lane"]: row for row in rows}
    assert (by["sync"]["judge_429s"], by["sync"]["judge_failed_calls"]) == (7, 1)
    assert by["zero_latency"]["judge_429s"] is None  # no judge server behind the bound: "-", not 0
    # the markdown table has as many cells in each row as in its header
    text = demo.markdown_table(rows).splitlines()
    assert len({line.count("|") for line in text}) == 1


@pytest.mark.quick
def test_the_timeline_marks_a_runs_429s_and_failed_calls_at_their_times():
    """The drawing data, pure: demo.json's run records with a 429 and a failure (as the judge log gave
    them) put each marker at the time its call ended, in its lane's row; a lane with none has none."""
    records = {
        "zero_latency": {"step_times": [1.0], "phases": {}, "blocked": [], "scores": [0.1]},
        "sync": {"step_times": [1.0], "phases": {}, "blocked": [], "scores": [0.1],
                 "judge_calls": [[0.1, 0.4], [0.2, 1.7]], "judge_marks": [[1.7, "failed"]]},
        "colocate_async": {"step_times": [1.0], "phases": {}, "blocked": [], "scores": [0.1],
                           "judge_calls": [[0.1, 0.25], [0.2, 0.9]], "judge_marks": [[0.25, "429"], [0.9, "failed"], [1.4, "429"]]},
    }
    marks = demo.timeline_marks(demo.results_from_report({"runs": records}))
    # rows bottom-up: the first lane (the bound) on top, row 2
    assert sorted(marks) == [("429", [0.25, 1.4], 0), ("failed", [0.9], 0), ("failed", [1.7], 1)]
    assert demo.timeline_marks(demo.results_from_report({"runs": {"zero_latency": records["zero_latency"]}})) == []


@pytest.mark.quick
def test_the_judge_logs_429_and_failure_reach_the_timeline_at_their_times(tmp_path):
    log = tmp_path / "judge_calls.jsonl"
    log.write_text("\n".join(json.dumps(c) for c in [
        {"start": 100.2, "end": 100.3, "outcome": "429"},
        {"start": 100.3, "end": 101.1, "outcome": "ok"},
        {"start": 100.5, "end": 102.75, "outcome": "500"},
    ]) + "\n")
    calls = demo.read_judge_log(log, loop_start=100.0)
    timeline = demo.ModeResult("sync", [3.0], {}, [], [0.1], judge_calls=[(a, b) for a, b, _ in calls],
                               judge_marks=demo.judge_marks(calls))
    marks = {kind: [round(t, 3) for t in ends] for kind, ends, _ in demo.timeline_marks({"sync": timeline})}
    assert marks == {"429": [0.3], "failed": [2.75]}


@pytest.mark.quick
def test_redraw_draws_a_saved_demo_json_with_its_marks(tmp_path, monkeypatch):
    """What run_demo writes for its runs is what --redraw draws: steps, judge calls and marks survive the JSON."""
    runs = {"sync": _lane_run("sync", marks=[(0.3, "429"), (1.25, "failed")]), "zero_latency": _lane_run("zero_latency")}
    (tmp_path / "demo.json").write_text(json.dumps({"runs": demo.run_records(runs)}))
    drawn = []
    monkeypatch.setattr(demo, "draw_timeline", lambda results, path: drawn.append((results, path)))
    assert demo.main(["--redraw", str(tmp_path / "demo.json")]) == 0
    (results, path), = drawn
    assert path == tmp_path / "timeline.png" and list(results) == ["sync", "zero_latency"]
    assert results["sync"].judge_marks == [(0.3, "429"), (1.25, "failed")]
    assert results["sync"].judge_calls == runs["sync"].timeline.judge_calls
    assert results["sync"].step_starts == runs["sync"].timeline.step_starts
    assert demo.timeline_marks(results) == demo.timeline_marks({n: r.timeline for n, r in runs.items()})


@pytest.mark.quick
def test_help_names_the_lanes_the_judge_and_the_options(capsys):
    with pytest.raises(SystemExit) as exc:
        demo.main(["--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    for said in (*demo.DEFAULT_LANES, "judge_real", "colocate_async", "rate_limited", "async_agent", "429",
                 "--steps", "--lanes", "--compute", "--redraw", "--out", "--quiet", "--parallel-startups"):
        assert said in out, said


@pytest.mark.quick
def test_the_json_records_the_command_as_typed(tmp_path, monkeypatch):
    """`python -m verl_async_rm_rig demo --steps 2` records that, not `... demo demo --steps 2`."""
    seen = {}
    monkeypatch.setattr(demo, "run_demo", lambda *a, **kw: seen.update(kw) or (_ for _ in ()).throw(SystemExit(9)))
    monkeypatch.setattr(demo.signal, "signal", lambda *a: None)
    monkeypatch.setattr(demo.sys, "argv", ["verl_async_rm_rig/__main__.py", "demo", "--steps", "2", "--out", str(tmp_path)])
    from verl_async_rm_rig.__main__ import main as rig_main

    with pytest.raises(SystemExit):
        rig_main()
    assert seen["command"] == f"python -m verl_async_rm_rig demo --steps 2 --out {tmp_path}"
