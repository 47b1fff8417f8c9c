"""The result tables and the end-to-end timeline, from the committed JSON in bench/results/.

    python bench/result_tables.py    # print every table; redraw bench/results/e2e_timeline.png

docs/results.md quotes these tables (bench/results_page.py writes it, and its test holds it equal to what this
module makes from the committed JSON today).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.agent_throughput import markdown as agent_markdown  # noqa: E402
from bench.backpressure import markdown as backpressure_markdown  # noqa: E402
from bench.e2e import (  # noqa: E402
    AGENT_COLOCATE,
    RECOMMENDED,
    STOCK,
    VERL_COLOCATE,
    VERL_MODES,
    admission_goals,
    admission_table,
    anchor_goals,
    goals,
    timing_table,
)
from bench.e2e import markdown as e2e_markdown  # noqa: E402
from bench.fault_suite import markdown as fault_markdown  # noqa: E402
from bench.pool_e2e import markdown as pooled_markdown  # noqa: E402
from bench.pool_e2e import pool  # noqa: E402
from verl_async_rm_rig.demo import ModeResult, draw_timeline  # noqa: E402
from verl_async_rm_rig.demo import markdown_table as demo_markdown  # noqa: E402

RESULTS = ROOT / "bench" / "results"
E2E_TIMELINE = RESULTS / "e2e_timeline.png"
# The goals of the earlier benchmark against verl's sync trainer, over every run of one tree (bench/pool_e2e.py):
# e2e.json and the focused reruns of single cells it names (e2e_tail_1x.json, e2e_pairs.json, ...).
E2E_POOLED = RESULTS / "e2e_pooled.json"
# The benchmark against verl's own asynchronous trainer (bench/e2e.py --anchor): the timeline's source when present.
E2E_ANCHOR = RESULTS / "e2e_anchor.json"


TIMELINE_REGIMES = ("judge_real", "heavy_2.5x", "tail_2.5x", "tail_1x")  # the first present is drawn
TIMELINE_MODES = (STOCK, "both", "tail_auto", "tail", "tail_drop", VERL_COLOCATE, AGENT_COLOCATE)


def tables() -> dict[str, str]:
    return {
        "demo": demo_markdown(json.loads((RESULTS / "demo" / "demo.json").read_text())["table"]),
        "e2e": e2e_markdown(e2e_report(RESULTS / "e2e.json")),
        "agent": agent_markdown(json.loads((RESULTS / "agent_throughput.json").read_text())),
        "backpressure": backpressure_markdown(json.loads((RESULTS / "backpressure.json").read_text())),
        "fault_suite": fault_markdown(json.loads((RESULTS / "fault_suite.json").read_text())),
        **({"e2e_pooled": pooled_markdown(pooled_report(E2E_POOLED))} if E2E_POOLED.exists() else {}),
    }


def pooled_report(path: Path) -> dict:
    """The pooled goals, pooled again from the committed reports it names (so the page always follows
    those reports, never a stale copy)."""
    names = [source["name"] for source in json.loads(path.read_text())["pooled_from"]]
    return pool({name: json.loads((path.parent / f"{name}.json").read_text()) for name in names})


def e2e_report(path: Path) -> dict:
    """An e2e report with its timing table and goals derived again from its per-run records, so a
    figure added to bench/e2e.py since the run (e.g. the middle-steps column) is shown for it too."""
    report = json.loads(path.read_text())
    report["timing"] = timing_table(report["records"])
    report["goals"] = goals(report["timing"], report["learning"], report["comparisons"])
    if report.get("recommended") and any(r["mode"] in VERL_MODES for r in report["records"]):  # as bench/e2e.py
        report["goals"] += anchor_goals(report["records"], report["recommended"])  # issue 43's (bench/e2e.py --anchor)
    if "admission" in report:  # issue 46's A/B (bench/e2e.py --admission-ab)
        report["admission"] = admission_table(report["records"])
        report["goals"] += admission_goals(report["admission"], report.get("recommended") or RECOMMENDED)
    return report


def timeline_runs(report: dict) -> tuple[str, dict[str, ModeResult]]:
    """The lanes of the e2e timeline: one seed of the headline trainer in its longest-tailed regime
    (stock with an instant judge, stock, the strategies), rebuilt from the JSON's per-step records."""
    records = report["records"]
    trainer = "v1" if any(r["trainer"] == "v1" for r in records) else records[0]["trainer"]
    regime = next(g for g in (*TIMELINE_REGIMES, None) if g is None or any(r["regime"] == g for r in records))

    def lanes_of(seed):
        # the instant-judge lane: the bound that trained in the drawn regime's group (older reports: the seed's only one)
        mine = {(r["regime"], r["mode"]): r for r in records if r["trainer"] == trainer and r["seed"] == seed
                and (r["regime"] != "zero" or (r.get("group") or "") in ("", regime))}
        return {f"{STOCK}, instant judge": mine.get(("zero", STOCK)), **{m: mine.get((regime, m)) for m in TIMELINE_MODES}}

    def completeness(seed):  # the seed with the most lanes, then the most lanes with judge calls, then the lowest
        lanes = [r for r in lanes_of(seed).values() if r is not None]
        return (len(lanes), sum(bool(r.get("judge_calls")) for r in lanes), -seed)

    seed = max(sorted({r["seed"] for r in records if r["trainer"] == trainer}), key=completeness)
    lanes = lanes_of(seed)
    results = {name: ModeResult(r["mode"], r["step_times"], r["phases"], r["blocked"] or [], r["scores"],
                                judge_calls=[tuple(c) for c in r.get("judge_calls") or []],
                                step_starts=r.get("step_starts") or [])
               for name, r in lanes.items() if r is not None}
    return f"{trainer}, seed {seed}, {regime}", results


def draw_e2e_timeline(path: Path = E2E_TIMELINE) -> str:
    source = E2E_ANCHOR if E2E_ANCHOR.exists() else RESULTS / "e2e.json"
    title, results = timeline_runs(json.loads(source.read_text()))
    draw_timeline(results, path)
    return title


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args(argv)
    for name, text in tables().items():
        print(f"<!-- {name} -->\n{text}")
    print(f"timeline ({draw_e2e_timeline()}): {E2E_TIMELINE.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
