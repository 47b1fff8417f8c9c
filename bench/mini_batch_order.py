"""What ``mini_batch_order`` costs: the pipeline's reward wait per step in completion order and in
verl's own (index) order, on the real step scheduler and a real agent, with verl's step functions
replaced by sleeps (the compute of a step's updates).

Model of a step (8 prompts x 4 samples, 4 mini-batches, as the CPU benchmarks): each sample has a
response length in [1, 16] tokens; its reward takes ``tail x length/16 x U(0.5, 1)`` seconds (latency
grows with length, as a judge's does); the batch is in the order verl's ``_balance_batch`` gives one
data-parallel rank (sorted by length, short ones at both ends), so verl's mini-batches mix groups.
Policy inputs take ``compute`` seconds, then each update ``compute / 4``.

    python bench/mini_batch_order.py           # 20 steps x 3 latency tails (~2 min)
    python bench/mini_batch_order.py --quick   # 3 steps
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import sys
import time
import uuid
from pathlib import Path
from typing import Optional

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from omegaconf import OmegaConf  # noqa: E402

from verl_async_rm.strategies.plan import StrategyConfig, TrainerShape, plan_mini_batches  # noqa: E402
from verl_async_rm.integration.settings import settings_from_verl_config  # noqa: E402
from verl_async_rm.strategies.rewards import BatchRewards  # noqa: E402
from verl_async_rm.strategies.scheduler import StepScheduler  # noqa: E402

REWARD = str(ROOT / "tests" / "helpers" / "seam_reward.py")
PROMPTS, N, MINI = 8, 4, 2


def verl_order(lengths: list[int]) -> list[int]:
    """verl 0.9.1 ``RayPPOTrainer._balance_batch`` for one rank: sort by workload, then the
    even positions followed by the odd ones reversed (small micro-batches at both ends)."""
    partition = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
    return partition[::2] + partition[1::2][::-1]


class SleepingOps:
    """verl's step functions as their durations: an update sleeps ``update_s``."""

    def __init__(self, order, update_s):
        self.order, self.update_s = order, update_s

    def rows(self, batch):
        return list(self.order)

    def pipelineable(self, batch, pending):
        return True

    def attach(self, batch, scored):
        pass

    def advantages(self, batch, rows, kl):
        return {}

    def update(self, batch, call, rows):
        time.sleep(self.update_s * call.epochs * (len(rows) / (MINI * N) if rows else 1))
        return {}


def one_step(rewards: BatchRewards, order_mode: str, tail: float, compute: float, rng: random.Random) -> float:
    lengths = [rng.randint(1, 16) for _ in range(PROMPTS * N)]
    order = verl_order(lengths)
    requests = [{"index": i, "solution_str": str(i), "ground_truth": 1.0, "data_source": "t", "uid": f"g{i // N}",
                 "extra_info": {"delay": tail * lengths[i] / 16 * rng.uniform(0.5, 1.0)}} for i in range(PROMPTS * N)]
    strategy = StrategyConfig(True, 0, order_mode)
    plan = plan_mini_batches(strategy, TrainerShape(train_batch_size=PROMPTS, ppo_mini_batch_size=MINI, rollout_n=N))
    scheduler = StepScheduler(strategy, plan, rewards, use_critic=False, reduce_lists=lambda d: d)
    pending = rewards.submit(requests)
    time.sleep(compute)  # old log-probs while the rewards are in flight
    scheduler.train(SleepingOps(order, compute / 4), None, pending, update_actor=True, timing_raw={})
    return pending.timing.blocked


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--compute", type=float, default=0.4, help="policy inputs, s (updates: the same in total)")
    parser.add_argument("--tails", default="0.4,0.8,1.6", help="reward latency tails, s")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "mini_batch_order.json"))
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    if args.quick:
        args.steps, args.out = 3, args.out.replace(".json", "_quick.json")
    config = OmegaConf.create({"reward": {"custom_reward_function": {"path": REWARD, "name": "delayed"},
                                          "async_agent": {"actor_name": f"order-{uuid.uuid4().hex}"}},
                               "actor_rollout_ref": {"rollout": {"n": N}}})
    rewards = BatchRewards(settings_from_verl_config(config), tokenizer=None)
    rows = []
    for tail in (float(t) for t in args.tails.split(",")):
        for mode in ("completion", "index"):
            rng = random.Random(0)  # the same steps for both orders
            blocked = [one_step(rewards, mode, tail, args.compute, rng) for _ in range(args.steps)]
            rows.append({"tail_s": tail, "order": mode, "blocked_per_step_s": round(float(np.mean(blocked)), 3),
                         "p90_s": round(float(np.percentile(blocked, 90)), 3)})
            print(f"tail {tail:g} s ({tail / (2 * args.compute):.1f}x compute), {mode:>10}: blocked "
                  f"{rows[-1]['blocked_per_step_s']:.3f} s/step (p90 {rows[-1]['p90_s']:.3f})", flush=True)
    report = {"command": " ".join(["python bench/mini_batch_order.py", *(argv if argv is not None else sys.argv[1:])]),
              "machine": {"python": platform.python_version(), "cpus": os.cpu_count()},
              "steps": args.steps, "compute_per_step_s": 2 * args.compute, "rows": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2))
    print(f"results: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
