"""bench/pool_e2e.py: goals over the union of several benchmark runs of one tree, pairs never
formed across two runs, mismatched runs refused, every run's own figure beside the pooled one."""

from __future__ import annotations

import json

import pytest

import bench.pool_e2e as pool_e2e
from bench.e2e import analyse
from tests.benchmarks.test_e2e_report import rec

pytestmark = pytest.mark.quick



def report(records, fingerprint="abc", steps=4, compute=None):
    return {"source_fingerprint": fingerprint, "steps": steps, "regime_compute_s": compute or {"v1": 0.8},
            "command": "python bench/e2e.py ...", "seeds_run": {"v1": sorted({r["seed"] for r in records})},
            "records": records}


def tail_1x_seed(seed, both_tail, bound=10.0, base=30.0):
    """One seed's runs for the tail_1x goal: hidden = (base - both_tail) / (base - bound)."""
    return [rec("v1", seed, "zero", "baseline", 12.0), rec("v1", seed, "zero", "both", bound),
            rec("v1", seed, "tail_1x", "baseline", base), rec("v1", seed, "tail_1x", "both", both_tail)]


def goal(report_, start):
    return next(g for g in report_["goals"] if g["trainer"] == "v1" and g["goal"].startswith(start))


def test_the_pooled_goal_is_the_median_over_every_runs_pairs_with_each_runs_own_figure_beside_it():
    # run a: hidden 95%, 95%, 50% (median 95%: PASS); run b: 50%, 50% (FAIL): union of 5 -> 50%: FAIL
    a = report(tail_1x_seed(0, 11.0) + tail_1x_seed(1, 11.0) + tail_1x_seed(2, 20.0))
    b = report(tail_1x_seed(0, 20.0) + tail_1x_seed(1, 20.0))
    pooled = pool_e2e.pool({"a": a, "b": b})
    both = goal(pooled, "both hides")
    assert both["figure"]["n"] == 5 and both["figure"]["median"] == pytest.approx(0.5)
    assert both["pass"] is False
    assert both["per_run"]["a"] == {"figure": "95%", "pass": True} and both["per_run"]["b"] == {"figure": "50%", "pass": False}
    # the same seed numbers in two runs are two pairs, not one record overwriting the other
    row = next(r for r in pooled["timing"] if (r["regime"], r["mode"]) == ("tail_1x", "both"))
    assert row["hidden_vs_same_mode_bound"]["n"] == 5 and row["reduction_vs_baseline"]["n"] == 5
    table = pool_e2e.markdown(pooled)
    assert "| v1 | both hides" in table and "a: 95% ✓; b: 50% ✗" in table and "| 5 |" in table


def test_a_pair_is_never_formed_across_two_runs():
    # run a has seed 0's stock run in tail_1x but not its `both` run; run b the other way round
    a = report([r for r in tail_1x_seed(0, 11.0) if (r["regime"], r["mode"]) != ("tail_1x", "both")])
    b = report([r for r in tail_1x_seed(0, 11.0) if (r["regime"], r["mode"]) != ("tail_1x", "baseline")])
    pooled = pool_e2e.pool({"a": a, "b": b})
    assert goal(pooled, "both hides")["pass"] is None  # no pair: not measured, never a pass
    # whereas one run holding all four makes the pair
    assert goal(analyse(a["records"] + [r for r in b["records"] if r["regime"] == "tail_1x"]), "both hides")["pass"] is True


@pytest.mark.parametrize("other, what", [(dict(fingerprint="abd"), "source_fingerprint"), (dict(steps=5), "steps"),
                                         (dict(compute={"v1": 0.9}), "C=0.9")])
def test_runs_of_another_tree_step_count_or_compute_are_refused(other, what):
    with pytest.raises(ValueError, match=what):
        pool_e2e.pool({"a": report(tail_1x_seed(0, 11.0)), "b": report(tail_1x_seed(0, 11.0), **other)})
    with pytest.raises(ValueError, match="at least two"):
        pool_e2e.pool({"a": report(tail_1x_seed(0, 11.0))})


def test_main_writes_the_pooled_report_and_names_each_run(tmp_path, capsys):
    paths = []
    for name, both_tail in (("first", 11.0), ("second", 10.5)):
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(report(tail_1x_seed(0, both_tail) + tail_1x_seed(1, both_tail))))
        paths.append(str(path))
    out = tmp_path / "pooled.json"
    assert pool_e2e.main([*paths, "--out", str(out)]) == 0
    written = json.loads(out.read_text())
    assert [r["name"] for r in written["pooled_from"]] == ["first", "second"]
    assert written["command"].startswith("python bench/pool_e2e.py")
    assert "never across two" in written["rule"]
    assert goal(written, "both hides")["figure"]["n"] == 4 and goal(written, "both hides")["pass"] is True
    assert "| v1 | both hides" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        pool_e2e.main([paths[0], paths[0]])  # the same report twice is not two runs
