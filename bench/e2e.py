"""End-to-end benchmark of issues 14 and 43: verl's real trainer on CPU, side by side in one run.

Every run is verl's trainer (v1, verl's default, as the headline; v0 alongside) on the CPU backend
with the toy task (8 prompts x 4 samples, 4 PPO mini-batches per step), the reward behind a
simulated judge (``verl_async_rm_rig.cpu_backend.latency``) or, in ``judge_real``, a real HTTP judge,
scored through the ``async_agent`` reward manager unless the mode is verl's own reward loop. A run is
(trainer, seed, regime, mode):

- regimes, in units of the measured step compute C (the median step of the stock trainer with an
  instant reward; measured by a calibration run first, or fixed with ``--compute``):
  ``zero`` (instant judge: the bounds), ``tail_1x`` (uniform in [C/40, C]), ``tail_2.5x`` (uniform
  in [2.5C/40, 2.5C]), ``heavy_2.5x`` (lognormal with p99 = 2.5C and p50 = p99/10, plus rare hangs
  that the agent's deadline settles), ``fail20`` (``tail_1x`` with 20% of judge calls failing),
  ``judge_real`` (the loopback judge server through the real openai client, as a hosted judge: a
  token bucket below the demand answering 429 + Retry-After, 5% HTTP 500s, 1% hangs, lognormal
  latency with p99 = C; cpu_backend/judged_toy.py);
- modes: ``baseline`` (verl's stock trainer, rewards scored per sample in verl's agent loop), the
  strategies (``both``: mini-batch pipeline + one step off-policy; ``tail``: the tail-tolerant pool
  with bounded staleness; ``tail_drop``, ``tail_s6`` and ``tail_auto``: its variants), under
  failures stock verl, ``both_neutral`` and ``both_mask``; and verl's own answer, the anchor:
  ``verl_colocate_async`` (``trainer.v1.trainer_mode=colocate_async`` with verl's reward loop, at its
  best for the judge: the ``rate_limited`` manager given the judge's limits and timeout, verl's default
  ``reward.num_workers``) and ``colocate_async_agent`` (the same command plus
  ``reward.reward_manager.name=async_agent``); for issue 46's A/B (``--admission-ab``), ``colocate_async_agent``
  and ``tail_auto`` (the agent's default ``admission_order: fifo``) beside their deadline twins (``*_deadline``:
  the same command plus ``reward.async_agent.admission_order=deadline``), judged on the trainer-timed blocked
  time and the loop time, paired within a seed.

Figures, per (trainer, regime, mode), median [min, max] over seeds, ratios paired within a seed:
loop time (from the start gate to the last step's end, by the trainer's step clock: the time before
step 1 and between steps counts; Ray start-up and the warm-up absorbed by a validation pass are left
out; the sum of step times where a trainer has no clock, v0), reduction vs the stock baseline, the
hidden fraction (T_base - T) / (T_base - T_bound) against two bounds (the stock zero-latency run, and
the same mode run with zero latency; a check), the latter also on steps 2..N-1 alone, the reward wait
exposed (the judged figure: the time the trainer itself timed as blocked on rewards, over what its
same-mode bound timed, as a share of the stock run's wait), and the staleness the trainer measured.
In ``judge_real`` also what the judge server saw during the loop (requests per trained sample, 429s,
goodput against its limit) and the samples trained on a failed call's 0 (verl's rollout dump joined
with the judge log). Learning: the held-out reward after the last step (verl's validation,
``VAL_SAMPLES`` samples per prompt; where dumped, the toy task's own score of the responses, which no
judge failure can bend) minus the same seed's baseline, 95% t-interval, with the training batches'
reward over the last 3 steps beside it; ``both_mask`` vs ``both_neutral`` and vs stock verl, each
meeting the same failures, paired. The done-when goals are printed as PASS/FAIL with their figures:
issue 14's against the same-mode bound, issue 43's as paired intervals against verl's
``colocate_async`` (``--recommended`` names the configuration judged; every other candidate is shown
against the same thresholds).

Fairness: every mode of a (trainer, seed) gets the same model, data, judge draws (hashed per
response and seed; the HTTP judge draws per request from its seed), sampling draws (the CPU rollout's paired draws: a prompt's samples come from
generators seeded by the prompt, so a strategy generating a step ahead draws what the baseline
draws; its learning gap is the strategy's, not sampling luck) and settings (agent concurrency, the v1 sampler's poll interval, the deadline);
each run starts its own Ray cluster the same way. A (trainer, seed, regime)'s runs (stock, every
mode and each one's zero-latency bound) start up together and train back to back, so a reduction
and a hidden fraction compare runs made at the same machine pace (the pace of start-up groups varied
up to 2x within one benchmark: a bound trained in another group, minutes apart, swung the hidden
fraction 60-146% per seed); the order of the regimes and each run's place in its group's queue are
a seeded shuffle, so drift on the shared machine does not favour one mode (the calibration run goes
first). A fixed ``--compute`` is checked against every group's stock bound: a step more than 1.5x
off C changes what a regime means, and is reported (``--recalibrate``: measured first and used
instead). Several runs of one package tree are judged together by bench/pool_e2e.py.

Each finished run is cached under --work, keyed by what it ran (trainer, seed, regime parameters in
seconds, mode, steps, and a fingerprint of the package source), so the same command resumes after an
interruption; delete the folder to measure afresh.
    python bench/e2e.py              # the earlier benchmark against verl's sync trainer (plan and estimate: add --dry-run)
    python bench/e2e.py --anchor     # issue 43: against verl's colocate_async, bench/results/e2e_anchor.json
    python bench/e2e.py --admission-ab   # issue 46: admission_order fifo vs deadline, bench/results/e2e_admission.json
    python bench/e2e.py --quick      # CI smoke: 2 short v1 runs (calibration + the tail-tolerant mode; 1 with --compute)
    python bench/results_page.py --write   # docs/results.md and the README's results table from bench/results/
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import platform
import random
import shutil
import subprocess
import sys
import time
import typing
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# The regimes and the contestants: one home with the demo's lanes (rig/verl_async_rm_rig/contestants.py)
from verl_async_rm_rig.contestants import (  # noqa: E402
    ADMISSION_REGIMES,
    AGENT,
    AGENT_COLOCATE,
    AGENT_COLOCATE_AHEAD,
    ANCHOR_DECODE_S,
    ANCHOR_REGIMES,
    DEADLINE_TWINS,
    MODES,
    OWN_WAIT_KEYS,  # noqa: F401 (the records' trainer_wait_key: e2e.OWN_WAIT_KEYS to its readers)
    PACE_TOLERANCE,
    RECOMMENDED,
    REGIMES,
    REWARD_MANAGER,
    SAMPLES_PER_STEP,
    SHAPE,
    STOCK,
    STOCK_COMMAND,
    TRAINER_WAIT_KEY,  # noqa: F401 (as OWN_WAIT_KEYS)
    V1_POLL_S,
    VERL_COLOCATE,
    VERL_MODES,
    VERL_REFERENCE,
    colocate,
    reward_function,
    reward_loop_overrides,
    trainer_wait,
)
from verl_async_rm_rig.contestants import start_judge_server as start_server  # noqa: E402
from verl_async_rm_rig.demo import ModeResult, summarize  # noqa: E402

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
# The done-when goals, judged on medians over seeds against the same-mode bound.
GOAL_BOTH_HIDDEN = 0.95  # `both` where the latency tail <= step compute
GOAL_TAIL_HIDDEN = 0.90  # the tail-tolerant mode, heavy-tailed latency with p99 = 2.5x compute
TIMELINE_JUDGE_CALLS = ("zero", "heavy_2.5x", "judge_real")  # regimes whose records keep their judge calls in the JSON
RUN_COST_S = 40  # a run's wall time with start-ups overlapped (the start gate), 2 idle cores
# ... more for a run of verl's reward loop at its default size: 8 reward-loop worker processes start
# (each imports verl) and hold memory, so fewer such runs start up together
VERL_REWARD_LOOP_RUN_COST_S = 60
# The configuration issue 43's goals judge (--recommended: contestants.RECOMMENDED by default), and the
# others measured against the same thresholds, each on its own row: the measurement decides which one
# the README recommends.
CANDIDATES = (AGENT_COLOCATE, "both", "tail_auto", AGENT_COLOCATE_AHEAD)


CALIBRATION = "calibration"  # the group of the run that measures C (trains alone, bounds nothing)


@dataclass(frozen=True, order=True)
class Run:
    trainer: str
    seed: int
    regime: str
    mode: str
    # The start-up group's regime: a zero-latency bound starts up and trains beside the runs it bounds
    # ("" for a regime's own runs; CALIBRATION for the run that measures C)
    group: str = ""

    @property
    def group_regime(self) -> str:
        return self.group or self.regime


def mode_unavailable(mode: str, trainer: str = "v1") -> Optional[str]:
    """Why this tree cannot run ``mode`` on ``trainer`` (its feature not merged, or refused there), or
    None. Checked up front so such runs are skipped loudly instead of failing after verl's start-up."""
    overrides = " ".join(MODES[mode])
    if trainer == "v0" and "trainer.v1.trainer_mode" in overrides:
        return "verl's trainer modes (trainer.v1.trainer_mode) are its v1 trainer's"
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
    if "admission_order=" in overrides and "admission_order:" not in (
            ROOT / "verl_async_rm" / "hydra_conf" / "async_reward_settings.yaml").read_text():
        return "admission_order (issue 46) is not in this tree"
    if "failure_policy=mask" in overrides:
        from verl_async_rm.failure_policy import PolicyName

        if "mask" not in typing.get_args(PolicyName):
            return "failure_policy: mask is not in this tree"
    return None


# ------------------------------------------------------------------------------------------------
# the plan
# ------------------------------------------------------------------------------------------------

def plan_cells(regimes: list[str], strategies: list[str], failure_modes: list[str]) -> list[tuple[str, str, str]]:
    """(regime, mode, start-up group) of one (trainer, seed): in every timing regime the stock
    baseline and every strategy, each beside its zero-latency bound in the same group (the stock
    bound and the same-mode bound train at the pace of the runs they bound); in the failure regimes
    the stock baseline (stock verl meeting the same failures) and the failure modes."""
    timing = [r for r in regimes if REGIMES[r].timing and r != "zero"]
    modes = [STOCK, *strategies]
    cells = [(cell, m, r) for r in timing for cell in (r, "zero") for m in modes]
    cells += [(r, m, r) for r in regimes if not REGIMES[r].timing for m in [STOCK, *failure_modes] if failure_modes]
    return cells


def plan_runs(seeds: dict[str, list[int]], cells: dict[str, list[tuple[str, str, str]]],
              calibrate: set[str]) -> list[Run]:
    """Every run once, in (trainer, seed) blocks, v1 first and v0 one block behind (v1 s0, v1 s1,
    v0 s0, v1 s2, v0 s1: a partial benchmark still has seeds of both trainers, the headline's first).
    Within a block, each regime's runs (its stock run, every mode and their zero-latency bounds) are
    consecutive, one start-up group (``startup_group``): the runs a reduction or a hidden fraction
    compares start up together and train back to back, at the same machine pace. The order of the
    regimes, and of the runs within a regime (their place in the group's queue), is a seeded shuffle.
    A trainer in ``calibrate`` gets a calibration run first (stock trainer, instant judge, a group of
    its own): it measures C, which every other run's judge is made of, so it trains before them."""
    blocks = sorted(((index + (trainer == "v0"), trainer != "v1", trainer, index, seed)
                     for trainer, trainer_seeds in seeds.items() for index, seed in enumerate(trainer_seeds)))
    runs: list[Run] = []
    for *_, trainer, index, seed in blocks:
        shuffle = random.Random(f"{trainer}-{seed}").shuffle
        # group -> mode -> its runs there (the mode's run in the regime and its bound: a pair, kept
        # adjacent so that they start up in one batch and train back to back)
        columns: dict[str, dict[str, list[Run]]] = {}
        for regime, mode, group in cells[trainer]:
            run = Run(trainer, seed, regime, mode, "" if group == regime else group)
            columns.setdefault(group, {}).setdefault(mode, []).append(run)
        order = list(columns)
        shuffle(order)
        if index == 0 and trainer in calibrate:
            runs.append(Run(trainer, seed, "zero", STOCK, CALIBRATION))
        for group in order:
            pairs = list(columns[group].values())
            shuffle(pairs)
            for pair in pairs:
                shuffle(pair)
                runs += pair
    return runs


def same_pair(a: Run, b: Run) -> bool:
    """``a`` and ``b`` are one mode's run and its zero-latency bound, in one group."""
    return (a.trainer, a.seed, a.mode, a.group_regime) == (b.trainer, b.seed, b.mode, b.group_regime) and a != b


def startup_group(run: Run) -> tuple:
    """Runs with the same key may start up together (up to --parallel-startups of them); a run of
    another key starts a new group. One (trainer, seed, regime), bounds included: see plan_runs."""
    return run.trainer, run.seed, run.group_regime


# What the runs measure: the package, and the rig parts a run executes (the CPU backend: rollout,
# samplers, the toy rewards; the loopback judge). A README, bench or demo edit keeps the cache.
FINGERPRINTED = ("verl_async_rm", "rig/verl_async_rm_rig/cpu_backend", "rig/verl_async_rm_rig/judge_server.py")


def source_fingerprint() -> str:
    """The source the runs measure (FINGERPRINTED): git's hashes of those paths, plus a hash of
    uncommitted changes there. Part of every cache key, so a merge that changes the trainer, the
    CPU backend (e.g. partial rollouts) or the judge never mixes with runs of the old code."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout

    try:
        trees = [git("rev-parse", f"HEAD:{path}").strip() for path in FINGERPRINTED]
        dirty = git("diff", "HEAD", "--", *FINGERPRINTED) + git("ls-files", "--others", "--exclude-standard", *FINGERPRINTED)
    except (subprocess.CalledProcessError, FileNotFoundError):
        return "nogit"
    tree = trees[0][:10] if len(trees) == 1 else hashlib.sha1(" ".join(trees).encode()).hexdigest()[:10]
    return tree + ("+" + hashlib.sha1(dirty.encode()).hexdigest()[:8] if dirty else "")


def async_fast_poll_supported() -> bool:
    """Whether the CPU backend's fast-polling v1 sampler covers verl's async replay buffer
    (colocate_async) too, not only its sync one. Read from the sampler's source: importing it imports
    verl (seconds in the benchmark's process). Without it, colocate_async runs keep verl's own
    sampler, which polls every 2 s: fine for trying the harness, not for figures (reported)."""
    from importlib.util import find_spec

    spec = find_spec("verl_async_rm_rig.cpu_backend.v1_sampler")
    return spec is not None and spec.origin is not None and "class FastPollReplayBufferAsync" in Path(spec.origin).read_text()


def v1_poll_interval(mode: str) -> Optional[float]:
    """The v1 sampler's poll interval a run gets: V1_POLL_S, except verl's async trainer modes on a
    CPU backend whose fast sampler is verl's sync one only (None: verl's own sampler)."""
    if colocate(mode) and not async_fast_poll_supported():
        return None
    return V1_POLL_S


def run_settings(run: Run, compute_s: float, decode_s: float, test_freq: int = 0) -> dict:
    """Everything that decides what a run measures (its cache key is a digest of this). ``test_freq``:
    verl's validation every that many steps as well (0: before the first step and after the last only)."""
    regime = REGIMES[run.regime]
    manager = REWARD_MANAGER.get(run.mode, "async_agent")
    settings = {"judge": regime.judge(compute_s, run.seed),
                "overrides": [*SHAPE, *VALIDATION, *MODES[run.mode], *reward_loop_overrides(regime, run.mode, compute_s)],
                "decode_s": decode_s}
    # Keys only where they differ from every earlier run's, so the cache of those runs still holds.
    if manager != "async_agent":
        settings["reward_manager"] = manager
    if run.trainer == "v1" and v1_poll_interval(run.mode) != V1_POLL_S:
        settings["v1_poll_interval_s"] = v1_poll_interval(run.mode)
    if test_freq:
        settings["test_freq"] = test_freq
    return settings


def run_key(run: Run, steps: int, settings: dict, fingerprint: str) -> str:
    """The run's folder and cache name. A zero-latency bound's group is part of it: the bound of
    each regime is its own run, trained beside the runs it bounds, never one run reused."""
    digest = hashlib.sha1(json.dumps([settings, fingerprint, *([run.group] if run.group else [])],
                                     sort_keys=True).encode()).hexdigest()[:10]
    return f"{run.trainer}_steps{steps}_seed{run.seed}_{run.regime}_{run.mode}_{digest}"


# ------------------------------------------------------------------------------------------------
# one run
# ------------------------------------------------------------------------------------------------

# timing_s/old_log_prob: the same worker call on the same batch in every mode, so a check on the
# machine's pace in each run (a mode's slower update means little if this pass slowed as much)
SAME_WORK_KEY = "timing_s/old_log_prob"
# verl's own: the step's wait for the replay buffer (TRAINER_WAIT_KEY), the final validation's time,
# and its v1 trainer's staleness and evictions (the anchor modes have no async_rm/ metrics)
VERL_STALENESS = "training/off_policy/trajectory_staleness/"
EXTRA_PREFIXES = ("async_rm/", "async_reward/", "val-core/", SAME_WORK_KEY, "timing_s/gen", "timing_s/reward_wait", "timing_s/testing",
                  VERL_STALENESS, "training/rollout_failure/")


def extra_series(metrics: list[dict]) -> dict[str, list[float]]:
    """Per-step values of this package's metrics (staleness, carried/dropped groups, failures...)."""
    out: dict[str, list[float]] = {}
    for entry in metrics:
        for key, value in entry["data"].items():
            if key.startswith(EXTRA_PREFIXES) and isinstance(value, (int, float)):
                out.setdefault(key, []).append(float(value))
    return out


JUDGE_LOG = "judge_calls.jsonl"
# verl's dumps of what each step trained on and of each validation, one JSONL file per step: the
# samples trained on a failed call's 0, and the toy task's own score of the responses
ROLLOUT_DUMPS, VALIDATION_DUMPS = "rollouts", "validations"


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
    server: object = None  # judge_real: its own loopback judge server (JudgeServer), while it runs


@dataclass
class Outcome:
    summary: ModeResult
    extra: dict
    wall_s: float  # start-up plus training (a gated run's wait at the gate left out)
    load: dict  # the machine's 1-min load average before and after the training
    startup_s: Optional[float] = None  # a gated run: launch to waiting at the gate (Ray, workers, validation)
    queue_position: Optional[int] = None  # a gated run: how many runs of its start-up group trained before it
    judge_server: Optional[dict] = None  # judge_real: what the judge saw during the loop (verl_async_rm_rig.run_figures.judge_window)
    dumps: Optional[dict] = None  # what verl's dumps and the judge log say (verl_async_rm_rig.run_figures.dump_figures)


def start_judge_server(job: Job):
    """judge_real: a loopback judge server of the run's own (a fresh token bucket and counters), before
    the run starts (its validation before step 1 calls the judge too), or None for a simulated judge."""
    return start_server(job.settings["judge"])


def run_config(job: Job, steps: int, start_gate: bool = False):
    """The trainer run of ``job``: identical for every mode but for the mode's own overrides (and, for
    verl's reward loop, its manager)."""
    from verl_async_rm_rig.cpu_backend.launch import CPURunConfig

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
    judge = job.settings["judge"]
    if "server" in judge and job.server is None:  # judge_real: the toy reward through the loopback server
        raise RuntimeError(f"{job.run}: its judge server is not running")
    reward = reward_function(judge, job.server.base_url if job.server is not None else None)
    run_dir = Path(job.run_dir).absolute()
    dumps = [f"trainer.rollout_data_dir={run_dir / ROLLOUT_DUMPS}", f"trainer.validation_data_dir={run_dir / VALIDATION_DUMPS}"]
    return CPURunConfig(
        out_dir=str(job.run_dir), trainer=job.run.trainer, steps=steps, seed=job.run.seed, entry_module="verl_async_rm.main_ppo",
        model_dir=job.assets.model_dir, train_file=job.assets.train_file, val_file=job.assets.val_file, val_before_train=True,
        **reward, reward_manager=job.settings.get("reward_manager", "async_agent"), timeout_s=1800,
        v1_poll_interval_s=job.settings.get("v1_poll_interval_s", V1_POLL_S), test_freq=job.settings.get("test_freq") or steps,  # + after the last step
        extra_env=env, extra_overrides=[*dumps, *job.settings["overrides"]], **gate,
    )


def start_gate_supported() -> bool:
    """Whether the CPU backend can start several runs together and train them one at a time (the demo
    helper's start gate, cpu_backend/start_gate.py)."""
    from dataclasses import fields

    from verl_async_rm_rig.cpu_backend import launch

    return hasattr(launch, "start") and any(f.name == "start_gate" for f in fields(launch.CPURunConfig))


def outcome_of(job: Job, steps: int, result, wall_s: float, load: dict, startup_s: Optional[float] = None,
             loop_start: Optional[float] = None, queue_position: Optional[int] = None,
             step_starts: Optional[list[float]] = None) -> Outcome:
    """``loop_start``: wall-clock time the training loop began (a gated run's), which places the judge
    calls on the step timeline (the demo's reader); without it the run has no calls drawn.
    ``step_starts``: the trainer's step clock (wall-clock starts), which places the steps there too and
    makes the loop time run from the gate (verl_async_rm_rig.run_figures.step_offsets)."""
    from verl_async_rm_rig.run_figures import dump_figures, judge_window, read_dumps, read_jsonl, step_offsets
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
    if loop_start is not None and step_starts:
        try:
            summary.step_starts = step_offsets(loop_start, step_starts, summary.step_times) or []
        except ValueError as error:
            raise RuntimeError(f"{job.run}: {error}") from None
    judge = None
    if job.server is not None:
        if loop_start is None:
            raise RuntimeError(f"{job.run}: a judge_real run needs the start gate (the loop's start places the judge's window)")
        stats = job.server.stats()
        # the server stamps arrivals with this process's monotonic clock; the gate with Unix time
        start = loop_start - (time.time() - time.monotonic())
        server = job.settings["judge"]["server"]
        judge = judge_window(((r.arrived, r.outcome, r.finished) for r in stats.records), start, start + summary.loop_time,
                             server["bucket_capacity"], server["bucket_refill_per_s"], steps * SAMPLES_PER_STEP)
        judge["whole_run_outcomes"] = {k: v for k, v in stats.outcomes.items() if v}
    dumps = dump_figures(read_dumps(Path(job.run_dir) / ROLLOUT_DUMPS), read_dumps(Path(job.run_dir) / VALIDATION_DUMPS),
                         read_jsonl(Path(job.run_dir) / JUDGE_LOG), FINAL_STEPS)
    return Outcome(summary, extra_series(read_all_metrics(str(job.run_dir))), round(wall_s, 1), load,
                   None if startup_s is None else round(startup_s, 1), queue_position, judge, dumps)



def startups_that_fit(jobs: list[Job], parallel: int) -> int:
    """How many of ``jobs`` (from the first) start up together: at most ``parallel``, and only as many
    as free memory holds (a Ray cluster a run; a verl reward loop of 8 workers weighs more)."""
    # a reward-loop worker's memory beyond a standard run's: demo.REWARD_LOOP_WORKER_GB, the demo's estimate
    from verl_async_rm_rig.demo import REWARD_LOOP_WORKER_GB, RUN_MEMORY_GB, default_parallel_startups

    weights = [1 + (STOCK_COMMAND.get(job.run.mode, 1) - 1) * REWARD_LOOP_WORKER_GB / RUN_MEMORY_GB["per_run"]
               for job in jobs]
    budget = default_parallel_startups(math.ceil(sum(weights)), share_ray=False)  # standard runs that fit
    count, used = 0, 0.0
    for weight in weights[:parallel]:
        if count and used + weight > budget:
            break
        count, used = count + 1, used + weight
    return max(1, count)


def first_batch(runs: list[Run], fit: int) -> int:
    """How many of ``runs`` start up in the first batch: ``fit`` (what memory and --parallel-startups
    allow), less one where that would start a run and its zero-latency bound in two batches."""
    size = max(1, min(fit, len(runs)))
    if 1 < size < len(runs) and same_pair(runs[size - 1], runs[size]):
        size -= 1
    return size


def execute_group(jobs: list[Job], steps: int, progress: bool, parallel: int) -> list:
    """Run ``jobs``; per job an Outcome, or the exception that ended it (one broken run must not end
    the benchmark). Every run starts its own Ray cluster in a fresh folder (an interrupted run starts
    over, never resumes). With the start gate (every run passes it, even alone: one code path for all
    modes, and the loop's start time places the judge calls) up to ``parallel`` runs start up together
    (verl's start-up leaves the cores idle between stages) and then train one at a time, in plan
    order, the others frozen at their gates: no two measured training loops overlap, none shares the
    machine with a parked run, and every mode is treated the same way. A judge_real run gets its own
    judge server from before its start-up to its end."""
    from verl_async_rm_rig.cpu_backend import launch

    for job in jobs:
        shutil.rmtree(job.run_dir, ignore_errors=True)
    if parallel > 1 and start_gate_supported():
        # the machine is shared: only as many start-ups at once as free memory holds
        parallel = first_batch([job.run for job in jobs], min(parallel, startups_that_fit(jobs, parallel)))
        if parallel < len(jobs):  # in groups; a group of one still passes its gate (the loop's start time)
            head = execute_group(jobs[:parallel], steps, progress, parallel)
            return head + execute_group(jobs[parallel:], steps, progress, parallel)
    try:
        for job in jobs:
            job.server = start_judge_server(job)
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
        return _execute_gated(jobs, steps, progress)
    finally:
        for job in jobs:
            if job.server is not None:
                job.server.close()
                job.server = None


def _execute_gated(jobs: list[Job], steps: int, progress: bool) -> list:
    from verl_async_rm_rig.cpu_backend import launch
    from verl_async_rm_rig.cpu_backend.start_gate import passed_marker, read_step_clock

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
                marker = passed_marker(trainer.gate)
                loop_start = float(marker.read_text()) if marker.exists() else None
                outcomes.append(outcome_of(job, steps, result, wall, load, trainer.gate_reached_s, loop_start, position,
                                           read_step_clock(trainer.gate)))
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


def staleness(extra: dict) -> tuple[Optional[float], Optional[float], Optional[str]]:
    """(mean, max, source): this package's pool's staleness where it ran, else verl's v1 trainer's
    (the weight versions between a trajectory's generation and its update)."""
    for prefix, source in (("async_rm/staleness/", "async_rm"), (VERL_STALENESS, "verl")):
        mean, worst = extra.get(prefix + "mean"), extra.get(prefix + "max")
        if mean:
            return float(np.mean(mean)), (max(worst) if worst else None), source
    return None, None, None


def record_of(run: Run, settings: dict, outcome: Outcome) -> dict:
    summary, extra = outcome.summary, outcome.extra
    val_first, val_final = validation_rewards(extra)

    def last(key, how):
        values = extra.get(key)
        return how(values) if values else None

    wait_key, wait_s = trainer_wait(run.mode, extra)
    stale_mean, stale_max, stale_source = staleness(extra)
    starts = list(getattr(summary, "step_starts", []) or [])
    dumps = outcome.dumps or {}
    return {
        **asdict(run), "judge": settings["judge"], "overrides": settings["overrides"], "decode_s": settings["decode_s"],
        "reward_manager": settings.get("reward_manager", "async_agent"),
        "v1_poll_interval_s": settings.get("v1_poll_interval_s", V1_POLL_S) if run.trainer == "v1" else None,
        # from the gate to the last step's end where the trainer has a step clock, else the steps' sum
        "loop_time_s": summary.loop_time, "step_sum_s": float(sum(summary.step_times)),
        "step_starts": [round(t, 3) for t in starts] or None, "gate_to_first_step_s": round(starts[0], 3) if starts else None,
        "run_wall_s": outcome.wall_s, "startup_s": outcome.startup_s,
        "blocked_per_step_s": float(np.mean(summary.blocked)) if summary.blocked else None,
        "trainer_wait_key": wait_key, "trainer_wait_s": wait_s,
        # verl's validation passes inside the loop (--test-freq; the last step's comes after the loop's end):
        # the trainer waits for each, its generation and its rewards (timing_s/testing)
        "validation_in_loop_s": float(sum(extra.get("timing_s/testing", [])[:-1])),
        "final_reward": float(np.mean(summary.scores[-FINAL_STEPS:])),
        "first_reward": float(np.mean(summary.scores[:FINAL_STEPS])),
        "val_first": val_first, "val_final": val_final,
        # the toy task's own score of what was dumped: what no judge failure bends
        "toy_final_true": dumps.get("toy_final_true"), "val_first_true": dumps.get("val_first_true"),
        "val_final_true": dumps.get("val_final_true"),
        "staleness_mean": stale_mean, "staleness_max": stale_max, "staleness_source": stale_source,
        # cumulative counters in the trainer's metrics: the run's total is the last step's value
        "groups_carried": last("async_rm/groups_carried", lambda v: v[-1]),
        "groups_dropped_stale": last("async_rm/groups_dropped_stale", lambda v: v[-1]),
        "off_policy_steps_chosen": last("async_rm/off_policy_steps", lambda v: float(np.mean(v))),
        "evicted_samples": last("training/rollout_failure/evicted_samples", sum),
        # samples the updates trained on a failed judge call's 0 (verl_async_rm_rig.run_figures.trained_on_failures)
        "trained_failed_zero": dumps.get("failed_scored_zero"), "trained_failed_ambiguous": dumps.get("ambiguous"),
        "trained_scored_off": dumps.get("scored_off"), "trained_unjoined": dumps.get("unjoined"),
        "trained_rows": dumps.get("rows"), "judge_calls_by_split": dumps.get("judge_calls_by_split"),
        "judge_server": outcome.judge_server,
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


def _measured(records: list[dict]) -> list[dict]:
    """The runs the tables compare: all but the calibration run (it trained alone, before its group,
    and bounds nothing; its step measured C)."""
    return [r for r in records if r.get("group") != CALIBRATION]


def _index(records: list[dict]) -> dict[tuple, dict]:
    """(trainer, unit, regime, mode, start-up group) -> the run. A regime's own runs have group ""; a
    zero-latency bound the regime it bounds ("" in reports from before bounds joined their groups)."""
    return {(r["trainer"], _unit(r), r["regime"], r["mode"], r.get("group") or ""): r for r in _measured(records)}


def _run(at: dict, trainer: str, unit: tuple, regime: str, mode: str) -> Optional[dict]:
    return at.get((trainer, unit, regime, mode, ""))


def _bound(at: dict, trainer: str, unit: tuple, mode: str, group: str) -> Optional[dict]:
    """``mode``'s zero-latency run that bounds ``group``'s runs: the one that started up and trained in
    that group; in an older report, the seed's only one."""
    return at.get((trainer, unit, "zero", mode, group)) or at.get((trainer, unit, "zero", mode, ""))


def _ordered(values, order) -> list:
    return sorted(set(values), key=lambda v: (order.index(v) if v in order else len(order), v))


def _wait_and_exposure(at: dict, r: dict, regime: str, mode: str) -> tuple[Optional[float], Optional[float], Optional[float]]:
    """(the reward wait, the part of it the trainer timed as blocked, that part over the wait) of run
    ``r``: the wait is the same seed's stock run's loop time over its zero-latency bound's (the time
    the stock trainer spends on rewards); the exposure is what ``r``'s trainer timed as waiting
    (trainer_wait) over what its same-mode bound, in the same group, timed."""
    trainer, unit = r["trainer"], _unit(r)
    base, stock_bound = _run(at, trainer, unit, regime, STOCK), _bound(at, trainer, unit, STOCK, regime)
    own_bound = _bound(at, trainer, unit, mode, regime)
    wait = base["loop_time_s"] - stock_bound["loop_time_s"] if base and stock_bound else None
    exposed = None
    if r.get("trainer_wait_s") is not None and own_bound and own_bound.get("trainer_wait_s") is not None:
        # with validation inside the loop (--test-freq), its passes are waited for too: their time beyond
        # the bound's (the same passes with an instant judge) is their reward wait
        exposed = (r["trainer_wait_s"] + r.get("validation_in_loop_s", 0.0)
                   - own_bound["trainer_wait_s"] - own_bound.get("validation_in_loop_s", 0.0))
    share = exposed / wait if exposed is not None and wait and wait > 0 else None
    return wait, exposed, share


def timing_table(records: list[dict]) -> list[dict]:
    """One row per (trainer, timing regime, mode); ratios paired within a seed. Hidden fraction
    against the stock bound (stock trainer, instant judge) and against the same mode's bound (the
    same mode, instant judge, in the same start-up group): (T_base - T) / (T_base - T_bound), where
    T_base > T_bound. The reward wait exposed, the judged figure: the time the trainer timed as
    waiting on rewards over its same-mode bound's, as a share of the stock run's wait."""
    at = _index(records)
    rows = []
    measured = _measured(records)
    for trainer in _ordered((r["trainer"] for r in measured), ["v1", "v0"]):
        mine = [r for r in measured if r["trainer"] == trainer and REGIMES[r["regime"]].timing]
        for regime in _ordered((r["regime"] for r in mine), list(REGIMES)):
            for mode in _ordered((r["mode"] for r in mine if r["regime"] == regime), list(MODES)):
                cell = [r for r in mine if r["regime"] == regime and r["mode"] == mode]
                reduction, vs_stock, vs_same, vs_same_steady = [], [], [], []
                first_extra, last_extra, exposed_s, exposed_share = [], [], [], []
                for r in cell:
                    group = r.get("group") or r["regime"]
                    base = (_bound(at, trainer, _unit(r), STOCK, group) if regime == "zero"
                            else _run(at, trainer, _unit(r), regime, STOCK))
                    if base is None or mode == STOCK:
                        continue
                    t, tb = r["loop_time_s"], base["loop_time_s"]
                    reduction.append(1 - t / tb)
                    if regime == "zero":
                        continue
                    for bound_mode, out in ((STOCK, vs_stock), (mode, vs_same)):
                        bound = _bound(at, trainer, _unit(r), bound_mode, regime)
                        if bound is not None and tb > bound["loop_time_s"]:
                            out.append((tb - t) / (tb - bound["loop_time_s"]))
                    _, exposed, share = _wait_and_exposure(at, r, regime, mode)
                    if exposed is not None:
                        exposed_s.append(exposed)
                    if share is not None:
                        exposed_share.append(share)
                    # The same, on steps 2..N-1: without the first step (its batch has only the next
                    # batch's generation to hide behind) and the last (only the step before's
                    # training), a per-run constant that a long training amortises. Context, not judged.
                    bound = _bound(at, trainer, _unit(r), mode, regime)
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
                judge = [r["judge_server"] for r in cell if r.get("judge_server")]
                rows.append({
                    "trainer": trainer, "regime": regime, "mode": mode,
                    "loop_time_s": spread([r["loop_time_s"] for r in cell]),
                    # what the loop time holds beyond the step timers: the time before step 1 (a
                    # strategy's set-up, verl's warm-up batches) and between steps
                    "outside_step_timers_s": spread([r["loop_time_s"] - r["step_sum_s"] for r in cell if r.get("step_sum_s") is not None]),
                    "gate_to_first_step_s": spread([r.get("gate_to_first_step_s") for r in cell]),
                    "reduction_vs_baseline": spread(reduction),
                    "hidden_vs_stock_bound": spread(vs_stock),
                    "hidden_vs_same_mode_bound": spread(vs_same),
                    "hidden_vs_same_mode_bound_middle_steps": spread(vs_same_steady),
                    "first_step_minus_same_mode_bound_s": spread(first_extra),
                    "last_step_minus_same_mode_bound_s": spread(last_extra),
                    "blocked_on_rewards_per_step_s": spread([r["blocked_per_step_s"] for r in cell]) if mode != STOCK else None,
                    "trainer_wait_key": cell[0].get("trainer_wait_key"),
                    "reward_wait_exposed_s": spread(exposed_s),
                    "reward_wait_exposed_of_wait": spread(exposed_share),
                    "staleness_mean": spread([r["staleness_mean"] for r in cell]),
                    "staleness_max": max(maxima) if maxima else None,
                    "staleness_source": next((r.get("staleness_source") for r in cell if r.get("staleness_source")), None),
                    "groups_carried": spread([r["groups_carried"] for r in cell]),
                    "groups_dropped_stale": spread([r["groups_dropped_stale"] for r in cell]),
                    "trained_failed_zero": _total([r.get("trained_failed_zero") for r in cell]),
                    "judge_requests_per_sample": spread([j["requests_per_trained_sample"] for j in judge]),
                    "judge_throttled": _total([j["throttled"] for j in judge]),
                    "judge_throttled_after_first_second": spread([j["throttled_after_first_second"] for j in judge]),
                    "judge_goodput_of_limit": spread([j["goodput_of_limit"] for j in judge]),
                    "latency_s": cell[0]["judge"] or None,
                })
    return rows


def _total(values: list) -> Optional[int]:
    present = [v for v in values if v is not None]
    return int(sum(present)) if present else None


def learning_label(record: dict) -> str:
    regime = REGIMES[record["regime"]]
    return record["mode"] if regime.timing else f"{record['mode']} ({regime.fail_prob:.0%} failures)"


def _partner(at: dict, r: dict, mode: str) -> Optional[dict]:
    """``mode``'s run paired with ``r``: same trainer, seed and regime (a bound: same start-up group)."""
    if r["regime"] == "zero":
        return _bound(at, r["trainer"], _unit(r), mode, r.get("group") or "")
    return _run(at, r["trainer"], _unit(r), r["regime"], mode)


def _learning_pair(a: dict, b: dict, true_key: str, judged_key: str) -> Optional[float]:
    """a - b on the toy task's own score of the dumped responses where both runs have it (no judge
    failure bends it: judge_real's failed calls score verl's samples 0), else on what the judge gave."""
    for key in (true_key, judged_key):
        if a.get(key) is not None and b.get(key) is not None:
            return a[key] - b[key]
    return None


def learning_table(records: list[dict]) -> list[dict]:
    """Per (trainer, run label): the held-out reward after the last step (``val_final``) and the
    training batches' reward over the last steps (``final_reward``), each with its difference to the
    same seed's stock baseline in the same regime (in a failure regime: stock verl meeting the same
    failures), paired by (seed, regime), with a 95% t-interval. Worse beyond noise = the
    held-out interval below 0 (the batch reward's where no held-out reward was measured). Where
    verl's dumps were kept, both are the toy task's own score of the dumped responses."""
    at = _index(records)
    rows = []
    measured = _measured(records)
    for trainer in _ordered((r["trainer"] for r in measured), ["v1", "v0"]):
        mine = [r for r in measured if r["trainer"] == trainer]
        labels = _ordered((learning_label(r) for r in mine), list(MODES))
        for label in labels:
            cell = [r for r in mine if learning_label(r) == label]
            diffs: dict[str, list[float]] = {"final_reward": [], "val_final": []}
            for r in cell:
                base = _partner(at, r, STOCK)
                if base is not None and base is not r:
                    for key, true_key in (("final_reward", "toy_final_true"), ("val_final", "val_final_true")):
                        diff = _learning_pair(r, base, true_key, key)
                        if diff is not None:
                            diffs[key].append(diff)
            batch, held_out = paired_interval(diffs["final_reward"]), paired_interval(diffs["val_final"])
            judged = held_out or batch
            rows.append({
                "trainer": trainer, "run": label, "mode": cell[0]["mode"],
                "first_reward": spread([r["first_reward"] for r in cell]),
                "final_reward": spread([r["final_reward"] for r in cell]),
                "final_minus_baseline": batch,
                "val_final": spread([r["val_final_true"] if r.get("val_final_true") is not None else r.get("val_final")
                                     for r in cell]),
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
    measured = _measured(records)
    for trainer in _ordered((r["trainer"] for r in measured), ["v1", "v0"]):
        pairs = [(r, partner) for r in measured if r["trainer"] == trainer and r["mode"] == better
                 for partner in [_partner(at, r, than)] if partner is not None]
        if pairs:
            rows.append(_paired_row(trainer, f"{better} - {than}", pairs, judged=True))
    return rows


def failure_cost(records: list[dict], mode: str) -> list[dict]:
    """What injected failures cost ``mode``: its runs in a failure regime minus stock verl's with the
    same judge without failures, paired by seed. Reported, never judged: stock verl pays it too (its
    own row), so the judged comparisons are the ones under the same failures."""
    at = _index(records)
    rows = []
    measured = _measured(records)
    for trainer in _ordered((r["trainer"] for r in measured), ["v1", "v0"]):
        pairs = [(r, partner) for r in measured
                 if r["trainer"] == trainer and r["mode"] == mode and not REGIMES[r["regime"]].timing
                 for partner in [_run(at, trainer, _unit(r), REGIMES[r["regime"]].without_failures, STOCK)]
                 if partner is not None]
        if pairs:
            rows.append(_paired_row(trainer, f"{mode} - {STOCK} without failures", pairs, judged=False))
    return rows


def _paired_row(trainer: str, name: str, pairs: list[tuple[dict, dict]], judged: bool) -> dict:
    def every(key):
        return all(a.get(key) is not None and b.get(key) is not None for a, b in pairs)

    key = next(k for k in ("val_final_true", "val_final", "toy_final_true", "final_reward") if k == "final_reward" or every(k))
    diffs = [a[key] - b[key] for a, b in pairs]
    interval = paired_interval(diffs)
    return {"trainer": trainer, "comparison": name, "diffs": [round(d, 4) for d in diffs],
            "judged_on": "held-out" if key.startswith("val_final") else "batch", "judged": judged,
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
                  if row["trainer"] == trainer and row["mode"] != STOCK and not colocate(row["mode"]) and row["reduction_vs_baseline"]]
        worst = min(slower, key=lambda s: s[2]["median"]) if slower else None
        out.append({"trainer": trainer, "goal": "strategies never slower than stock (median paired reduction >= 0 in every regime)",
                    "threshold": 0.0, "figure": worst and {"regime": worst[0], "mode": worst[1], **worst[2]},
                    "pass": None if not slower else all(s[2]["median"] >= 0 for s in slower)})
        # every run of this package against the stock baseline (stock verl meeting failures is a row
        # of the table, what failures cost it, not a mode under test; verl's colocate_async with its
        # own reward loop is verl's, shown beside them, not judged)
        mine = [row for row in learning if row["trainer"] == trainer and row.get("mode") not in (STOCK, VERL_COLOCATE)
                and (row["val_minus_baseline"] or row["final_minus_baseline"])]
        out.append({"trainer": trainer, "goal": "learning: no run worse than the stock baseline (same judge, same failures) beyond seed noise",
                    "threshold": 0.0, "figure": {row["run"]: row["val_minus_baseline"] or row["final_minus_baseline"] for row in mine},
                    "pass": None if not mine else not any(row["worse_beyond_noise"] for row in mine)})
        for comp in (c for c in comparisons if c["trainer"] == trainer and c.get("judged", True)):
            out.append({"trainer": trainer, "goal": f"{comp['comparison']} >= 0 within noise (same failures, paired)",
                        "threshold": 0.0, "figure": comp["interval"],
                        "pass": None if comp["interval"] is None else not comp["worse_beyond_noise"]})
    return out


# Issue 43's goals, each judged on an interval over seeds (95% t, pairs formed within a seed and
# start-up group), for the recommended configuration; every other candidate is shown on its own row.
GOAL_LOOP_VS_VERL = 0.03  # loop time / verl colocate_async's - 1: upper bound at most +3%
GOAL_EXPOSED = 0.02  # reward wait exposed (trainer-timed) over the stock run's wait: upper bound
GOAL_GOODPUT = 0.90  # judge_real: answered requests over the server's limit, lower bound
GOAL_THROTTLED = 0.05  # judge_real: 429s after the loop's first second over its requests, upper bound


def anchor_goals(records: list[dict], recommended: str = RECOMMENDED, candidates: tuple = CANDIDATES) -> list[dict]:
    """Issue 43's done-when goals against verl's colocate_async, per anchor regime present, judged for
    ``recommended`` (each other candidate that ran: the same thresholds on a ``variant`` row). A goal
    without its runs, or with fewer than two seeds for an interval, is reported as not measured."""
    at = _index(records)
    measured = _measured(records)
    out = []
    for trainer in _ordered((r["trainer"] for r in measured), ["v1", "v0"]):
        mine = [r for r in measured if r["trainer"] == trainer]
        present = {r["mode"] for r in mine}
        for regime in [g for g in ANCHOR_REGIMES if any(r["regime"] == g for r in mine)]:
            for mode in [recommended, *[c for c in candidates if c != recommended and c in present]]:
                runs = [r for r in mine if r["regime"] == regime and r["mode"] == mode]
                reference = VERL_REFERENCE.get(mode, VERL_COLOCATE)
                against = "verl colocate_async" if reference == VERL_COLOCATE else f"verl's {reference}"
                verl = [_run(at, trainer, _unit(r), regime, reference) for r in runs]
                ratios = [r["loop_time_s"] / v["loop_time_s"] - 1 for r, v in zip(runs, verl) if v]
                shares = [share for r in runs for *_, share in [_wait_and_exposure(at, r, regime, mode)] if share is not None]

                def goal(name, figure, passed, kind):
                    out.append({"trainer": trainer, "goal": f"{mode}: {name} ({regime})", "regime": regime, "mode": mode,
                                "kind": kind, "variant": mode != recommended, "figure": figure,
                                "pass": None if figure is None else passed(figure)})

                goal(f"loop time <= {against}'s (paired ratio - 1, upper bound <= +{GOAL_LOOP_VS_VERL:.0%})",
                     paired_interval(ratios), lambda f: f["high"] <= GOAL_LOOP_VS_VERL, "loop_vs_verl")
                goal(f"reward wait exposed (trainer-timed) <= {GOAL_EXPOSED:.0%} of the wait (upper bound)",
                     paired_interval(shares), lambda f: f["high"] <= GOAL_EXPOSED, "exposed")
                if not REGIMES[regime].http:
                    continue
                counts = [r.get("trained_failed_zero") for r in runs]
                verl_counts = [r.get("trained_failed_zero") for r in mine if r["regime"] == regime and r["mode"] == reference]
                figure = None if not runs or None in counts else {
                    "count": int(sum(counts)), "runs": len(runs),
                    reference: None if not verl_counts or None in verl_counts else int(sum(verl_counts))}
                goal("0 samples trained on a failed reward scored 0", figure, lambda f: f["count"] == 0, "trained_failed_zero")
                judge = [r["judge_server"] for r in runs if r.get("judge_server")]
                goal(f"judge goodput >= {GOAL_GOODPUT:.0%} of the server's limit (lower bound)",
                     paired_interval([j["goodput_of_limit"] for j in judge]), lambda f: f["low"] >= GOAL_GOODPUT, "goodput")
                goal(f"429s <= {GOAL_THROTTLED:.0%} of requests after the loop's first second (upper bound)",
                     paired_interval([j["throttled_after_first_second"] for j in judge]),
                     lambda f: f["high"] <= GOAL_THROTTLED, "throttled")
                goal(f"loop time below {against}'s (paired ratio - 1, interval below 0)",
                     paired_interval(ratios), lambda f: f["high"] < 0, "loop_below_verl")
    return out


# Issue 46's goals (--admission-ab), each judged on a 95% t-interval over seeds of a paired ratio (the deadline
# twin's figure over the same seed's FIFO run's, in one start-up group), for the recommended configuration's
# pair; the other pairs are shown against the same thresholds on variant rows.
GOAL_BLOCKED_VS_FIFO = -0.50  # where the judge binds: blocked time / FIFO's - 1, upper bound (at least halved)
GOAL_UNCHANGED = 0.03  # where it does not: loop time / FIFO's - 1, the whole interval within +-3% (no change)


def admission_table(records: list[dict]) -> list[dict]:
    """Issue 46's A/B: per (trainer, regime) and contestant run both ways, its FIFO run (the default) beside
    its deadline twin (DEADLINE_TWINS): the trainer-timed blocked time (the reward wait exposed, as the anchor
    judges it: what the trainer timed as waiting over what its same-mode bound in the same group timed), the
    loop time, the judge's 429s and goodput, the samples trained on a failed call's 0. Paired within a seed:
    the twin's blocked time and loop time over FIFO's, minus 1 (a seed whose FIFO run exposed no blocked time
    has no ratio: the blocked time's paired difference in seconds is beside it)."""
    at = _index(records)
    measured = [r for r in _measured(records) if r["regime"] != "zero"]
    rows = []
    for trainer in _ordered((r["trainer"] for r in measured), ["v1", "v0"]):
        mine = [r for r in measured if r["trainer"] == trainer]
        for regime in _ordered((r["regime"] for r in mine), list(ADMISSION_REGIMES)):
            for fifo, twin in DEADLINE_TWINS.items():
                cells = {m: [r for r in mine if r["regime"] == regime and r["mode"] == m] for m in (fifo, twin)}
                if not cells[twin]:
                    continue

                def blocked(r):
                    return _wait_and_exposure(at, r, regime, r["mode"])[1]

                def side(cell):
                    judge = [r["judge_server"] for r in cell if r.get("judge_server")]
                    return {"runs": len(cell), "blocked_s": spread([blocked(r) for r in cell]),
                            "loop_time_s": spread([r["loop_time_s"] for r in cell]),
                            "validation_in_loop_s": spread([r.get("validation_in_loop_s", 0.0) for r in cell]),
                            "judge_throttled": _total([j["throttled"] for j in judge]),
                            "judge_goodput_of_limit": spread([j["goodput_of_limit"] for j in judge]),
                            "trained_failed_zero": _total([r.get("trained_failed_zero") for r in cell])}

                pairs = [(r, f) for r in cells[twin] for f in [_run(at, trainer, _unit(r), regime, fifo)] if f is not None]
                both = [(blocked(d), blocked(f)) for d, f in pairs if blocked(d) is not None and blocked(f) is not None]
                rows.append({
                    "trainer": trainer, "regime": regime, "judge_binds": REGIMES[regime].throughput_binds,
                    "fifo": fifo, "deadline": twin, "fifo_figures": side(cells[fifo]), "deadline_figures": side(cells[twin]),
                    "blocked_vs_fifo": paired_interval([d / f - 1 for d, f in both if f > 0]),
                    "blocked_minus_fifo_s": paired_interval([d - f for d, f in both]),
                    "loop_vs_fifo": paired_interval([d["loop_time_s"] / f["loop_time_s"] - 1 for d, f in pairs]),
                    "validation_vs_fifo": paired_interval([d["validation_in_loop_s"] / f["validation_in_loop_s"] - 1
                                                           for d, f in pairs if f.get("validation_in_loop_s")]),
                })
    return rows


def admission_goals(table: list[dict], recommended: str = RECOMMENDED) -> list[dict]:
    """Issue 46's done-when goals, per row of ``admission_table``: where the judge's throughput binds, the
    deadline twin's blocked time at most half FIFO's (the paired ratio's upper bound <= 0.5); where it does
    not, no change in the loop time (the paired ratio's whole interval within +-3%). Judged for the pair of
    ``recommended``; the other pairs are variant rows. Fewer than two seeds: not measured."""
    out = []
    for row in table:
        if row["judge_binds"]:
            name, figure = (f"blocked time (trainer-timed) at most half FIFO's (paired ratio - 1, upper bound "
                            f"<= {GOAL_BLOCKED_VS_FIFO:+.0%})"), row["blocked_vs_fifo"]
            passed = figure is not None and figure["high"] <= GOAL_BLOCKED_VS_FIFO
        else:
            name, figure = f"loop time unchanged (paired ratio - 1 within +-{GOAL_UNCHANGED:.0%})", row["loop_vs_fifo"]
            passed = figure is not None and -GOAL_UNCHANGED <= figure["low"] and figure["high"] <= GOAL_UNCHANGED
        out.append({"trainer": row["trainer"], "goal": f"{row['deadline']} vs {row['fifo']}: {name} ({row['regime']})",
                    "regime": row["regime"], "mode": row["deadline"], "kind": "blocked_vs_fifo" if row["judge_binds"] else "loop_vs_fifo",
                    "variant": row["fifo"] != recommended, "figure": figure, "pass": None if figure is None else passed})
    return out


def pace_check(records: list[dict], regime_compute: dict[str, float], tolerance: float = PACE_TOLERANCE) -> list[dict]:
    """Per stock zero-latency run (the calibration and every group's stock bound): its median step over
    the C the regimes' latencies were made of. Off by more than ``tolerance`` either way, a regime is
    another regime on that group's machine (at C = 1.075 s a stock step of 2.99 s made "tail 1x" a
    0.36x tail): such groups are listed, never silently pooled."""
    out = []
    for r in records:
        compute = regime_compute.get(r["trainer"])
        if r["regime"] != "zero" or r["mode"] != STOCK or not compute or not r.get("step_times"):
            continue
        ratio = float(np.median(r["step_times"])) / compute
        out.append({"trainer": r["trainer"], "seed": r["seed"], "group": r.get("group") or "zero",
                    "measured_step_s": round(float(np.median(r["step_times"])), 3), "compute_s": compute,
                    "ratio": round(ratio, 3), "off": not (1 / tolerance <= ratio <= tolerance)})
    return out


def queue_bias(records: list[dict]) -> list[dict]:
    """A check on the harness, not on a mode: per place in the start-up queue (how many runs of its
    group trained before it), each run's loop time over its cell's median (same trainer, regime and
    mode). Runs of a group start up together and train one at a time, the others frozen at their
    gates; were a parked run to take CPU, the first place would be the slowest."""
    records = _measured(records)
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


def _fmt_interval(i: Optional[dict], pct: bool = False) -> str:
    if not i:
        return "—"
    if pct:
        return f"{i['mean']:+.1%} [{i['low']:+.1%}, {i['high']:+.1%}] (n={i['n']})"
    return f"{i['mean']:+.3f} [{i['low']:+.3f}, {i['high']:+.3f}] (n={i['n']})"


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
    if "count" in figure:
        reference = next((mode for mode in figure if mode in VERL_MODES), VERL_COLOCATE)
        verl = figure.get(reference)
        name = "verl colocate_async" if reference == VERL_COLOCATE else reference
        return (f"{figure['count']} in {figure['runs']} run{'s' if figure['runs'] != 1 else ''} "
                f"({name}: {'not run' if verl is None else verl})")
    if "mean" in figure:
        return _fmt_interval(figure, pct=bool(goal.get("kind")))
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
    """The e2e tables (docs/results.md quotes them; tests/benchmarks/test_e2e_report.py checks it)."""
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
    if any(row.get("outside_step_timers_s") for row in report["timing"]):
        lines += ["", *anchor_markdown(report)]
    if report.get("admission"):
        lines += ["", *admission_markdown(report)]
    lines += ["", "| trainer | goal | figure | result |", "|---|---|---|---|"]
    for goal in report["goals"]:
        lines.append(f"| {goal['trainer']} | {goal['goal']} | {goal_figure(goal)} | {verdict_text(goal, markdown=True)} |")
    return "\n".join(lines) + "\n"


def anchor_markdown(report: dict) -> list[str]:
    """Issue 43's table: per regime and run, the loop time from the start gate and what lies outside
    the step timers, the reward wait exposed as the trainer timed it (the judged figure) beside the
    loop-time hidden fraction (a check), staleness, and what the judge saw (judge_real)."""
    lines = ["| trainer | regime | run | loop time s (from the gate) | outside the step timers s / before step 1 s "
             "| reward wait exposed, trainer-timed s | of the stock run's wait | hidden (same-mode bound; a check) "
             "| staleness mean / max | judge requests per trained sample | 429s, after the first second | judge goodput of its limit "
             "| trained on a failed call's 0 |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in report["timing"]:
        if row["regime"] == "zero":
            continue
        stale = "—" if row["staleness_mean"] is None else (
            f"{row['staleness_mean']['median']:.2f} / {row['staleness_max']:g}" + (" (verl)" if row.get("staleness_source") == "verl" else ""))
        outside = f"{_fmt(row.get('outside_step_timers_s'))} / {_fmt(row.get('gate_to_first_step_s'))}"
        throttled = "—" if row.get("judge_throttled") is None else \
            f"{row['judge_throttled']}, {_fmt(row.get('judge_throttled_after_first_second'), True)}"
        failed = "—" if row.get("trained_failed_zero") is None else str(row["trained_failed_zero"])
        lines.append(f"| {row['trainer']} | {_regime_cell(report, row['trainer'], row['regime'])} | {row['mode']} "
                     f"| {_fmt(row['loop_time_s'])} | {outside} | {_fmt(row.get('reward_wait_exposed_s'))} "
                     f"| {_fmt(row.get('reward_wait_exposed_of_wait'), True)} | {_fmt(row['hidden_vs_same_mode_bound'], True)} "
                     f"| {stale} | {_fmt(row.get('judge_requests_per_sample'))} | {throttled} "
                     f"| {_fmt(row.get('judge_goodput_of_limit'), True)} | {failed} |")
    return lines


def admission_markdown(report: dict) -> list[str]:
    """Issue 46's table: per regime and contestant, FIFO beside its deadline twin (median [min, max] over
    seeds) and the twin's figure over FIFO's, paired within a seed (95% interval)."""
    lines = ["| trainer | regime | judge binds | contestant: FIFO / deadline | blocked s (trainer-timed), FIFO / deadline "
             "| blocked, deadline / FIFO - 1 (paired) | blocked, deadline - FIFO s (paired) | loop time s, FIFO / deadline "
             "| loop time, deadline / FIFO - 1 (paired) | validation in the loop s, FIFO / deadline | 429s "
             "| judge goodput of its limit | trained on a failed call's 0 |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in report["admission"]:
        fifo, deadline = row["fifo_figures"], row["deadline_figures"]

        def both(key, pct=False):
            return f"{_fmt(fifo[key], pct)} / {_fmt(deadline[key], pct)}"

        def counts(key):
            return " / ".join("—" if side[key] is None else str(side[key]) for side in (fifo, deadline))

        lines.append(f"| {row['trainer']} | {_regime_cell(report, row['trainer'], row['regime'])} "
                     f"| {'yes' if row['judge_binds'] else 'no'} | {row['fifo']} / {row['deadline']} | {both('blocked_s')} "
                     f"| {_fmt_interval(row['blocked_vs_fifo'], pct=True)} | {_fmt_interval(row['blocked_minus_fifo_s'])} "
                     f"| {both('loop_time_s')} | {_fmt_interval(row['loop_vs_fifo'], pct=True)} "
                     f"| {both('validation_in_loop_s') if 'validation_in_loop_s' in fifo else '—'} | {counts('judge_throttled')} "
                     f"| {both('judge_goodput_of_limit', True)} | {counts('trained_failed_zero')} |")
    return lines


def setup_text(report: dict) -> str:
    seeds = ", ".join(f"{t}: {len(s)} seed{'s' if len(s) != 1 else ''} ({','.join(map(str, s))})"
                      for t, s in report["seeds_run"].items())
    measured = report["compute_per_step_s"]
    compute = ", ".join(f"{t} {c} s" + (f" (median over all its stock zero-latency runs: {measured[t]} s)"
                                        if measured.get(t) and measured[t] != c else "")
                        for t, c in report["regime_compute_s"].items())
    regimes = "; ".join(f"`{name}`: {REGIMES[name].describe()}" for name in report["regimes"])
    text = (f"{report['steps']} steps per run; {seeds}; C (step compute the regimes scale with) = {compute}; "
            f"regimes: {regimes}. Cells: median [min, max] over seeds, ratios paired within a seed.")
    if report.get("recommended"):
        judged = (f"; issue 43's goals judge `{report['recommended']}`"
                  if VERL_COLOCATE in report.get("modes", [VERL_COLOCATE]) else "")
        text += (f" Zero-latency bounds start up and train in the group of the runs they bound; loop time runs from the "
                 f"start gate; decode {report.get('decode_s_per_token') or 0:g} s per token{judged}.")
    if report.get("admission"):
        text += (" Admission A/B: each contestant with the agent's admission_order fifo (the default) and its deadline twin "
                 "(the same command plus reward.async_agent.admission_order=deadline), paired within a seed and start-up group; blocked time: "
                 "the reward wait the trainer timed beyond its same-mode bound's.")
    for note in report.get("notes", []):
        text += f" {note}"
    return text


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
    for note in report.get("notes", []):
        print(f"NOTE: {note}")
    for row in (row for row in report.get("pace_check", []) if row["off"]):
        print(f"WARNING: {row['trainer']} seed {row['seed']} group {row['group']}: the stock step with an instant judge "
              f"took {row['measured_step_s']} s, {row['ratio']:.2f}x the C = {row['compute_s']} s its judges were made "
              f"of (beyond {PACE_TOLERANCE}x): that group's regimes are not the named ones")
    if report.get("queue_bias"):
        print("harness check, loop time over its cell's median by place in the start-up queue: "
              + "; ".join(f"{row['queue_position'] + 1}: {_fmt(row['loop_time_over_cell_median'])}"
                          for row in report["queue_bias"]))


def analyse(records: list[dict], recommended: Optional[str] = None) -> dict:
    """Every table and the goals, from per-run records (of one benchmark run, or pooled from several).
    ``recommended``: the configuration issue 43's goals judge (anchor_goals), when verl's
    colocate_async ran."""
    timing = timing_table(records)
    learning = learning_table(records)
    # mask against neutral meeting the same failures (against stock verl meeting them: the learning
    # table's row); what the failures cost, against stock verl without them: reported, not judged
    comparisons = (paired_comparison(records, "both_mask", "both_neutral")
                   + [row for mode in [STOCK, "both_mask"] for row in failure_cost(records, mode)])
    anchor = anchor_goals(records, recommended) if recommended and any(r["mode"] in VERL_MODES for r in records) else []
    # issue 46's A/B, where a deadline twin ran (--admission-ab)
    admission = admission_table(records)
    return {"timing": timing, "learning": learning, "comparisons": comparisons, "admission": admission,
            "goals": goals(timing, learning, comparisons) + anchor + admission_goals(admission, recommended or RECOMMENDED),
            "queue_bias": queue_bias(records)}


def report_notes(records: list[dict]) -> list[str]:
    """What the reader of the figures must know about how they were made on this tree."""
    notes = []
    slow_poll = sorted({r["mode"] for r in records if r["trainer"] == "v1" and r.get("v1_poll_interval_s", V1_POLL_S) is None})
    if slow_poll:
        notes.append(f"{', '.join(slow_poll)} ran with verl's own v1 sampler (a 2 s replay-buffer poll: this CPU backend's "
                     "fast sampler does not cover colocate_async): their loop times are not comparable to the others'.")
    unjoined = sum(r.get("trained_unjoined") or 0 for r in records)
    if unjoined:
        notes.append(f"{unjoined} trained samples have no call in their run's judge log: the trained-on-failures counts are incomplete.")
    return notes


def build_report(records: list[dict], *, command: str, steps: int, seeds: dict, regimes: list[str],
                 regime_compute: dict, fingerprint: str, decode_s: float, skipped: dict, failed: list[str],
                 missing: list[str], started: float, from_cache: int, retried: list[str] = (),
                 recommended: Optional[str] = None, recalibrated: Optional[dict] = None) -> dict:
    analysis = analyse(records, recommended)
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
        "recommended": recommended, "notes": report_notes(records),
        "pace_check": pace_check(records, regime_compute), "recalibrated": recalibrated or {},
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


def plan_cost_s(runs: list[Run]) -> float:
    """The plan's wall time on a quiet machine, start-ups overlapped (a rough guide for --dry-run)."""
    return sum(VERL_REWARD_LOOP_RUN_COST_S if run.mode in STOCK_COMMAND else RUN_COST_S for run in runs)


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
    parser.add_argument("--skip", default="", help="regime:mode cells left out of the plan, with their zero-latency bounds (e.g. to finish a "
                        "partial benchmark's essential cells first; a later --cached-only report still shows them)")
    parser.add_argument("--compute", help="fix C per trainer (e.g. v1=0.8,v0=0.8) instead of a calibration run")
    parser.add_argument("--recalibrate", action="store_true",
                        help=f"with --compute: measure C first anyway, and use the measurement where the given C is "
                             f"more than {PACE_TOLERANCE}x off (without it such a C is kept and reported)")
    parser.add_argument("--decode-s", type=float, default=None,
                        help="simulated decode seconds per token in the CPU rollout (every run; default 0, --anchor 0.02)")
    parser.add_argument("--work", help="run folders and the per-run cache (default: <out>_runs/)")
    parser.add_argument("--out", default=None, help="the report (default bench/results/e2e.json; --anchor: e2e_anchor.json)")
    parser.add_argument("--progress", action="store_true", help="per-step progress of each run")
    parser.add_argument("--parallel-startups", type=int, default=4,
                        help="runs started up together, then trained one at a time (needs the CPU backend's start gate; "
                             "as many as free memory holds; a run and its zero-latency bound are never split)")
    parser.add_argument("--dry-run", action="store_true", help="print the plan and an estimate, run nothing")
    parser.add_argument("--cached-only", action="store_true",
                        help="report from the cached runs only (a partial benchmark: the rest are listed as not run)")
    parser.add_argument("--quick", action="store_true", help="CI smoke: 2 runs of 2 steps on v1")
    parser.add_argument("--anchor", action="store_true",
                        help=f"issue 43: v1, seeds 0-4, regimes {','.join(ANCHOR_REGIMES)}, stock, both, tail_auto and "
                             f"verl's colocate_async (its reward loop, and {AGENT_COLOCATE}); goals judged for --recommended")
    parser.add_argument("--admission-ab", action="store_true",
                        help=f"issue 46: v1, seeds 0-4, regimes {','.join(ADMISSION_REGIMES)} (the judge binds / does not), "
                             f"each of {', '.join(DEADLINE_TWINS)} with admission_order fifo (the default) and deadline "
                             f"({', '.join(DEADLINE_TWINS.values())}), beside stock; bench/results/e2e_admission.json")
    parser.add_argument("--test-freq", type=int, default=0,
                        help="verl's validation every N steps inside the loop as well (trainer.test_freq; 0, the default: "
                             "before the first step and after the last only); its passes count as waited for")
    parser.add_argument("--recommended", default=RECOMMENDED,
                        help=f"the configuration issue 43's goals judge (default {RECOMMENDED}); the other candidates "
                             f"({', '.join(c for c in CANDIDATES)}) are shown against the same thresholds")
    args = parser.parse_args(argv)
    if args.anchor + args.quick + args.admission_ab > 1:
        parser.error("--anchor, --admission-ab and --quick are different plans: choose one")
    if args.anchor:
        args.trainers, args.seeds, args.regimes = "v1", "0,1,2,3,4", ",".join(ANCHOR_REGIMES)
        args.strategies, args.failure_modes = f"both,tail_auto,{VERL_COLOCATE},{AGENT_COLOCATE}", ""
        if args.decode_s is None:  # a GPU-like token time: generation is still running when colocate_async samples
            args.decode_s = ANCHOR_DECODE_S
    if args.admission_ab:  # the anchor's judges and decode time, each contestant both ways
        args.trainers, args.seeds, args.regimes = "v1", "0,1,2,3,4", ",".join(ADMISSION_REGIMES)
        args.strategies = ",".join(m for pair in DEADLINE_TWINS.items() for m in pair)
        args.failure_modes = ""
        if args.decode_s is None:
            args.decode_s = ANCHOR_DECODE_S
    args.decode_s = args.decode_s or 0.0
    if args.out is None:
        args.out = str(RESULTS / ("e2e_anchor.json" if args.anchor else "e2e_admission.json" if args.admission_ab else "e2e.json"))
    if args.quick:
        args.trainers, args.steps, args.seeds, args.regimes = "v1", 2, "0", "heavy_2.5x"
        args.out = args.out.replace(".json", "_quick.json")
    if args.recommended not in MODES or args.recommended in (STOCK, *VERL_MODES):
        parser.error(f"--recommended: a configuration of this package, of {[m for m in MODES if m not in (STOCK, *VERL_MODES)]}")
    if args.decode_s < 0:
        parser.error("--decode-s: seconds per token, >= 0")
    if args.test_freq < 0 or (args.test_freq and args.test_freq >= args.steps):
        parser.error(f"--test-freq: 0, or a number of steps below --steps ({args.steps})")

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
    if any(colocate(m) for m in strategies) and "v1" in trainers and not async_fast_poll_supported():
        print("WARNING: this CPU backend's fast v1 sampler does not cover colocate_async: its runs keep verl's 2 s "
              "replay-buffer poll, and their loop times are not comparable to the others' (reported)", flush=True)

    def usable(modes: list[str], trainer: str) -> list[str]:
        return [m for m in modes if f"{m} on {trainer}" not in skipped]

    if args.quick:
        cells = {"v1": [("heavy_2.5x", "tail_auto" if usable(["tail_auto"], "v1") else "both", "heavy_2.5x")]}
    else:
        cells = {t: plan_cells(regimes_of[t], usable(strategies, t), usable(failure_modes, t)) for t in trainers}
    skip = {tuple(cell.split(":", 1)) for cell in _names(args.skip)}
    if any(len(cell) != 2 for cell in skip):
        parser.error(f"--skip: regime:mode pairs, got {args.skip}")
    # a skipped cell's zero-latency bound (in its regime's group) is skipped with it: it bounds nothing else
    cells = {t: [c for c in cs if c[:2] not in skip and (c[2], c[1]) not in skip] for t, cs in cells.items()}
    fixed = parse_compute(args.compute)
    calibrate = {t for t in trainers if t not in fixed or args.recalibrate}
    if args.quick and "v1" not in fixed:  # with --compute v1=C the smoke is one run (CI's; calibration has fake-run tests)
        calibrate = {"v1"}
    runs = plan_runs(seeds, cells, calibrate=calibrate)
    print(f"{len(runs)} runs of {args.steps} steps ({', '.join(f'{t}: {len(seeds[t])} seeds x {len(cells[t])}' for t in trainers)}"
          f"{' + a calibration run' if calibrate else ''}); ~{plan_cost_s(runs) / 60:.0f} min at ~{RUN_COST_S} s a run "
          f"(~{VERL_REWARD_LOOP_RUN_COST_S} s with verl's 8 reward-loop workers) on a quiet machine", flush=True)
    if args.dry_run:
        pairs = [(fifo, twin) for fifo, twin in DEADLINE_TWINS.items() if twin in strategies]
        if pairs:
            print("issue 46's A/B (FIFO / deadline): " + "; ".join(
                f"{fifo} / {twin}{'' if fifo == args.recommended else ' (a variant)'}" for fifo, twin in pairs)
                + f"; goals: where the judge binds ({', '.join(r for t in trainers for r in regimes_of[t] if REGIMES[r].throughput_binds)})"
                f" deadline's blocked time / FIFO's - 1 <= {GOAL_BLOCKED_VS_FIFO:+.0%} (upper bound), elsewhere the loop "
                f"time's within +-{GOAL_UNCHANGED:.0%}", flush=True)
        for run in runs:
            where = f" (bound, {run.group} group)" if run.group and run.group != CALIBRATION else \
                (" (calibration: measures C)" if run.group == CALIBRATION else "")
            print(f"  {run.trainer} seed {run.seed} {run.regime:>11} {run.mode}{where}")
        return 0

    from verl_async_rm_rig.cpu_backend.launch import CPURunConfig, prepare_assets

    work = Path(args.work or str(Path(args.out).with_suffix("")) + "_runs")
    cache = work / "records"
    cache.mkdir(parents=True, exist_ok=True)
    fingerprint = source_fingerprint()
    command = " ".join(["python bench/e2e.py", *(argv if argv is not None else sys.argv[1:])])
    records, failed, missing, retried = [], [], [], []
    started, from_cache = time.time(), 0
    regime_compute, recalibrated = dict(fixed), {}
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
        """The calibration run measures C (with --recalibrate, replacing a given C more than
        PACE_TOLERANCE off); every group's stock bound is checked against the C in force."""
        trainer = record["trainer"]
        if record["regime"] != "zero" or record["mode"] != STOCK:
            return
        measured = round(float(np.median(record["step_times"])), 3)
        if record.get("group") == CALIBRATION:
            given = regime_compute.get(trainer)
            if given is None:
                regime_compute[trainer] = measured
                print(f"calibration: {trainer} step compute C = {measured} s", flush=True)
            elif not 1 / PACE_TOLERANCE <= measured / given <= PACE_TOLERANCE:
                recalibrated[trainer] = {"given_s": given, "measured_s": measured}
                regime_compute[trainer] = measured
                print(f"WARNING: {trainer}: the given C = {given} s is {measured / given:.2f}x off the measured step "
                      f"({measured} s): using the measurement (--recalibrate)", flush=True)
            else:
                print(f"calibration: {trainer} measured {measured} s, within {PACE_TOLERANCE}x of the given C = {given} s: kept",
                      flush=True)
            return
        given = regime_compute.get(trainer)
        if given and not 1 / PACE_TOLERANCE <= measured / given <= PACE_TOLERANCE:
            print(f"WARNING: {trainer} seed {record['seed']} group {record.get('group') or 'zero'}: the stock step with an "
                  f"instant judge took {measured} s, {measured / given:.2f}x the C = {given} s its judges are made of "
                  f"(beyond {PACE_TOLERANCE}x): on this machine's pace that group's regimes are not the named ones", flush=True)

    for index, run in enumerate(runs, 1):
        calibration = run.group == CALIBRATION
        if calibration:
            flush()
        if run.trainer not in regime_compute and not calibration:
            missing.append(f"{run.trainer}/s{run.seed}/{run.regime}/{run.mode}")  # its calibration failed
            continue
        settings = run_settings(run, regime_compute.get(run.trainer, 0.0), args.decode_s, args.test_freq)
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
        next_run = runs[index] if index < len(runs) else None
        if calibration or (len(pending) >= args.parallel_startups and not (next_run and same_pair(run, next_run))):
            flush()
    flush()

    report = build_report(records, command=command, steps=args.steps, seeds=seeds,
                          regimes=list(dict.fromkeys(r for rs in regimes_of.values() for r in rs)) if not args.quick else ["heavy_2.5x"],
                          regime_compute=regime_compute, fingerprint=fingerprint, decode_s=args.decode_s, skipped=skipped,
                          failed=failed, missing=missing, started=started, from_cache=from_cache, retried=retried,
                          recommended=args.recommended if any(colocate(m) for m in strategies) else None,
                          recalibrated=recalibrated)
    print_report(report)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2))
    print(f"\nresults: {args.out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
