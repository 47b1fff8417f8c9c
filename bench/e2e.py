"""End-to-end benchmark of issue 14's "done when": verl's real trainer on CPU, side by side in one run.

Every run is verl's trainer (v1, verl's default, as the headline; v0 alongside) on the CPU backend
with the toy task (8 prompts x 4 samples, 4 PPO mini-batches per step), the reward behind a
simulated judge (``verl_async_rm_rig.cpu_backend.latency``), scored through the ``async_agent`` reward
manager. A run is (trainer, seed, regime, mode):

- regimes, in units of the measured step compute C (the median step of the stock trainer with an
  instant reward; measured by a calibration run first, or fixed with ``--compute``):
  ``zero`` (instant judge: the bounds), ``tail_1x`` (uniform in [C/40, C]), ``tail_2.5x`` (uniform
  in [2.5C/40, 2.5C]), ``heavy_2.5x`` (lognormal with p99 = 2.5C and p50 = p99/10, plus rare hangs
  that the agent's deadline settles), ``fail20`` (``tail_1x`` with 20% of judge calls failing);
- modes: ``baseline`` (verl's stock trainer, rewards scored per sample in verl's agent loop), the
  strategies (``both``: mini-batch pipeline + one step off-policy; ``tail``: the tail-tolerant pool
  with bounded staleness; ``tail_drop``, ``tail_s6`` and ``tail_auto``: its variants), and, under failures, stock verl, ``both_neutral`` and ``both_mask``.

Figures, per (trainer, regime, mode), median [min, max] over seeds, ratios paired within a seed:
loop time (sum of step times: Ray start-up and the warm-up absorbed by a validation pass are left
out), reduction vs the stock baseline, the hidden fraction (T_base - T) / (T_base - T_bound) against
two bounds (the stock zero-latency run, and the same mode run with zero latency), the latter also on
steps 2..N-1 alone (without the pipeline's first and last steps, a per-run constant; not judged),
time blocked on rewards per step, and the staleness the trainer measured. Learning: the held-out reward after the
last step (verl's validation, ``VAL_SAMPLES`` samples per prompt) minus the same seed's baseline,
95% t-interval, with the training batches' reward over the last 3 steps beside it; ``both_mask`` vs
``both_neutral`` and vs stock verl, each meeting the same failures, paired. The done-when goals are
printed as PASS/FAIL with their figures, against the same-mode bound.

Fairness: every mode of a (trainer, seed) gets the same model, data, judge draws (hashed per
response and seed), sampling draws (the CPU rollout's paired draws: a prompt's samples come from
generators seeded by the prompt, so a strategy generating a step ahead draws what the baseline
draws; its learning gap is the strategy's, not sampling luck) and settings (agent concurrency, the v1 sampler's poll interval, the deadline);
each run starts its own Ray cluster the same way. A (trainer, seed, regime)'s runs (stock and every
mode) start up together and train back to back, so a reduction compares runs made at the same
machine pace (the pace of start-up groups varied up to 2x within one benchmark); the order of the
regimes and each mode's place in its group's queue are a seeded shuffle, so drift on the shared
machine does not favour one mode (the calibration run goes first). Several runs of one package tree
are judged together by bench/pool_e2e.py.

Each finished run is cached under --work, keyed by what it ran (trainer, seed, regime parameters in
seconds, mode, steps, and a fingerprint of the package source), so the same command resumes after an
interruption; delete the folder to measure afresh.
    python bench/e2e.py              # the README's figures (plan and estimate: add --dry-run)
    python bench/e2e.py --quick      # CI smoke: 2 short v1 runs (calibration + the tail-tolerant mode)
    python bench/readme_tables.py --write-readme   # README tables and timeline from bench/results/e2e.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import random
import shutil
import subprocess
import sys
import time
import typing
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Optional

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from verl_async_rm_rig.demo import MODES as DEMO_MODES  # noqa: E402
from verl_async_rm_rig.demo import SHAPE, ModeResult, summarize  # noqa: E402

RESULTS = ROOT / "bench" / "results"
FINAL_STEPS = 3  # first/final toy reward = mean batch reward over the first/last 3 steps
# Learning is judged on the policy after the last update, on the 16 held-out prompts, sampled
# VAL_SAMPLES times each at the training temperature (verl's validation before training and after
# the last step; outside the step timer, so loop times are unaffected). The training batches' reward
# is reported too, but a strategy generating a step ahead trains at step t on what the policy of
# step t-2 sampled, so at equal steps its batch reward lags the baseline's by construction.
VAL_SAMPLES = 4
VALIDATION = ["actor_rollout_ref.rollout.val_kwargs.do_sample=true",
              "actor_rollout_ref.rollout.val_kwargs.temperature=1.0", f"actor_rollout_ref.rollout.val_kwargs.n={VAL_SAMPLES}"]
VAL_KEY_SUFFIX = f"/acc/mean@{VAL_SAMPLES}"  # verl's val-core/<data source>/acc/mean@N
STOCK = "baseline"
# The done-when goals, judged on medians over seeds against the same-mode bound.
GOAL_BOTH_HIDDEN = 0.95  # `both` where the latency tail <= step compute
GOAL_TAIL_HIDDEN = 0.90  # the tail-tolerant mode, heavy-tailed latency with p99 = 2.5x compute
# Agent settings every run gets (the demo's): enough concurrency that no judge queue forms.
AGENT = ["reward.async_agent.max_concurrency=64"]
TIMELINE_JUDGE_CALLS = ("zero", "heavy_2.5x")  # regimes whose records keep their judge calls in the JSON
RUN_COST_S = 40  # a run's wall time with start-ups overlapped (the start gate), 2 idle cores
V1_POLL_S = 0.05  # v1's replay-buffer poll (verl's fixed 2 s would swamp ~1 s steps), for every v1 run

# The modes (hydra overrides on top of the stock trainer). The tail-tolerant mode (issue 14): a pool of
# scored groups, generation ahead sized from measured latency (off_policy_steps=auto), a group carried
# at most 2 steps, then waited for (nothing dropped). The pool is v1 only and excludes the mini-batch
# pipeline (strategies/plan.py refuses both). Failure policies are agent settings.
TAIL = ["off_policy_steps=auto", "max_staleness=2", "on_stale=wait"]
# The same pool, but a group still unscored when it is due is dropped (counted) instead of waited
# for: with hangs that only a deadline settles, the step never waits for one.
TAIL_DROP = ["off_policy_steps=auto", "max_staleness=2", "on_stale=drop"]
# The waiting pool with a bound that outlasts the deadline: in `heavy_2.5x` a hung call is settled
# 5C after it is sent, and a group may be carried 6 steps (each about C) before it is due, so no step
# waits for a hang's group at its bound: what `wait` hides when the bound follows the README's rule
# (at least ticket_deadline / step time), against `tail`, whose bound of 2 is shorter.
TAIL_S6 = ["off_policy_steps=auto", "max_staleness=6", "on_stale=wait"]
# The README's rule made executable: max_staleness=auto raises the bound each step to ceil(ticket
# deadline / median step compute) (strategies/pool.py), so no step waits for a group the deadline
# settles. It needs a ticket deadline: in a regime without one (the instant judge, its same-mode
# bound), the heavy regime's (AUTO_BOUND_DEADLINE), so both runs are the same configuration.
TAIL_AUTO = ["off_policy_steps=auto", "max_staleness=auto", "on_stale=wait"]
MODES: dict[str, list[str]] = {
    STOCK: [],
    **{m: o for m, o in DEMO_MODES.items() if m not in ("zero_latency", STOCK)},
    "tail": TAIL,
    "tail_drop": TAIL_DROP,
    "tail_s6": TAIL_S6,
    "tail_auto": TAIL_AUTO,
    "both_neutral": [*DEMO_MODES["both"], "reward.async_agent.failure_policy=neutral"],
    "both_mask": [*DEMO_MODES["both"], "reward.async_agent.failure_policy=mask"],
}


@dataclass(frozen=True)
class Regime:
    """A simulated judge, in units of the step compute C (so a regime means the same on any machine)."""

    name: str
    model: str  # "zero" (instant), "uniform" or "lognormal"
    tail_x: float = 0.0  # uniform: the top of the range; lognormal: p99; both x C
    hang_prob: float = 0.0
    fail_prob: float = 0.0
    p50_ratio: float = 10.0  # lognormal: p99 / p50 (the issue: p99 ~ 10x p50)
    deadline_x: float = 0.0  # > 0: request_timeout = ticket_deadline = this x C (settles hangs)
    # A failure regime (fail_prob > 0) is judged on learning only, against stock verl meeting the same
    # failures (the regime's own baseline, as in every regime); this names the same judge without
    # failures, whose stock run shows what the failures cost (reported, not judged).
    without_failures: Optional[str] = None

    def judge(self, compute_s: float, seed: int) -> dict:
        """Reward kwargs of the toy reward's simulated judge (cpu_backend/latency.py)."""
        if self.model == "zero":
            return {}
        tail = round(self.tail_x * compute_s, 4)
        kwargs: dict = {"latency_seed": seed}
        if self.model == "uniform":
            kwargs |= {"latency_model": "uniform", "latency_lo": round(tail / 40, 4), "latency_hi": tail}
        else:
            kwargs |= {"latency_model": "lognormal", "latency_p50": round(tail / self.p50_ratio, 4), "latency_p99": tail}
        if self.hang_prob:
            kwargs["hang_prob"] = self.hang_prob
        if self.fail_prob:
            kwargs["fail_prob"] = self.fail_prob
        return kwargs

    def agent(self, compute_s: float) -> list[str]:
        if not self.deadline_x:
            return []
        deadline = round(self.deadline_x * compute_s, 3)
        return [f"reward.async_agent.request_timeout={deadline}", f"reward.async_agent.ticket_deadline={deadline}"]

    @property
    def timing(self) -> bool:
        return not self.fail_prob

    def describe(self) -> str:
        if self.model == "zero":
            return "instant judge"
        what = (f"uniform in [{self.tail_x:g}C/40, {self.tail_x:g}C]" if self.model == "uniform"
                else f"lognormal, p99 = {self.tail_x:g}C, p50 = p99/{self.p50_ratio:g}")
        if self.hang_prob:
            what += f", {self.hang_prob:.1%} hangs settled by a {self.deadline_x:g}C deadline"
        if self.fail_prob:
            what += f", {self.fail_prob:.0%} of calls fail"
        return what


ZERO = Regime("zero", "zero")
REGIMES: dict[str, Regime] = {r.name: r for r in [
    ZERO,
    Regime("tail_1x", "uniform", 1.0),
    Regime("tail_2.5x", "uniform", 2.5),
    Regime("heavy_2.5x", "lognormal", 2.5, hang_prob=0.005, deadline_x=5.0),
    Regime("fail20", "uniform", 1.0, fail_prob=0.2, without_failures="tail_1x"),
]}


@dataclass(frozen=True, order=True)
class Run:
    trainer: str
    seed: int
    regime: str
    mode: str


def mode_unavailable(mode: str, trainer: str = "v1") -> Optional[str]:
    """Why this tree cannot run ``mode`` on ``trainer`` (its feature not merged, or refused there), or
    None. Checked up front so such runs are skipped loudly instead of failing after verl's start-up."""
    overrides = " ".join(MODES[mode])
    if trainer == "v0" and "max_staleness" in overrides:
        return "the staleness pool runs on the v1 trainer only (strategies/plan.py)"
    if trainer == "v1" and any(f"off_policy_steps={k}" in overrides for k in range(2, 10)):
        return "v1 prefetches one batch at most (strategies/plan.py)"
    if "max_staleness=auto" in overrides:
        from verl_async_rm.strategies import plan

        if not hasattr(plan, "AUTO_STALENESS_START"):
            return "max_staleness=auto is not in this tree"
    if "max_staleness" in overrides:
        settings = (ROOT / "verl_async_rm" / "hydra_conf" / "async_reward_settings.yaml").read_text()
        if "max_staleness:" not in settings:
            return "the tail-tolerant pool (max_staleness) is not in this tree"
    if "failure_policy=mask" in overrides:
        from verl_async_rm.policy import PolicyName

        if "mask" not in typing.get_args(PolicyName):
            return "failure_policy: mask is not in this tree"
    return None


# ------------------------------------------------------------------------------------------------
# the plan
# ------------------------------------------------------------------------------------------------

def plan_cells(regimes: list[str], strategies: list[str], failure_modes: list[str]) -> list[tuple[str, str]]:
    """(regime, mode) pairs of one (trainer, seed): the stock baseline and every strategy in every
    timing regime and at zero latency (the two bounds); in the failure regimes the stock baseline
    (stock verl meeting the same failures) and the failure modes."""
    timing = [r for r in regimes if REGIMES[r].timing and r != "zero"]
    cells = [(r, m) for r in ["zero", *timing] for m in [STOCK, *strategies]]
    cells += [(r, m) for r in regimes if not REGIMES[r].timing for m in [STOCK, *failure_modes] if failure_modes]
    return cells


def plan_runs(seeds: dict[str, list[int]], cells: dict[str, list[tuple[str, str]]],
              calibrate: set[str]) -> list[Run]:
    """Every run once, in (trainer, seed) blocks, v1 first and v0 one block behind (v1 s0, v1 s1,
    v0 s0, v1 s2, v0 s1: a partial benchmark still has seeds of both trainers, the headline's first).
    Within a block, each regime's runs (its stock run and every mode) are consecutive, one
    start-up group (``startup_group``): the runs a reduction compares start up together and train
    back to back, at the same machine pace. The order of the regimes, and of the modes within a
    regime (their place in the group's queue), is a seeded shuffle.
    A trainer in ``calibrate`` gets its first block's stock zero-latency run first: it measures C."""
    blocks = sorted(((index + (trainer == "v0"), trainer != "v1", trainer, index, seed)
                     for trainer, trainer_seeds in seeds.items() for index, seed in enumerate(trainer_seeds)))
    runs: list[Run] = []
    for *_, trainer, index, seed in blocks:
        shuffle = random.Random(f"{trainer}-{seed}").shuffle
        columns: dict[str, list[Run]] = {}
        for regime, mode in cells[trainer]:
            columns.setdefault(regime, []).append(Run(trainer, seed, regime, mode))
        order = list(columns)
        shuffle(order)
        for column in columns.values():
            shuffle(column)
        if index == 0 and trainer in calibrate and "zero" in columns:
            order.remove("zero")
            order.insert(0, "zero")
            first = Run(trainer, seed, "zero", STOCK)
            columns["zero"].remove(first)
            columns["zero"].insert(0, first)
        runs += [run for regime in order for run in columns[regime]]
    return runs


def startup_group(run: Run) -> tuple:
    """Runs with the same key may start up together (up to --parallel-startups of them); a run of
    another key starts a new group. One (trainer, seed, regime): see plan_runs."""
    return run.trainer, run.seed, run.regime


def source_fingerprint() -> str:
    """The package source the runs measure: git's tree hash of verl_async_rm/, plus a hash of
    uncommitted changes there. Part of every cache key, so a merge that changes the trainer never
    mixes with runs of the old code (a README or bench edit does not invalidate the cache)."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout

    try:
        tree = git("rev-parse", "HEAD:verl_async_rm").strip()
        dirty = git("diff", "HEAD", "--", "verl_async_rm") + git("ls-files", "--others", "--exclude-standard", "verl_async_rm")
    except (subprocess.CalledProcessError, FileNotFoundError):
        return "nogit"
    return tree[:10] + ("+" + hashlib.sha1(dirty.encode()).hexdigest()[:8] if dirty else "")


AUTO_BOUND_DEADLINE = "heavy_2.5x"  # the regime whose deadline max_staleness=auto gets where none is set


def run_settings(run: Run, compute_s: float, decode_s: float) -> dict:
    """Everything that decides what a run measures (its cache key is a digest of this)."""
    regime = REGIMES[run.regime]
    agent = regime.agent(compute_s)
    if "max_staleness=auto" in MODES[run.mode] and not agent:  # auto needs a ticket deadline (TAIL_AUTO)
        agent = REGIMES[AUTO_BOUND_DEADLINE].agent(compute_s)
    return {"judge": regime.judge(compute_s, run.seed),
            "overrides": [*SHAPE, *VALIDATION, *MODES[run.mode], *AGENT, *agent],
            "decode_s": decode_s}


def run_key(run: Run, steps: int, settings: dict, fingerprint: str) -> str:
    digest = hashlib.sha1(json.dumps([settings, fingerprint], sort_keys=True).encode()).hexdigest()[:10]
    return f"{run.trainer}_steps{steps}_seed{run.seed}_{run.regime}_{run.mode}_{digest}"


# ------------------------------------------------------------------------------------------------
# one run
# ------------------------------------------------------------------------------------------------

# timing_s/old_log_prob: the same worker call on the same batch in every mode, so a check on the
# machine's pace in each run (a mode's slower update means little if this pass slowed as much)
SAME_WORK_KEY = "timing_s/old_log_prob"
EXTRA_PREFIXES = ("async_rm/", "async_reward/", "val-core/", SAME_WORK_KEY)


def extra_series(metrics: list[dict]) -> dict[str, list[float]]:
    """Per-step values of this package's metrics (staleness, carried/dropped groups, failures...)."""
    out: dict[str, list[float]] = {}
    for entry in metrics:
        for key, value in entry["data"].items():
            if key.startswith(EXTRA_PREFIXES) and isinstance(value, (int, float)):
                out.setdefault(key, []).append(float(value))
    return out


JUDGE_LOG = "judge_calls.jsonl"


def judge_log_env() -> Optional[str]:
    """The toy reward's judge-call log (the demo helper's), or None in a tree without it."""
    from verl_async_rm_rig.cpu_backend import toy_task

    return getattr(toy_task, "JUDGE_LOG_ENV", None)


def decode_env() -> Optional[str]:
    """The CPU rollout's simulated per-token decode time (the trainer branch's), or None before it."""
    from verl_async_rm_rig.cpu_backend import names

    return getattr(names, "DECODE_S_ENV", None)


def paired_draws_env() -> Optional[str]:
    """The CPU rollout's paired-draws switch (common random numbers across modes), or None before it."""
    from verl_async_rm_rig.cpu_backend import names

    return getattr(names, "PAIRED_DRAWS_ENV", None)


@dataclass
class Job:
    """A run to execute now, with everything it needs."""

    run: Run
    settings: dict
    run_dir: Path
    assets: object  # CPURunConfig with model_dir / train_file / val_file


@dataclass
class Outcome:
    summary: ModeResult
    extra: dict
    wall_s: float  # start-up plus training (a gated run's wait at the gate left out)
    load: dict  # the machine's 1-min load average before and after the training
    startup_s: Optional[float] = None  # a gated run: launch to waiting at the gate (Ray, workers, validation)
    queue_position: Optional[int] = None  # a gated run: how many runs of its start-up group trained before it


def run_config(job: Job, steps: int, start_gate: bool = False):
    """The trainer run of ``job``: identical for every mode but for the mode's own overrides."""
    from verl_async_rm_rig.cpu_backend.launch import CPURunConfig, toy_reward_path

    gate = {"start_gate": True} if start_gate else {}
    env = {judge_log_env(): str(Path(job.run_dir).absolute() / JUDGE_LOG)} if judge_log_env() else {}
    if job.settings["decode_s"]:
        env[decode_env()] = str(job.settings["decode_s"])
    if paired_draws_env():
        # Every mode of a seed samples the same random numbers for the same prompt (batched as
        # usual, so the compute is unchanged): the learning gaps are paired on the draws, not only
        # on the seed (issue 14: unpaired, two identical schedules differed by up to 0.11).
        env[paired_draws_env()] = "1"
    # As the demo starts its runs: Ray's two prestarted workers per cluster are never used by verl.
    env["RAY_prestart_worker_first_driver"] = "0"
    return CPURunConfig(
        out_dir=str(job.run_dir), trainer=job.run.trainer, steps=steps, seed=job.run.seed, entry_module="verl_async_rm.main_ppo",
        model_dir=job.assets.model_dir, train_file=job.assets.train_file, val_file=job.assets.val_file, val_before_train=True,
        reward_path=toy_reward_path(), reward_name="compute_score_with_latency", reward_kwargs=job.settings["judge"],
        reward_manager="async_agent", timeout_s=1800, v1_poll_interval_s=V1_POLL_S, test_freq=steps,  # + after the last step
        extra_env=env, extra_overrides=job.settings["overrides"], **gate,
    )


def start_gate_supported() -> bool:
    """Whether the CPU backend can start several runs together and train them one at a time (the demo
    helper's start gate, cpu_backend/start_gate.py)."""
    from dataclasses import fields

    from verl_async_rm_rig.cpu_backend import launch

    return hasattr(launch, "start") and any(f.name == "start_gate" for f in fields(launch.CPURunConfig))


def outcome_of(job: Job, steps: int, result, wall_s: float, load: dict, startup_s: Optional[float] = None,
             loop_start: Optional[float] = None, queue_position: Optional[int] = None) -> Outcome:
    """``loop_start``: wall-clock time the training loop began (a gated run's), which places the judge
    calls on the step timeline (the demo's reader); without it the run has no calls drawn."""
    from verl_async_rm_rig.cpu_backend.launch import read_all_metrics

    if not result.ok:
        raise RuntimeError(f"{job.run} failed (rc {result.returncode}); log: {result.log_path}")
    calls = None
    if loop_start is not None:
        from verl_async_rm_rig.demo import read_judge_calls

        calls = read_judge_calls(Path(job.run_dir) / JUDGE_LOG, loop_start)
    summary = summarize(job.run.mode, result, calls) if calls else summarize(job.run.mode, result)
    if len(summary.step_times) != steps:
        raise RuntimeError(f"{job.run} logged {len(summary.step_times)} of {steps} steps; log: {result.log_path}")
    return Outcome(summary, extra_series(read_all_metrics(str(job.run_dir))), round(wall_s, 1), load,
                   None if startup_s is None else round(startup_s, 1), queue_position)


def execute_group(jobs: list[Job], steps: int, progress: bool, parallel: int) -> list:
    """Run ``jobs``; per job an Outcome, or the exception that ended it (one broken run must not end
    the benchmark). Every run starts its own Ray cluster in a fresh folder (an interrupted run starts
    over, never resumes). With the start gate (every run passes it, even alone: one code path for all
    modes, and the loop's start time places the judge calls) up to ``parallel`` runs start up together
    (verl's start-up leaves the cores idle between stages) and then train one at a time, in plan
    order, the others frozen at their gates: no two measured training loops overlap, none shares the
    machine with a parked run, and every mode is treated the same way."""
    from verl_async_rm_rig.cpu_backend import launch

    for job in jobs:
        shutil.rmtree(job.run_dir, ignore_errors=True)
    if parallel > 1 and start_gate_supported():
        from verl_async_rm_rig.demo import default_parallel_startups

        # the machine is shared: only as many start-ups at once as free memory holds (a Ray cluster a run)
        parallel = min(parallel, default_parallel_startups(len(jobs), share_ray=False))
        if parallel < len(jobs):  # in groups; a group of one still passes its gate (the loop's start time)
            head = execute_group(jobs[:parallel], steps, progress, parallel)
            return head + execute_group(jobs[parallel:], steps, progress, parallel)
    if not start_gate_supported():
        outcomes = []
        for job in jobs:
            started, load_before = time.monotonic(), os.getloadavg()[0]
            try:
                result = launch.run(run_config(job, steps), progress=progress)
                load = {"load_1min_before": load_before, "load_1min_after": os.getloadavg()[0]}
                outcomes.append(outcome_of(job, steps, result, time.monotonic() - started, load))
            except RuntimeError as error:
                outcomes.append(error)
        return outcomes
    trainers = []
    try:
        for job in jobs:
            trainers.append(launch.start(run_config(job, steps, start_gate=True), progress=progress))
        launch.park_at_gates(trainers)
        outcomes = []
        for position, (job, trainer) in enumerate(zip(jobs, trainers)):
            if trainer.gate_reached_s is None:
                trainer.close()
                outcomes.append(RuntimeError(f"{job.run} ended before training (rc {trainer.result().returncode}); "
                                             f"log: {trainer.log_path}"))
                continue
            load_before = os.getloadavg()[0]
            trainer.open_gate()
            result = trainer.wait(0.2)
            load = {"load_1min_before": load_before, "load_1min_after": os.getloadavg()[0]}
            wall = trainer.gate_reached_s + (trainer.ended_s - trainer.gate_opened_s)
            try:
                from verl_async_rm_rig.cpu_backend.start_gate import passed_marker

                marker = passed_marker(trainer.gate)
                loop_start = float(marker.read_text()) if marker.exists() else None
                outcomes.append(outcome_of(job, steps, result, wall, load, trainer.gate_reached_s, loop_start, position))
            except RuntimeError as error:
                outcomes.append(error)
        return outcomes
    finally:
        for trainer in trainers:
            trainer.close()


def validation_rewards(extra: dict) -> tuple[Optional[float], Optional[float]]:
    """(before training, after the last step): the held-out reward, or None where it was not run."""
    values = next((v for k, v in extra.items() if k.startswith("val-core/") and k.endswith(VAL_KEY_SUFFIX)), [])
    return (values[0] if values else None), (values[-1] if len(values) > 1 else None)


def record_of(run: Run, settings: dict, outcome: Outcome) -> dict:
    summary, extra = outcome.summary, outcome.extra
    val_first, val_final = validation_rewards(extra)

    def last(key, how):
        values = extra.get(key)
        return how(values) if values else None

    return {
        **asdict(run), "judge": settings["judge"], "overrides": settings["overrides"], "decode_s": settings["decode_s"],
        "loop_time_s": summary.loop_time, "run_wall_s": outcome.wall_s, "startup_s": outcome.startup_s,
        "blocked_per_step_s": float(np.mean(summary.blocked)) if summary.blocked else None,
        "final_reward": float(np.mean(summary.scores[-FINAL_STEPS:])),
        "first_reward": float(np.mean(summary.scores[:FINAL_STEPS])),
        "val_first": val_first, "val_final": val_final,
        # the trainer branch's staleness pool (None until it is merged, and for the stock trainer)
        "staleness_mean": last("async_rm/staleness/mean", lambda v: float(np.mean(v))),
        "staleness_max": last("async_rm/staleness/max", max),
        # cumulative counters in the trainer's metrics: the run's total is the last step's value
        "groups_carried": last("async_rm/groups_carried", lambda v: v[-1]),
        "groups_dropped_stale": last("async_rm/groups_dropped_stale", lambda v: v[-1]),
        "off_policy_steps_chosen": last("async_rm/off_policy_steps", lambda v: float(np.mean(v))),
        "step_times": summary.step_times, "phases": summary.phases, "same_work_s": extra.get(SAME_WORK_KEY), "blocked": summary.blocked, "scores": summary.scores,
        # (start, end) of each judge call, seconds from the loop's start: the timeline's rewards in flight
        "judge_calls": [[round(a, 3), round(b, 3)] for a, b in getattr(summary, "judge_calls", [])],
        # the shared machine's 1-min load average around the run (other engineers' jobs): context for outliers
        "machine_load": outcome.load, "queue_position": outcome.queue_position, "extra": extra,
    }


# ------------------------------------------------------------------------------------------------
# tables (pure: records in, rows out)
# ------------------------------------------------------------------------------------------------

def spread(values: list) -> Optional[dict]:
    values = [v for v in values if v is not None]
    if not values:
        return None
    return {"median": round(float(np.median(values)), 4), "min": round(float(min(values)), 4),
            "max": round(float(max(values)), 4), "n": len(values)}


def paired_interval(diffs: list[float]) -> Optional[dict]:
    """Mean of paired differences with a 95% Student-t interval (None with fewer than 2 pairs)."""
    if len(diffs) < 2:
        return None
    from scipy import stats

    mean, sem = float(np.mean(diffs)), float(np.std(diffs, ddof=1) / np.sqrt(len(diffs)))
    half = float(stats.t.ppf(0.975, len(diffs) - 1)) * sem
    return {"mean": round(mean, 4), "low": round(mean - half, 4), "high": round(mean + half, 4), "n": len(diffs)}


def _unit(record: dict) -> tuple:
    """What a pair is formed within: one seed of one benchmark run. Records pooled from several runs
    (bench/pool_e2e.py) carry the run they came from, so a pair never mixes two runs' machines."""
    return record.get("benchmark_run"), record["seed"]


def _index(records: list[dict]) -> dict[tuple, dict]:
    return {(r["trainer"], _unit(r), r["regime"], r["mode"]): r for r in records}


def _ordered(values, order) -> list:
    return sorted(set(values), key=lambda v: (order.index(v) if v in order else len(order), v))


def timing_table(records: list[dict]) -> list[dict]:
    """One row per (trainer, timing regime, mode); ratios paired within a seed. Hidden fraction
    against the stock bound (stock trainer, instant judge) and against the same mode's bound (the
    same mode, instant judge): (T_base - T) / (T_base - T_bound), where T_base > T_bound."""
    at = _index(records)
    rows = []
    for trainer in _ordered((r["trainer"] for r in records), ["v1", "v0"]):
        mine = [r for r in records if r["trainer"] == trainer and REGIMES[r["regime"]].timing]
        for regime in _ordered((r["regime"] for r in mine), list(REGIMES)):
            for mode in _ordered((r["mode"] for r in mine if r["regime"] == regime), list(MODES)):
                cell = [r for r in mine if r["regime"] == regime and r["mode"] == mode]
                reduction, vs_stock, vs_same, vs_same_steady = [], [], [], []
                first_extra, last_extra = [], []
                for r in cell:
                    base = at.get((trainer, _unit(r), regime, STOCK))
                    if base is None or mode == STOCK:
                        continue
                    t, tb = r["loop_time_s"], base["loop_time_s"]
                    reduction.append(1 - t / tb)
                    if regime == "zero":
                        continue
                    for bound_mode, out in ((STOCK, vs_stock), (mode, vs_same)):
                        bound = at.get((trainer, _unit(r), "zero", bound_mode))
                        if bound is not None and tb > bound["loop_time_s"]:
                            out.append((tb - t) / (tb - bound["loop_time_s"]))
                    # The same, on steps 2..N-1: without the first step (its batch has only the next
                    # batch's generation to hide behind) and the last (only the step before's
                    # training), a per-run constant that a long training amortises. Context, not judged.
                    bound = at.get((trainer, _unit(r), "zero", mode))
                    middle = [len(x["step_times"]) > 2 for x in (r, base, bound or {"step_times": []})]
                    if bound is not None and all(middle):
                        t_mid, tb_mid, bound_mid = (sum(x["step_times"][1:-1]) for x in (r, base, bound))
                        if tb_mid > bound_mid:
                            vs_same_steady.append((tb_mid - t_mid) / (tb_mid - bound_mid))
                        # What the first and the last step cost over the same step with an instant
                        # judge: the pipeline's fill and drain, in seconds.
                        first_extra.append(r["step_times"][0] - bound["step_times"][0])
                        last_extra.append(r["step_times"][-1] - bound["step_times"][-1])
                maxima = [r["staleness_max"] for r in cell if r["staleness_max"] is not None]
                rows.append({
                    "trainer": trainer, "regime": regime, "mode": mode,
                    "loop_time_s": spread([r["loop_time_s"] for r in cell]),
                    "reduction_vs_baseline": spread(reduction),
                    "hidden_vs_stock_bound": spread(vs_stock),
                    "hidden_vs_same_mode_bound": spread(vs_same),
                    "hidden_vs_same_mode_bound_middle_steps": spread(vs_same_steady),
                    "first_step_minus_same_mode_bound_s": spread(first_extra),
                    "last_step_minus_same_mode_bound_s": spread(last_extra),
                    "blocked_on_rewards_per_step_s": spread([r["blocked_per_step_s"] for r in cell]) if mode != STOCK else None,
                    "staleness_mean": spread([r["staleness_mean"] for r in cell]),
                    "staleness_max": max(maxima) if maxima else None,
                    "groups_carried": spread([r["groups_carried"] for r in cell]),
                    "groups_dropped_stale": spread([r["groups_dropped_stale"] for r in cell]),
                    "latency_s": cell[0]["judge"] or None,
                })
    return rows


def learning_label(record: dict) -> str:
    regime = REGIMES[record["regime"]]
    return record["mode"] if regime.timing else f"{record['mode']} ({regime.fail_prob:.0%} failures)"


def learning_table(records: list[dict]) -> list[dict]:
    """Per (trainer, run label): the held-out reward after the last step (``val_final``) and the
    training batches' reward over the last steps (``final_reward``), each with its difference to the
    same seed's stock baseline in the same regime (in a failure regime: stock verl meeting the same
    failures), paired by (seed, regime), with a 95% t-interval. Worse beyond noise = the
    held-out interval below 0 (the batch reward's where no held-out reward was measured)."""
    at = _index(records)
    rows = []
    for trainer in _ordered((r["trainer"] for r in records), ["v1", "v0"]):
        mine = [r for r in records if r["trainer"] == trainer]
        labels = _ordered((learning_label(r) for r in mine), list(MODES))
        for label in labels:
            cell = [r for r in mine if learning_label(r) == label]
            diffs: dict[str, list[float]] = {"final_reward": [], "val_final": []}
            for r in cell:
                base = at.get((trainer, _unit(r), r["regime"], STOCK))
                if base is not None and base is not r:
                    for key, out in diffs.items():
                        if r.get(key) is not None and base.get(key) is not None:
                            out.append(r[key] - base[key])
            batch, held_out = paired_interval(diffs["final_reward"]), paired_interval(diffs["val_final"])
            judged = held_out or batch
            rows.append({
                "trainer": trainer, "run": label, "mode": cell[0]["mode"],
                "first_reward": spread([r["first_reward"] for r in cell]),
                "final_reward": spread([r["final_reward"] for r in cell]),
                "final_minus_baseline": batch,
                "val_final": spread([r.get("val_final") for r in cell]),
                "val_minus_baseline": held_out,
                "judged_on": "held-out" if held_out else "batch",
                "worse_beyond_noise": None if judged is None else judged["high"] < 0,
            })
    return rows


def paired_comparison(records: list[dict], better: str, than: str) -> list[dict]:
    """``better`` minus ``than`` per trainer, paired by (seed, regime) where both ran: on the held-out
    reward after the last step where every pair has it, else on the training batches' final reward."""
    at = _index(records)
    rows = []
    for trainer in _ordered((r["trainer"] for r in records), ["v1", "v0"]):
        pairs = [(r, at[trainer, _unit(r), r["regime"], than]) for r in records
                 if r["trainer"] == trainer and r["mode"] == better and (trainer, _unit(r), r["regime"], than) in at]
        if pairs:
            rows.append(_paired_row(trainer, f"{better} - {than}", pairs, judged=True))
    return rows


def failure_cost(records: list[dict], mode: str) -> list[dict]:
    """What injected failures cost ``mode``: its runs in a failure regime minus stock verl's with the
    same judge without failures, paired by seed. Reported, never judged: stock verl pays it too (its
    own row), so the judged comparisons are the ones under the same failures."""
    at = _index(records)
    rows = []
    for trainer in _ordered((r["trainer"] for r in records), ["v1", "v0"]):
        pairs = [(r, at[trainer, _unit(r), REGIMES[r["regime"]].without_failures, STOCK]) for r in records
                 if r["trainer"] == trainer and r["mode"] == mode and not REGIMES[r["regime"]].timing
                 and (trainer, _unit(r), REGIMES[r["regime"]].without_failures, STOCK) in at]
        if pairs:
            rows.append(_paired_row(trainer, f"{mode} - {STOCK} without failures", pairs, judged=False))
    return rows


def _paired_row(trainer: str, name: str, pairs: list[tuple[dict, dict]], judged: bool) -> dict:
    key = "val_final" if all(a.get("val_final") is not None and b.get("val_final") is not None for a, b in pairs) \
        else "final_reward"
    diffs = [a[key] - b[key] for a, b in pairs]
    interval = paired_interval(diffs)
    return {"trainer": trainer, "comparison": name, "diffs": [round(d, 4) for d in diffs],
            "judged_on": "held-out" if key == "val_final" else "batch", "judged": judged,
            "interval": interval, "worse_beyond_noise": None if interval is None else interval["high"] < 0}


def goals(timing: list[dict], learning: list[dict], comparisons: list[dict]) -> list[dict]:
    """The done-when goals per trainer, each with the figure it is judged on (medians over seeds;
    hidden fractions against the same-mode bound). A goal whose runs are missing is reported as such."""
    out = []
    for trainer in _ordered((row["trainer"] for row in timing + learning), ["v1", "v0"]):
        rows = {(row["regime"], row["mode"]): row for row in timing if row["trainer"] == trainer}

        def hidden_goal(regime, mode, threshold, name, variant=False):
            row = rows.get((regime, mode))
            figure = row and row["hidden_vs_same_mode_bound"]
            out.append({"trainer": trainer, "goal": name, "threshold": threshold, "variant": variant,
                        "figure": figure, "vs_stock_bound": row and row["hidden_vs_stock_bound"],
                        "middle_steps": row and row.get("hidden_vs_same_mode_bound_middle_steps"),
                        "pass": None if not figure else figure["median"] >= threshold})

        hidden_goal("tail_1x", "both", GOAL_BOTH_HIDDEN, f"both hides >= {GOAL_BOTH_HIDDEN:.0%} when the tail <= compute (tail_1x)")
        # The heavy goal is judged on the configuration the README gives a judge with a deadline:
        # max_staleness=auto (the bound follows ticket_deadline / step time). The other pool settings
        # are variants, each judged against the same threshold on its own row when it was run, so a
        # setting below it is shown, not hidden (e.g. `tail`: a bound shorter than the deadline waits
        # for hung calls by construction).
        hidden_goal("heavy_2.5x", "tail_auto", GOAL_TAIL_HIDDEN,
                    f"tail-tolerant mode (max_staleness=auto, on_stale=wait) hides >= {GOAL_TAIL_HIDDEN:.0%}, "
                    "lognormal p99 = 2.5x compute (heavy_2.5x)")
        for mode, what in (("tail", "max_staleness=2 (shorter than the 5C deadline), on_stale=wait"),
                           ("tail_drop", "max_staleness=2, on_stale=drop"),
                           ("tail_s6", "max_staleness=6 (past the 5C deadline), on_stale=wait")):
            if ("heavy_2.5x", mode) in rows:
                hidden_goal("heavy_2.5x", mode, GOAL_TAIL_HIDDEN,
                            f"variant `{mode}` ({what}) against the same {GOAL_TAIL_HIDDEN:.0%} (heavy_2.5x)", variant=True)
        # never slower than stock: in every regime (instant judge included), the median paired
        # reduction of every strategy is >= 0; the worst single seed is reported beside it
        slower = [(row["regime"], row["mode"], row["reduction_vs_baseline"]) for row in timing
                  if row["trainer"] == trainer and row["mode"] != STOCK and row["reduction_vs_baseline"]]
        worst = min(slower, key=lambda s: s[2]["median"]) if slower else None
        out.append({"trainer": trainer, "goal": "strategies never slower than stock (median paired reduction >= 0 in every regime)",
                    "threshold": 0.0, "figure": worst and {"regime": worst[0], "mode": worst[1], **worst[2]},
                    "pass": None if not slower else all(s[2]["median"] >= 0 for s in slower)})
        # every strategy run against the stock baseline (stock verl meeting failures is a row of
        # the table, what failures cost it, not a mode under test)
        mine = [row for row in learning if row["trainer"] == trainer and row.get("mode") != STOCK
                and (row["val_minus_baseline"] or row["final_minus_baseline"])]
        out.append({"trainer": trainer, "goal": "learning: no run worse than the stock baseline (same judge, same failures) beyond seed noise",
                    "threshold": 0.0, "figure": {row["run"]: row["val_minus_baseline"] or row["final_minus_baseline"] for row in mine},
                    "pass": None if not mine else not any(row["worse_beyond_noise"] for row in mine)})
        for comp in (c for c in comparisons if c["trainer"] == trainer and c.get("judged", True)):
            out.append({"trainer": trainer, "goal": f"{comp['comparison']} >= 0 within noise (same failures, paired)",
                        "threshold": 0.0, "figure": comp["interval"],
                        "pass": None if comp["interval"] is None else not comp["worse_beyond_noise"]})
    return out


def queue_bias(records: list[dict]) -> list[dict]:
    """A check on the harness, not on a mode: per place in the start-up queue (how many runs of its
    group trained before it), each run's loop time over its cell's median (same trainer, regime and
    mode). Runs of a group start up together and train one at a time, the others frozen at their
    gates; were a parked run to take CPU, the first place would be the slowest."""
    cells: dict[tuple, list[float]] = {}
    for r in records:
        cells.setdefault((r["trainer"], r["regime"], r["mode"]), []).append(r["loop_time_s"])
    by_position: dict[int, list[float]] = {}
    for r in records:
        if r.get("queue_position") is not None:
            cell = cells[(r["trainer"], r["regime"], r["mode"])]
            if len(cell) > 1:
                by_position.setdefault(r["queue_position"], []).append(r["loop_time_s"] / float(np.median(cell)))
    return [{"queue_position": p, "loop_time_over_cell_median": spread(v)} for p, v in sorted(by_position.items())]


def compute_per_step(records: list[dict]) -> dict[str, Optional[float]]:
    """Per trainer, the median step of the stock zero-latency runs (the compute C regimes scale with)."""
    out = {}
    for trainer in _ordered((r["trainer"] for r in records), ["v1", "v0"]):
        steps = [t for r in records if r["trainer"] == trainer and r["regime"] == "zero" and r["mode"] == STOCK
                 for t in r["step_times"]]
        out[trainer] = round(float(np.median(steps)), 3) if steps else None
    return out


# ------------------------------------------------------------------------------------------------
# report
# ------------------------------------------------------------------------------------------------

def _fmt(s: Optional[dict], pct: bool = False, none: str = "—") -> str:
    if not s:
        return none
    f = (lambda v: f"{v:.0%}") if pct else (lambda v: f"{v:.2f}")
    return f"{f(s['median'])} [{f(s['min'])}, {f(s['max'])}]"


def _fmt_interval(i: Optional[dict]) -> str:
    return "—" if not i else f"{i['mean']:+.3f} [{i['low']:+.3f}, {i['high']:+.3f}] (n={i['n']})"


def verdict_text(goal: dict, markdown: bool) -> str:
    """A goal's PASS / FAIL / not measured; a variant row meets or misses a threshold, not a goal."""
    if goal["pass"] is None:
        return "not measured" if markdown else "NOT MEASURED"
    if goal.get("variant"):
        text = "meets it" if goal["pass"] else "below it"
        return (text if goal["pass"] else f"**{text}**") if markdown else f"VARIANT {text}"
    return ("PASS" if goal["pass"] else "**FAIL**") if markdown else ("PASS" if goal["pass"] else "FAIL")


def goal_figure(goal: dict) -> str:
    figure = goal["figure"]
    if not figure:
        return "not measured"
    if "median" in figure and "regime" in figure:
        return f"worst: {figure['mode']} at {figure['regime']}, {_fmt(figure, True)}"
    if "median" in figure:
        middle = f"; steps 2..N-1: {_fmt(goal['middle_steps'], True)}" if goal.get("middle_steps") else ""
        return f"{_fmt(figure, True)} (vs the stock bound: {_fmt(goal['vs_stock_bound'], True)}{middle})"
    if "mean" in figure:
        return _fmt_interval(figure)
    return "; ".join(f"{k} {_fmt_interval(v)}" for k, v in figure.items())


def _regime_cell(report: dict, trainer: str, regime: str) -> str:
    compute = report["regime_compute_s"].get(trainer)  # the C the run's latencies were made of
    if regime == "zero" or not compute:
        return regime
    r = REGIMES[regime]
    return f"{regime} ({r.tail_x * compute:.2f} s)"


def _first_last(row: dict) -> str:
    first, last = row.get("first_step_minus_same_mode_bound_s"), row.get("last_step_minus_same_mode_bound_s")
    if not first or not last:
        return "—"
    return f"{first['median']:+.2f} / {last['median']:+.2f}"


def markdown(report: dict) -> str:
    """The README's e2e tables (a test checks the README quotes them verbatim)."""
    lines = [f"Setup: {report['setup']}", ""]
    lines += ["| trainer | regime | run | loop time s | reduction vs stock | hidden (stock bound) | hidden (same-mode bound) "
              "| hidden (same-mode bound), steps 2..N-1 | first / last step minus the same mode's, instant judge, s "
              "| blocked on rewards per step s | staleness mean / max |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in report["timing"]:
        stale = "—" if row["staleness_mean"] is None else f"{row['staleness_mean']['median']:.2f} / {row['staleness_max']:g}"
        lines.append(f"| {row['trainer']} | {_regime_cell(report, row['trainer'], row['regime'])} | {row['mode']} "
                     f"| {_fmt(row['loop_time_s'])} | {_fmt(row['reduction_vs_baseline'], True)} "
                     f"| {_fmt(row['hidden_vs_stock_bound'], True)} | {_fmt(row['hidden_vs_same_mode_bound'], True)} "
                     f"| {_fmt(row.get('hidden_vs_same_mode_bound_middle_steps'), True)} "
                     f"| {_first_last(row)} "
                     f"| {_fmt(row['blocked_on_rewards_per_step_s'])} | {stale} |")
    lines += ["", "| trainer | run | held-out reward after the last step | minus the stock baseline's (paired, 95% interval) "
              "| training batches' reward, last 3 steps | minus the stock baseline's | worse beyond noise (held-out) |",
              "|---|---|---|---|---|---|---|"]
    for row in report["learning"]:
        worse = {None: "—", True: "**yes**", False: "no"}[row["worse_beyond_noise"]]
        lines.append(f"| {row['trainer']} | {row['run']} | {_fmt(row.get('val_final'))} | {_fmt_interval(row.get('val_minus_baseline'))} "
                     f"| {_fmt(row['final_reward'])} | {_fmt_interval(row['final_minus_baseline'])} | {worse} |")
    for comp in report["comparisons"]:
        worse = {None: "—", True: "**yes**", False: "no"}[comp["worse_beyond_noise"]]
        held_out = comp.get("judged_on") == "held-out"
        interval = _fmt_interval(comp["interval"])
        what = "same failures" if comp.get("judged", True) else "what the failures cost; not judged"
        lines.append(f"| {comp['trainer']} | {comp['comparison']} ({what}) | — | {interval if held_out else '—'} "
                     f"| — | {'—' if held_out else interval} | {worse} |")
    lines += ["", "| trainer | goal | figure | result |", "|---|---|---|---|"]
    for goal in report["goals"]:
        lines.append(f"| {goal['trainer']} | {goal['goal']} | {goal_figure(goal)} | {verdict_text(goal, markdown=True)} |")
    return "\n".join(lines) + "\n"


def setup_text(report: dict) -> str:
    seeds = ", ".join(f"{t}: {len(s)} seed{'s' if len(s) != 1 else ''} ({','.join(map(str, s))})"
                      for t, s in report["seeds_run"].items())
    measured = report["compute_per_step_s"]
    compute = ", ".join(f"{t} {c} s" + (f" (median over all its stock zero-latency runs: {measured[t]} s)"
                                        if measured.get(t) and measured[t] != c else "")
                        for t, c in report["regime_compute_s"].items())
    regimes = "; ".join(f"`{name}`: {REGIMES[name].describe()}" for name in report["regimes"])
    return (f"{report['steps']} steps per run; {seeds}; C (step compute the regimes scale with) = {compute}; "
            f"regimes: {regimes}. Cells: median [min, max] over seeds, ratios paired within a seed.")


def print_report(report: dict) -> None:
    print()
    print(markdown(report))
    if report["skipped"]:
        print("SKIPPED: " + "; ".join(f"{m}: {why}" for m, why in report["skipped"].items()))
    if report["failed_runs"]:
        print("FAILED RUNS: " + "; ".join(report["failed_runs"]))
    if report["missing_runs"]:
        print(f"NOT RUN ({len(report['missing_runs'])} of the plan): " + ", ".join(report["missing_runs"][:20]))
    for goal in report["goals"]:
        print(f"[{verdict_text(goal, markdown=False)}] {goal['trainer']}: {goal['goal']}: {goal_figure(goal)}")
    if report.get("queue_bias"):
        print("harness check, loop time over its cell's median by place in the start-up queue: "
              + "; ".join(f"{row['queue_position'] + 1}: {_fmt(row['loop_time_over_cell_median'])}"
                          for row in report["queue_bias"]))


def analyse(records: list[dict]) -> dict:
    """Every table and the goals, from per-run records (of one benchmark run, or pooled from several)."""
    timing = timing_table(records)
    learning = learning_table(records)
    # mask against neutral meeting the same failures (against stock verl meeting them: the learning
    # table's row); what the failures cost, against stock verl without them: reported, not judged
    comparisons = (paired_comparison(records, "both_mask", "both_neutral")
                   + [row for mode in [STOCK, "both_mask"] for row in failure_cost(records, mode)])
    return {"timing": timing, "learning": learning, "comparisons": comparisons,
            "goals": goals(timing, learning, comparisons), "queue_bias": queue_bias(records)}


def build_report(records: list[dict], *, command: str, steps: int, seeds: dict, regimes: list[str],
                 regime_compute: dict, fingerprint: str, decode_s: float, skipped: dict, failed: list[str],
                 missing: list[str], started: float, from_cache: int, retried: list[str] = ()) -> dict:
    analysis = analyse(records)
    seeds_run = {t: sorted({r["seed"] for r in records if r["trainer"] == t}) for t in seeds}
    report = {
        "command": command,
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count(), "platform": platform.platform(),
                    "load_avg_at_end": os.getloadavg(),
                    "load_1min_around_runs": spread([v for r in records for v in (r.get("machine_load") or {}).values()])},
        "source_fingerprint": fingerprint, "steps": steps, "seeds_planned": seeds, "seeds_run": seeds_run,
        "regimes": regimes, "regime_definitions": {n: asdict(REGIMES[n]) for n in regimes},
        "regime_compute_s": regime_compute, "compute_per_step_s": compute_per_step(records),
        "decode_s_per_token": decode_s, "v1_poll_interval_s": V1_POLL_S, "agent_overrides": AGENT,
        "modes": {m: MODES[m] for m in sorted({r["mode"] for r in records})},
        **analysis,
        "skipped": skipped, "failed_runs": failed, "missing_runs": missing, "retried_runs": list(retried),
        "this_invocation_s": round(time.time() - started, 1), "runs_from_cache": from_cache,
        # judge calls only where the timeline may draw them (instant and heavy-tailed judges), to keep the JSON small
        "records": [{k: v for k, v in r.items() if k != "extra" and (k != "judge_calls" or r["regime"] in TIMELINE_JUDGE_CALLS)}
                    for r in records],
    }
    report["setup"] = setup_text(report)
    return report


# ------------------------------------------------------------------------------------------------
# main
# ------------------------------------------------------------------------------------------------

def _ints(text: str) -> list[int]:
    return [int(s) for s in text.split(",") if s.strip()]


def _names(text: str) -> list[str]:
    return [s.strip() for s in text.split(",") if s.strip()]


def parse_compute(text: Optional[str]) -> dict[str, float]:
    """"v1=0.8,v0=0.75" -> {"v1": 0.8, "v0": 0.75}."""
    out = {}
    for part in _names(text or ""):
        trainer, equals, value = part.partition("=")
        try:
            out[trainer.strip()] = float(value)
        except ValueError:
            raise SystemExit(f"--compute wants trainer=seconds per trainer (e.g. v1=0.86,v0=0.65), got {part!r}") from None
        if not equals or out[trainer.strip()] <= 0:
            raise SystemExit(f"--compute wants trainer=seconds per trainer (e.g. v1=0.86,v0=0.65), got {part!r}")
    return out


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trainers", default="v1,v0", help="v1 (verl's default, the headline) and/or v0")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--seeds", default="0,1,2", help="seeds of every trainer but v0")
    parser.add_argument("--v0-seeds", default="0,1", help="v0's seeds (fewer: v0 is verl's deprecated trainer)")
    parser.add_argument("--regimes", default="tail_1x,tail_2.5x,heavy_2.5x,fail20", help=f"of {[r for r in REGIMES if r != 'zero']}")
    parser.add_argument("--v0-regimes", default="tail_1x,heavy_2.5x", help="v0's regimes (fewer, to fit the time)")
    parser.add_argument("--strategies", default="both,tail_auto", help=f"strategy modes in the timing regimes, of {list(MODES)}")
    parser.add_argument("--failure-modes", default="both_neutral,both_mask", help="modes of the failure regimes")
    parser.add_argument("--skip", default="", help="regime:mode cells left out of the plan (e.g. to finish a "
                        "partial benchmark's essential cells first; a later --cached-only report still shows them)")
    parser.add_argument("--compute", help="fix C per trainer (e.g. v1=0.8,v0=0.8) instead of a calibration run")
    parser.add_argument("--decode-s", type=float, default=0.0, help="simulated decode seconds per token in the CPU rollout (every run)")
    parser.add_argument("--work", help="run folders and the per-run cache (default: <out>_runs/)")
    parser.add_argument("--out", default=str(RESULTS / "e2e.json"))
    parser.add_argument("--progress", action="store_true", help="per-step progress of each run")
    parser.add_argument("--parallel-startups", type=int, default=3,
                        help="runs started up together, then trained one at a time (needs the CPU backend's start gate)")
    parser.add_argument("--dry-run", action="store_true", help="print the plan and an estimate, run nothing")
    parser.add_argument("--cached-only", action="store_true",
                        help="report from the cached runs only (a partial benchmark: the rest are listed as not run)")
    parser.add_argument("--quick", action="store_true", help="CI smoke: 2 runs of 2 steps on v1")
    args = parser.parse_args(argv)
    if args.quick:
        args.trainers, args.steps, args.seeds, args.regimes = "v1", 2, "0", "heavy_2.5x"
        args.out = args.out.replace(".json", "_quick.json")

    trainers = _names(args.trainers)
    if set(trainers) - {"v1", "v0"} or not trainers:
        parser.error(f"--trainers: v1 and/or v0, got {args.trainers}")
    seeds = {t: _ints(args.v0_seeds if t == "v0" else args.seeds) for t in trainers}
    regimes_of = {t: _names(args.v0_regimes if t == "v0" else args.regimes) for t in trainers}
    strategies, failure_modes = _names(args.strategies), _names(args.failure_modes)
    for name in {r for rs in regimes_of.values() for r in rs}:
        if name not in REGIMES or name == "zero":
            parser.error(f"unknown regime {name!r}: choose from {[r for r in REGIMES if r != 'zero']}")
    for mode in strategies + failure_modes:
        if mode not in MODES or mode == STOCK:
            parser.error(f"unknown mode {mode!r}: choose from {[m for m in MODES if m != STOCK]}")
    if args.decode_s and decode_env() is None:
        parser.error("--decode-s: this tree's CPU rollout has no simulated decode time")
    skipped = {f"{m} on {t}": why for t in trainers for m in dict.fromkeys(strategies + failure_modes)
               if (why := mode_unavailable(m, t))}
    for what, why in skipped.items():
        print(f"SKIPPING {what}: {why}", flush=True)

    def usable(modes: list[str], trainer: str) -> list[str]:
        return [m for m in modes if f"{m} on {trainer}" not in skipped]

    if args.quick:
        cells = {"v1": [("zero", STOCK), ("heavy_2.5x", "tail_auto" if usable(["tail_auto"], "v1") else "both")]}
    else:
        cells = {t: plan_cells(regimes_of[t], usable(strategies, t), usable(failure_modes, t)) for t in trainers}
    skip = {tuple(cell.split(":", 1)) for cell in _names(args.skip)}
    if any(len(cell) != 2 for cell in skip):
        parser.error(f"--skip: regime:mode pairs, got {args.skip}")
    cells = {t: [c for c in cs if c not in skip] for t, cs in cells.items()}
    fixed = parse_compute(args.compute)
    runs = plan_runs(seeds, cells, calibrate={t for t in trainers if t not in fixed})
    print(f"{len(runs)} runs of {args.steps} steps ({', '.join(f'{t}: {len(seeds[t])} seeds x {len(cells[t])}' for t in trainers)}); "
          f"~{len(runs) * RUN_COST_S / 60:.0f} min at ~{RUN_COST_S} s a run on a quiet machine", flush=True)
    if args.dry_run:
        for run in runs:
            print(f"  {run.trainer} seed {run.seed} {run.regime:>11} {run.mode}")
        return 0

    from verl_async_rm_rig.cpu_backend.launch import CPURunConfig, prepare_assets

    work = Path(args.work or str(Path(args.out).with_suffix("")) + "_runs")
    cache = work / "records"
    cache.mkdir(parents=True, exist_ok=True)
    fingerprint = source_fingerprint()
    command = " ".join(["python bench/e2e.py", *(argv if argv is not None else sys.argv[1:])])
    records, failed, missing, retried = [], [], [], []
    started, from_cache = time.time(), 0
    regime_compute = dict(fixed)
    pending: list[tuple[int, Job, str]] = []

    def flush() -> None:
        """Execute the pending runs (together, when the start gate allows), cache and record them."""
        if not pending:
            return
        outcomes = execute_group([job for _, job, _ in pending], args.steps, args.progress, args.parallel_startups)
        for position, ((index, job, key), outcome) in enumerate(zip(pending, outcomes)):
            if isinstance(outcome, Exception):
                # once more, alone: on the shared machine a run can die of others' memory use (Ray's
                # OOM killer); a mode that fails twice is reported as failed, never dropped silently
                print(f"[{index}/{len(runs)}] {key}: failed ({outcome}); retrying it alone", flush=True)
                retried.append(key)
                kept = job.run_dir.with_name(job.run_dir.name + ".failed")  # its log, for the report's reader
                shutil.rmtree(kept, ignore_errors=True)
                if job.run_dir.exists():
                    job.run_dir.rename(kept)
                outcome = outcomes[position] = execute_group([job], args.steps, args.progress, 1)[0]
            if isinstance(outcome, Exception):  # reported at the end; the rest of the benchmark goes on
                print(f"[{index}/{len(runs)}] {key}: FAILED: {outcome}", flush=True)
                failed.append(f"{key}: {outcome}")
                continue
            record = record_of(job.run, job.settings, outcome)
            (cache / f"{key}.json").write_text(json.dumps(record))
            records.append(record)
            print(f"[{index}/{len(runs)}] {key}: loop {record['loop_time_s']:.1f} s (run {outcome.wall_s:.0f} s), "
                  f"final reward {record['final_reward']:.3f} ({(time.time() - started) / 60:.1f} min elapsed)", flush=True)
            calibrate_from(record)
        pending.clear()

    def calibrate_from(record: dict) -> None:
        """The first stock zero-latency run of a trainer without a fixed C measures it."""
        trainer = record["trainer"]
        if trainer not in regime_compute and record["regime"] == "zero" and record["mode"] == STOCK:
            regime_compute[trainer] = round(float(np.median(record["step_times"])), 3)
            print(f"calibration: {trainer} step compute C = {regime_compute[trainer]} s", flush=True)

    for index, run in enumerate(runs, 1):
        calibration = run.trainer not in regime_compute and run.regime == "zero" and run.mode == STOCK
        if calibration:
            flush()
        if run.trainer not in regime_compute and not calibration:
            missing.append(f"{run.trainer}/s{run.seed}/{run.regime}/{run.mode}")  # its calibration failed
            continue
        settings = run_settings(run, regime_compute.get(run.trainer, 0.0), args.decode_s)
        key = run_key(run, args.steps, settings, fingerprint)
        cached = cache / f"{key}.json"
        if cached.exists():
            records.append(json.loads(cached.read_text()))
            from_cache += 1
            print(f"[{index}/{len(runs)}] {key}: cached", flush=True)
            calibrate_from(records[-1])
            continue
        if args.cached_only:
            missing.append(f"{run.trainer}/s{run.seed}/{run.regime}/{run.mode}")
            continue
        assets = prepare_assets(CPURunConfig(out_dir=str(work / f"assets_seed{run.seed}"), seed=run.seed))
        if pending and startup_group(pending[-1][1].run) != startup_group(run):
            flush()
        pending.append((index, Job(run, settings, work / key, assets), key))
        if calibration or len(pending) >= args.parallel_startups:
            flush()
    flush()

    report = build_report(records, command=command, steps=args.steps, seeds=seeds,
                          regimes=list(dict.fromkeys(r for rs in regimes_of.values() for r in rs)) if not args.quick else ["heavy_2.5x"],
                          regime_compute=regime_compute, fingerprint=fingerprint, decode_s=args.decode_s, skipped=skipped,
                          failed=failed, missing=missing, started=started, from_cache=from_cache, retried=retried)
    print_report(report)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2))
    print(f"\nresults: {args.out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
