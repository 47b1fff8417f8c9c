"""Agent core benchmark, side by side in one run on one machine.

- throughput with zero-latency rewards (async and sync): our agent vs a sequential loop (verl's
  naive manager's way), the recipe's design (bench/recipe_agent.py) and verl 0.9.1's own
  RateLimitedRewardManager (which also decodes tokens: noted);
- wake-up latency of get (last needed group ready -> get returns), ours vs the recipe's polling;
- 2,000 samples with 0.1-0.5 s latency: wall time vs the ideal (the slowest request);
- 10,000 requests in flight with 1-2 s latency: RSS growth and wall time vs the ideal.

Fair clocks. Each design is built, left idle for a random phase U(0, 1) s (the same draw for every
contestant of a round), then given the batch. The recipe's proxy thread sleeps 1 s whenever it is
idle, so a batch submitted at a random moment waits U(0, 1) s before the design notices it, as it
would between training steps. Two clocks per run, both stopped when the caller holds the last score:
- from submit: what a trainer waits (the recipe's idle wait included);
- from pickup: core throughput, from the moment the design starts working on the batch (the recipe:
  its proxy thread takes the request off its queue; ours: submit itself, since our loop has no idle
  wait and starts the ticket as it is submitted, the input checks in submit counted as work).
One untimed warm-up run per contestant; rounds rotate the contestants' order; a gc.collect() before
every run; medians with min-max are reported.
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
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.recipe_agent import RecipeRewardAgent  # noqa: E402
from verl_async_rm import RewardAgent  # noqa: E402

RESULTS = ROOT / "bench" / "results"
TARGETS = {"async_scores_per_s": 20_000, "sync_scores_per_s": 5_000, "wakeup_p99_ms": 5.0, "rss_mb_10k": 200.0,
           "vs_recipe_from_pickup": 1.5}
RECIPE_IDLE_SLEEP_S = 1.0  # the recipe's proxy thread sleeps this long whenever its queue is empty


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


@dataclass(frozen=True)
class Timing:
    """One run: seconds from submit, and from pickup, to the caller holding the last score."""

    from_submit: float
    from_pickup: float
    submit_call: float = 0.0  # seconds inside the submit call itself (ours: input checks; recipe: grouping)

    @property
    def pickup_delay(self) -> float:
        return self.from_submit - self.from_pickup


def spread(values: list[float]) -> dict:
    return {"median": float(np.median(values)), "min": float(min(values)), "max": float(max(values)), "runs": len(values)}


# -- contestants ---------------------------------------------------------------------------------
def ours(reward, items, group_size, cap, chunk, phase_s: float) -> Timing:
    with RewardAgent(reward, {"max_concurrency": cap}) as agent:
        time.sleep(phase_s)  # idle as long as the recipe's agent is in the same round
        start = time.perf_counter()  # our loop starts the ticket as it is submitted: pickup = submit
        ticket = agent.submit(items, group_size)
        submitted = time.perf_counter()
        got = 0
        while c := agent.get(ticket, chunk):
            got += len(c)
        elapsed = time.perf_counter() - start
    assert got == len(items)
    return Timing(elapsed, elapsed, submitted - start)


def recipe(reward, items, group_size, cap, chunk, phase_s: float) -> Timing:
    agent = RecipeRewardAgent(reward, cap)
    try:
        time.sleep(phase_s)  # a random moment relative to the proxy thread's 1 s idle sleep
        start = time.perf_counter()
        agent.compute_reward_pipeline(items, group_size)
        submitted = time.perf_counter()
        got = 0
        while got < len(items):
            idxs, _ = agent.get(min(chunk, len(items) - got))
            got += len(idxs)
        end = time.perf_counter()
        picked_up = agent.picked_up_at
    finally:
        agent.close()
    assert picked_up is not None and start <= picked_up <= end
    return Timing(end - start, end - picked_up, submitted - start)


def sequential(reward, items, *_) -> Timing:
    start = time.perf_counter()
    for item in items:
        reward(item["data_source"], item["solution_str"], item["ground_truth"], item["extra_info"])
    elapsed = time.perf_counter() - start
    return Timing(elapsed, elapsed)


def verl_rate_limited(reward, items, group_size, cap, chunk, tokenizer) -> Timing:
    """verl 0.9.1's RateLimitedRewardManager.__call__ on a DataProto of the same samples."""
    from omegaconf import DictConfig

    from verl.experimental.reward_loop.reward_manager.limited import RateLimitedRewardManager
    from tests.seam.test_verl_integration import make_batch

    latencies = [it["extra_info"].get("latency", 0.0) for it in items]
    data, _ = make_batch(tokenizer, ["x"] * len(items), ["x"] * len(items), [str(it["uid"]) for it in items])
    data.non_tensor_batch["extra_info"] = np.array([{"latency": x} for x in latencies], dtype=object)
    RateLimitedRewardManager._class_initialized = False  # its limits are class-level: reset per contestant
    manager = RateLimitedRewardManager(DictConfig({"reward": {"max_concurrent": cap, "timeout": 300}}), tokenizer, reward)
    start = time.perf_counter()  # a blocking call: it starts working when called
    manager(data)
    elapsed = time.perf_counter() - start
    return Timing(elapsed, elapsed)


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


def rounds_side_by_side(contestants: dict, rounds: int, rng: random.Random, log_label: str) -> dict[str, list[Timing]]:
    """One untimed warm-up run each, then every contestant once per round, in an order rotated by one
    each round (none always first or last), all after the same random idle phase of that round."""
    runs: dict[str, list[Timing]] = {name: [] for name in contestants}
    names = list(contestants)
    for name in names:  # warm-up, not counted: the process's first agent pays imports and thread starts
        gc.collect()
        contestants[name](0.0)
    for r in range(rounds):
        phase = rng.uniform(0.0, RECIPE_IDLE_SLEEP_S)
        order = names[r % len(names):] + names[: r % len(names)]
        for name in order:
            gc.collect()  # nobody pays for the previous contestant's garbage
            timing = contestants[name](phase)
            runs[name].append(timing)
            print(f"{log_label} round {r + 1}/{rounds} phase {phase:.2f}s {name:<24} from submit {timing.from_submit:7.3f}s"
                  f"  from pickup {timing.from_pickup:7.3f}s", flush=True)
    return runs


def summarize(runs: dict[str, list[Timing]], n: int) -> dict:
    return {
        name: {
            "from_submit_scores_per_s": spread([n / t.from_submit for t in timings]),
            "from_pickup_scores_per_s": spread([n / t.from_pickup for t in timings]),
            "pickup_delay_s": spread([t.pickup_delay for t in timings]),
            "submit_call_s": spread([t.submit_call for t in timings]),
            "raw": [{"from_submit_s": t.from_submit, "from_pickup_s": t.from_pickup, "submit_call_s": t.submit_call}
                    for t in timings],
        }
        for name, timings in runs.items()
    }


def summarize_seconds(runs: dict[str, list[Timing]]) -> dict:
    return {
        name: {"from_submit_s": spread([t.from_submit for t in timings]),
               "from_pickup_s": spread([t.from_pickup for t in timings])}
        for name, timings in runs.items()
    }  # fmt: skip


def fmt_spread(s: dict, unit: str = "", digits: int = 0) -> str:
    return f"{s['median']:,.{digits}f}{unit} ({s['min']:,.{digits}f}-{s['max']:,.{digits}f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    # each size: (full, --quick); one given on the command line wins over both
    sizes = {"samples": (10_000, 400, "zero-latency samples"), "latency_samples": (2_000, 96, "0.1-0.5 s samples"),
             "in_flight": (10_000, 192, "requests in flight"), "rounds": (7, 2, "rounds of the zero-latency contest"),
             "latency_rounds": (3, 1, "rounds of the 0.1-0.5 s contest")}
    for name, (full, quick, what) in sizes.items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=int, default=None, help=f"{what} ({full:,}; --quick: {quick:,})")
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0, help="seed of the random phases")
    parser.add_argument("--quick", action="store_true", help="tiny sizes for CI: checks the script runs")
    parser.add_argument("--out", default=str(RESULTS / "agent_throughput.json"))
    args = parser.parse_args()
    for name, (full, quick, _) in sizes.items():
        if getattr(args, name) is None:
            setattr(args, name, quick if args.quick else full)
    if args.quick:
        args.out = args.out.replace(".json", "_quick.json")
    from verl_async_rm_rig.cpu_backend.tiny_model import build_tokenizer
    import tempfile

    from transformers import AutoTokenizer

    token_dir = tempfile.mkdtemp(prefix="bench_tok_")
    build_tokenizer(token_dir)
    tokenizer = AutoTokenizer.from_pretrained(token_dir)
    rng = random.Random(args.seed)
    load_before = os.getloadavg()[0]  # other work on the machine shows up as noise: recorded

    gs, n, cap, chunk = args.group_size, args.samples, 256, args.group_size * 64
    zero = batch(n, gs)
    contestants = {
        "ours_async": lambda phase: ours(zero_async, zero, gs, cap, chunk, phase),
        "ours_sync": lambda phase: ours(zero_sync, zero, gs, cap, chunk, phase),
        "recipe_sync": lambda phase: recipe(zero_sync, zero, gs, cap, chunk, phase),
        "sequential_sync": lambda phase: sequential(zero_sync, zero),
        "verl_rate_limited_async": lambda phase: verl_rate_limited(zero_async, zero, gs, cap, chunk, tokenizer),
        "verl_rate_limited_sync": lambda phase: verl_rate_limited(zero_sync, zero, gs, cap, chunk, tokenizer),
    }
    throughput = summarize(rounds_side_by_side(contestants, args.rounds, rng, "zero-latency"), n)
    for name, row in throughput.items():
        note = " (includes decoding tokens)" if name.startswith("verl") else ""
        print(f"throughput {name:<24} from submit {fmt_spread(row['from_submit_scores_per_s'])} scores/s; "
              f"from pickup {fmt_spread(row['from_pickup_scores_per_s'])}{note}", flush=True)

    m = args.latency_samples
    latencies = _latencies(m)
    slow = batch(m, gs, latencies)
    ideal = max(latencies)
    slow_contestants = {
        "ours_async_cap_all": lambda phase: ours(sleep_async, slow, gs, m, gs, phase),
        "ours_sync_cap_256": lambda phase: ours(sleep_sync, slow, gs, 256, gs, phase),
        "recipe_sync_256_threads": lambda phase: recipe(sleep_sync, slow, gs, 256, gs, phase),
        "verl_rate_limited_async_cap_all": lambda phase: verl_rate_limited(sleep_async, slow, gs, m, gs, tokenizer),
    }
    latency = {"samples": m, "ideal_s": ideal, "sequential_estimate_s": sum(latencies),
               **summarize_seconds(rounds_side_by_side(slow_contestants, args.latency_rounds, rng, "latency 0.1-0.5 s"))}
    latency["sequential_measured_on_20_s"] = sequential(sleep_sync, slow[:20]).from_submit
    for key in slow_contestants:
        row = latency[key]
        print(f"latency 0.1-0.5 s x {m}: {key:<32} from submit {fmt_spread(row['from_submit_s'], ' s', 3)}; "
              f"from pickup {fmt_spread(row['from_pickup_s'], ' s', 3)} (ideal {ideal:.3f} s)", flush=True)

    wake = {"ours": wakeup_latency(min(400, n // gs), gs), "recipe": recipe_wakeup(min(50, n // gs), gs)}
    print(f"get wake-up: ours p50 {wake['ours']['p50_ms']:.2f} ms, p99 {wake['ours']['p99_ms']:.2f} ms; "
          f"recipe p50 {wake['recipe']['p50_ms']:.1f} ms, p99 {wake['recipe']['p99_ms']:.1f} ms", flush=True)
    flight = in_flight(args.in_flight, gs)
    print(f"{flight['requests']} in flight (1-2 s): RSS +{flight['rss_growth_mb']:.0f} MB, wall {flight['wall_s']:.2f} s "
          f"vs ideal {flight['ideal_s']:.2f} s", flush=True)

    median = lambda name, clock: throughput[name][f"{clock}_scores_per_s"]["median"]  # noqa: E731
    vs_recipe = {clock: median("ours_sync", clock) / median("recipe_sync", clock) for clock in ("from_submit", "from_pickup")}
    print(f"ours_sync / recipe_sync (medians): from submit {vs_recipe['from_submit']:.2f}x, "
          f"from pickup {vs_recipe['from_pickup']:.2f}x; recipe's pickup delay "
          f"{fmt_spread(throughput['recipe_sync']['pickup_delay_s'], ' s', 3)}; submit call: ours "
          f"{fmt_spread(throughput['ours_sync']['submit_call_s'], ' s', 3)}, recipe "
          f"{fmt_spread(throughput['recipe_sync']['submit_call_s'], ' s', 3)}", flush=True)
    targets = {
        "async >= 20k scores/s (median, from submit)": median("ours_async", "from_submit") >= TARGETS["async_scores_per_s"],
        "sync >= 5k scores/s (median, from submit)": median("ours_sync", "from_submit") >= TARGETS["sync_scores_per_s"],
        "get wake-up p99 <= 5 ms": wake["ours"]["p99_ms"] <= TARGETS["wakeup_p99_ms"],
        "<= 200 MB extra RSS for 10k in flight": flight["rss_growth_mb"] <= TARGETS["rss_mb_10k"],
        ">= 1.5x the recipe design's sync throughput from pickup (medians)":
            vs_recipe["from_pickup"] >= TARGETS["vs_recipe_from_pickup"],
    }  # fmt: skip
    for name, met in targets.items():
        print(f"target {name}: {'met' if met else 'MISSED'}")
    results = {
        "command": " ".join(["bench/agent_throughput.py", *sys.argv[1:]]),
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count(), "platform": platform.platform(),
                    "load_average_1m_before": load_before, "load_average_1m_after": os.getloadavg()[0]},
        "method": ("each round: every contestant built, idle for the round's random phase U(0, 1) s, then given the "
                   "batch; from_submit = submit -> last score held by the caller; from_pickup = from the moment the "
                   "design starts on the batch (recipe: proxy takes it off its queue; ours: submit; verl and "
                   "sequential: the blocking call)"),
        "samples": n, "group_size": gs, "rounds": args.rounds, "latency_rounds": args.latency_rounds, "seed": args.seed,
        "throughput_scores_per_s": throughput, "ours_sync_vs_recipe_sync": vs_recipe,
        "latency_0.1_0.5": latency, "get_wakeup": wake, "in_flight": flight, "targets_met": targets,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=2))
    print(f"wrote {args.out}")


def _latencies(m: int) -> list[float]:
    rng = random.Random(0)  # the same 2,000 latencies in every run
    return [rng.uniform(0.1, 0.5) for _ in range(m)]


if __name__ == "__main__":
    main()


def markdown(report: dict) -> str:
    """The README's agent-core table, from this benchmark's JSON."""
    throughput = report["throughput_scores_per_s"]

    def rate(name: str, clock: str) -> str:
        s = throughput[name][f"{clock}_scores_per_s"]
        return f"{s['median']:,.0f} [{s['min']:,.0f}, {s['max']:,.0f}]"

    slow = report["latency_0.1_0.5"]

    def wall(name: str) -> str:
        s = slow[name]["from_submit_s"]
        return f"{s['median']:.2f} s [{s['min']:.2f}, {s['max']:.2f}]"

    wake, flight = report["get_wakeup"], report["in_flight"]
    ratio = report["ours_sync_vs_recipe_sync"]
    rows = [
        ("zero-latency sync reward, scores/s from submit", rate("ours_sync", "from_submit"), rate("recipe_sync", "from_submit"),
         rate("verl_rate_limited_sync", "from_submit")),
        ("zero-latency sync reward, scores/s from pickup", rate("ours_sync", "from_pickup"), rate("recipe_sync", "from_pickup"), "—"),
        ("zero-latency async reward, scores/s", rate("ours_async", "from_submit"), "—", rate("verl_rate_limited_async", "from_submit")),
        (f"{slow['samples']:,} requests of 0.1-0.5 s (ideal {slow['ideal_s']:.2f} s)",
         f"async {wall('ours_async_cap_all')}; sync, 256 threads {wall('ours_sync_cap_256')}",
         f"{wall('recipe_sync_256_threads')} (256 threads)", wall("verl_rate_limited_async_cap_all")),
        ("`get` wake-up, p50 / p99", f"{wake['ours']['p50_ms']:.2f} / {wake['ours']['p99_ms']:.2f} ms",
         f"{wake['recipe']['p50_ms']:.2f} / {wake['recipe']['p99_ms']:.0f} ms (0.1 s polling)", "—"),
        (f"{flight['requests']:,} requests in flight, 1-2 s latency", f"+{flight['rss_growth_mb']:.0f} MB RSS, "
         f"{flight['wall_s']:.2f} s (ideal {flight['ideal_s']:.2f} s)", "—", "—"),
    ]
    lines = ["| measure (medians [min, max] over rounds) | ours | recipe design | verl `RateLimitedRewardManager` |",
             "|---|---|---|---|", *(f"| {' | '.join(row)} |" for row in rows)]
    lines.append("")
    lines.append(f"Ours over the recipe design, sync, medians: {ratio['from_submit']:.1f}x from submit, "
                 f"{ratio['from_pickup']:.2f}x from pickup. Machine load (1 min) before / after: "
                 f"{report['machine']['load_average_1m_before']:.1f} / {report['machine']['load_average_1m_after']:.1f}.")
    return "\n".join(lines)
