"""The demo: verl's real trainer on CPU against a judge that behaves like a hosted one.

What stock verl, verl's own asynchronous mode and this project's recommended configuration do with
a judge's 429s, failures and stragglers. Each lane is the end-to-end benchmark's run of the same
name (the regimes and contestants are one module, ``verl_async_rm_rig/contestants.py``;
``bench/e2e.py --anchor`` measures them over seeds), ``--steps`` GRPO steps of verl's v1 trainer, 8
prompts x 4 samples a step, 4 PPO mini-batches, on the same seed, model, data and sampling draws:

- ``zero_latency``: stock ``sync`` with an instant judge, the bound (and the pace check below);
- ``sync``: verl's stock trainer (trainer mode ``sync``), rewards scored in verl's agent loop through
  this package's ``async_agent`` reward manager;
- ``colocate_async``: verl's ``trainer.v1.trainer_mode=colocate_async`` with verl's reward loop: its
  ``rate_limited`` manager given the judge's limits and timeout, verl's default 8 reward-loop workers;
- ``recommended``: ``contestants.RECOMMENDED`` (default ``colocate_async_agent``: the same command
  with ``reward.reward_manager.name=async_agent``).

Every lane but the bound meets ``judge_real``: its own loopback HTTP judge (``judge_server.py``, through
the real openai client) with a token bucket at 80% of the demand that answers 429 + Retry-After past
it, 5% HTTP 500s, 1% hangs and lognormal latency with p99 = C, the step compute. C is fixed
(``--compute``; the regime is defined in its units, as the benchmark's) and checked against the
bound's median step: a step more than 1.5x off C means another regime, and is reported.

It prints a table per lane (training-loop time from the start gate to the last step's end; the
reward wait exposed as the trainer timed it; judge requests per trained sample and 429s during the
loop as the judge saw them, failed calls as the reward function logged them; samples the updates
trained on a failed call's 0; the toy reward of the last 3 steps' responses), writes it as JSON and
draws a timeline (one lane per run: its steps' phases, the judge calls in flight, and each 429 and
failed call marked where it ended).

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
import signal
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Optional

import numpy as np

from verl_async_rm_rig.contestants import (
    ANCHOR_DECODE_S,
    MODES,
    PACE_TOLERANCE,
    RECOMMENDED,
    REGIMES,
    SAMPLES_PER_STEP,
    SHAPE,
    STOCK,
    STOCK_COMMAND,
    V1_POLL_S,
    VERL_COLOCATE,
    reward_function,
    reward_loop_overrides,
    reward_manager,
    start_judge_server,
    trainer_wait,
)
from verl_async_rm_rig.cpu_backend.assets import read_built
from verl_async_rm_rig.cpu_backend.launch import CPURunConfig, RunningTrainer, RunResult, park_at_gates, v1_trainer_mode
from verl_async_rm_rig.cpu_backend.names import PAIRED_DRAWS_ENV
from verl_async_rm_rig.cpu_backend.shared_cluster import SharedCluster
from verl_async_rm_rig.cpu_backend.start_gate import passed_marker, read_step_clock
from verl_async_rm_rig.cpu_backend.toy_task import JUDGE_LOG_ENV
from verl_async_rm_rig.run_figures import THROTTLED, dump_figures, judge_window, read_dumps, read_jsonl

TRAINER = "v1"  # verl's default trainer; colocate_async is one of its modes (v0 has none)
REGIME = "judge_real"  # what every lane but the bound meets
# C, the step compute judge_real is made of: the bound's median step on this project's 2-core machine
# with the lanes' decode time (bench/results/demo/demo.json's pace_check reads it against each run)
COMPUTE_S = 1.5
DEFAULT_STEPS = 8
FINAL_STEPS = 3  # the toy reward of the last 3 steps' batches
JUDGE_LOG, ROLLOUT_DUMPS = "judge_calls.jsonl", "rollouts"
# Phases drawn in the timeline, from verl's timing_s/* metrics (the rest of a step is "other").
PHASES = {"gen": "generation", "reward_wait": "waiting on rewards", "update_actor": "updates"}
# The stock trainer times no wait on rewards: they are scored inside its generation, whose timer
# (timing_s/gen) holds the wait; the other lanes' is contestants.trainer_wait's
STOCK_WAIT_KEY = "timing_s/gen"
WAIT_KEYS = ("timing_s/gen", "timing_s/reward_wait", "async_reward/blocked_s")


@dataclass(frozen=True)
class Lane:
    """One run of the demo: a contestant (``contestants.MODES``) meeting a judge (``contestants.REGIMES``)."""

    name: str
    regime: str
    mode: str
    what: str = ""

    @property
    def reward_manager(self) -> str:
        return reward_manager(self.mode)

    @property
    def reward_workers(self) -> int:
        """verl's reward-loop worker processes: verl's default for a mode run as a verl user's
        command, else the CPU backend's one."""
        return STOCK_COMMAND.get(self.mode, 1)

    @property
    def trainer_mode(self) -> str:
        return v1_trainer_mode(MODES[self.mode])


LANES: dict[str, Lane] = {lane.name: lane for lane in [
    Lane("zero_latency", "zero", STOCK, "the bound: stock sync, instant judge"),
    Lane("sync", REGIME, STOCK, "verl's stock trainer (sync)"),
    Lane("colocate_async", REGIME, VERL_COLOCATE, "verl's colocate_async, verl's reward loop"),
    Lane("recommended", REGIME, RECOMMENDED, f"recommended: {RECOMMENDED}"),
]}
DEFAULT_LANES = list(LANES)
BOUND = "zero_latency"


def lane_of(spec: str) -> Lane:
    """A lane of :data:`LANES` by name, or any contestant as ``MODE`` (meeting :data:`REGIME`) or
    ``MODE@REGIME`` (e.g. ``both@tail_1x``)."""
    if spec in LANES:
        return LANES[spec]
    mode, _, regime = spec.partition("@")
    regime = regime or REGIME
    if mode not in MODES or regime not in REGIMES:
        raise ValueError(f"{spec!r}: a lane of {list(LANES)}, or MODE[@REGIME] with a mode of {list(MODES)} "
                         f"and a regime of {list(REGIMES)}")
    return Lane(spec, regime, mode, f"{mode}, {regime}")


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
    # the loop's judge calls that did not answer, (end, "429" or "failed"), seconds from the loop's
    # start: marked on the timeline, so a reader sees where each lane met them
    judge_marks: list[tuple[float, str]] = field(default_factory=list)

    @property
    def loop_time(self) -> float:
        """From the gate to the last step's end where the step clock is known (the time before step 1
        and between steps counts), else the sum of the step times."""
        if self.step_starts and len(self.step_starts) == len(self.step_times):
            return float(self.step_starts[-1] + self.step_times[-1])
        return float(sum(self.step_times))


def read_judge_log(path: Path, loop_start: float) -> list[tuple[float, float, str]]:
    """The judge log's calls that ended after the loop started, as (start, end, outcome) with times in
    seconds from it (validation's calls, before the gate, are left out; a call begun before it starts
    at 0)."""
    calls = []
    for call in read_jsonl(path):
        if "end" in call and call["end"] > loop_start:
            calls.append((max(0.0, call["start"] - loop_start), call["end"] - loop_start, str(call.get("outcome", "ok"))))
    return sorted(calls)


def read_judge_calls(path: Path, loop_start: float) -> list[tuple[float, float]]:
    """The judge log's calls during the loop, as (start, end) seconds from its start."""
    return [(start, end) for start, end, _ in read_judge_log(path, loop_start)]


def judge_marks(calls: list[tuple[float, float, str]]) -> list[tuple[float, str]]:
    """Where the calls that did not answer ended: ``429`` for a refusal by the judge's rate limit,
    ``failed`` for any other (an HTTP 500, a timeout, a hang the caller cancelled, a simulated failure)."""
    return [(end, "429" if outcome in THROTTLED else "failed") for _, end, outcome in calls if outcome != "ok"]


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


# ------------------------------------------------------------------------------------------------
# a lane's run
# ------------------------------------------------------------------------------------------------

def lane_settings(lane: Lane, compute_s: float, seed: int) -> dict:
    """What decides what ``lane`` runs: its judge (for judge_real, its server's settings) and the
    overrides on top of the CPU backend's (the benchmark's, bench/e2e.py run_settings, but for the
    benchmark's own validation sampling), and its reward manager."""
    regime = REGIMES[lane.regime]
    return {"judge": regime.judge(compute_s, seed),
            "overrides": [*SHAPE, *MODES[lane.mode], *reward_loop_overrides(regime, lane.mode, compute_s)],
            "reward_manager": lane.reward_manager}


# Ray starts idle workers per new cluster and driver that verl never uses (each ~1 CPU-s, 100 MB).
RAY_SETTINGS = {"RAY_prestart_worker_first_driver": "0"}
# verl's placement groups ask one (fake) GPU per run; Ray's logical CPUs per run as CPURunConfig's
RUN_RAY_CPUS = 8


def lane_config(out: Path, assets: CPURunConfig, lane: Lane, steps: int, seed: int, compute_s: float, *,
                base_url: Optional[str] = None, start_gate: bool = False, ray_address: Optional[str] = None,
                decode_s: float = ANCHOR_DECODE_S, trainer: str = TRAINER) -> CPURunConfig:
    """One training run of ``lane`` (its judge server, for judge_real, at ``base_url``). Validation
    before step 1 absorbs the one-time warm-up (first generation), so step times are steady-state and
    comparable between runs. With ``ray_address`` the run is a job on that shared cluster
    (:func:`shared_cluster`), which carries :data:`RAY_SETTINGS`; otherwise it starts a cluster of its
    own with them. ``trainer``: v0 runs the lanes of its modes (bench/startup_profile.py profiles both)."""
    settings = lane_settings(lane, compute_s, seed)
    run_dir = Path(out).absolute()
    env = {JUDGE_LOG_ENV: str(run_dir / JUDGE_LOG),
           # every lane samples the same random numbers for the same prompt, as the benchmark's runs
           PAIRED_DRAWS_ENV: "1",
           **({} if ray_address else RAY_SETTINGS)}
    return CPURunConfig(
        out_dir=str(out), trainer=trainer, steps=steps, seed=seed, entry_module="verl_async_rm.main_ppo",
        model_dir=assets.model_dir, train_file=assets.train_file, val_file=assets.val_file, assets_dir=assets.assets_dir,
        val_before_train=True, **reward_function(settings["judge"], base_url), reward_manager=settings["reward_manager"],
        timeout_s=1800, start_gate=start_gate, v1_poll_interval_s=V1_POLL_S, decode_s=decode_s,
        light_driver=True,  # the lanes' drivers start together: ~6 CPU-s less each (cpu_backend/light_driver.py)
        # verl's dump of what each step trained on: the samples trained on a failed call's 0, the toy reward
        extra_overrides=[f"trainer.rollout_data_dir={run_dir / ROLLOUT_DUMPS}", *settings["overrides"]],
        extra_env=env, num_cpus=RUN_RAY_CPUS, ray_address=ray_address,
    )


@dataclass
class StartedLane:
    """A lane's trainer, started, and its own judge server (judge_real; None for a simulated judge),
    which runs from before the trainer's start-up (its validation calls the judge) to the lane's end."""

    lane: Lane
    trainer: RunningTrainer
    server: object
    settings: dict

    def close(self) -> None:
        try:
            self.trainer.close()
        finally:
            if self.server is not None:
                self.server.close()
                self.server = None


def start_lane(out: Path, assets: CPURunConfig, lane: Lane, steps: int, seed: int, compute_s: float, *,
               ray_address: Optional[str] = None, decode_s: float = ANCHOR_DECODE_S, trainer: str = TRAINER,
               say=None) -> StartedLane:
    """Start ``lane``'s judge server (judge_real) and its trainer, which waits at its start gate."""
    settings = lane_settings(lane, compute_s, seed)
    server = start_judge_server(settings["judge"])
    try:
        cfg = lane_config(out, assets, lane, steps, seed, compute_s, base_url=server.base_url if server else None,
                          start_gate=True, ray_address=ray_address, decode_s=decode_s, trainer=trainer)
        return StartedLane(lane, RunningTrainer(cfg, say=say), server, settings)
    except BaseException:
        if server is not None:
            server.close()
        raise


def lane_figures(started: StartedLane, result: RunResult, timeline: ModeResult, loop_start: float, steps: int) -> dict:
    """What a lane's files and judge say beyond its timeline: the trainer-timed wait, the judge's view
    of the loop (judge_real), and what verl's rollout dump says it trained on."""
    extra = {key: [float(v) for _, v in result.series(key)] for key in WAIT_KEYS}
    if started.lane.mode == STOCK:
        key, values = STOCK_WAIT_KEY, extra[STOCK_WAIT_KEY]
        wait = (key, float(sum(values)) if values else None)
    else:
        wait = trainer_wait(started.lane.mode, extra)
    out_dir = Path(started.trainer.cfg.out_dir)
    figures = {"trainer_wait_key": wait[0], "trainer_wait_s": wait[1],
               "gen_s": float(sum(extra["timing_s/gen"])) if extra["timing_s/gen"] else None,
               "judge_server": None,
               "dumps": dump_figures(read_dumps(out_dir / ROLLOUT_DUMPS), {}, read_jsonl(out_dir / JUDGE_LOG), FINAL_STEPS)}
    if started.server is not None:
        stats = started.server.stats()
        # the server stamps arrivals with this process's monotonic clock; the gate with Unix time
        start = loop_start - (time.time() - time.monotonic())
        server = started.settings["judge"]["server"]
        figures["judge_server"] = judge_window(((r.arrived, r.outcome, r.finished) for r in stats.records), start,
                                               start + timeline.loop_time, server["bucket_capacity"],
                                               server["bucket_refill_per_s"], steps * SAMPLES_PER_STEP)
    return figures


@dataclass
class LaneRun:
    lane: Lane
    timeline: ModeResult
    figures: dict


# ------------------------------------------------------------------------------------------------
# the table
# ------------------------------------------------------------------------------------------------

def exposed_wait(figures: dict, bound_gen_s: Optional[float]) -> Optional[float]:
    """The reward wait the trainer timed, in seconds over the loop. A wait on rewards alone (this
    package's strategies' timers) is the figure; a generation timer (``timing_s/gen``: the stock
    trainer's rewards are scored inside generation, verl's colocate_async times its wait for finished
    groups) holds generation too, so the bound's generation time (stock, instant judge) is taken off,
    at least 0 (the benchmark's same-mode bounds measure it per mode: bench/e2e.py --anchor)."""
    wait = figures.get("trainer_wait_s")
    if wait is None:
        return None
    if figures.get("trainer_wait_key") != "timing_s/gen":
        return wait
    return None if bound_gen_s is None else max(0.0, wait - bound_gen_s)


def table(runs: dict[str, LaneRun]) -> list[dict]:
    bound = runs.get(BOUND)
    bound_gen = bound.figures.get("gen_s") if bound else None
    rows = []
    for name, run_ in runs.items():
        lane, timeline, figures = run_.lane, run_.timeline, run_.figures
        judge = figures.get("judge_server") or {}
        dumps = figures.get("dumps") or {}
        failed = sum(1 for _, kind in timeline.judge_marks if kind == "failed")
        true_reward = dumps.get("toy_final_true")
        exposed = exposed_wait(figures, bound_gen)
        rows.append({
            "lane": name, "regime": lane.regime, "mode": lane.mode, "trainer_mode": lane.trainer_mode,
            "reward_manager": lane.reward_manager, "reward_workers": lane.reward_workers,
            "loop_time_s": round(timeline.loop_time, 2),
            "reward_wait_exposed_s": None if exposed is None else round(exposed, 2),
            "trainer_wait_key": figures.get("trainer_wait_key"),
            "judge_requests_per_sample": None if not judge else round(judge["requests_per_trained_sample"], 2),
            "judge_429s": judge.get("throttled"),
            # the caller's view (its judge log): 500s, timeouts, hangs cancelled, during the loop
            "judge_failed_calls": failed if timeline.judge_calls else None,
            "trained_failed_zero": dumps.get("failed_scored_zero"),
            # the toy task's own score of the responses the last steps trained on (no judge failure
            # bends it), else the judged batch reward
            "final_toy_reward": round(true_reward if true_reward is not None else float(np.mean(timeline.scores[-FINAL_STEPS:])), 3)
            if (true_reward is not None or timeline.scores) else None,
        })
    return rows


COLUMNS = [("lane", "lane", 15), ("trainer_mode", "trainer mode", 14), ("reward_manager", "reward manager", 14),
           ("loop_time_s", "loop s", 7), ("reward_wait_exposed_s", "wait exposed s", 14),
           ("judge_requests_per_sample", "requests/sample", 15), ("judge_429s", "429s", 5),
           ("judge_failed_calls", "failed calls", 12), ("trained_failed_zero", "trained on failed 0", 19),
           ("final_toy_reward", "toy reward", 10)]


def print_table(rows: list[dict]) -> None:
    print(" | ".join(f"{title:>{width}}" for _, title, width in COLUMNS))
    for row in rows:
        print(" | ".join(f"{'-' if row.get(key) is None else row[key]!s:>{width}}" for key, _, width in COLUMNS))


def _cell(value, fmt) -> str:
    return "—" if value is None else fmt(value)


def markdown_table(rows: list[dict]) -> str:
    """The README's demo table, generated from demo.json's rows (a test checks the README quotes it)."""
    if rows and "lane" not in rows[0]:
        return _markdown_table_before_lanes(rows)
    lines = ["| run | trainer mode, reward manager | loop time | reward wait exposed (trainer-timed) "
             "| judge requests per trained sample | 429s | failed judge calls | samples trained on a failed call's 0 "
             "| toy reward, last 3 steps |",
             "|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        lane = LANES.get(row["lane"])
        what = lane.what if lane and lane.mode == row["mode"] else f"{row['mode']}, {row['regime']}"
        workers = f" ({row['reward_workers']} reward-loop workers)" if row["reward_workers"] > 1 else ""
        lines.append(f"| `{row['lane']}`: {what} | {row['trainer_mode']}, `{row['reward_manager']}`{workers} "
                     f"| {row['loop_time_s']:.1f} s | {_cell(row['reward_wait_exposed_s'], lambda v: f'{v:.1f} s')} "
                     f"| {_cell(row['judge_requests_per_sample'], lambda v: f'{v:.2f}')} | {_cell(row['judge_429s'], str)} "
                     f"| {_cell(row['judge_failed_calls'], str)} | {_cell(row['trained_failed_zero'], str)} "
                     f"| {_cell(row['final_toy_reward'], lambda v: f'{v:.3f}')} |")
    return "\n".join(lines) + "\n"


def _markdown_table_before_lanes(rows: list[dict]) -> str:
    """A demo.json from before the lanes (the strategies behind a simulated judge), as it was quoted."""
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


def pace_check(runs: dict[str, LaneRun], compute_s: float, tolerance: float = PACE_TOLERANCE) -> Optional[dict]:
    """The bound's median step (stock, instant judge) against the C the judges were made of, as the
    benchmark checks each group's: more than ``tolerance`` x off, the lanes met another regime than
    the named one. None without the bound."""
    bound = runs.get(BOUND)
    if bound is None or not bound.timeline.step_times:
        return None
    measured = round(float(np.median(bound.timeline.step_times)), 3)
    ratio = measured / compute_s
    return {"compute_s": compute_s, "measured_step_s": measured, "ratio": round(ratio, 3),
            "off": not 1 / tolerance <= ratio <= tolerance, "tolerance": tolerance}


# ------------------------------------------------------------------------------------------------
# the timeline
# ------------------------------------------------------------------------------------------------

MARKS = {"429": {"marker": "v", "color": "#d62728", "label": "429 (the judge's rate limit)"},
         "failed": {"marker": "x", "color": "#000000", "label": "failed call (HTTP 500, timeout, hang)"}}


def timeline_marks(results: dict[str, ModeResult]) -> list[tuple[str, list[float], int]]:
    """What :func:`draw_timeline` marks: per run and kind (``429``, ``failed``) with any, the times its
    calls that did not answer ended and the run's row (rows bottom-up: the first run is drawn on top)."""
    rows = len(results)
    marks = []
    for index, r in enumerate(results.values()):
        for kind in MARKS:
            ends = [t for t, k in r.judge_marks if k == kind]
            if ends:
                marks.append((kind, ends, rows - 1 - index))
    return marks


def draw_timeline(results: dict[str, ModeResult], path: Path) -> None:
    """One lane per run: its steps split into phases (bars), under them the judge calls in flight (a
    filled curve, the same scale in every lane), so rewards overlapping generation and updates show,
    and under that each call that did not answer, marked where it ended (a 429, or a failure)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"gen": "#d62728", "reward_wait": "#f2b701", "update_actor": "#1f77b4", "other": "#c7c7c7"}
    flight_color = "#2ca02c"
    peak = max([max(in_flight(r.judge_calls)[1]) for r in results.values() if r.judge_calls] or [0])
    fig, ax = plt.subplots(figsize=(12, 0.8 + 1.0 * len(results)))
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
                    ax.barh(lane + 0.15, width, height=0.4, left=cursor, color=colors[key], edgecolor="white", linewidth=0.3)
                    cursor += width
            if start + total > cursor:
                ax.barh(lane + 0.15, start + total - cursor, height=0.4, left=cursor, color=colors["other"],
                        edgecolor="white", linewidth=0.3)
            start += total
        ax.text(start + 0.2, lane + 0.15, f"{start:.1f} s", va="center", fontsize=8)
        if peak and r.judge_calls:
            times, counts = in_flight(r.judge_calls)
            times, counts = [*times, start], [*counts, counts[-1]]
            base, scale = lane - 0.33, 0.26 / peak  # the band under the bars
            ax.fill_between(times, base, [base + c * scale for c in counts], step="post", color=flight_color,
                            alpha=0.6, linewidth=0)
    for kind, ends, row in timeline_marks(results):  # the row under the band: where each call that did not answer ended
        style = MARKS[kind]
        ax.scatter(ends, [row - 0.42] * len(ends), s=14, marker=style["marker"], color=style["color"], linewidths=0.8,
                   zorder=3)
    ax.set_ylim(-0.6, len(results) - 0.4)
    ax.set_yticks(range(len(results)), list(reversed(list(results))))
    ax.set_xlabel("training-loop time (s) from the start gate: each step drawn as generation / waiting on rewards / "
                  "updates / other")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in [*colors.values(), flight_color]]
    labels = ["generation (sync: with its rewards; colocate_async: waiting for finished groups)", "waiting on rewards",
              "actor updates", "other compute", f"judge calls in flight (band height = {peak})"]
    marks = [kind for kind in MARKS if any(k == kind for k, _, _ in timeline_marks(results))]
    handles += [plt.Line2D([], [], linestyle="", marker=MARKS[k]["marker"], color=MARKS[k]["color"]) for k in marks]
    labels += [MARKS[k]["label"] for k in marks]
    fig.legend(handles, labels, loc="lower center", ncol=3, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.12 + 0.2 / len(results), 1, 1))  # room below the axis for the legend
    fig.savefig(path, dpi=120)
    plt.close(fig)


# ------------------------------------------------------------------------------------------------
# running the lanes
# ------------------------------------------------------------------------------------------------

# One CPU run's processes (Ray's daemons, the trainer and ~6 workers), GiB, with ~20% margin: measured
# as the drop in available memory with five demo lanes at their gates, 1.88-1.94 GiB a lane on one
# shared cluster (``memory_per_run_at_gate_gib`` in demo.json), 2.2 with a Ray cluster each (their
# RSS sums read 2.7-3.8 GB: each process counts the shared torch/verl libraries again). The shared
# figure decides whether a 16 GB machine starts all the lanes at once or in two groups (a whole
# start-up more).
RUN_MEMORY_GB = {"shared": 2.3, "per_run": 2.7}
MEMORY_HEADROOM = 0.15  # of total memory left free: Ray's memory monitor kills workers above 95% use
# One run's memory beyond a standard run's: verl's reward loop at its default size starts 7 more
# reward-loop worker processes, each with verl imported (an estimate from a verl process's resident
# set, not measured per worker: it only sizes how many runs start up at once).
REWARD_LOOP_WORKER_GB = 0.35


def default_parallel_startups(n_runs: int, share_ray: bool = True) -> int:
    """As many standard runs at once as the free memory holds (five on one shared cluster: ~11.5 GiB
    and 15% of memory free), at least one."""
    import psutil

    memory = psutil.virtual_memory()
    spare_gb = (memory.available - MEMORY_HEADROOM * memory.total) / 2**30
    per_run = RUN_MEMORY_GB["shared" if share_ray else "per_run"]
    return max(1, min(n_runs, int(spare_gb / per_run)))


def lane_weight(lane: Lane, share_ray: bool = True) -> float:
    """A lane's memory in standard runs: one with verl's reward loop at its default size weighs more."""
    return 1 + (lane.reward_workers - 1) * REWARD_LOOP_WORKER_GB / RUN_MEMORY_GB["shared" if share_ray else "per_run"]


def startup_groups(lanes: list[Lane], parallel_startups: Optional[int] = None, share_ray: bool = True) -> list[list[Lane]]:
    """The lanes, in order, cut into groups that start up together: ``parallel_startups`` at a time if
    given, else as many as the free memory holds (each lane by :func:`lane_weight`; a group of one at
    least)."""
    if parallel_startups:
        return [lanes[i:i + parallel_startups] for i in range(0, len(lanes), parallel_startups)]
    weights = [lane_weight(lane, share_ray) for lane in lanes]
    budget = default_parallel_startups(int(np.ceil(sum(weights))), share_ray)  # standard runs that fit
    groups: list[list[Lane]] = []
    used = 0.0
    for lane, weight in zip(lanes, weights):
        if not groups or used + weight > budget:
            groups.append([])
            used = 0.0
        groups[-1].append(lane)
        used += weight
    return groups


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


def _lane_say(name: str, progress: bool):
    if not progress:
        return None
    return lambda line: print(f"  [{name}] {line.removeprefix('[cpu-backend] ')}", file=sys.stderr, flush=True)


def shared_cluster(n_runs: int) -> SharedCluster:
    """One Ray cluster for ``n_runs`` lanes starting together: one set of Ray's daemons instead of
    one a lane (~5 CPU-s each on a usual hour: shared_cluster.py)."""
    return SharedCluster(num_cpus=RUN_RAY_CPUS * n_runs, num_gpus=n_runs, ray_settings=RAY_SETTINGS)


def run_lanes(out: Path, assets: CPURunConfig, groups: list[list[Lane]], steps: int, seed: int, compute_s: float,
              progress: bool, poll_s: float = 0.2, share_ray: bool = True,
              decode_s: float = ANCHOR_DECODE_S) -> dict[str, LaneRun]:
    """Start each group's lanes together (on one shared Ray cluster unless not ``share_ray``), each
    with its own judge server; once all of them wait at their start gates, let them train one at a
    time, in order, each after the previous one has ended (its processes gone); then the next group."""
    runs: dict[str, LaneRun] = {}
    names = [lane.name for group in groups for lane in group]
    for group in groups:
        started: dict[str, StartedLane] = {}
        available_before = _available_gib()
        cluster = shared_cluster(len(group)) if share_ray else None
        try:
            for lane in group:
                started[lane.name] = start_lane(out / lane.name, assets, lane, steps, seed, compute_s,
                                                ray_address=cluster and cluster.address, decode_s=decode_s,
                                                say=_lane_say(lane.name, progress))
            print(f"starting {', '.join(started)} together (Ray, workers, validation)...", flush=True)
            park_at_gates([s.trainer for s in started.values()], poll_s)
            rss_at_gate = {name: rss_mb(s.trainer.processes()) for name, s in started.items()}
            # what a run really takes (RUN_MEMORY_GB is counted from it): RSS sums count the shared
            # torch/verl libraries once per process, the drop in available memory does not
            memory_per_run_gib = (available_before - _available_gib()) / len(group)
            for name, s in started.items():
                if s.trainer.ended_s is not None:
                    raise RuntimeError(f"the {name} run ended before training (rc {s.trainer.result().returncode}); "
                                       f"its log is in {out / name}")
            for name, s in started.items():
                trainer = s.trainer
                print(f"[{names.index(name) + 1}/{len(names)}] {name}: started in {trainer.gate_reached_s:.0f} s; "
                      f"training {steps} steps", flush=True)
                trainer.open_gate()
                result = trainer.wait(poll_s)
                if not result.ok:
                    raise RuntimeError(f"the {name} run failed (rc {result.returncode}); its log is in {out / name}")
                loop_start = float(passed_marker(trainer.gate).read_text())
                calls = read_judge_log(out / name / JUDGE_LOG, loop_start)
                timeline = summarize(name, result, [(a, b) for a, b, _ in calls])
                timeline.judge_marks = judge_marks(calls)
                starts = read_step_clock(trainer.gate)  # v1's step clock: the loop from the gate, steps where they ran
                if len(starts) == len(timeline.step_times):
                    timeline.step_starts = [max(0.0, t - loop_start) for t in starts]
                timeline.wall = {"startup_s": round(trainer.gate_reached_s, 2),
                                 "gate_wait_s": round(trainer.gate_opened_s - trainer.gate_reached_s, 2),
                                 "train_s": round(trainer.ended_s - trainer.gate_opened_s, 2),
                                 "loop_s": round(timeline.loop_time, 2),
                                 "rss_at_gate_mb": round(rss_at_gate[name]),
                                 "memory_per_run_at_gate_gib": round(memory_per_run_gib, 2),
                                 # Unix times: the loop passed the gate; the trainer had ended (its processes gone)
                                 "loop_started_at": loop_start, "ended_at": time.time()}
                runs[name] = LaneRun(s.lane, timeline, lane_figures(s, result, timeline, loop_start, steps))
                s.close()  # its judge server's figures are read: free its port and thread now
                row = table({name: runs[name]})[0]
                print(f"  {name}: loop {timeline.loop_time:.1f} s, 429s {_cell(row['judge_429s'], str)}, failed calls "
                      f"{_cell(row['judge_failed_calls'], str)}, trained on a failed call's 0: "
                      f"{_cell(row['trained_failed_zero'], str)}", flush=True)
        finally:
            for s in started.values():
                s.close()
            if cluster is not None:
                cluster.close()
    return runs


def lane_definitions(lanes: list[Lane], compute_s: float, seed: int) -> dict:
    """What each lane ran, as the JSON records it."""
    return {lane.name: {"regime": lane.regime, "mode": lane.mode, "what": lane.what, "trainer_mode": lane.trainer_mode,
                        "reward_manager": lane.reward_manager, "reward_workers": lane.reward_workers,
                        **{k: v for k, v in lane_settings(lane, compute_s, seed).items() if k != "reward_manager"}}
            for lane in lanes}


def command_line(args: list[str]) -> str:
    """The command that ran the demo with ``args`` (its own, after ``demo``), as its JSON records it."""
    return " ".join(["python -m verl_async_rm_rig demo", *args])


def run_demo(out: Path, steps: int, seed: int, lanes: list[Lane], progress: bool, *, compute_s: float = COMPUTE_S,
             decode_s: float = ANCHOR_DECODE_S, parallel_startups: Optional[int] = None, share_ray: bool = True,
             command: str = "") -> dict:
    # The model and data are built by the first run to reach its TaskRunner (assets.py): the runs
    # start at once instead of after ~7 s (~45 s on a cold disk cache) of imports here.
    assets = CPURunConfig(out_dir=str(out / "assets"), seed=seed, assets_dir=str(out / "assets"))
    groups = startup_groups(lanes, parallel_startups, share_ray)
    runs = run_lanes(out, assets, groups, steps, seed, compute_s, progress, share_ray=share_ray, decode_s=decode_s)
    built = read_built(assets.assets_dir, seed)
    picture = out / "timeline.png"
    draw_timeline({name: r.timeline for name, r in runs.items()}, picture)
    regimes = sorted({lane.regime for lane in lanes}, key=list(REGIMES).index)
    return {
        "command": command,
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count(), "platform": platform.platform()},
        "steps": steps, "seed": seed, "trainer": TRAINER, "compute_s": compute_s, "decode_s_per_token": decode_s,
        "recommended": RECOMMENDED,
        "regimes": {name: {**asdict(REGIMES[name]), "described": REGIMES[name].describe()} for name in regimes},
        "lanes": lane_definitions(lanes, compute_s, seed),
        "table": table(runs),
        "pace_check": pace_check(runs, compute_s),
        "runs": run_records(runs),
        "wall_breakdown_s": {"assets_build": built["build_s"], "startup_groups": [[lane.name for lane in g] for g in groups]},
        "assets_built_by": "the demo" if built["pid"] == os.getpid() else "a run's TaskRunner",
        "ray_clusters": "shared" if share_ray else "per_run",
        "timeline": str(picture),
    }


def run_records(runs: dict[str, LaneRun]) -> dict[str, dict]:
    """The lanes' runs as demo.json records them: what :func:`results_from_report` draws again, and
    each lane's figures."""
    return {name: {"step_times": r.timeline.step_times, "phases": r.timeline.phases, "blocked": r.timeline.blocked,
                   "scores": r.timeline.scores,
                   "judge_calls": [[round(a, 3), round(b, 3)] for a, b in r.timeline.judge_calls],
                   "judge_marks": [[round(t, 3), kind] for t, kind in r.timeline.judge_marks],
                   "wall": r.timeline.wall, "step_starts": [round(t, 3) for t in r.timeline.step_starts],
                   **r.figures}
            for name, r in runs.items()}


def results_from_report(report: dict) -> dict[str, ModeResult]:
    """The runs of a demo.json, as drawn (older reports, without judge calls, marks or wall times, too)."""
    return {name: ModeResult(name, run_["step_times"], run_["phases"], run_["blocked"], run_["scores"],
                             [tuple(call) for call in run_.get("judge_calls", [])], run_.get("wall", {}),
                             run_.get("step_starts") or [], [(t, kind) for t, kind in run_.get("judge_marks", [])])
            for name, run_ in report["runs"].items()}


def redraw(report_path: Path) -> Path:
    """Draw ``timeline.png`` next to a demo.json from the JSON alone (no training)."""
    picture = report_path.parent / "timeline.png"
    draw_timeline(results_from_report(json.loads(report_path.read_text())), picture)
    return picture


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m verl_async_rm_rig demo", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=DEFAULT_STEPS, help=f"GRPO steps per lane (default {DEFAULT_STEPS})")
    parser.add_argument("--lanes", default=",".join(DEFAULT_LANES),
                        help=f"comma-separated, trained in this order: of {DEFAULT_LANES}, or any contestant as MODE "
                             f"(meeting {REGIME}) or MODE@REGIME (e.g. both@tail_1x); default all four")
    parser.add_argument("--compute", type=float, default=COMPUTE_S,
                        help=f"C, the step compute the judge is made of, seconds (default {COMPUTE_S}; checked against "
                             f"the bound's median step, {PACE_TOLERANCE}x)")
    parser.add_argument("--decode-s", type=float, default=ANCHOR_DECODE_S,
                        help=f"simulated decode seconds per generated token (default {ANCHOR_DECODE_S}, the benchmark's "
                             f"anchor runs': generation still running when colocate_async samples)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--parallel-startups", type=int, default=None,
                        help=f"how many runs start up at once (default: as many as free memory holds, "
                             f"~{RUN_MEMORY_GB['shared']:g} GiB each, {RUN_MEMORY_GB['per_run']:g} with "
                             f"--ray-clusters per_run, {REWARD_LOOP_WORKER_GB:g} more per extra reward-loop worker)")
    parser.add_argument("--ray-clusters", choices=("shared", "per_run"), default="shared",
                        help="runs starting together share one Ray cluster (default), or each starts its own")
    parser.add_argument("--out", help="output folder (default: a new temp folder)")
    parser.add_argument("--json", help="also write the results JSON here")
    parser.add_argument("--quiet", action="store_true", help="no per-step progress lines")
    parser.add_argument("--redraw", metavar="DEMO_JSON",
                        help="train nothing: draw timeline.png next to this demo.json from its data")
    argv = list(sys.argv[1:] if argv is None else argv)  # `python -m verl_async_rm_rig demo` passes those after `demo`
    args = parser.parse_args(argv)
    if importlib.util.find_spec("matplotlib") is None:  # fail now, not after minutes of training
        parser.error("the demo draws its timeline with matplotlib, a dependency of the rig: pip install -e ./rig")
    if args.redraw:
        print(f"timeline: {redraw(Path(args.redraw))}")
        return 0
    specs = [s.strip() for s in args.lanes.split(",") if s.strip()]
    try:
        lanes = [lane_of(s) for s in specs]
    except ValueError as exc:
        parser.error(f"--lanes: {exc}")
    if not lanes or len(set(specs)) != len(specs):
        parser.error(f"--lanes: distinct lanes, at least one (got {args.lanes!r})")
    if args.parallel_startups is not None and args.parallel_startups < 1:
        parser.error("--parallel-startups must be at least 1")
    if args.steps < 1 or args.compute <= 0 or args.decode_s < 0:
        parser.error("--steps >= 1, --compute > 0 and --decode-s >= 0 seconds")
    out = Path(args.out or tempfile.mkdtemp(prefix="verl_async_rm_demo_"))
    out.mkdir(parents=True, exist_ok=True)
    signal.signal(signal.SIGTERM, _terminate)
    started = time.time()
    report = run_demo(out, args.steps, args.seed, lanes, not args.quiet, compute_s=args.compute, decode_s=args.decode_s,
                      parallel_startups=args.parallel_startups, share_ray=args.ray_clusters == "shared",
                      command=command_line(argv))
    report["wall_time_s"] = round(time.time() - started, 1)
    print()
    print_table(report["table"])
    print_notes(report)
    print_wall_breakdown(report)
    (out / "demo.json").write_text(json.dumps(report, indent=2))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(report, indent=2))
    print(f"\nresults: {out / 'demo.json'}\ntimeline: {report['timeline']}\nwhole demo: {report['wall_time_s']} s")
    return 0


def _terminate(signum: int, frame) -> None:
    """SIGTERM ends the demo as an exception does: its lanes (a frozen one too), their judge servers
    and the shared cluster are closed on the way out, not left behind (Python's default ends the
    process at once, and a lane frozen at its gate outlived it)."""
    raise SystemExit(128 + signum)


def print_notes(report: dict) -> None:
    for name, regime in report["regimes"].items():
        print(f"{name}: {regime['described']} (C = {report['compute_s']} s)")
    pace = report.get("pace_check")
    if pace and pace["off"]:
        print(f"WARNING: the bound's median step took {pace['measured_step_s']} s, {pace['ratio']:.2f}x the C = "
              f"{pace['compute_s']} s the judge was made of (beyond {pace['tolerance']}x): on this machine's pace the "
              f"lanes met another regime than the named one (--compute {pace['measured_step_s']})")
    elif pace:
        print(f"pace: the bound's median step {pace['measured_step_s']} s, {pace['ratio']:.2f}x C")


def print_wall_breakdown(report: dict) -> None:
    print("\nwall time per run (s): start-up (together) | waiting for its turn | training + shut-down | loop")
    for name, run_ in report["runs"].items():
        w = run_["wall"]
        if w:
            print(f"{name:>14} | {w['startup_s']:8.1f} | {w['gate_wait_s']:8.1f} | {w['train_s']:8.1f} | {w['loop_s']:6.1f}")
    if "assets_built_by" in report:
        print(f"model and data built by {report['assets_built_by']} in {report['wall_breakdown_s']['assets_build']} s")


if __name__ == "__main__":
    sys.exit(main())
