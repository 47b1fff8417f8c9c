"""Agent core benchmark: throughput with zero-latency rewards, and wall time under latency vs the ideal.

Prints a table and writes bench/results/agent_throughput.json (with the command and machine facts).
    python bench/agent_throughput.py            # 10,000 samples; 2,000 with 0.1-0.5 s latency
    python bench/agent_throughput.py --quick    # small sizes, for CI (numbers not meaningful)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import sys
import time
from pathlib import Path

from verl_async_rm import RewardAgent

RESULTS = Path(__file__).resolve().parent / "results"


async def zero_async(data_source, solution_str, ground_truth, extra_info=None):
    return 1.0


def zero_sync(data_source, solution_str, ground_truth, extra_info=None):
    return 1.0


async def latency_async(data_source, solution_str, ground_truth, extra_info=None):
    await asyncio.sleep(extra_info["latency"])
    return 1.0


def batch(n: int, group_size: int, latencies: list[float] | None = None) -> list[dict]:
    return [
        {"solution_str": "x", "uid": i // group_size, "extra_info": {"latency": latencies[i]} if latencies else None}
        for i in range(n)
    ]


def throughput(reward, n: int, group_size: int, repeats: int) -> dict:
    """Scores/s from submit to the last group returned, best and median of ``repeats`` runs."""
    items = batch(n, group_size)
    rates = []
    with RewardAgent(reward, {"max_concurrency": 1024}) as agent:
        for _ in range(repeats):
            start = time.perf_counter()
            ticket = agent.submit(items, group_size)
            got = 0
            while chunk := agent.get(ticket, group_size * 64):
                got += len(chunk)
            rates.append(n / (time.perf_counter() - start))
            assert got == n
    rates.sort()
    return {"samples": n, "repeats": repeats, "scores_per_s_median": rates[len(rates) // 2], "scores_per_s_best": rates[-1]}


def latency_run(n: int, lo: float, hi: float, group_size: int, seed: int) -> dict:
    rng = random.Random(seed)
    latencies = [rng.uniform(lo, hi) for _ in range(n)]
    ideal = max(latencies)  # every request concurrent: the slowest one bounds the batch
    with RewardAgent(latency_async, {"max_concurrency": n}) as agent:
        start = time.perf_counter()
        ticket = agent.submit(batch(n, group_size, latencies), group_size)
        first_chunk_at = None
        while chunk := agent.get(ticket, group_size):
            first_chunk_at = first_chunk_at or time.perf_counter() - start
        wall = time.perf_counter() - start
    return {
        "samples": n, "latency_s": [lo, hi], "wall_s": wall, "ideal_s": ideal, "overhead_s": wall - ideal,
        "wall_over_ideal": wall / ideal, "first_group_s": first_chunk_at, "sequential_s": sum(latencies),
    }


def machine() -> dict:
    return {"python": platform.python_version(), "cpus": os.cpu_count(), "platform": platform.platform()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=10_000)
    parser.add_argument("--latency-samples", type=int, default=2_000)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="tiny sizes for CI: checks the script runs")
    parser.add_argument("--out", default=str(RESULTS / "agent_throughput.json"))
    args = parser.parse_args()
    if args.quick:
        args.samples, args.latency_samples, args.repeats = 800, 200, 1
        args.out = args.out.replace(".json", "_quick.json")

    results = {
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "machine": machine(),
        "async_zero_latency": throughput(zero_async, args.samples, args.group_size, args.repeats),
        "sync_zero_latency": throughput(zero_sync, args.samples, args.group_size, args.repeats),
        "latency_0.1_0.5": latency_run(args.latency_samples, 0.1, 0.5, args.group_size, seed=0),
    }
    a, s, lat = results["async_zero_latency"], results["sync_zero_latency"], results["latency_0.1_0.5"]
    print(f"async, zero latency, {a['samples']} samples: {a['scores_per_s_median']:,.0f} scores/s (median of {a['repeats']})")
    print(f"sync,  zero latency, {s['samples']} samples: {s['scores_per_s_median']:,.0f} scores/s (median of {s['repeats']})")
    print(
        f"latency 0.1-0.5 s, {lat['samples']} samples: wall {lat['wall_s']:.3f} s vs ideal {lat['ideal_s']:.3f} s "
        f"(x{lat['wall_over_ideal']:.3f}, +{lat['overhead_s'] * 1000:.0f} ms); sequential would take {lat['sequential_s']:.0f} s"
    )
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
