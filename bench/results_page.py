"""docs/results.md, and the README's results table, generated from the committed JSON in bench/results/.

    python bench/results_page.py           # print the page
    python bench/results_page.py --write   # write docs/results.md and the README's results block

Every figure the docs quote is made here from the JSON its benchmark wrote (each JSON records the command
that made it), so a figure cannot drift from its source: tests/benchmarks/test_results_page.py checks that
docs/results.md and the README's block are what this script writes today.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.result_tables import e2e_report, tables  # noqa: E402
from bench.e2e import markdown as e2e_markdown  # noqa: E402

RESULTS = ROOT / "bench" / "results"
PAGE = ROOT / "docs" / "results.md"
README = ROOT / "README.md"
ANCHOR = RESULTS / "e2e_anchor.json"
ADMISSION = RESULTS / "e2e_admission.json"
ADMISSION_VALIDATION = RESULTS / "e2e_admission_validation.json"
ANCHOR_AHEAD = RESULTS / "e2e_anchor_ahead.json"
SUITE_TIME = RESULTS / "suite_time.json"
README_BEGIN = "<!-- results: python bench/results_page.py --write -->"
README_END = "<!-- /results -->"
SUITE_BEGIN = "<!-- suite time: python bench/results_page.py --write -->"
SUITE_END = "<!-- /suite time -->"
# The anchor's contestants as the README's one table names them (bench/e2e.py's modes).
CONTESTANTS = {
    "baseline": "verl `sync` (stock)",
    "verl_colocate_async": "verl `colocate_async`, its reward loop",
    "colocate_async_agent": "verl `colocate_async` + `async_agent`",
    "both": "`async_agent` + mini-batch pipeline + one step ahead",
    "tail_auto": "`async_agent` + the staleness pool (`max_staleness: auto`)",
}
# The deeper prefetch window's benchmark (its own start-up groups, so a table of its own).
AHEAD_CONTESTANTS = {
    "baseline": CONTESTANTS["baseline"],
    "verl_colocate_async_ahead": "verl `colocate_async`, window 2, its reward loop",
    "colocate_async_agent_ahead": "verl `colocate_async`, window 2, + `async_agent`",
}


def _load(name: str) -> dict | None:
    path = RESULTS / name
    return json.loads(path.read_text()) if path.exists() else None


def _scalars(figures: dict, skip: tuple[str, ...] = ("command", "machine")) -> str:
    """A flat JSON's numbers and short values as a two-column table (lists and dicts of figures inline)."""
    rows = ["| figure | value |", "|---|---|"]
    for key, value in figures.items():
        if key in skip or (isinstance(value, (list, dict)) and len(json.dumps(value)) > 160):
            continue
        shown = f"{value:.4g}" if isinstance(value, float) else json.dumps(value) if isinstance(value, (list, dict)) else value
        rows.append(f"| `{key}` | {shown} |")
    return "\n".join(rows) + "\n"


def _section(title: str, source: str, figures: dict | None, body: str) -> str:
    if figures is None:
        return ""
    command = figures.get("command") or (figures.get("runs") or [{}])[0].get("command", "")
    return f"## {title}\n\n`bench/results/{source}`, made by `{command}`.\n\n{body}\n"


def anchor_table(report: dict, contestants: dict[str, str] = CONTESTANTS) -> str:
    """The README's one table: per regime and contestant, the training-loop time, the reward wait the trainer
    itself timed beyond its zero-latency bound, the judge's 429s, samples trained on a failed call's 0, and
    learning: the figures of the report's own rows (``e2e_report``: medians over seeds)."""
    report = {**report}
    rows = ["| regime | configuration | loop time s | reward wait exposed s | 429s | trained on a failed call's 0 | held-out reward |",
            "|---|---|---|---|---|---|---|"]
    held_out: dict[tuple[str, str], list[float]] = {}  # the toy task's own score of the final validation
    for record in report["records"]:
        if record["trainer"] == "v1" and record.get("val_final_true") is not None and not record.get("group"):
            held_out.setdefault((record["regime"], record["mode"]), []).append(record["val_final_true"])

    def median(cell):
        return cell["median"] if isinstance(cell, dict) else cell

    def shown(value, digits=1):
        return "—" if value is None else f"{value:.{digits}f}"

    timing = [row for row in report["timing"] if row["trainer"] == "v1" and row["regime"] != "zero"]
    for regime in dict.fromkeys(row["regime"] for row in timing):
        for mode, name in contestants.items():
            row = next((r for r in timing if r["regime"] == regime and r["mode"] == mode), None)
            if row is None:
                continue
            finals = sorted(held_out.get((regime, mode), []))
            final = finals[len(finals) // 2] if finals else None
            rows.append(
                f"| {regime} | {name} | {shown(median(row.get('loop_time_s')))} "
                f"| {shown(median(row.get('reward_wait_exposed_s')))} "
                f"| {shown(median(row.get('judge_throttled')), 0)} "
                f"| {shown(row.get('trained_failed_zero'), 0)} | {shown(final, 3)} |")
    return "\n".join(rows) + "\n"


def page() -> str:
    parts = ["# Results\n",
             "Generated by `python bench/results_page.py --write` from the committed JSON in `bench/results/`; "
             "each section names its file and the command that made it. Measured on this project's machine: "
             "2 cores, no GPU, verl's real trainer on the CPU backend. Do not edit by hand.\n"]
    anchor = _load(ANCHOR.name)
    if anchor is not None:
        parts.append(_section("Against verl's own asynchronous trainer", ANCHOR.name, anchor,
                              e2e_markdown(e2e_report(ANCHOR))))
    if ANCHOR_AHEAD.exists():
        parts.append(_section("verl's `colocate_async` with its prefetch window one batch deeper "
                              "(`trainer.v1.colocate_async.num_warmup_batches=2`), both reward paths", ANCHOR_AHEAD.name,
                              _load(ANCHOR_AHEAD.name), e2e_markdown(e2e_report(ANCHOR_AHEAD))))
    if ADMISSION.exists():
        parts.append(_section("Admission order: first in, first out against deadline-aware", ADMISSION.name,
                              _load(ADMISSION.name), e2e_markdown(e2e_report(ADMISSION))))
    if ADMISSION_VALIDATION.exists():
        parts.append(_section("Admission order with verl's validation inside the loop", ADMISSION_VALIDATION.name,
                              _load(ADMISSION_VALIDATION.name), e2e_markdown(e2e_report(ADMISSION_VALIDATION))))
    everything = tables()
    demo = _load("demo/demo.json")
    if demo is not None:
        parts.append(_section("The demo", "demo/demo.json", demo, everything["demo"]))
    parts.append(_section("The agent alone: throughput and wake-ups", "agent_throughput.json",
                          _load("agent_throughput.json"), everything["agent"]))
    parts.append(_section("Flow control against a rate-limited judge", "backpressure.json",
                          _load("backpressure.json"), everything["backpressure"]))
    parts.append(_section("The fault suite", "fault_suite.json", _load("fault_suite.json"), everything["fault_suite"]))
    for name, title in (("fault_suite_verdict_log_resume.json", "Fault: a verdict-log resume after SIGKILL, group judge"),
                        ("fault_suite_limiter_killed.json", "Fault: the shared limiter killed mid-run"),
                        ("hot_path.json", "The hot path: memory over many tickets, a deadline over a backlog"),
                        ("verdict_log_overhead.json", "What the verdict log costs")):
        figures = _load(name)
        parts.append(_section(title, name, figures, _scalars(figures) if figures else ""))
    replay = _load("replay.json")
    if replay is not None:
        parts.append(_section("Judge replay: a committed exact-match log re-judged with partial credit", "replay.json",
                              {"command": replay["run"]["bench_command"]},
                              _scalars(replay["agreement"]) + "\n![old vs new scores](../bench/results/replay.png)\n"))
    budget = _load("fault_suite_budget.json")
    if budget is not None:
        parts.append(_section("Fault: a budget near the limit under 2,000 concurrent requests", "fault_suite_budget.json",
                              budget, "".join(_scalars(run) + "\n" for run in budget["runs"])))
    for name, title in (("suite_time.json", "The test suite's time"),
                        ("suite_time_loaded.json", "The quick tier beside a running CI (a loaded machine)")):
        figures = _load(name)
        if figures is not None:
            rows = [f"| {part} | {run['wall_s']} | {run['exit_code']} | {run['load_1min_at_start']} | {run['load_1min_at_end']} |"
                    for part in ("quick", "ci") if part in figures
                    for run in (figures[part]["runs"] if part == "quick" else [figures[part]])]
            parts.append(_section(title, name, figures, "| run | wall s | exit code | load at start | load at end |\n"
                                  "|---|---|---|---|---|\n" + "\n".join(rows) + "\n"))
    for name, title in (("e2e.json", "Against verl's `sync` trainer (the earlier benchmark)"),
                        ("e2e_pooled.json", "Against verl's `sync` trainer, pooled over runs")):
        key = "e2e" if name == "e2e.json" else "e2e_pooled"
        if key in everything:
            parts.append(_section(title, name, _load(name), everything[key]))
    return "\n".join(part for part in parts if part)


def against_verl(report: dict, contestants: dict[str, str] = CONTESTANTS,
                 reference: str = "verl's `colocate_async` with its reward loop") -> str:
    """One sentence per regime: each configuration's loop time against verl's colocate_async with its own
    reward loop (the same window: ``reference``), paired within a seed (the report's ``loop_vs_verl`` goals:
    mean and 95% interval)."""
    rows = [g for g in report.get("goals", []) if g.get("kind") == "loop_vs_verl" and g["trainer"] == "v1"]
    parts = []
    for regime in dict.fromkeys(g["regime"] for g in rows):
        cells = [f"{contestants.get(g['mode'], g['mode'])} {g['figure']['mean']:+.1%} "
                 f"[{g['figure']['low']:+.1%}, {g['figure']['high']:+.1%}]" for g in rows if g["regime"] == regime]
        parts.append(f"{regime}: " + "; ".join(cells))
    if not parts:
        return ""
    return (f"Loop time against {reference}, paired within a seed (mean, 95% "
            "interval): " + " · ".join(parts) + ".\n")


def readme_block() -> str:
    anchor = _load(ANCHOR.name)
    if anchor is None:
        return ""
    missing = len(anchor.get("missing_runs") or [])
    partial = f" ({missing} runs of the planned seeds still to run: a partial benchmark)" if missing else ""
    report = e2e_report(ANCHOR)
    return (f"{anchor_table(report)}\n{against_verl(report)}\nMedians over {len({r['seed'] for r in anchor['records']})} seeds{partial}, "
            "\"trained on a failed call's 0\" summed over them "
            f"(`bench/results/{ANCHOR.name}`: `{anchor.get('command', '')}`); \"—\": not measured there (stock `sync` "
            "scores inside generation, so its whole wait is in its loop time; only `judge_real` has a judge that answers "
            "429). Every figure, interval and goal: [docs/results.md](docs/results.md).\n" + ahead_block())


def ahead_block() -> str:
    """The deeper prefetch window (``trainer.v1.colocate_async.num_warmup_batches=2``), both reward paths:
    its own table, from its own benchmark (other start-up groups than the table above: not paired with it)."""
    ahead = _load(ANCHOR_AHEAD.name)
    if ahead is None:
        return ""
    report = e2e_report(ANCHOR_AHEAD)
    seeds = len({r["seed"] for r in ahead["records"] if r["regime"] != "zero"})
    paired = against_verl(report, AHEAD_CONTESTANTS, "verl's `colocate_async` with the same window and its reward loop")
    return (f"\nverl's prefetch window one batch deeper (`trainer.v1.colocate_async.num_warmup_batches=2`, \"window 2\"), "
            f"its own benchmark (medians over {seeds} seeds, `bench/results/{ANCHOR_AHEAD.name}`: "
            f"`{ahead.get('command', '')}`):\n\n"
            f"{anchor_table(report, AHEAD_CONTESTANTS)}\n{paired}")


def suite_time_block() -> str:
    """The contributor section's sentence on the suite's time, from bench/results/suite_time.json."""
    figures = _load(SUITE_TIME.name)
    if figures is None:
        return ""
    said = []
    if "quick" in figures:
        quick = figures["quick"]
        said.append(f"`{quick['command']}` took at most {quick['max_wall_s']:.0f} s over {len(quick['runs'])} runs "
                    f"(1-minute load at most {quick['max_load_1min']:.1f})")
    if "ci" in figures:
        ci = figures["ci"]
        said.append(f"`{ci['command']}` {ci['wall_s']:.0f} s, {ci['wall_s'] / 60:.1f} minutes (load at most {ci['max_load_1min']:.1f})")
    return (f"On {figures['cores']} cores, {' and '.join(said)}: `bench/results/{SUITE_TIME.name}`, made by "
            f"`{figures['command']}`.\n")


def readme_blocks() -> dict[tuple[str, str], str]:
    return {(README_BEGIN, README_END): readme_block(), (SUITE_BEGIN, SUITE_END): suite_time_block()}


def write(readme: Path = README, page_path: Path = PAGE) -> None:
    page_path.write_text(page())
    text = readme.read_text()
    for (begin, end), block in readme_blocks().items():
        if begin in text and end in text:
            head, rest = text.split(begin, 1)
            _, tail = rest.split(end, 1)
            text = f"{head}{begin}\n{block}{end}{tail}"
    readme.write_text(text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--write", action="store_true", help="write docs/results.md and the README's results block")
    args = parser.parse_args(argv)
    if args.write:
        write()
        print(f"wrote {PAGE.relative_to(ROOT)} and the README's results block")
    else:
        print(page())
    return 0


if __name__ == "__main__":
    sys.exit(main())
