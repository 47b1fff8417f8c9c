"""bench/e2e.py's pure parts: the run plan and the tables (paired within a seed), on synthetic records."""

from __future__ import annotations

import pytest

import json

from bench.e2e import learning_table, plan_runs, targets, timing_table
from verl_async_rm.demo import ModeResult

pytestmark = pytest.mark.quick

MODES = ["zero_latency", "baseline", "pipeline", "off_policy", "both"]


def test_plan_runs_each_combination_once_and_zero_latency_once_per_seed():
    runs = plan_runs([0, 1], [0.5, 2.0], MODES)
    assert len(runs) == len(set(runs)) == 2 * (1 + 2 * 4)
    assert sorted(r for r in runs if r[2] == "zero_latency") == [(0, None, "zero_latency"), (1, None, "zero_latency")]
    assert [r[0] for r in runs] == [0] * 9 + [1] * 9  # seed by seed, so a partial run is usable
    assert runs == plan_runs([0, 1], [0.5, 2.0], MODES)  # the shuffle is seeded


def record(seed, hi, mode, loop, final=0.4, blocked=0.0):
    return {"seed": seed, "latency_hi_s": hi, "mode": mode, "loop_time_s": loop, "blocked_per_step_s": blocked,
            "final_reward": final, "first_reward": 0.25, "result": {"step_times": [loop / 4] * 4}}


def synthetic():
    records = []
    for seed, zero, base in [(0, 10.0, 30.0), (1, 12.0, 28.0), (2, 11.0, 31.0)]:
        records.append(record(seed, None, "zero_latency", zero))
        records.append(record(seed, 2.0, "baseline", base, final=0.40 + 0.01 * seed))
        # hides 90% of the seed's reward wait, learns 0.02 less than its baseline
        records.append(record(seed, 2.0, "both", base - 0.9 * (base - zero), final=0.38 + 0.01 * seed, blocked=0.1))
    return records


def test_timing_table_pairs_ratios_within_a_seed():
    rows = {row["mode"]: row for row in timing_table(synthetic(), [2.0])}
    assert rows["both"]["hidden_fraction"] == {"median": 0.9, "min": 0.9, "max": 0.9, "n": 3}
    reductions = [0.9 * (30 - 10) / 30, 0.9 * (28 - 12) / 28, 0.9 * (31 - 11) / 31]
    assert rows["both"]["reduction_vs_baseline"]["median"] == pytest.approx(sorted(reductions)[1], abs=1e-3)
    assert rows["baseline"]["reduction_vs_baseline"] is None and rows["baseline"]["hidden_fraction"] is None
    assert rows["zero_latency"]["loop_time_s"] == {"median": 11.0, "min": 10.0, "max": 12.0, "n": 3}


def test_learning_table_flags_a_consistent_loss_as_worse_beyond_noise():
    rows = {row["mode"]: row for row in learning_table(synthetic())}
    diff = rows["both"]["final_minus_baseline"]
    assert diff["mean"] == pytest.approx(-0.02) and diff["n"] == 3
    assert rows["both"]["worse_beyond_noise"]  # -0.02 every time: the interval is below 0
    noisy = synthetic()
    for rec, delta in zip([r for r in noisy if r["mode"] == "both"], [-0.05, +0.04, +0.01]):
        rec["final_reward"] = 0.40 + 0.01 * rec["seed"] + delta
    assert learning_table(noisy)[2]["worse_beyond_noise"] is False


def test_targets_apply_to_the_regimes_they_name():
    rows = timing_table(synthetic(), [2.0])
    assert targets(rows, compute=1.0, highs=[2.0]) == {"reduction>=40% at hi=2s (both)": True}
    assert targets(rows, compute=2.0, highs=[2.0]) == {"hidden>=0.9 at hi=2s (both)": True}


def test_readme_quotes_the_committed_result_tables():
    from bench.readme_tables import tables
    from tests.conftest import ROOT

    readme = (ROOT / "README.md").read_text()
    for name, text in tables().items():
        assert text in readme, f"README's {name} table is not the committed JSON's: run python bench/readme_tables.py"


def test_the_script_plans_caches_and_reports(tmp_path, monkeypatch):
    """main() end to end with the trainer run replaced (the demo's test runs the real one through
    the same run_mode): every planned run once, then all of them from the cache."""
    import bench.e2e as e2e
    import verl_async_rm.cpu_backend.launch as launch

    calls = []

    def fake_run_mode(out, assets, mode, steps, seed, latency, progress):
        calls.append((mode, seed, latency))
        step = 0.8 + (0.0 if mode in ("zero_latency", "off_policy", "both") else latency[1])
        return ModeResult(mode, [step] * steps, {"gen": [0.3] * steps}, [0.01] * steps, [0.25 + 0.01 * i for i in range(steps)])

    monkeypatch.setattr(e2e, "run_mode", fake_run_mode)
    monkeypatch.setattr(launch, "prepare_assets", lambda cfg: cfg)
    out = tmp_path / "e2e.json"
    argv = ["--steps", "4", "--seeds", "0,1", "--latency-hi", "0.5,1.6", "--modes", "zero_latency,baseline,both,both_k2@1.6",
            "--out", str(out)]
    assert e2e.main(argv) == 0
    assert len(calls) == 2 * (1 + 2 * 2 + 1)
    assert ("both_k2", 0, (0.04, 1.6)) in calls and not any(c[0] == "both_k2" and c[2][1] == 0.5 for c in calls)
    first = json.loads(out.read_text())
    assert first["runs_from_cache"] == 0 and first["compute_per_step_s"] == 0.8
    hidden = {(r["latency_hi_s"], r["mode"]): r["hidden_fraction"] for r in first["timing"]}
    assert hidden[1.6, "both"]["median"] == 1.0  # the fake hides the whole wait
    calls.clear()
    assert e2e.main(argv) == 0
    again = json.loads(out.read_text())
    assert calls == [] and again["runs_from_cache"] == len(plan_runs([0, 1], [0.5, 1.6], {"zero_latency": None, "baseline": None, "both": None, "both_k2": {1.6}})) == 12, again["runs_from_cache"]
    assert again["timing"] == first["timing"]
