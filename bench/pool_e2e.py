"""The done-when goals judged on the union of several end-to-end benchmark runs of one package tree.

    python bench/pool_e2e.py bench/results/e2e.json bench/results/e2e_tail_1x.json \
        bench/results/e2e_heavy.json bench/results/e2e_zero.json bench/results/e2e_pairs.json \
        --out bench/results/e2e_pooled.json

The rule (decided before the runs it was first applied to, see the README): a goal measured by more
than one run of the benchmark on the same package tree is judged on the union of the paired seeds of
all those runs. Each pair (a mode's run, the same seed's stock run, the same mode's zero-latency
bound) is formed within one run, never across two, so each ratio still compares runs that trained
side by side on one machine at one time; the figure is the median with min-max over the union, and
every run's own figure is printed beside it. Runs of another package tree, steps or C are refused,
and no run given is left out, whatever it reads.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.e2e import analyse, goal_figure, verdict_text  # noqa: E402

RESULTS = ROOT / "bench" / "results"
# What must agree for runs to measure the same thing; C (the judge's latencies are made of it) is
# checked per trainer in pool(), as a report holds one C per trainer it ran.
SAME = ("source_fingerprint", "steps")


def pool(reports: dict[str, dict]) -> dict:
    """``reports``: name -> an e2e report. The pooled tables and goals, each goal with every run's
    own figure and verdict beside it (None where that run did not measure it)."""
    if len(reports) < 2:
        raise ValueError("pooling needs at least two benchmark runs")
    first_name, first = next(iter(reports.items()))
    compute: dict[str, float] = {}
    for name, report in reports.items():
        for key in SAME:
            if report[key] != first[key]:
                raise ValueError(f"{name} has {key}={report[key]!r}, {first_name} {first[key]!r}: "
                                 "only runs of one package tree and one step count are pooled")
        for trainer, c in report["regime_compute_s"].items():
            if compute.setdefault(trainer, c) != c:
                raise ValueError(f"{name} ran {trainer} with C={c} s, another run with {compute[trainer]} s: "
                                 "the judges' latencies differ, so their pairs do not measure one thing")
    records = [{**r, "benchmark_run": name} for name, report in reports.items() for r in report["records"]]
    recommended = next((r["recommended"] for r in reports.values() if r.get("recommended")), None)
    pooled = analyse(records, recommended)
    own = {name: analyse(report["records"], recommended)["goals"] for name, report in reports.items()}
    for goal in pooled["goals"]:
        goal["per_run"] = {}
        for name, goals in own.items():
            match = next((g for g in goals if (g["trainer"], g["goal"]) == (goal["trainer"], goal["goal"])), None)
            goal["per_run"][name] = None if match is None or match["pass"] is None else \
                {"figure": _short(match), "pass": match["pass"]}
    return {
        "command": None, "rule": __doc__.split("\n\n", 2)[2].strip(),
        "source_fingerprint": first["source_fingerprint"], "steps": first["steps"], "regime_compute_s": compute,
        "pooled_from": [{"name": name, "command": report["command"], "runs": len(report["records"]),
                         "seeds_run": report["seeds_run"]} for name, report in reports.items()],
        **pooled,
    }


def _short(goal: dict) -> str:
    """A goal's figure in a few characters: the median for fractions, the mean for intervals."""
    figure = goal["figure"]
    if "count" in figure:
        return str(figure["count"])
    if "median" in figure:
        return f"{figure['median']:+.0%}" if "regime" in figure else f"{figure['median']:.0%}"
    if "mean" in figure:
        return f"{figure['mean']:+.3f}"
    worst = min((v for v in figure.values() if v), key=lambda v: v["high"], default=None)
    return "—" if worst is None else f"lowest upper bound {worst['high']:+.3f}"


def markdown(report: dict) -> str:
    """The README's pooled goals table."""
    runs = ", ".join(f"`{r['name']}` ({r['runs']} runs)" for r in report["pooled_from"])
    lines = [f"Pooled from {runs}; pairs formed within a run, medians [min, max] over the union.", "",
             "| trainer | goal | pooled figure | pairs | each run (median) | result |", "|---|---|---|---|---|---|"]
    for goal in report["goals"]:
        each = "; ".join(f"{name}: {v['figure']} {'✓' if v['pass'] else '✗'}"
                         for name, v in goal["per_run"].items() if v) or "—"
        lines.append(f"| {goal['trainer']} | {goal['goal']} | {goal_figure(goal)} | {_pairs(goal)} | {each} "
                     f"| {verdict_text(goal, markdown=True)} |")
    return "\n".join(lines) + "\n"


def _pairs(goal: dict) -> str:
    figure = goal["figure"]
    if not figure:
        return "—"
    if "n" in figure:
        return str(figure["n"])
    if "count" in figure:
        return f"{figure['runs']} runs"
    return ", ".join(str(v["n"]) for v in figure.values() if v) or "—"


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("reports", nargs="+", help="e2e reports (JSON) of one package tree")
    parser.add_argument("--out", default=str(RESULTS / "e2e_pooled.json"))
    args = parser.parse_args(argv)
    paths = [Path(p) for p in args.reports]
    names = [p.stem for p in paths]
    if len(set(names)) != len(names):
        parser.error(f"two reports share a name: {names}")
    try:
        report = pool({name: json.loads(path.read_text()) for name, path in zip(names, paths)})
    except (ValueError, OSError, KeyError) as error:
        parser.error(str(error))
    report["command"] = " ".join(["python bench/pool_e2e.py", *(argv if argv is not None else sys.argv[1:])])
    print(markdown(report))
    Path(args.out).write_text(json.dumps(report, indent=2))
    print(f"results: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
