"""The demo: verl's real trainer on CPU, with a slow simulated reward, with and without the strategies.

Five runs on the same seed, model and data (the toy task), each ``--steps`` GRPO steps of
8 prompts x 4 samples, 4 PPO mini-batches per step, behind a simulated judge: by default latency
uniform in [lo, hi] seconds (a scaled analog of the recipe's 1-40 s), or ``--latency-model
lognormal`` (a heavy tail given by p50 and p99, optional hangs and failures):
- ``zero_latency``: the stock trainer with an instant reward, the bound (all waiting hidden);
- ``baseline``: the stock trainer (rewards scored in verl's agent loop through the async_agent manager);
- ``pipeline``, ``off_policy`` (one step), ``both``: the strategies (``both_k2``, two steps ahead,
  on request).
It prints a table (training-loop time, i.e. the sum of step times, so Ray start-up and the one-time
warm-up, absorbed by a validation pass before step 1, are left out; reduction vs the baseline;
hidden fraction = (T_base - T) / (T_base - T_zero); time blocked on rewards per step; final toy
reward), and writes it as JSON with a timeline picture (one lane per run: each step's phases, and
under them the judge calls in flight).

The runs start up together and train one at a time: every run waits at a start gate after its
validation pass (cpu_backend/start_gate.py) until the previous run has ended, so start-up (Ray and
a verl import in each worker process, most of a run's wall time here) overlaps while no measured
training loop shares the cores with another run. ``--parallel-startups`` caps how many start at once.
The model and data are built by the first run to reach its TaskRunner, after its verl imports
(cpu_backend/assets.py), so the runs start at once rather than after the demo imports torch itself.
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
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from verl_async_rm_rig.contestants import SHAPE, STOCK, STRATEGIES
from verl_async_rm_rig.cpu_backend.assets import read_built
from verl_async_rm_rig.cpu_backend.latency import MODELS as LATENCY_MODELS
from verl_async_rm_rig.cpu_backend.latency import JudgeModel
from verl_async_rm_rig.cpu_backend.launch import (
    CPURunConfig,
    RunningTrainer,
    RunResult,
    park_at_gates,
    run,
    toy_reward_path,
)
from verl_async_rm_rig.cpu_backend.shared_cluster import SharedCluster
from verl_async_rm_rig.cpu_backend.start_gate import passed_marker, read_step_clock
from verl_async_rm_rig.cpu_backend.toy_task import JUDGE_LOG_ENV

MODES: dict[str, list[str]] = {"zero_latency": [], STOCK: [], **STRATEGIES}
DEFAULT_MODES = ["zero_latency", "baseline", "pipeline", "off_policy", "both"]
DEFAULT_TRAINER = "v0"
# Phases drawn in the timeline, from verl's timing_s/* metrics (the rest of a step is "other").
PHASES = {"gen": "generation", "reward_wait": "waiting on rewards", "update_actor": "updates"}


@dataclass
class ModeResult:
    mode: str
    step_times: list[float]
    phases: dict[str, list[float]]
    blocked: list[float]
    scores: list[float]
    # judge calls of the training loop, (start, end) seconds from the loop's start (empty if unknown)
    judge_calls: list[tuple[float, float]] = field(default_factory=list)
    # wall-time breakdown of the run: startup (launch to waiting at the gate), gate_wait, train
    # (gate opened to the trainer's exit: the loop plus shutdown)
    wall: dict[str, float] = field(default_factory=dict)
    # each step's start, seconds from the loop's start (the gate), by the trainer's step clock
    # (cpu_backend/start_gate.py; empty where unknown): the steps drawn where they happened
    step_starts: list[float] = field(default_factory=list)

    @property
    def loop_time(self) -> float:
        """From the gate to the last step's end where the step clock is known (the time before step 1
        and between steps counts), else the sum of the step times."""
        if self.step_starts and len(self.step_starts) == len(self.step_times):
            return float(self.step_starts[-1] + self.step_times[-1])
        return float(sum(self.step_times))


def read_judge_calls(path: Path, loop_start: float) -> list[tuple[float, float]]:
    """The judge log's calls that ended after the loop started, as (start, end) seconds from it
    (validation's calls, before the gate, are left out; a call begun before it starts at 0)."""
    if not path.exists():
        return []
    calls = []
    for line in path.read_text().splitlines():
        try:
            call = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut by a killed writer
        if call["end"] > loop_start:
            calls.append((max(0.0, call["start"] - loop_start), call["end"] - loop_start))
    return sorted(calls)


def in_flight(calls: list[tuple[float, float]]) -> tuple[list[float], list[int]]:
    """The number of calls in flight as a step function: at times[i] it becomes counts[i]."""
    events = sorted([(s, 1) for s, _ in calls] + [(e, -1) for _, e in calls], key=lambda ev: (ev[0], ev[1]))
    times, counts, current = [0.0], [0], 0
    for t, delta in events:
        current += delta
        if times[-1] == t:
            counts[-1] = current
        else:
            times.append(t)
            counts.append(current)
    return times, counts


def summarize(mode: str, result: RunResult, judge_calls: list[tuple[float, float]] | None = None) -> ModeResult:
    def series(key: str) -> list[float]:
        return [float(v) for _, v in result.series(key)]

    step_times = series("timing_s/step")
    phases = {}
    for key in PHASES:
        values = dict(result.series(f"timing_s/{key}"))
        phases[key] = [float(values.get(step, 0.0)) for step in range(1, len(step_times) + 1)]
    return ModeResult(mode, step_times, phases, series("async_reward/blocked_s"), series("critic/score/mean"),
                      judge_calls=judge_calls or [])


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
    """One lane per run: its steps split into phases (bars), and under them the judge calls in flight
    (a filled curve, the same scale in every lane), so rewards overlapping generation and updates show."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"gen": "#d62728", "reward_wait": "#f2b701", "update_actor": "#1f77b4", "other": "#c7c7c7"}
    flight_color = "#2ca02c"
    peak = max([max(in_flight(r.judge_calls)[1]) for r in results.values() if r.judge_calls] or [0])
    fig, ax = plt.subplots(figsize=(12, 0.8 + 0.9 * len(results)))
    for lane, (mode, r) in enumerate(reversed(list(results.items()))):
        start = 0.0
        # where the step clock is known, each step where it happened (the judge calls are drawn at
        # their own times from the gate: a lane's set-up before step 1 must not shift them)
        placed = len(r.step_starts) == len(r.step_times)
        for step, total in enumerate(r.step_times):
            if placed:
                start = r.step_starts[step]
            cursor = start
            for key in ("gen", "reward_wait", "update_actor"):
                width = min(r.phases[key][step], start + total - cursor)
                if width > 0:
                    ax.barh(lane + 0.12, width, height=0.45, left=cursor, color=colors[key], edgecolor="white", linewidth=0.3)
                    cursor += width
            if start + total > cursor:
                ax.barh(lane + 0.12, start + total - cursor, height=0.45, left=cursor, color=colors["other"],
                        edgecolor="white", linewidth=0.3)
            start += total
        ax.text(start + 0.2, lane + 0.12, f"{start:.1f} s", va="center", fontsize=8)
        if peak and r.judge_calls:
            times, counts = in_flight(r.judge_calls)
            times, counts = [*times, start], [*counts, counts[-1]]
            base, scale = lane - 0.42, 0.3 / peak  # the band under the bars
            ax.fill_between(times, base, [base + c * scale for c in counts], step="post", color=flight_color,
                            alpha=0.6, linewidth=0)
    ax.set_yticks(range(len(results)), list(reversed(list(results))))
    ax.set_xlabel("training-loop time (s) from the start gate: each step drawn as generation / waiting on rewards / "
                  "updates / other")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in [*colors.values(), flight_color]]
    labels = ["generation (baseline: incl. in-loop rewards)", "waiting on rewards", "actor updates", "other compute",
              f"judge calls in flight (band height = {peak})"]
    fig.legend(handles, labels, loc="lower center", ncol=3, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.1 + 0.2 / len(results), 1, 1))  # room below the axis for the legend
    fig.savefig(path, dpi=120)
    plt.close(fig)


def uniform_judge(latency: tuple[float, float]) -> dict:
    return {"latency_lo": latency[0], "latency_hi": latency[1]}


def instant_judge(judge: dict) -> dict:
    """The zero_latency run's judge: the same model with no wait, no hang and no failure."""
    return {**judge, "latency_lo": 0.0, "latency_hi": 0.0, "latency_p50": 0.0, "latency_p99": 0.0,
            "hang_prob": 0.0, "fail_prob": 0.0}


# Ray starts idle workers per new cluster and driver that verl never uses (each ~1 CPU-s, 100 MB).
RAY_SETTINGS = {"RAY_prestart_worker_first_driver": "0"}
# verl's placement groups ask one (fake) GPU per run; Ray's logical CPUs per run as CPURunConfig's
RUN_RAY_CPUS = 8


def lane_config(out: Path, assets: CPURunConfig, mode: str, steps: int, seed: int, judge: dict,
                trainer: str = "v0", start_gate: bool = False, extra_overrides: list[str] = (),
                ray_address: str | None = None) -> CPURunConfig:
    """One training run of ``mode``. Validation before step 1 absorbs the one-time warm-up (first
    generation: ~9 s here), so step times are steady-state and comparable between runs. With
    ``ray_address`` the run is a job on that shared cluster (:func:`shared_cluster`), which carries
    :data:`RAY_SETTINGS`; otherwise it starts a cluster of its own with them."""
    JudgeModel.from_kwargs(judge)  # a bad judge fails here, not as failed rewards inside the run
    judge = instant_judge(judge) if mode == "zero_latency" else judge
    return CPURunConfig(
        out_dir=str(out), trainer=trainer, steps=steps, seed=seed, entry_module="verl_async_rm.main_ppo",
        model_dir=assets.model_dir, train_file=assets.train_file, val_file=assets.val_file, assets_dir=assets.assets_dir,
        val_before_train=True, reward_path=toy_reward_path(), reward_name="compute_score_with_latency",
        reward_kwargs=judge, reward_manager="async_agent", timeout_s=1800, start_gate=start_gate,
        light_driver=True,  # five drivers start together: ~6 CPU-s less each (cpu_backend/light_driver.py)
        extra_overrides=[*SHAPE, *MODES[mode], "reward.async_agent.max_concurrency=64", *extra_overrides],
        extra_env={JUDGE_LOG_ENV: str(Path(out).absolute() / "judge_calls.jsonl"),
                   **({} if ray_address else RAY_SETTINGS)},
        num_cpus=RUN_RAY_CPUS, ray_address=ray_address,
    )


def shared_cluster(n_runs: int) -> SharedCluster:
    """One Ray cluster for ``n_runs`` lanes starting together: one set of Ray's daemons instead of
    one a lane (~5 CPU-s each on a usual hour: shared_cluster.py)."""
    return SharedCluster(num_cpus=RUN_RAY_CPUS * n_runs, num_gpus=n_runs, ray_settings=RAY_SETTINGS)


def run_mode(out: Path, assets: CPURunConfig, mode: str, steps: int, seed: int, latency: tuple[float, float],
             progress: bool, *, trainer: str = "v0", judge: dict | None = None) -> ModeResult:
    """One training run of ``mode`` on its own (the benchmark's unit); ``judge`` (reward kwargs of
    cpu_backend/latency.py) replaces the uniform ``latency`` when given."""
    result = run(lane_config(out, assets, mode, steps, seed, judge or uniform_judge(latency), trainer), progress=progress)
    if not result.ok:
        raise RuntimeError(f"the {mode} run failed (rc {result.returncode}); its log is in {out}")
    return summarize(mode, result)


# One CPU run's processes (Ray's daemons, the trainer and ~6 workers), GiB, with ~20% margin: measured
# as the drop in available memory with five demo lanes at their gates, 1.88-1.94 GiB a lane on one
# shared cluster (``memory_per_run_at_gate_gib`` in demo.json), 2.2 with a Ray cluster each (their
# RSS sums read 2.7-3.8 GB: each process counts the shared torch/verl libraries again). The shared
# figure decides whether a 16 GB machine starts all five lanes at once or four and then one (a
# whole start-up more).
RUN_MEMORY_GB = {"shared": 2.3, "per_run": 2.7}
MEMORY_HEADROOM = 0.15  # of total memory left free: Ray's memory monitor kills workers above 95% use


def default_parallel_startups(n_runs: int, share_ray: bool = True) -> int:
    """As many runs at once as the free memory holds (all five on one shared cluster: ~11.5 GiB and
    15% of memory free), at least one."""
    import psutil

    memory = psutil.virtual_memory()
    spare_gb = (memory.available - MEMORY_HEADROOM * memory.total) / 2**30
    per_run = RUN_MEMORY_GB["shared" if share_ray else "per_run"]
    return max(1, min(n_runs, int(spare_gb / per_run)))


def _available_gib() -> float:
    import psutil

    return psutil.virtual_memory().available / 2**30


def rss_mb(procs: list) -> float:
    """Summed RSS of ``procs`` (psutil processes; those gone count nothing)."""
    import psutil

    total = 0
    for p in procs:
        try:
            total += p.memory_info().rss
        except psutil.Error:
            pass
    return total / 2**20


def _lane_say(mode: str, progress: bool):
    if not progress:
        return None
    return lambda line: print(f"  [{mode}] {line.removeprefix('[cpu-backend] ')}", file=sys.stderr, flush=True)


def run_lanes(out: Path, assets: CPURunConfig, modes: list[str], steps: int, seed: int, judge: dict, trainer: str,
              progress: bool, parallel_startups: int, poll_s: float = 0.2,
              extra_overrides: list[str] = (), share_ray: bool = True) -> dict[str, ModeResult]:
    """Start up to ``parallel_startups`` runs together (on one shared Ray cluster unless not
    ``share_ray``); once all of them wait at their start gates, let them train one at a time, in
    ``modes`` order, each after the previous one has ended (its processes gone)."""
    results: dict[str, ModeResult] = {}
    for first in range(0, len(modes), parallel_startups):
        group = modes[first:first + parallel_startups]
        lanes: dict[str, RunningTrainer] = {}
        available_before = _available_gib()
        cluster = shared_cluster(len(group)) if share_ray else None
        try:
            for mode in group:
                cfg = lane_config(out / mode, assets, mode, steps, seed, judge, trainer, start_gate=True,
                                  extra_overrides=extra_overrides, ray_address=cluster and cluster.address)
                lanes[mode] = RunningTrainer(cfg, say=_lane_say(mode, progress))
            print(f"starting {', '.join(group)} together (Ray, workers, validation)...", flush=True)
            park_at_gates(list(lanes.values()), poll_s)
            rss_at_gate = {mode: rss_mb(lane.processes()) for mode, lane in lanes.items()}
            # what a run really takes (RUN_MEMORY_GB is counted from it): RSS sums count the shared
            # torch/verl libraries once per process, the drop in available memory does not
            memory_per_run_gib = (available_before - _available_gib()) / len(group)
            for mode, lane in lanes.items():
                if lane.ended_s is not None:
                    lane.close()
                    raise RuntimeError(f"the {mode} run ended before training (rc {lane.result().returncode}); "
                                       f"its log is in {out / mode}")
            for mode, lane in lanes.items():
                print(f"[{modes.index(mode) + 1}/{len(modes)}] {mode}: started in {lane.gate_reached_s:.0f} s; "
                      f"training {steps} steps", flush=True)
                lane.open_gate()
                result = lane.wait(poll_s)
                if not result.ok:
                    raise RuntimeError(f"the {mode} run failed (rc {result.returncode}); its log is in {out / mode}")
                loop_start = float(passed_marker(lane.gate).read_text())
                mode_result = summarize(mode, result, read_judge_calls(out / mode / "judge_calls.jsonl", loop_start))
                starts = read_step_clock(lane.gate)  # v1's step clock: the loop from the gate, steps where they ran
                if len(starts) == len(mode_result.step_times):
                    mode_result.step_starts = [max(0.0, t - loop_start) for t in starts]
                mode_result.wall = {"startup_s": round(lane.gate_reached_s, 2),
                                    "gate_wait_s": round(lane.gate_opened_s - lane.gate_reached_s, 2),
                                    "train_s": round(lane.ended_s - lane.gate_opened_s, 2),
                                    "loop_s": round(mode_result.loop_time, 2),
                                    "rss_at_gate_mb": round(rss_at_gate[mode]),
                                    "memory_per_run_at_gate_gib": round(memory_per_run_gib, 2),
                                    # Unix times: the loop passed the gate; the trainer had ended (its processes gone)
                                    "loop_started_at": loop_start, "ended_at": time.time()}
                results[mode] = mode_result
        finally:
            for lane in lanes.values():
                lane.close()
            if cluster is not None:
                cluster.close()
    return results


def run_demo(out: Path, steps: int, latency: tuple[float, float], seed: int, modes: list[str], progress: bool,
             *, judge: dict | None = None, trainer: str = "v0", parallel_startups: int | None = None,
             request_timeout: float | None = None, share_ray: bool = True) -> dict:
    judge = judge or uniform_judge(latency)
    # The model and data are built by the first run to reach its TaskRunner (assets.py): the runs
    # start at once instead of after ~7 s (~45 s on a cold disk cache) of imports here.
    assets = CPURunConfig(out_dir=str(out / "assets"), seed=seed, assets_dir=str(out / "assets"))
    # A hung judge call answers only when the agent's request timeout cancels it (then it is retried,
    # hangs again, and after max_attempts the failure policy scores it).
    overrides = [f"reward.async_agent.request_timeout={request_timeout}"] if request_timeout else []
    parallel_startups = parallel_startups or default_parallel_startups(len(modes), share_ray)
    results = run_lanes(out, assets, modes, steps, seed, judge, trainer, progress, parallel_startups,
                        extra_overrides=overrides, share_ray=share_ray)
    built = read_built(assets.assets_dir, seed)
    rows = table(results)
    picture = out / "timeline.png"
    draw_timeline(results, picture)
    return {
        "command": " ".join(["python -m verl_async_rm_rig.demo", *sys.argv[1:]]),
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count(), "platform": platform.platform()},
        "steps": steps, "latency_s": list(latency), "judge": judge, "request_timeout_s": request_timeout,
        "trainer": trainer, "seed": seed,
        "table": rows,
        "runs": {m: {"step_times": r.step_times, "phases": r.phases, "blocked": r.blocked, "scores": r.scores,
                     "judge_calls": [[round(a, 3), round(b, 3)] for a, b in r.judge_calls], "wall": r.wall,
                     "step_starts": [round(t, 3) for t in r.step_starts]}
                 for m, r in results.items()},
        "wall_breakdown_s": {"assets_build": built["build_s"], "parallel_startups": parallel_startups},
        "assets_built_by": "the demo" if built["pid"] == os.getpid() else "a run's TaskRunner",
        "ray_clusters": "shared" if share_ray else "per_run",
        "timeline": str(picture),
    }


def results_from_report(report: dict) -> dict[str, ModeResult]:
    """The runs of a demo.json, as drawn (older reports, without judge calls or wall times, too)."""
    return {mode: ModeResult(mode, run_["step_times"], run_["phases"], run_["blocked"], run_["scores"],
                             [tuple(call) for call in run_.get("judge_calls", [])], run_.get("wall", {}),
                             run_.get("step_starts") or [])
            for mode, run_ in report["runs"].items()}


def redraw(report_path: Path) -> Path:
    """Draw ``timeline.png`` next to a demo.json from the JSON alone (no training)."""
    picture = report_path.parent / "timeline.png"
    draw_timeline(results_from_report(json.loads(report_path.read_text())), picture)
    return picture


def judge_from_args(args: argparse.Namespace) -> dict:
    if args.latency_model == "uniform":
        judge = {"latency_model": "uniform", "latency_lo": args.latency_lo, "latency_hi": args.latency_hi}
    else:
        judge = {"latency_model": "lognormal", "latency_p50": args.latency_p50, "latency_p99": args.latency_p99}
    judge.update(hang_prob=args.hang_prob, fail_prob=args.fail_prob)
    if args.hang_s is not None:
        judge["hang_s"] = args.hang_s
    JudgeModel.from_kwargs(judge)  # ValueError naming the bad parameter
    return judge


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m verl_async_rm_rig demo", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--trainer", choices=("v0", "v1"), default=DEFAULT_TRAINER,
                        help=f"verl's trainer (default {DEFAULT_TRAINER}; see README 'The demo')")
    judge = parser.add_argument_group("simulated judge (cpu_backend/latency.py)")
    judge.add_argument("--latency-model", choices=LATENCY_MODELS, default="uniform",
                       help="uniform in [lo, hi], or lognormal given by its p50 and p99")
    judge.add_argument("--latency-lo", type=float, default=0.05, help="uniform: seconds (default 0.05)")
    judge.add_argument("--latency-hi", type=float, default=2.0, help="uniform: seconds (default 2)")
    judge.add_argument("--latency-p50", type=float, default=0.3, help="lognormal: median seconds (default 0.3)")
    judge.add_argument("--latency-p99", type=float, default=3.0, help="lognormal: 99th percentile seconds (default 3)")
    judge.add_argument("--hang-prob", type=float, default=0.0, help="fraction of calls that never answer")
    judge.add_argument("--hang-s", type=float, default=None, help="how long a hung call sleeps (default 3600)")
    judge.add_argument("--fail-prob", type=float, default=0.0, help="fraction of calls that raise a judge error")
    judge.add_argument("--request-timeout", type=float, default=None,
                       help="the agent's per-call timeout in seconds (default: the agent's 120 s; "
                            "with --hang-prob, 3 x the latency tail)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--modes", default=",".join(DEFAULT_MODES), help=f"comma-separated subset of {list(MODES)}")
    parser.add_argument("--parallel-startups", type=int, default=None,
                        help=f"how many runs start up at once (default: as many as free memory holds, "
                             f"~{RUN_MEMORY_GB['shared']:g} GiB each, {RUN_MEMORY_GB['per_run']:g} with "
                             f"--ray-clusters per_run)")
    parser.add_argument("--ray-clusters", choices=("shared", "per_run"), default="shared",
                        help="runs starting together share one Ray cluster (default), or each starts its own")
    parser.add_argument("--out", help="output folder (default: a new temp folder)")
    parser.add_argument("--json", help="also write the results JSON here")
    parser.add_argument("--quiet", action="store_true", help="no per-step progress lines")
    parser.add_argument("--redraw", metavar="DEMO_JSON",
                        help="train nothing: draw timeline.png next to this demo.json from its data")
    args = parser.parse_args(argv)
    if importlib.util.find_spec("matplotlib") is None:  # fail now, not after minutes of training
        parser.error("the demo draws its timeline with matplotlib: pip install 'verl-async-rm[demo]'")
    if args.redraw:
        print(f"timeline: {redraw(Path(args.redraw))}")
        return 0
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = set(modes) - set(MODES)
    if unknown or not {"baseline", "zero_latency"} <= set(modes):
        parser.error(f"--modes must name runs of {list(MODES)} and include baseline and zero_latency (got {modes})")
    if args.parallel_startups is not None and args.parallel_startups < 1:
        parser.error("--parallel-startups must be at least 1")
    try:
        judge_kwargs = judge_from_args(args)
    except ValueError as exc:
        parser.error(f"simulated judge: {exc}")
    request_timeout = args.request_timeout
    if request_timeout is None and args.hang_prob > 0:
        tail = args.latency_hi if args.latency_model == "uniform" else args.latency_p99
        request_timeout = max(1.0, 3 * tail)
    out = Path(args.out or tempfile.mkdtemp(prefix="verl_async_rm_demo_"))
    out.mkdir(parents=True, exist_ok=True)
    started = time.time()
    report = run_demo(out, args.steps, (args.latency_lo, args.latency_hi), args.seed, modes, not args.quiet,
                      judge=judge_kwargs, trainer=args.trainer, parallel_startups=args.parallel_startups,
                      request_timeout=request_timeout, share_ray=args.ray_clusters == "shared")
    report["wall_time_s"] = round(time.time() - started, 1)
    print()
    print_table(report["table"])
    print_wall_breakdown(report)
    (out / "demo.json").write_text(json.dumps(report, indent=2))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(report, indent=2))
    print(f"\nresults: {out / 'demo.json'}\ntimeline: {report['timeline']}\nwhole demo: {report['wall_time_s']} s")
    return 0


def print_wall_breakdown(report: dict) -> None:
    print("\nwall time per run (s): start-up (together) | waiting for its turn | training + shut-down | loop")
    for mode, run_ in report["runs"].items():
        w = run_["wall"]
        if w:
            print(f"{mode:>14} | {w['startup_s']:8.1f} | {w['gate_wait_s']:8.1f} | {w['train_s']:8.1f} | {w['loop_s']:6.1f}")
    if "assets_built_by" in report:
        print(f"model and data built by {report['assets_built_by']} in {report['wall_breakdown_s']['assets_build']} s")


if __name__ == "__main__":
    sys.exit(main())
