"""The demo: verl's real trainer on CPU, with a slow simulated reward, with and without the strategies.

Five runs on the same seed, model and data (the toy task), each ``--steps`` GRPO steps of
8 prompts x 4 samples, 4 PPO mini-batches per step, rewards uniform in [lo, hi] seconds (a scaled
analog of the recipe's 1-40 s):
- ``zero_latency``: the stock trainer with an instant reward, the bound (all waiting hidden);
- ``baseline``: the stock trainer (rewards scored in verl's agent loop through the async_agent manager);
- ``pipeline``, ``off_policy`` (one step), ``both``: the strategies (``both_k2``, two steps ahead,
  on request).
It prints a table (training-loop time, i.e. the sum of step times, so Ray start-up and the one-time
warm-up, absorbed by a validation pass before step 1, are left out; reduction vs the baseline;
hidden fraction = (T_base - T) / (T_base - T_zero); time blocked on rewards per step; final toy
reward), and writes it as JSON with a timeline picture (one lane per run).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from verl_async_rm.cpu_backend.launch import CPURunConfig, RunResult, prepare_assets, run, toy_reward_path

MODES: dict[str, list[str]] = {
    "zero_latency": [],
    "baseline": [],
    "pipeline": ["mini_batch_pipeline=true"],
    "off_policy": ["off_policy_steps=1"],
    "both": ["mini_batch_pipeline=true", "off_policy_steps=1"],
    # opt-in: two batches ahead (v0 only), for a reward tail longer than a step's compute
    "both_k2": ["mini_batch_pipeline=true", "off_policy_steps=2"],
    # opt-in: the same, with verl's off-policy correction (token-level importance weights between the
    # rollout's and the trainer's log-probs: the decoupled PPO loss the recipe offered)
    "both_k2_rc": ["mini_batch_pipeline=true", "off_policy_steps=2", "+algorithm.rollout_correction.rollout_is=token"],
}
DEFAULT_MODES = ["zero_latency", "baseline", "pipeline", "off_policy", "both"]
SHAPE = ["actor_rollout_ref.actor.ppo_mini_batch_size=2", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8"]
# Phases drawn in the timeline, from verl's timing_s/* metrics (the rest of a step is "other").
PHASES = {"gen": "generation", "reward_wait": "waiting on rewards", "update_actor": "updates"}


@dataclass
class ModeResult:
    mode: str
    step_times: list[float]
    phases: dict[str, list[float]]
    blocked: list[float]
    scores: list[float]

    @property
    def loop_time(self) -> float:
        return float(sum(self.step_times))


def summarize(mode: str, result: RunResult) -> ModeResult:
    def series(key: str) -> list[float]:
        return [float(v) for _, v in result.series(key)]

    step_times = series("timing_s/step")
    phases = {}
    for key in PHASES:
        values = dict(result.series(f"timing_s/{key}"))
        phases[key] = [float(values.get(step, 0.0)) for step in range(1, len(step_times) + 1)]
    return ModeResult(mode, step_times, phases, series("async_reward/blocked_s"), series("critic/score/mean"))


def table(results: dict[str, ModeResult]) -> list[dict]:
    base, zero = results["baseline"].loop_time, results["zero_latency"].loop_time
    rows = []
    for mode, r in results.items():
        t = r.loop_time
        rows.append(
            {
                "mode": mode,
                "loop_time_s": round(t, 2),
                "reduction_vs_baseline": round(1 - t / base, 3) if mode != "baseline" else 0.0,
                "hidden_fraction": round((base - t) / (base - zero), 3) if base > zero and mode not in ("baseline", "zero_latency") else None,
                "blocked_on_rewards_per_step_s": round(float(np.mean(r.blocked)), 3) if r.blocked else None,
                "final_toy_reward": round(float(np.mean(r.scores[-3:])), 3) if r.scores else None,
            }
        )
    return rows


def print_table(rows: list[dict]) -> None:
    header = ["mode", "loop time s", "reduction", "hidden", "blocked/step s", "final reward"]
    print(" | ".join(f"{h:>14}" for h in header))
    for row in rows:
        cells = [row["mode"], row["loop_time_s"], row["reduction_vs_baseline"], row["hidden_fraction"],
                 row["blocked_on_rewards_per_step_s"], row["final_toy_reward"]]
        print(" | ".join(f"{'-' if c is None else (f'{c:.0%}' if isinstance(c, float) and i in (2, 3) else c):>14}" for i, c in enumerate(cells)))


def markdown_table(rows: list[dict]) -> str:
    """The README's demo table, generated from demo.json's rows (a test checks the README quotes it)."""
    names = {"zero_latency": "zero latency (the bound)", "baseline": "baseline (stock trainer, rewards in verl's agent loop)",
             "pipeline": "mini-batch pipeline", "off_policy": "one-step off-policy", "both": "both",
             "both_k2": "both, two steps ahead", "both_k2_rc": "both, two steps ahead, rollout correction"}
    lines = ["| run | loop time | reduction vs baseline | reward wait hidden | blocked on rewards per step | toy reward, last 3 steps |",
             "|---|---|---|---|---|---|"]
    for row in rows:
        def cell(key, fmt):
            return "—" if row[key] is None or (row["mode"] == "baseline" and key == "reduction_vs_baseline") else fmt(row[key])
        lines.append(f"| {names.get(row['mode'], row['mode'])} | {row['loop_time_s']:.1f} s "
                     f"| {cell('reduction_vs_baseline', lambda v: f'{v:.0%}')} | {cell('hidden_fraction', lambda v: f'{v:.0%}')} "
                     f"| {cell('blocked_on_rewards_per_step_s', lambda v: f'{v:.2f} s')} | {cell('final_toy_reward', lambda v: f'{v:.3f}')} |")
    return "\n".join(lines) + "\n"


def draw_timeline(results: dict[str, ModeResult], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"gen": "#d62728", "reward_wait": "#f2b701", "update_actor": "#1f77b4", "other": "#c7c7c7"}
    fig, ax = plt.subplots(figsize=(12, 0.8 + 0.6 * len(results)))
    for lane, (mode, r) in enumerate(reversed(list(results.items()))):
        start = 0.0
        for step, total in enumerate(r.step_times):
            cursor = start
            for key in ("gen", "reward_wait", "update_actor"):
                width = min(r.phases[key][step], start + total - cursor)
                if width > 0:
                    ax.barh(lane, width, left=cursor, color=colors[key], edgecolor="white", linewidth=0.3)
                    cursor += width
            if start + total > cursor:
                ax.barh(lane, start + total - cursor, left=cursor, color=colors["other"], edgecolor="white", linewidth=0.3)
            ax.axvline(start, ymin=0, ymax=1, color="white", linewidth=0)  # keeps step boundaries crisp
            start += total
        ax.text(start + 0.2, lane, f"{start:.1f} s", va="center", fontsize=8)
    ax.set_yticks(range(len(results)), list(reversed(list(results))))
    ax.set_xlabel("training-loop time (s): each step drawn as generation / waiting on rewards / updates / other")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in colors.values()]
    ax.legend(handles, ["generation (baseline: incl. in-loop rewards)", "waiting on rewards", "actor updates", "other compute"],
              loc="upper center", bbox_to_anchor=(0.5, -0.35), ncol=4, fontsize=8, frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def run_mode(out: Path, assets: CPURunConfig, mode: str, steps: int, seed: int, latency: tuple[float, float],
             progress: bool) -> ModeResult:
    """One training run of ``mode``. Validation before step 1 absorbs the one-time warm-up (first
    generation: ~9 s here), so step times are steady-state and comparable between runs."""
    lo, hi = (0.0, 0.0) if mode == "zero_latency" else latency
    cfg = CPURunConfig(
        out_dir=str(out), trainer="v0", steps=steps, seed=seed, entry_module="verl_async_rm.main_ppo",
        model_dir=assets.model_dir, train_file=assets.train_file, val_file=assets.val_file,
        val_before_train=True, reward_path=toy_reward_path(), reward_name="compute_score_with_latency",
        reward_kwargs={"latency_lo": lo, "latency_hi": hi}, reward_manager="async_agent", timeout_s=1800,
        extra_overrides=[*SHAPE, *MODES[mode], "reward.async_agent.max_concurrency=64"],
    )
    result = run(cfg, progress=progress)
    if not result.ok:
        raise RuntimeError(f"the {mode} run failed (rc {result.returncode}); its log is in {out}")
    return summarize(mode, result)


def run_demo(out: Path, steps: int, latency: tuple[float, float], seed: int, modes: list[str], progress: bool) -> dict:
    assets = prepare_assets(CPURunConfig(out_dir=str(out / "assets"), seed=seed))
    results: dict[str, ModeResult] = {}
    for index, mode in enumerate(modes, 1):
        lo, hi = (0.0, 0.0) if mode == "zero_latency" else latency
        print(f"[{index}/{len(modes)}] {mode}: {steps} steps, reward latency {lo}-{hi} s", flush=True)
        results[mode] = run_mode(out / mode, assets, mode, steps, seed, latency, progress)
    rows = table(results)
    picture = out / "timeline.png"
    draw_timeline(results, picture)
    return {
        "command": " ".join(["python -m verl_async_rm.demo", *sys.argv[1:]]),
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count(), "platform": platform.platform()},
        "steps": steps, "latency_s": list(latency), "seed": seed,
        "table": rows,
        "runs": {m: {"step_times": r.step_times, "phases": r.phases, "blocked": r.blocked, "scores": r.scores} for m, r in results.items()},
        "timeline": str(picture),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m verl_async_rm.demo", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--latency-lo", type=float, default=0.05)
    parser.add_argument("--latency-hi", type=float, default=2.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--modes", default=",".join(DEFAULT_MODES), help=f"comma-separated subset of {list(MODES)}")
    parser.add_argument("--out", help="output folder (default: a new temp folder)")
    parser.add_argument("--json", help="also write the results JSON here")
    parser.add_argument("--quiet", action="store_true", help="no per-step progress lines")
    args = parser.parse_args(argv)
    if importlib.util.find_spec("matplotlib") is None:  # fail now, not after minutes of training
        parser.error("the demo draws its timeline with matplotlib: pip install 'verl-async-rm[demo]'")
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = set(modes) - set(MODES)
    if unknown or not {"baseline", "zero_latency"} <= set(modes):
        parser.error(f"--modes must name runs of {list(MODES)} and include baseline and zero_latency (got {modes})")
    out = Path(args.out or tempfile.mkdtemp(prefix="verl_async_rm_demo_"))
    out.mkdir(parents=True, exist_ok=True)
    started = time.time()
    report = run_demo(out, args.steps, (args.latency_lo, args.latency_hi), args.seed, modes, not args.quiet)
    report["wall_time_s"] = round(time.time() - started, 1)
    print()
    print_table(report["table"])
    (out / "demo.json").write_text(json.dumps(report, indent=2))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(report, indent=2))
    print(f"\nresults: {out / 'demo.json'}\ntimeline: {report['timeline']}\nwhole demo: {report['wall_time_s']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
