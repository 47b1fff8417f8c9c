"""bench/step_costs.py on synthetic run folders: the right runs are paired, per step, per timer."""

from __future__ import annotations

import json

import pytest

from bench.step_costs import describe, pace_pairs, paired_costs, run_metrics

pytestmark = pytest.mark.quick


def write_run(work, name, waits):
    run = work / name
    run.mkdir()
    rows = [{"step": 0, "data": {"val-core/x": 1.0}}]
    rows += [{"step": i + 1, "data": {"timing_s/reward_wait": w, "timing_s/adv": 0.02}} for i, w in enumerate(waits)]
    (run / "metrics-0.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")


def test_costs_pair_each_seed_with_the_same_modes_instant_run(tmp_path):
    for seed, extra in ((0, 0.1), (1, 0.3), (2, 0.2)):
        write_run(tmp_path, f"v1_steps2_seed{seed}_tail_1x_both_{'a' * 10}", [extra, 2 * extra])
        write_run(tmp_path, f"v1_steps2_seed{seed}_zero_both_{'b' * 10}", [0.0, 0.0])
        # another mode whose name starts alike must not be picked up
        write_run(tmp_path, f"v1_steps2_seed{seed}_tail_1x_both_serial_{'c' * 10}", [9.0, 9.0])
    costs = paired_costs(tmp_path, "v1", "both", "tail_1x", [0, 1, 2])
    assert costs["timing_s/reward_wait"] == pytest.approx([0.2, 0.4])  # medians over seeds, per step
    assert costs["timing_s/adv"] == pytest.approx([0.0, 0.0])


def test_metrics_are_listed_per_seed_from_that_seeds_run_only(tmp_path):
    for seed, due in ((0, [0.5, None, 0.25]), (1, [0.0, 0.0, 0.0])):
        run = tmp_path / f"v1_steps3_seed{seed}_heavy_2.5x_tail_{'a' * 10}"
        run.mkdir()
        rows = [{"step": 0, "data": {"async_rm/pool_wait_due_s": 99.0}}]  # validation: not a training step
        rows += [{"step": i + 1, "data": {} if d is None else {"async_rm/pool_wait_due_s": d, "async_rm/groups_dropped_stale": i}}
                 for i, d in enumerate(due)]
        (run / "metrics-0.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    write_run(tmp_path, f"v1_steps3_seed0_heavy_2.5x_tail_drop_{'b' * 10}", [9.0, 9.0, 9.0])  # another mode
    got = run_metrics(tmp_path, "v1", "tail", "heavy_2.5x", [0, 1], ["async_rm/pool_wait_due_s", "async_rm/groups_dropped_stale", "nope"])
    assert got["async_rm/pool_wait_due_s"] == {0: [0.5, None, 0.25], 1: [0.0, 0.0, 0.0]}
    assert describe(got["async_rm/pool_wait_due_s"][0]).startswith("sum 0.750, step 1 0.5, last 0.25")
    assert describe(got["async_rm/groups_dropped_stale"][0]).startswith("sum 2.000, step 1 0, last 2")  # a counter: read "last"
    assert describe(got["nope"][1]) == "not recorded"
    with pytest.raises(SystemExit, match="no run of v1 seed 2"):
        run_metrics(tmp_path, "v1", "tail", "heavy_2.5x", [2], ["async_rm/pool_wait_due_s"])


def test_pace_pairs_each_seeds_mode_run_with_its_stock_run_in_the_same_regime():
    def record(seed, regime, mode, loop, probe):
        return {"trainer": "v1", "seed": seed, "regime": regime, "mode": mode, "loop_time_s": loop,
                "same_work_s": None if probe is None else [probe, probe, 9.0 * probe]}
    report = {"records": [record(0, "zero", "baseline", 10.0, 0.1), record(0, "zero", "tail_auto", 12.0, 0.2),
                          record(0, "tail_1x", "baseline", 20.0, 0.5),  # another regime's stock run: not the pair
                          record(1, "zero", "baseline", 10.0, None), record(1, "zero", "tail_auto", 9.0, 0.1),
                          record(2, "zero", "tail_auto", 9.0, 0.1)]}  # no stock run: no row
    rows = pace_pairs(report, "v1", "tail_auto", "zero")
    assert [r["seed"] for r in rows] == [0, 1]
    assert rows[0]["reduction"] == pytest.approx(-0.2) and rows[0]["probe_ratio"] == pytest.approx(2.0)  # medians
    assert rows[1]["reduction"] == pytest.approx(0.1) and rows[1]["probe_ratio"] is None


def test_pace_splits_the_hidden_fraction_into_exposed_and_blocked_time_where_the_instant_run_is_there():
    def record(seed, regime, mode, loop, blocked=None):
        return {"trainer": "v1", "seed": seed, "regime": regime, "mode": mode, "loop_time_s": loop,
                "same_work_s": [0.1], "blocked": blocked}
    report = {"records": [record(0, "zero", "baseline", 12.0), record(0, "zero", "both", 10.0), record(0, "tail_1x", "baseline", 20.0),
                          record(0, "tail_1x", "both", 11.0, blocked=[0.1, 0.0, 0.2]),
                          record(1, "tail_1x", "baseline", 20.0), record(1, "tail_1x", "both", 9.0),  # no instant run
                          record(2, "zero", "both", 10.0), record(2, "tail_1x", "baseline", 19.0),
                          record(2, "tail_1x", "both", 9.5, blocked=[])]}  # faster than its instant run
    rows = {r["seed"]: r for r in pace_pairs(report, "v1", "both", "tail_1x")}
    assert rows[0]["wait_s"] == pytest.approx(10.0) and rows[0]["exposed_s"] == pytest.approx(1.0)
    assert rows[0]["blocked_s"] == pytest.approx(0.3) and rows[0]["hidden"] == pytest.approx(0.9)
    assert "hidden" not in rows[1]
    assert rows[2]["exposed_s"] == pytest.approx(-0.5) and rows[2]["hidden"] > 1 and rows[2]["blocked_s"] is None
    # at zero latency there is no wait to split
    zero = pace_pairs(report, "v1", "both", "zero")
    assert [r["seed"] for r in zero] == [0] and "hidden" not in zero[0]


def test_a_regimes_costs_pair_with_the_bound_that_trained_in_its_group(tmp_path):
    """bench/e2e.py trains a bound per regime, in that regime's start-up group (and a calibration run):
    a regime's costs and pace pairs take that one, never another group's."""
    (tmp_path / "records").mkdir()
    for seed in (0, 1):
        write_run(tmp_path, f"v1_steps2_seed{seed}_tail_1x_both_{'a' * 10}", [0.3, 0.3])
        for group, wait, digest in (("tail_1x", 0.1, "b"), ("heavy_2.5x", 9.0, "c")):
            name = f"v1_steps2_seed{seed}_zero_both_{digest * 10}"
            write_run(tmp_path, name, [wait, wait])
            (tmp_path / "records" / f"{name}.json").write_text(json.dumps({"group": group}))
    costs = paired_costs(tmp_path, "v1", "both", "tail_1x", [0, 1])
    assert costs["timing_s/reward_wait"] == pytest.approx([0.2, 0.2])

    def record(regime, mode, loop, group=""):
        return {"trainer": "v1", "seed": 0, "regime": regime, "mode": mode, "loop_time_s": loop, "group": group,
                "same_work_s": [0.1], "blocked": [0.0]}
    report = {"records": [record("tail_1x", "baseline", 30.0), record("tail_1x", "both", 12.0),
                          record("zero", "both", 10.0, "tail_1x"), record("zero", "both", 5.0, "heavy_2.5x"),
                          record("zero", "baseline", 1.0, "calibration")]}
    (row,) = pace_pairs(report, "v1", "both", "tail_1x")
    assert row["hidden"] == pytest.approx((30 - 12) / (30 - 10))
