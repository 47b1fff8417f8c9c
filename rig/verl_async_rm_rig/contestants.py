"""What the demo and the end-to-end benchmark run: the judges (regimes) and the contestants (modes).

One home for both, so that the demo's lanes (``verl_async_rm_rig.demo``) are the benchmark's runs
(``bench/e2e.py``) and not a look-alike: a regime is a simulated judge in units of the measured step
compute C (so it means the same on any machine), a mode is a set of hydra overrides on top of the
stock trainer, with its reward manager (``async_agent`` unless :data:`REWARD_MANAGER` names verl's)
and, for a mode run as a verl user's command, verl's default ``reward.num_workers``
(:data:`STOCK_COMMAND`). :func:`reward_loop_overrides` is what a (regime, mode) adds for its reward
manager; :func:`reward_function` and :func:`start_judge_server` are the toy reward a run scores with
(in ``judge_real`` through its own loopback judge server).

Pure definitions (no verl, torch or Ray import): the quick tests and ``bench/e2e.py --dry-run`` read
them without paying for one.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Optional

# The demo's and the benchmark's GRPO shape beside CPURunConfig's (8 prompts x 4 samples a step):
# 4 PPO mini-batches of 2 prompts, so the mini-batch pipeline has updates to overlap.
SHAPE = ["actor_rollout_ref.actor.ppo_mini_batch_size=2", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8"]
# Samples a step trains on (CPURunConfig's 8 prompts x 4): the judge's demand, with the step compute C
SAMPLES_PER_STEP = 8 * 4
# A fixed C means another regime on a machine of another pace: a stock step with an instant judge
# more than this factor off C is reported (bench/e2e.py: or, with --recalibrate, C is measured first)
PACE_TOLERANCE = 1.5
# Simulated decode seconds per generated token of the anchor runs (issue 43: bench/e2e.py --anchor, and
# the demo): a GPU-like token time, so generation is still running when colocate_async samples
ANCHOR_DECODE_S = 0.02
# The v1 sampler's replay-buffer poll (verl's fixed 2 s would swamp ~1 s steps), for every v1 run
V1_POLL_S = 0.05

# ------------------------------------------------------------------------------------------------
# the contestants
# ------------------------------------------------------------------------------------------------

STOCK = "baseline"  # verl's stock trainer (v1: trainer mode sync), rewards scored in its agent loop
# Agent settings every async_agent run gets: enough concurrency that no judge queue forms.
AGENT = ["reward.async_agent.max_concurrency=64"]
# This package's strategies (issue 14), hydra overrides on top of the stock trainer.
STRATEGIES: dict[str, list[str]] = {
    "pipeline": ["mini_batch_pipeline=true"],
    "off_policy": ["off_policy_steps=1"],
    "both": ["mini_batch_pipeline=true", "off_policy_steps=1"],
    # opt-in: two batches ahead (v0 only), for a reward tail longer than a step's compute
    "both_k2": ["mini_batch_pipeline=true", "off_policy_steps=2"],
    # opt-in: the same, with verl's off-policy correction (token-level importance weights between the
    # rollout's and the trainer's log-probs: the decoupled PPO loss the recipe offered)
    "both_k2_rc": ["mini_batch_pipeline=true", "off_policy_steps=2", "+algorithm.rollout_correction.rollout_is=token"],
}
# The tail-tolerant mode (issue 14): a pool of scored groups, generation ahead sized from measured
# latency (off_policy_steps=auto), a group carried at most 2 steps, then waited for (nothing dropped).
# The pool is v1 only and excludes the mini-batch pipeline (strategies/plan.py refuses both). Failure
# policies are agent settings.
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
# deadline / median step compute) (strategies/staleness_pool.py), so no step waits for a group the deadline
# settles. It needs a ticket deadline: in a regime without one (the instant judge, its same-mode
# bound), the heavy regime's (AUTO_BOUND_DEADLINE), so both runs are the same configuration.
TAIL_AUTO = ["off_policy_steps=auto", "max_staleness=auto", "on_stale=wait"]
AUTO_BOUND_DEADLINE = "heavy_2.5x"  # the regime whose deadline max_staleness=auto gets where none is set
MODES: dict[str, list[str]] = {
    STOCK: [],
    **STRATEGIES,
    "tail": TAIL,
    "tail_drop": TAIL_DROP,
    "tail_s6": TAIL_S6,
    "tail_auto": TAIL_AUTO,
    "both_neutral": [*STRATEGIES["both"], "reward.async_agent.failure_policy=neutral"],
    "both_mask": [*STRATEGIES["both"], "reward.async_agent.failure_policy=mask"],
}
# verl's own answer to a slow reward (issue 43), the anchor: its colocate_async trainer mode (partial
# rollouts, rewards scored in the background, staleness bounded by its replay buffer), with verl's
# reward loop at its best for the judge (the rate_limited manager given the judge's limits and
# timeout: Regime.verl_reward_loop), and the same command with this package's reward manager.
VERL_COLOCATE = "verl_colocate_async"
AGENT_COLOCATE = "colocate_async_agent"
COLOCATE = ["trainer.v1.trainer_mode=colocate_async"]
MODES |= {VERL_COLOCATE: COLOCATE, AGENT_COLOCATE: COLOCATE}
REWARD_MANAGER = {VERL_COLOCATE: "rate_limited"}  # every other mode: async_agent
# Modes run as a verl user's command: verl's default reward.num_workers (the CPU backend's own runs
# use 1); verl's rate_limited limits are per worker process, so its judge sees up to 8x them.
STOCK_COMMAND = {VERL_COLOCATE: 8, AGENT_COLOCATE: 8}
ANCHOR_MODES = (VERL_COLOCATE, AGENT_COLOCATE)
# The same two commands with verl's prefetch window one batch deeper (trainer.v1.colocate_async.num_warmup_batches,
# default 1): a batch is generated, and its rewards scored, a step before the trainer samples it, as this package's
# off_policy_steps=1 does; one more step of staleness, within verl's max_off_policy_threshold (8).
AHEAD = ["trainer.v1.colocate_async.num_warmup_batches=2"]
VERL_COLOCATE_AHEAD, AGENT_COLOCATE_AHEAD = f"{VERL_COLOCATE}_ahead", f"{AGENT_COLOCATE}_ahead"
MODES |= {VERL_COLOCATE_AHEAD: [*COLOCATE, *AHEAD], AGENT_COLOCATE_AHEAD: [*COLOCATE, *AHEAD]}
REWARD_MANAGER |= {VERL_COLOCATE_AHEAD: "rate_limited"}
STOCK_COMMAND |= {VERL_COLOCATE_AHEAD: 8, AGENT_COLOCATE_AHEAD: 8}
# What a configuration's loop time is judged against: verl's own reward loop under the same trainer settings
# (the prefetch window deeper for the deeper one), the best a verl user could pick instead
VERL_REFERENCE = {AGENT_COLOCATE_AHEAD: VERL_COLOCATE_AHEAD}
VERL_MODES = (VERL_COLOCATE, VERL_COLOCATE_AHEAD)
# The configuration this project recommends against a hosted judge: the one issue 43's goals judge
# (bench/e2e.py --recommended) and the demo's third lane. The lead sets it from the benchmark's verdict.
RECOMMENDED = AGENT_COLOCATE
# verl's trainer measures the time its step waits for the replay buffer's finished (generated and
# scored) groups as timing_s/gen; this package's strategies time the wait on rewards alone, as
# timing_s/reward_wait (the mini-batch pipeline's takes, the pool's wait for due groups; older
# trees: the pipeline's async_reward/blocked_s only).
TRAINER_WAIT_KEY = dict.fromkeys((VERL_COLOCATE, AGENT_COLOCATE, VERL_COLOCATE_AHEAD, AGENT_COLOCATE_AHEAD), "timing_s/gen")
OWN_WAIT_KEYS = ("timing_s/reward_wait", "async_reward/blocked_s")
# Issue 46: the agent's opt-in admission_order: deadline (verl_async_rm/engine/admission_order.py): when
# the judge's throughput binds, queued requests start in the order the trainer needs them. A contestant's
# deadline twin is the same command plus this one agent setting (spelled as the other reward.async_agent
# settings: the runs' entry point, verl_async_rm.main_ppo, declares the key, and takes it with or without
# "+"); the contestant itself is the FIFO side (the default, its command unchanged). bench/e2e.py
# --admission-ab runs each pair in ADMISSION_REGIMES.
DEADLINE = ["reward.async_agent.admission_order=deadline"]
DEADLINE_TWINS = {AGENT_COLOCATE: f"{AGENT_COLOCATE}_deadline", "tail_auto": "tail_auto_deadline"}
MODES |= {twin: [*MODES[fifo], *DEADLINE] for fifo, twin in DEADLINE_TWINS.items()}
STOCK_COMMAND |= {twin: STOCK_COMMAND[fifo] for fifo, twin in DEADLINE_TWINS.items() if fifo in STOCK_COMMAND}
TRAINER_WAIT_KEY |= {twin: TRAINER_WAIT_KEY[fifo] for fifo, twin in DEADLINE_TWINS.items() if fifo in TRAINER_WAIT_KEY}
# The A/B's judges: judge_real, whose throughput binds (a token bucket at 80% of the demand), and tail_1x,
# where it does not (no limit, and the agent's concurrency, 64, above a step's 32 requests)
ADMISSION_REGIMES = ("judge_real", "tail_1x")


def colocate(mode: str) -> bool:
    """Whether ``mode`` runs verl's colocate_async trainer mode (a deadline twin included)."""
    return COLOCATE[0] in MODES[mode]


def reward_manager(mode: str) -> str:
    """The reward manager a mode's runs score through (``reward.reward_manager.name``)."""
    return REWARD_MANAGER.get(mode, "async_agent")


def trainer_wait(mode: str, extra: dict) -> tuple[str, Optional[float]]:
    """(metric, seconds over the run) the trainer itself timed as waiting for rewards: this package's
    strategies' ``timing_s/reward_wait``, or for verl's trainer modes its step's wait for the replay
    buffer's finished groups (verl times no wait on rewards alone). None where the run logged none
    (the stock trainer: its rewards are scored inside generation; its wait is the reference).
    ``extra``: metric -> its per-step values."""
    keys = [TRAINER_WAIT_KEY[mode]] if mode in TRAINER_WAIT_KEY else [k for k in OWN_WAIT_KEYS if extra.get(k)] or [OWN_WAIT_KEYS[0]]
    values = extra.get(keys[0])
    return keys[0], (float(sum(values)) if values else None)


# ------------------------------------------------------------------------------------------------
# the judges
# ------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Regime:
    """A simulated judge, in units of the step compute C (so a regime means the same on any machine)."""

    name: str
    model: str  # "zero" (instant), "uniform", "lognormal", or "http" (the loopback judge server, lognormal)
    tail_x: float = 0.0  # uniform: the top of the range; lognormal: p99; both x C
    hang_prob: float = 0.0
    fail_prob: float = 0.0  # http: the share of HTTP 500s
    p50_ratio: float = 10.0  # lognormal: p99 / p50 (the issue: p99 ~ 10x p50)
    deadline_x: float = 0.0  # > 0: request_timeout = ticket_deadline = this x C (settles hangs)
    # A failure regime (fail_prob > 0) is judged on learning only, against stock verl meeting the same
    # failures (the regime's own baseline, as in every regime); this names the same judge without
    # failures, whose stock run shows what the failures cost (reported, not judged).
    without_failures: Optional[str] = None
    # > 0: the agent's ticket deadline (x C) where it differs from the request timeout: room for retries
    ticket_deadline_x: float = 0.0
    # http: the server's token bucket refills at this share of the demand (SAMPLES_PER_STEP / C per
    # second) with a burst of one second's refill, the shape of verl's own rate_limited bucket
    limit_x: float = 0.0

    @property
    def http(self) -> bool:
        return self.model == "http"

    def limit_per_s(self, compute_s: float) -> float:
        """http: the server's refill rate, requests per second."""
        return round(self.limit_x * SAMPLES_PER_STEP / compute_s, 3)

    def server(self, compute_s: float, seed: int) -> dict:
        """http: the loopback judge server's settings (JudgeServerConfig kwargs, JSON-able)."""
        tail = round(self.tail_x * compute_s, 4)
        refill = self.limit_per_s(compute_s)
        return {"latency_lognormal": [round(tail / self.p50_ratio, 4), tail], "rate_500": self.fail_prob,
                "rate_hang": self.hang_prob, "hang_seconds": 3600.0, "bucket_capacity": max(1, math.ceil(refill)),
                "bucket_refill_per_s": refill, "seed": seed}

    def judge(self, compute_s: float, seed: int) -> dict:
        """Reward kwargs of the toy reward's simulated judge (cpu_backend/latency.py); for the http
        judge, its server's settings and the client's timeout (the server's address is the run's own,
        added when it starts: :func:`reward_function`)."""
        if self.model == "zero":
            return {}
        if self.http:
            return {"server": self.server(compute_s, seed), "timeout": round(self.deadline_x * compute_s, 3)}
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
        ticket = round(self.ticket_deadline_x * compute_s, 3) if self.ticket_deadline_x else deadline
        out = [f"reward.async_agent.request_timeout={deadline}", f"reward.async_agent.ticket_deadline={ticket}"]
        if self.http:  # the judge's published limit, as verl's rate_limited manager is given it
            out.append(f"reward.async_agent.requests_per_minute={round(self.limit_per_s(compute_s) * 60, 3)}")
        return out

    def verl_reward_loop(self, compute_s: float) -> list[str]:
        """verl's rate_limited manager at its best for this judge: concurrency as the agent's, the
        judge's rate limit (per reward-loop worker: verl's limiters are per process) and the request
        timeout (verl's own 300 s where the regime sets none)."""
        out = ["+reward.max_concurrent=64"]
        if self.deadline_x:
            out.append(f"+reward.timeout={round(self.deadline_x * compute_s, 3)}")
        if self.http:
            out.append(f"+reward.max_rpm={round(self.limit_per_s(compute_s) * 60, 3)}")
        return out

    @property
    def throughput_binds(self) -> bool:
        """The judge answers fewer requests per second than the trainer asks for (a limit below the demand)."""
        return 0 < self.limit_x < 1

    @property
    def timing(self) -> bool:
        return not self.fail_prob or self.http

    def describe(self) -> str:
        if self.model == "zero":
            return "instant judge"
        if self.http:
            return (f"loopback HTTP judge through the openai client: lognormal, p99 = {self.tail_x:g}C, "
                    f"p50 = p99/{self.p50_ratio:g}; token bucket at {self.limit_x:.0%} of the demand "
                    f"({SAMPLES_PER_STEP}/C per s, 1 s burst), 429 + Retry-After past it; "
                    f"{self.fail_prob:.0%} HTTP 500s, {self.hang_prob:.0%} hangs; {self.deadline_x:g}C request timeout"
                    + (f" (the agent's ticket deadline {self.ticket_deadline_x:g}C)" if self.ticket_deadline_x else ""))
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
    # What a hosted judge imposes (issue 43): a rate limit below what the trainer asks, transient 500s,
    # hangs, a heavy tail. The request timeout (2.5C: past the p99) is every manager's; the agent's
    # ticket deadline leaves it room for retries.
    Regime("judge_real", "http", 1.0, hang_prob=0.01, fail_prob=0.05, deadline_x=2.5, ticket_deadline_x=10.0,
           limit_x=0.8),
]}
ANCHOR_REGIMES = ("tail_1x", "heavy_2.5x", "judge_real")


# ------------------------------------------------------------------------------------------------
# a (regime, mode)'s reward
# ------------------------------------------------------------------------------------------------

def reward_loop_overrides(regime: Regime, mode: str, compute_s: float) -> list[str]:
    """What ``mode``'s reward manager gets in ``regime``, after the mode's own overrides: verl's
    default ``reward.num_workers`` for a mode run as a verl user's command, then the agent's settings
    (concurrency, the regime's deadlines and published limit) or, for verl's own reward loop, its
    manager's (the agent's settings mean nothing to it)."""
    if reward_manager(mode) == "async_agent":
        agent = regime.agent(compute_s)
        if "max_staleness=auto" in MODES[mode] and not agent:  # auto needs a ticket deadline (TAIL_AUTO)
            agent = REGIMES[AUTO_BOUND_DEADLINE].agent(compute_s)
        loop = [*AGENT, *agent]
    else:
        loop = regime.verl_reward_loop(compute_s)
    workers = [f"reward.num_workers={STOCK_COMMAND[mode]}"] if mode in STOCK_COMMAND else []
    return [*workers, *loop]


def reward_function(judge: dict, base_url: Optional[str] = None) -> dict:
    """The toy reward a run scores with, as CPURunConfig's reward_path / reward_name / reward_kwargs:
    for an http judge (``judge`` with a ``server``: :meth:`Regime.judge`), through the loopback judge
    server at ``base_url`` (the run's own: :func:`start_judge_server`); else the simulated judge."""
    from verl_async_rm_rig.cpu_backend import judged_toy
    from verl_async_rm_rig.cpu_backend.launch import toy_reward_path

    if "server" in judge:
        if not base_url:
            raise RuntimeError("an http judge's run needs its judge server running (its base_url)")
        return {"reward_path": os.path.abspath(judged_toy.__file__), "reward_name": "compute_score_via_judge",
                "reward_kwargs": {"base_url": base_url, "timeout": judge["timeout"]}}
    return {"reward_path": toy_reward_path(), "reward_name": "compute_score_with_latency", "reward_kwargs": judge}


def start_judge_server(judge: dict):
    """For an http judge, a loopback judge server of the run's own (a fresh token bucket and counters),
    started: to be started before the run (its validation before step 1 calls the judge too) and
    closed after it. None for a simulated judge."""
    server = judge.get("server")
    if not server:
        return None
    from verl_async_rm_rig.cpu_backend.judged_toy import toy_judge
    from verl_async_rm_rig.judge_server import JudgeServer, JudgeServerConfig

    config = {k: tuple(v) if isinstance(v, list) else v for k, v in server.items()}
    return JudgeServer(JudgeServerConfig(judge=toy_judge, **config)).start()
