"""Agent core benchmark, side by side in one run on one machine.

- throughput with zero-latency rewards (async and sync): our agent vs a sequential loop (verl's
  naive manager's way), the recipe's design (bench/recipe_agent.py) and verl 0.9.1's own
  RateLimitedRewardManager (which also decodes tokens: noted);
- wake-up latency of get (last needed group ready -> get returns), ours vs the recipe's polling;
- 2,000 samples with 0.1-0.5 s latency: wall time vs the ideal (the slowest request);
- 10,000 requests in flight with 1-2 s latency: RSS growth and wall time vs the ideal.
Prints a table and writes bench/results/agent_throughput.json (command and machine included).
    python bench/agent_throughput.py            # full sizes
    python bench/agent_throughput.py --quick    # small sizes, for CI (checks it runs)
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import platform
import random
import sys
import time
from pathlib import Path

import numpy as np
import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.recipe_agent import RecipeRewardAgent  # noqa: E402
from verl_async_rm import RewardAgent  # noqa: E402

RESULTS = ROOT / "bench" / "results"
TARGETS = {"async_scores_per_s": 20_000, "sync_scores_per_s": 5_000, "wakeup_p99_ms": 5.0, "rss_mb_10k": 200.0,
           "vs_recipe_throughput": 2.0}


async def zero_async(data_source, solution_str, ground_truth, extra_info=None):
    return 1.0


def zero_sync(data_source, solution_str, ground_truth, extra_info=None):
    return 1.0


async def sleep_async(data_source, solution_str, ground_truth, extra_info=None):
    await asyncio.sleep(extra_info["latency"])
    return 1.0


def sleep_sync(data_source, solution_str, ground_truth, extra_info=None):
    time.sleep(extra_info["latency"])
    return 1.0


def batch(n: int, group_size: int, latencies: list[float] | None = None) -> list[dict]:
    return [
        {"solution_str": "x", "ground_truth": "x", "data_source": "bench", "uid": i // group_size,
         "extra_info": {"latency": latencies[i]} if latencies else {}}
        for i in range(n)
    ]


def best_of(repeats: int, measure) -> float:
    return max(measure() for _ in range(repeats))


# -- contestants ---------------------------------------------------------------------------------
def ours(reward, items, group_size, cap, chunk) -> float:
    with RewardAgent(reward, {"max_concurrency": cap}) as agent:
        start = time.perf_counter()
        ticket = agent.submit(items, group_size)
        got = 0
        while c := agent.get(ticket, chunk):
            got += len(c)
        elapsed = time.perf_counter() - start
    assert got == len(items)
    return elapsed


def recipe(reward, items, group_size, cap, chunk) -> float:
    agent = RecipeRewardAgent(reward, cap)
    time.sleep(1.1)  # let the idle proxy thread reach its 1 s sleep, as it would between steps
    start = time.perf_counter()
    agent.compute_reward_pipeline(items, group_size)
    got = 0
    while got < len(items):
        idxs, _ = agent.get(min(chunk, len(items) - got))
        got += len(idxs)
    elapsed = time.perf_counter() - start
    agent.close()
    return elapsed


def sequential(reward, items, *_):
    start = time.perf_counter()
    for item in items:
        reward(item["data_source"], item["solution_str"], item["ground_truth"], item["extra_info"])
    return time.perf_counter() - start


def verl_rate_limited(reward, items, group_size, cap, chunk, tokenizer) -> float:
    """verl 0.9.1's RateLimitedRewardManager.__call__ on a DataProto of the same samples."""
    from omegaconf import DictConfig

    from verl.experimental.reward_loop.reward_manager.limited import RateLimitedRewardManager
    from tests.test_verl_integration import make_batch

    latencies = [it["extra_info"].get("latency", 0.0) for it in items]
    data, _ = make_batch(tokenizer, ["x"] * len(items), ["x"] * len(items), [str(it["uid"]) for it in items])
    data.non_tensor_batch["extra_info"] = np.array([{"latency": x} for x in latencies], dtype=object)
    RateLimitedRewardManager._class_initialized = False  # its limits are class-level: reset per contestant
    manager = RateLimitedRewardManager(DictConfig({"reward": {"max_concurrent": cap, "timeout": 300}}), tokenizer, reward)
    start = time.perf_counter()
    manager(data)
    return time.perf_counter() - start


# -- measurements --------------------------------------------------------------------------------
def wakeup_latency(groups: int, group_size: int) -> dict:
    """Group g becomes ready about 5 ms after group g-1; the caller waits for each in turn. Wake-up =
    get's return minus the later of: the moment its group became ready (the agent's stamp; same
    process, same clock) and the moment get was called (a group that was ready before the caller
    asked for it measures the call, not the caller's own delay)."""
    latencies = [0.005 * (i // group_size + 1) for i in range(groups * group_size)]
    wakes = []
    with RewardAgent(sleep_async, {"max_concurrency": groups * group_size}) as agent:
        ticket = agent.submit(batch(groups * group_size, group_size, latencies), group_size)
        while True:
            called = time.monotonic()
            chunk = agent.get(ticket, group_size)
            if not chunk:
                break
            wakes.append(time.monotonic() - max(chunk.ready_at, called))
    wakes_ms = np.asarray(wakes) * 1000
    return {"groups": groups, "p50_ms": float(np.percentile(wakes_ms, 50)), "p99_ms": float(np.percentile(wakes_ms, 99))}


def recipe_wakeup(groups: int, group_size: int) -> dict:
    """The recipe's get polls every 0.1 s: time from a group's completion (or the call, if later) to get returning."""
    ready_at: dict[int, float] = {}

    def marked(data_source, solution_str, ground_truth, extra_info=None):
        time.sleep(extra_info["latency"])
        ready_at[extra_info["group"]] = time.monotonic()  # the last member's finish ~ group ready
        return 1.0

    items = [{"solution_str": "x", "ground_truth": "x", "data_source": "b", "uid": i // group_size,
              "extra_info": {"latency": 0.02 * (i // group_size + 1), "group": i // group_size}}
             for i in range(groups * group_size)]
    agent = RecipeRewardAgent(marked, 256)
    agent.compute_reward_pipeline(items, group_size)
    wakes = []
    for _ in range(groups):
        called = time.monotonic()
        idxs, _ = agent.get(group_size)
        wakes.append(time.monotonic() - max(ready_at[items[idxs[0]]["extra_info"]["group"]], called))
    agent.close()
    wakes_ms = np.asarray(wakes) * 1000
    return {"groups": groups, "p50_ms": float(np.percentile(wakes_ms, 50)), "p99_ms": float(np.percentile(wakes_ms, 99))}


def in_flight(n: int, group_size: int, seed: int = 0) -> dict:
    rng = random.Random(seed)
    latencies = [rng.uniform(1.0, 2.0) for _ in range(n)]
    gc.collect()
    process = psutil.Process()
    rss_before = process.memory_info().rss
    peak = rss_before
    with RewardAgent(sleep_async, {"max_concurrency": n}) as agent:
        start = time.perf_counter()
        ticket = agent.submit(batch(n, group_size, latencies), group_size)
        while agent.remaining(ticket):
            peak = max(peak, process.memory_info().rss)
            chunk = agent.get(ticket, group_size * 64)
            if not len(chunk):
                break
        wall = time.perf_counter() - start
    return {"requests": n, "rss_growth_mb": (peak - rss_before) / 2**20, "wall_s": wall, "ideal_s": max(latencies),
            "wall_over_ideal": wall / max(latencies)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=10_000)
    parser.add_argument("--latency-samples", type=int, default=2_000)
    parser.add_argument("--in-flight", type=int, default=10_000)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="tiny sizes for CI: checks the script runs")
    parser.add_argument("--out", default=str(RESULTS / "agent_throughput.json"))
    args = parser.parse_args()
    if args.quick:
        args.samples, args.latency_samples, args.in_flight, args.repeats = 400, 96, 192, 1
        args.out = args.out.replace(".json", "_quick.json")
    from verl_async_rm.cpu_backend.tiny_model import build_tokenizer
    import tempfile

    from transformers import AutoTokenizer

    token_dir = tempfile.mkdtemp(prefix="bench_tok_")
    build_tokenizer(token_dir)
    tokenizer = AutoTokenizer.from_pretrained(token_dir)

    gs, n = args.group_size, args.samples
    zero = batch(n, gs)
    throughput = {}
    for name, fn, contestant in [
        ("ours_async", zero_async, ours), ("ours_sync", zero_sync, ours),
        ("recipe_sync", zero_sync, recipe), ("sequential_sync", zero_sync, sequential),
    ]:
        throughput[name] = best_of(args.repeats, lambda: n / contestant(fn, zero, gs, 256, gs * 64))
        print(f"throughput {name:<22} {throughput[name]:>10,.0f} scores/s", flush=True)
    for name, fn in [("verl_rate_limited_async", zero_async), ("verl_rate_limited_sync", zero_sync)]:
        throughput[name] = best_of(args.repeats, lambda: n / verl_rate_limited(fn, zero, gs, 256, gs * 64, tokenizer))
        print(f"throughput {name:<22} {throughput[name]:>10,.0f} scores/s (includes decoding tokens)", flush=True)

    rng = random.Random(0)
    m = args.latency_samples
    latencies = [rng.uniform(0.1, 0.5) for _ in range(m)]
    slow = batch(m, gs, latencies)
    ideal = max(latencies)
    latency = {"samples": m, "ideal_s": ideal, "sequential_estimate_s": sum(latencies)}
    latency["ours_async_cap_all"] = ours(sleep_async, slow, gs, m, gs)
    latency["ours_sync_cap_256"] = ours(sleep_sync, slow, gs, 256, gs)
    latency["recipe_sync_256_threads"] = recipe(sleep_sync, slow, gs, 256, gs)
    latency["verl_rate_limited_async_cap_all"] = verl_rate_limited(sleep_async, slow, gs, m, gs, tokenizer)
    sample = slow[:20]
    latency["sequential_measured_on_20_s"] = sequential(sleep_sync, sample)
    for key in ("ours_async_cap_all", "ours_sync_cap_256", "recipe_sync_256_threads", "verl_rate_limited_async_cap_all"):
        print(f"latency 0.1-0.5 s x {m}: {key:<32} {latency[key]:7.3f} s (ideal {ideal:.3f} s)", flush=True)

    wake = {"ours": wakeup_latency(min(400, n // gs), gs), "recipe": recipe_wakeup(min(50, n // gs), gs)}
    print(f"get wake-up: ours p50 {wake['ours']['p50_ms']:.2f} ms, p99 {wake['ours']['p99_ms']:.2f} ms; "
          f"recipe p50 {wake['recipe']['p50_ms']:.1f} ms, p99 {wake['recipe']['p99_ms']:.1f} ms", flush=True)
    flight = in_flight(args.in_flight, gs)
    print(f"{flight['requests']} in flight (1-2 s): RSS +{flight['rss_growth_mb']:.0f} MB, wall {flight['wall_s']:.2f} s "
          f"vs ideal {flight['ideal_s']:.2f} s", flush=True)

    targets = {
        "async >= 20k scores/s": throughput["ours_async"] >= TARGETS["async_scores_per_s"],
        "sync >= 5k scores/s": throughput["ours_sync"] >= TARGETS["sync_scores_per_s"],
        "get wake-up p99 <= 5 ms": wake["ours"]["p99_ms"] <= TARGETS["wakeup_p99_ms"],
        "<= 200 MB extra RSS for 10k in flight": flight["rss_growth_mb"] <= TARGETS["rss_mb_10k"],
        ">= 2x the recipe design's throughput": throughput["ours_sync"] >= 2 * throughput["recipe_sync"],
    }
    for name, met in targets.items():
        print(f"target {name}: {'met' if met else 'MISSED'}")
    results = {
        "command": " ".join(["bench/agent_throughput.py", *sys.argv[1:]]),
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count(), "platform": platform.platform()},
        "samples": n, "group_size": gs,
        "throughput_scores_per_s": throughput, "latency_0.1_0.5": latency, "get_wakeup": wake, "in_flight": flight,
        "targets_met": targets,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
