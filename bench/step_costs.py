"""Where a mode's unhidden reward time goes, step by step, from an e2e benchmark's run folders.

For one trainer, mode and latency regime, pairs each seed's run with the same mode's run under the
instant judge (``zero``) and prints, per training step, the median over seeds of the difference of
each ``timing_s/*`` timer (``reward_wait``, ``adv``, ``reward_attach``, ``update_actor``, ...), plus
its sum over the run. What the README's tail_1x breakdown quotes:

    python bench/e2e.py --trainers v1 --steps 10 --seeds 0,1,2 --regimes tail_1x --strategies both \\
        --failure-modes "" --compute v1=1.075 --out /tmp/diag.json
    python bench/step_costs.py /tmp/diag_runs --trainer v1 --mode both --regime tail_1x --seeds 0,1,2

With ``--metrics``, instead, each named trainer metric of each seed's run, unpaired: its values step
by step, their sum over the run, step 1's and the last step's (a cumulative counter such as
``async_rm/groups_dropped_stale`` is read at the last step; a per-step figure such as
``async_rm/pool_wait_due_s`` is summed). What the README's heavy_2.5x per-run figures quote:

    python bench/step_costs.py bench/results/e2e_runs --mode tail_auto --regime heavy_2.5x --seeds 0,1,2,3,4 \\
        --metrics async_rm/pool_wait_s,async_rm/pool_wait_due_s,async_rm/groups_dropped_stale

With ``--pace REPORT``, from an e2e report's committed records (no run folders needed): per seed, a
mode's reduction vs the same seed's stock run in one regime, beside its pace probe, how long
``timing_s/old_log_prob`` (the same forward pass in every mode; median step) took in the mode's run
over the stock run. A seed slower than stock with a probe well over 1 ran on a slower machine (or
its mode took CPU from compute). In a latency regime it also splits the goal's hidden fraction:
the wait, what the mode's loop exposed of it, and how much of that its trainer timed as blocked on
rewards. What the README's per-seed figures quote:

    python bench/step_costs.py --pace bench/results/e2e.json --mode tail_auto --regime zero
    python bench/step_costs.py --pace bench/results/e2e_pairs.json --mode both --regime tail_1x
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
from pathlib import Path


def run_group(work: Path, run: Path) -> str:
    """The start-up group a run folder's cached record names ("" where none: a regime's own run, or a
    benchmark from before each regime's bounds trained in its group)."""
    record = work / "records" / f"{run.name}.json"
    return (json.loads(record.read_text()).get("group") or "") if record.exists() else ""


def latest_run(work: Path, trainer: str, seed: int, regime: str, mode: str, group: str = "") -> Path:
    """The newest run folder of this cell (folders end in the run key's 10-hex digest, so `both` does
    not match `both_serial`). ``group``: for a zero-latency bound, the regime whose group it trained
    in (bench/e2e.py trains one per regime); a benchmark from before that has one bound, whatever
    the group asked."""
    pattern = re.compile(rf"{trainer}_steps\d+_seed{seed}_{re.escape(regime)}_{re.escape(mode)}_[0-9a-f]{{10}}")
    runs = [d for d in work.iterdir() if pattern.fullmatch(d.name) and (d / "metrics-0.jsonl").exists()]
    if group:
        runs = [d for d in runs if run_group(work, d) == group] or [d for d in runs if not run_group(work, d)]
    if not runs:
        raise SystemExit(f"no run of {trainer} seed {seed} {regime} {mode}{f' in the {group} group' if group else ''} in {work}")
    return max(runs, key=lambda d: (d / "metrics-0.jsonl").stat().st_mtime)


def step_metrics(run: Path) -> list[dict]:
    """Each training step's metrics (step 0, the validation before training, left out)."""
    rows = [json.loads(line) for line in (run / "metrics-0.jsonl").read_text().splitlines() if line.strip()]
    return [row["data"] for row in rows if row["step"] > 0]


def paired_costs(work: Path, trainer: str, mode: str, regime: str, seeds: list[int]) -> dict[str, list[float]]:
    """timer -> per step, the median over seeds of (this regime's value - the instant judge's)."""
    slow = [step_metrics(latest_run(work, trainer, s, regime, mode)) for s in seeds]
    fast = [step_metrics(latest_run(work, trainer, s, "zero", mode, group=regime)) for s in seeds]
    steps = min(len(run) for run in slow + fast)
    timers = sorted({k for run in slow for step in run for k in step if k.startswith("timing_s/")})
    return {
        timer: [statistics.median(s[i].get(timer, 0.0) - f[i].get(timer, 0.0) for s, f in zip(slow, fast))
                for i in range(steps)]
        for timer in timers
    }


def run_metrics(work: Path, trainer: str, mode: str, regime: str, seeds: list[int], names: list[str]) -> dict[str, dict[int, list]]:
    """metric -> seed -> its value at each training step of that seed's run (None where a step has
    no such metric)."""
    runs = {seed: step_metrics(latest_run(work, trainer, seed, regime, mode)) for seed in seeds}
    return {name: {seed: [step.get(name) for step in run] for seed, run in runs.items()} for name in names}


def pace_pairs(report: dict, trainer: str, mode: str, regime: str) -> list[dict]:
    """Per seed with both runs: the mode's reduction vs stock, and the pace probe's ratio. In a
    latency regime, where the seed's run of the mode with an instant judge is there too, the goal's
    hidden fraction split: of the wait (stock's loop minus the mode's instant-judge loop), what the
    mode's loop exposed (its loop minus its instant-judge loop) and, of that, what its trainer timed
    as blocked on rewards; the rest is the two runs' other differences (machine pace, CPU taken)."""
    records = [r for r in report["records"] if r["trainer"] == trainer]
    runs = {(r["seed"], r["mode"]): r for r in records if r["regime"] == regime
            and (regime != "zero" or (r.get("group") or "") != "calibration")}
    # the bound that trained in this regime's group (bench/e2e.py), or the seed's only one (older reports)
    bounds = {r["seed"]: r for r in records if r["regime"] == "zero" and r["mode"] == mode
              and (r.get("group") or "") in ("", regime)}
    out = []
    for seed in sorted({seed for seed, m in runs if m == mode and (seed, "baseline") in runs}):
        mine, stock = runs[seed, mode], runs[seed, "baseline"]
        probe = (statistics.median(mine["same_work_s"]) / statistics.median(stock["same_work_s"])
                 if mine.get("same_work_s") and stock.get("same_work_s") else None)
        row = {"seed": seed, "reduction": 1 - mine["loop_time_s"] / stock["loop_time_s"], "probe_ratio": probe}
        bound = bounds.get(seed)
        if regime != "zero" and bound is not None and stock["loop_time_s"] > bound["loop_time_s"]:
            wait, exposed = stock["loop_time_s"] - bound["loop_time_s"], mine["loop_time_s"] - bound["loop_time_s"]
            blocked = sum(mine["blocked"]) if mine.get("blocked") else None
            row |= {"wait_s": wait, "exposed_s": exposed, "blocked_s": blocked, "hidden": 1 - exposed / wait}
        out.append(row)
    return out


def describe(values: list) -> str:
    present = [v for v in values if v is not None]
    if not present:
        return "not recorded"
    first = "—" if values[0] is None else f"{values[0]:.4g}"
    return (f"sum {sum(present):.3f}, step 1 {first}, last {present[-1]:.4g}, "
            f"per step {[None if v is None else round(v, 3) for v in values]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("work", type=Path, nargs="?", help="the benchmark's run folders (<out>_runs/)")
    parser.add_argument("--trainer", default="v1")
    parser.add_argument("--mode", default="both")
    parser.add_argument("--regime", default="tail_1x")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--metrics", help="comma-separated trainer metrics to list per seed's run (unpaired), "
                        "e.g. async_rm/pool_wait_due_s,async_rm/groups_dropped_stale")
    parser.add_argument("--pace", type=Path, help="an e2e report (JSON): per seed, reduction vs stock and the pace probe")
    args = parser.parse_args()
    if args.pace:
        for row in pace_pairs(json.loads(args.pace.read_text()), args.trainer, args.mode, args.regime):
            probe = "—" if row["probe_ratio"] is None else f"{row['probe_ratio']:.2f}"
            split = "" if "hidden" not in row else (
                f"; hidden {row['hidden']:.0%}: of {row['wait_s']:.2f} s of wait, {row['exposed_s']:+.2f} s exposed, "
                + ("blocked on rewards not recorded" if row["blocked_s"] is None else f"{row['blocked_s']:.2f} s of it blocked on rewards"))
            print(f"seed {row['seed']}: reduction vs stock {row['reduction']:+.0%}, pace probe {probe}{split}")
        return
    if args.work is None:
        parser.error("the run folders are needed (or --pace REPORT)")
    seeds = [int(s) for s in args.seeds.split(",")]
    if args.metrics:
        per_metric = run_metrics(args.work, args.trainer, args.mode, args.regime, seeds,
                                 [m.strip() for m in args.metrics.split(",") if m.strip()])
        for name, by_seed in per_metric.items():
            for seed, values in by_seed.items():
                print(f"{name:32s} seed {seed}: {describe(values)}")
        return
    costs = paired_costs(args.work, args.trainer, args.mode, args.regime, seeds)
    for timer, per_step in costs.items():
        print(f"{timer:32s} sum {sum(per_step):+.3f} s   per step {[round(x, 3) for x in per_step]}")


if __name__ == "__main__":
    main()
