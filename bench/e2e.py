"""End-to-end and learning benchmark: the demo's runs over latency regimes and seeds.

For every seed: one zero-latency run (the bound; latency-independent, so shared by all regimes) and,
per latency regime, the baseline and the three strategies (``verl_async_rm.demo.run_mode``: verl's
v0 trainer on CPU, the toy task, 8 prompts x 4 samples, 4 PPO mini-batches per step). Reward latency
is uniform in [hi/40, hi] (the recipe's 1-40 s shape), with ``hi`` a multiple of the measured
compute time of a step. Run order is shuffled per seed, so machine drift does not favour one mode.

Reports, per regime and mode, the median and min-max over seeds of: training-loop time, reduction
vs the same seed's baseline, hidden fraction (T_base - T) / (T_base - T_zero), time blocked on
rewards per step. Learning: the final toy reward per mode, and each strategy's difference to the
baseline paired by (seed, regime) with a 95% t-interval ("worse beyond noise" = interval below 0).

Each finished run is cached under --work (by steps, seed, latency and mode), so running the same
command again after an interruption resumes where it stopped; delete the folder to measure afresh.
    python bench/e2e.py            # the README's figures: 3 seeds x 4 regimes, 16 steps (~65 min, 2 cores)
    python bench/e2e.py --quick    # 3 runs of 1 step (checks it runs, the rollout-correction lane included)

The rollout-correction lane (``both_k2_rc``: pipeline, two steps ahead, and verl's
``algorithm.rollout_correction.rollout_is=token``, importance weights for the samples' staleness) is
opt-in, like ``both_k2``: add ``both_k2_rc@2.0`` to ``--modes``. Its learning row answers whether
correcting two-step-old samples helps over ``both_k2``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Optional

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from verl_async_rm.demo import DEFAULT_MODES, MODES, ModeResult, run_mode  # noqa: E402

RESULTS = ROOT / "bench" / "results"
STRATEGIES = ("pipeline", "off_policy", "both", "both_k2", "both_k2_rc")
FINAL_STEPS = 3  # first/final toy reward = mean batch reward over the first/last 3 steps
TARGETS = {"hidden_when_latency_le_compute": 0.9, "reduction_at_2x_compute": 0.40}


def run_key(steps: int, seed: int, hi: Optional[float], mode: str) -> str:
    latency = "" if mode == "zero_latency" else f"_hi{hi:g}"
    return f"steps{steps}_seed{seed}{latency}_{mode}"


def parse_modes(text: str) -> dict[str, Optional[set[float]]]:
    """"a,b,c@2.0" -> {a: None, b: None, c: {2.0}}: a mode named with @hi runs at those regimes only."""
    modes: dict[str, Optional[set[float]]] = {}
    for part in filter(None, text.split(",")):
        name, _, at = part.partition("@")
        if at:
            modes[name] = (modes.get(name) or set()) | {float(at)}
        else:
            modes[name] = None
    return modes


def plan_runs(seeds: list[int], highs: list[float], modes) -> list[tuple[int, Optional[float], str]]:
    """Every (seed, latency hi, mode) to run, zero-latency once per seed, shuffled within a seed.
    ``modes``: names, or a parse_modes() mapping restricting some modes to some regimes."""
    only = modes if isinstance(modes, dict) else dict.fromkeys(modes)
    runs = []
    for seed in seeds:
        mine = [(seed, None, "zero_latency")] if "zero_latency" in only else []
        mine += [(seed, hi, mode) for hi in highs for mode, at in only.items()
                 if mode != "zero_latency" and (at is None or hi in at)]
        random.Random(seed).shuffle(mine)
        runs += mine
    return runs


def _spread(values: list[float]) -> Optional[dict]:
    if not values:
        return None
    return {"median": round(float(np.median(values)), 3), "min": round(float(min(values)), 3),
            "max": round(float(max(values)), 3), "n": len(values)}


def record_of(seed: int, hi: Optional[float], result: ModeResult) -> dict:
    return {
        "seed": seed, "latency_hi_s": hi, "mode": result.mode, "loop_time_s": result.loop_time,
        "blocked_per_step_s": float(np.mean(result.blocked)) if result.blocked else 0.0,
        "final_reward": float(np.mean(result.scores[-FINAL_STEPS:])),
        "first_reward": float(np.mean(result.scores[:FINAL_STEPS])),
        "result": asdict(result),
    }


def ordered_modes(records: list[dict]) -> list[str]:
    present = {r["mode"] for r in records}
    return [m for m in MODES if m in present]


def timing_table(records: list[dict], highs: list[float]) -> list[dict]:
    """One row per (regime, mode): medians and min-max over seeds, ratios paired within a seed."""
    zero = {r["seed"]: r["loop_time_s"] for r in records if r["mode"] == "zero_latency"}
    rows = []
    for hi in highs:
        cell = [r for r in records if r["latency_hi_s"] == hi]
        base = {r["seed"]: r["loop_time_s"] for r in cell if r["mode"] == "baseline"}
        for mode in ordered_modes(records):
            mine = [r for r in records if r["mode"] == mode] if mode == "zero_latency" else [r for r in cell if r["mode"] == mode]
            if not mine:
                continue
            reductions = [1 - r["loop_time_s"] / base[r["seed"]] for r in mine if r["seed"] in base]
            hidden = [(base[r["seed"]] - r["loop_time_s"]) / (base[r["seed"]] - zero[r["seed"]])
                      for r in mine if mode in STRATEGIES and r["seed"] in base and r["seed"] in zero
                      and base[r["seed"]] > zero[r["seed"]]]
            rows.append({
                "latency_hi_s": hi, "mode": mode,
                "loop_time_s": _spread([r["loop_time_s"] for r in mine]),
                "reduction_vs_baseline": _spread(reductions) if mode != "baseline" else None,
                "hidden_fraction": _spread(hidden),
                "blocked_on_rewards_per_step_s": _spread([r["blocked_per_step_s"] for r in mine]) if mode in STRATEGIES else None,
            })
    return rows


def paired_interval(diffs: list[float]) -> Optional[dict]:
    """Mean of paired differences with a 95% Student-t interval (None with fewer than 2 pairs)."""
    if len(diffs) < 2:
        return None
    from scipy import stats

    mean, sem = float(np.mean(diffs)), float(np.std(diffs, ddof=1) / np.sqrt(len(diffs)))
    half = float(stats.t.ppf(0.975, len(diffs) - 1)) * sem
    return {"mean": round(mean, 4), "low": round(mean - half, 4), "high": round(mean + half, 4), "n": len(diffs)}


def learning_table(records: list[dict]) -> list[dict]:
    base = {(r["seed"], r["latency_hi_s"]): r["final_reward"] for r in records if r["mode"] == "baseline"}
    rows = []
    for mode in ordered_modes(records):
        mine = [r for r in records if r["mode"] == mode]
        diffs = [r["final_reward"] - base[r["seed"], r["latency_hi_s"]] for r in mine
                 if mode in STRATEGIES and (r["seed"], r["latency_hi_s"]) in base]
        interval = paired_interval(diffs)
        rows.append({
            "mode": mode,
            "first_reward": _spread([r["first_reward"] for r in mine]),
            "final_reward": _spread([r["final_reward"] for r in mine]),
            "final_minus_baseline": interval,
            "worse_beyond_noise": None if interval is None else interval["high"] < 0,
        })
    return rows


def compute_per_step(records: list[dict]) -> Optional[float]:
    """Median step time of the zero-latency runs: the compute a reward latency is compared with."""
    steps = [t for r in records if r["mode"] == "zero_latency" for t in r["result"]["step_times"]]
    return round(float(np.median(steps)), 3) if steps else None


def targets(rows: list[dict], compute: Optional[float], highs: list[float]) -> dict:
    """The issue's targets, per strategy: hidden >= 0.9 where the latency tail <= compute; reduction
    >= 40% at the regime nearest to 2x compute (if one lies within 1.5-2.5x)."""
    if compute is None:
        return {}
    out = {}
    near_2x = min(highs, key=lambda hi: abs(hi / compute - 2))
    for row in rows:
        hidden, reduction, hi = row["hidden_fraction"], row["reduction_vs_baseline"], row["latency_hi_s"]
        if row["mode"] not in STRATEGIES:
            continue
        if hidden and hi / compute <= 1.0:
            out[f"hidden>={TARGETS['hidden_when_latency_le_compute']} at hi={hi:g}s ({row['mode']})"] = (
                hidden["median"] >= TARGETS["hidden_when_latency_le_compute"])
        if reduction and hi == near_2x and 1.5 <= hi / compute <= 2.5:
            out[f"reduction>={TARGETS['reduction_at_2x_compute']:.0%} at hi={hi:g}s ({row['mode']})"] = (
                reduction["median"] >= TARGETS["reduction_at_2x_compute"])
    return out


def _fmt(spread: Optional[dict], pct: bool = False, none: str = "-") -> str:
    if spread is None:
        return none
    f = (lambda v: f"{v:.0%}") if pct else (lambda v: f"{v:.2f}")
    return f"{f(spread['median'])} [{f(spread['min'])}, {f(spread['max'])}]"


def print_report(report: dict) -> None:
    print(f"\ncompute per step (zero-latency median): {report['compute_per_step_s']} s")
    print(" | ".join(f"{h:>24}" for h in ["latency hi (x compute)", "mode", "loop time s", "reduction", "hidden", "blocked/step s"]))
    for row in report["timing"]:
        ratio = "" if not report["compute_per_step_s"] else f" ({row['latency_hi_s'] / report['compute_per_step_s']:.1f}x)"
        cells = [f"{row['latency_hi_s']:g} s{ratio}", row["mode"], _fmt(row["loop_time_s"]),
                 _fmt(row["reduction_vs_baseline"], True), _fmt(row["hidden_fraction"], True),
                 _fmt(row["blocked_on_rewards_per_step_s"])]
        print(" | ".join(f"{c:>24}" for c in cells))
    print("\nlearning (toy reward; median [min, max] over seeds x regimes; strategy - baseline paired, 95% CI)")
    for row in report["learning"]:
        diff = row["final_minus_baseline"]
        paired = "-" if diff is None else f"{diff['mean']:+.3f} [{diff['low']:+.3f}, {diff['high']:+.3f}]"
        print(f"{row['mode']:>14} | first {_fmt(row['first_reward'])} | final {_fmt(row['final_reward'])} | vs baseline {paired}")
    for name, met in report["targets"].items():
        print(f"target {name}: {'met' if met else 'MISSED'}")


def markdown(report: dict) -> str:
    """The README's tables, generated from the report (a test checks the README quotes them verbatim)."""
    compute = report["compute_per_step_s"]

    def fmt(spread, pct=False):
        return _fmt(spread, pct, none="—")

    lines = ["| latency tail (× compute) | run | loop time s | reduction vs baseline | reward wait hidden | blocked on rewards per step s |",
             "|---|---|---|---|---|---|"]
    for row in report["timing"]:
        regime = f"{row['latency_hi_s']:g} s ({row['latency_hi_s'] / compute:.1f}×)"
        lines.append(f"| {regime} | {row['mode']} | {fmt(row['loop_time_s'])} | {fmt(row['reduction_vs_baseline'], True)} "
                     f"| {fmt(row['hidden_fraction'], True)} | {fmt(row['blocked_on_rewards_per_step_s'])} |")
    lines += ["", "| run | toy reward, first 3 steps | toy reward, last 3 steps | last 3 steps minus the baseline's (paired, 95% interval) | worse beyond noise |",
              "|---|---|---|---|---|"]
    for row in report["learning"]:
        diff = row["final_minus_baseline"]
        paired = "—" if diff is None else f"{diff['mean']:+.3f} [{diff['low']:+.3f}, {diff['high']:+.3f}]"
        worse = {None: "—", True: "**yes**", False: "no"}[row["worse_beyond_noise"]]
        lines.append(f"| {row['mode']} | {fmt(row['first_reward'])} | {fmt(row['final_reward'])} | {paired} | {worse} |")
    return "\n".join(lines) + "\n"


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--latency-hi", default="0.25,1.0,1.6,2.0", help="regimes: the latency tail in seconds (lo = hi/40)")
    parser.add_argument("--modes", default=",".join([*DEFAULT_MODES, "both_k2@2.0"]),
                        help=f"comma-separated subset of {list(MODES)}; mode@hi runs that mode at that regime only")
    parser.add_argument("--work", help="run folders and the per-run cache (default: next to --out, <out>_runs/)")
    parser.add_argument("--out", default=str(RESULTS / "e2e.json"))
    parser.add_argument("--progress", action="store_true", help="per-step progress of each run")
    parser.add_argument("--quick", action="store_true", help="3 runs of 1 step: checks the script runs")
    args = parser.parse_args(argv)
    if args.quick:
        args.steps, args.seeds, args.latency_hi, args.modes = 1, "0", "0.2", "zero_latency,baseline,both_k2_rc"
        args.out = args.out.replace(".json", "_quick.json")
    seeds = [int(s) for s in args.seeds.split(",")]
    highs = [float(h) for h in args.latency_hi.split(",")]
    modes = parse_modes(args.modes)
    if set(modes) - set(MODES) or not {"baseline", "zero_latency"} <= set(modes) or modes["baseline"] or modes["zero_latency"]:
        parser.error(f"--modes must name runs of {list(MODES)} (mode@hi: at that regime only) and include "
                     f"baseline and zero_latency at every regime (got {args.modes})")
    work = Path(args.work or str(Path(args.out).with_suffix("")) + "_runs")
    cache = work / "records"
    cache.mkdir(parents=True, exist_ok=True)

    from verl_async_rm.cpu_backend.launch import CPURunConfig, prepare_assets

    runs = plan_runs(seeds, highs, modes)
    records, started, from_cache = [], time.time(), 0
    print(f"{len(runs)} runs of {args.steps} steps; work folder {work}", flush=True)
    for index, (seed, hi, mode) in enumerate(runs, 1):
        key = run_key(args.steps, seed, hi, mode)
        cached = cache / f"{key}.json"
        if cached.exists():
            records.append(json.loads(cached.read_text()))
            from_cache += 1
            print(f"[{index}/{len(runs)}] {key}: cached", flush=True)
            continue
        assets = prepare_assets(CPURunConfig(out_dir=str(work / f"assets_seed{seed}"), seed=seed))
        latency = (hi / 40, hi) if hi else (0.0, 0.0)
        result = run_mode(work / key, assets, mode, args.steps, seed, latency, args.progress)
        record = record_of(seed, hi, result)
        cached.write_text(json.dumps(record))
        records.append(record)
        elapsed = time.time() - started
        print(f"[{index}/{len(runs)}] {key}: loop {result.loop_time:.1f} s, final reward {record['final_reward']:.3f} "
              f"({elapsed / 60:.1f} min elapsed)", flush=True)

    compute = compute_per_step(records)
    timing = timing_table(records, highs)
    report = {
        "command": " ".join(["python bench/e2e.py", *(argv if argv is not None else sys.argv[1:])]),
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count(), "platform": platform.platform()},
        "steps": args.steps, "seeds": seeds, "latency_hi_s": highs, "latency_lo": "hi/40",
        "compute_per_step_s": compute, "timing": timing, "learning": learning_table(records),
        "targets": targets(timing, compute, highs), "this_invocation_s": round(time.time() - started, 1),
        "runs_from_cache": from_cache,
        "records": [{k: v for k, v in r.items() if k != "result"} | {"step_times": r["result"]["step_times"],
                     "scores": r["result"]["scores"]} for r in records],
    }
    print_report(report)
    print("\n" + markdown(report))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2))
    print(f"\nresults: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
