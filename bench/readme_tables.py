"""The README's result tables and the end-to-end timeline, from the committed JSON in bench/results/.

    python bench/readme_tables.py                 # print every table; redraw bench/results/e2e_timeline.png
    python bench/readme_tables.py --write-readme  # the same, and replace the e2e blocks in README.md

tests/benchmarks/test_e2e_report.py checks that the README quotes every table verbatim, so a regenerated result
whose tables were not pasted (or written) fails the quick loop.
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
from bench.e2e import AGENT_COLOCATE, STOCK, VERL_COLOCATE, anchor_goals, goals, timing_table  # noqa: E402
from bench.e2e import markdown as e2e_markdown  # noqa: E402
from bench.fault_suite import markdown as fault_markdown  # noqa: E402
from bench.pool_e2e import markdown as pooled_markdown  # noqa: E402
from bench.pool_e2e import pool  # noqa: E402
from verl_async_rm_rig.demo import ModeResult, draw_timeline  # noqa: E402
from verl_async_rm_rig.demo import markdown_table as demo_markdown  # noqa: E402

RESULTS = ROOT / "bench" / "results"
README = ROOT / "README.md"
E2E_TIMELINE = RESULTS / "e2e_timeline.png"
# The e2e block of README.md lies between these two lines (both kept by --write-readme).
E2E_BEGIN = "<!-- e2e tables: python bench/readme_tables.py --write-readme -->"
E2E_END = "<!-- /e2e tables -->"
# Focused reruns of one goal's cells (each command is in its JSON and the README), each with its own
# README block: name -> the JSON; its block lies between "<!-- e2e NAME tables: ... -->" and
# "<!-- /e2e NAME tables -->".
E2E_FOCUSED = {"tail_1x": RESULTS / "e2e_tail_1x.json", "heavy_2.5x": RESULTS / "e2e_heavy.json",
               "zero": RESULTS / "e2e_zero.json", "pairs": RESULTS / "e2e_pairs.json",
               "pairs2": RESULTS / "e2e_pairs2.json"}
# The goals over every run of one tree (bench/pool_e2e.py): its block is "<!-- e2e pooled tables: ... -->".
E2E_POOLED = RESULTS / "e2e_pooled.json"


def focused_markers(name: str) -> tuple[str, str]:
    return f"<!-- e2e {name} tables: python bench/readme_tables.py --write-readme -->", f"<!-- /e2e {name} tables -->"


TIMELINE_REGIMES = ("judge_real", "heavy_2.5x", "tail_2.5x", "tail_1x")  # the first present is drawn
TIMELINE_MODES = (STOCK, "both", "tail_auto", "tail", "tail_drop", VERL_COLOCATE, AGENT_COLOCATE)


def tables() -> dict[str, str]:
    return {
        "demo": demo_markdown(json.loads((RESULTS / "demo" / "demo.json").read_text())["table"]),
        "e2e": e2e_markdown(e2e_report(RESULTS / "e2e.json")),
        "agent": agent_markdown(json.loads((RESULTS / "agent_throughput.json").read_text())),
        "backpressure": backpressure_markdown(json.loads((RESULTS / "backpressure.json").read_text())),
        "fault_suite": fault_markdown(json.loads((RESULTS / "fault_suite.json").read_text())),
        **{f"e2e_{name}": e2e_markdown(e2e_report(path)) for name, path in E2E_FOCUSED.items() if path.exists()},
        **({"e2e_pooled": pooled_markdown(pooled_report(E2E_POOLED))} if E2E_POOLED.exists() else {}),
    }


def pooled_report(path: Path) -> dict:
    """The pooled goals, pooled again from the committed reports it names (so the README's block
    always follows those reports, never a stale copy)."""
    names = [source["name"] for source in json.loads(path.read_text())["pooled_from"]]
    return pool({name: json.loads((path.parent / f"{name}.json").read_text()) for name in names})


def e2e_report(path: Path) -> dict:
    """An e2e report with its timing table and goals derived again from its per-run records, so a
    figure added to bench/e2e.py since the run (e.g. the middle-steps column) is shown for it too."""
    report = json.loads(path.read_text())
    report["timing"] = timing_table(report["records"])
    report["goals"] = goals(report["timing"], report["learning"], report["comparisons"])
    if report.get("recommended"):  # issue 43's goals against verl's colocate_async (bench/e2e.py --anchor)
        report["goals"] += anchor_goals(report["records"], report["recommended"])
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
    title, results = timeline_runs(json.loads((RESULTS / "e2e.json").read_text()))
    draw_timeline(results, path)
    return title


def write_readme(e2e_table: str, readme: Path = README, begin: str = E2E_BEGIN, end: str = E2E_END) -> None:
    text = readme.read_text()
    if begin not in text or end not in text:
        raise SystemExit(f"{readme} has no e2e block ({begin!r} ... {end!r}); add the two lines first")
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    readme.write_text(f"{head}{begin}\n{e2e_table}{end}{tail}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--write-readme", action="store_true", help="replace the e2e block of README.md")
    args = parser.parse_args(argv)
    all_tables = tables()
    for name, text in all_tables.items():
        print(f"<!-- {name} -->\n{text}")
    print(f"timeline ({draw_e2e_timeline()}): {E2E_TIMELINE.relative_to(ROOT)}")
    if args.write_readme:
        write_readme(all_tables["e2e"])
        for name in [*E2E_FOCUSED, "pooled"]:
            if f"e2e_{name}" in all_tables:
                begin, end = focused_markers(name)
                write_readme(all_tables[f"e2e_{name}"], begin=begin, end=end)
        print("README.md: e2e blocks rewritten")
    return 0


if __name__ == "__main__":
    sys.exit(main())
