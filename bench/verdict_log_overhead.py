"""Overhead of the verdict log (and of usage accounting) on the agent's throughput.

The worst case for the log: zero-latency async rewards, so the agent's own cost per sample is all
there is. Each round scores the same batch three ways, in rotating order, each on a fresh agent:
- off: no verdict log, the reward returns a score and the judge's reply, no usage;
- usage: the reward reports usage (taken out of its extra info, charged to the cost ledger);
- log: the same, with the verdict log on (a fresh file per run, fsync every 1 s: the default).
Throughput = samples / (submit -> last score). Medians with min-max; a gc.collect() before each run.
The log's records are built on the loop (a dict per sample) and serialised + written by its thread,
so what is left on the loop is the request-key hash and the record; the rest competes for the GIL.
    python bench/verdict_log_overhead.py            # 20,000 samples x 7 rounds
    python bench/verdict_log_overhead.py --quick    # small, for CI (checks it runs)
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from verl_async_rm.agent import RewardAgent  # noqa: E402

RESULTS = ROOT / "bench" / "results"
USAGE = {"prompt_tokens": 120, "completion_tokens": 3}


async def plain_reward(data_source, solution_str, ground_truth, extra_info=None):
    return {"score": 1.0, "judge_reply": "1"}


async def usage_reward(data_source, solution_str, ground_truth, extra_info=None):
    return {"score": 1.0, "judge_reply": "1", "usage": USAGE}


def one_run(mode: str, items: list[dict], group_size: int, folder: str) -> tuple[float, float]:
    config = {"max_concurrency": 256}
    reward = plain_reward if mode == "off" else usage_reward
    if mode == "log":
        config["verdict_log"] = os.path.join(folder, f"v{time.monotonic_ns()}.jsonl")
    gc.collect()
    cpu = time.process_time()
    with RewardAgent(reward, config) as agent:
        start = time.perf_counter()
        chunk = agent.get(agent.submit(items, group_size))
        elapsed = time.perf_counter() - start
        assert len(chunk) == len(items)
    cpu = time.process_time() - cpu  # every thread of the process, the log writer's included, until closed
    if mode == "log":  # closed: everything is written
        with open(config["verdict_log"], "rb") as f:
            logged = sum(1 for _ in f)
        assert logged == 1 + len(items), logged  # the agent's reward record, then one per sample
    return elapsed, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=20_000)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", default=str(RESULTS / "verdict_log_overhead.json"))
    args = parser.parse_args()
    if args.quick:
        args.samples, args.rounds = 800, 2
    out = Path(args.out)
    if args.quick:
        out = out.with_name(out.stem + "_quick.json")
    items = [{"solution_str": f"response {i}", "ground_truth": str(i % 10), "uid": i // args.group_size}
             for i in range(args.samples)]
    modes = ["off", "usage", "log"]
    times: dict[str, list[float]] = {m: [] for m in modes}
    cpus: dict[str, list[float]] = {m: [] for m in modes}
    with tempfile.TemporaryDirectory() as folder:
        for mode in modes:  # untimed warm-up
            one_run(mode, items[: args.group_size * 10], args.group_size, folder)
        for round_ in range(args.rounds):
            for mode in modes[round_ % 3:] + modes[: round_ % 3]:
                elapsed, cpu = one_run(mode, items, args.group_size, folder)
                times[mode].append(elapsed)
                cpus[mode].append(cpu)
    result = {
        "command": " ".join(["python", "bench/verdict_log_overhead.py", *sys.argv[1:]]),
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count(), "platform": platform.platform()},
        "samples": args.samples,
        "rounds": args.rounds,
        "scores_per_s": {
            m: {"median": float(np.median(args.samples / np.array(t))), "min": float(args.samples / max(t)),
                "max": float(args.samples / min(t))}
            for m, t in times.items()
        },
    }
    # CPU per sample is robust to other processes on the machine; wall throughput is what a caller sees.
    result["cpu_us_per_sample"] = {m: float(np.median(c)) / args.samples * 1e6 for m, c in cpus.items()}
    off = result["scores_per_s"]["off"]["median"]
    result["overhead_vs_off"] = {m: 1 - result["scores_per_s"][m]["median"] / off for m in ("usage", "log")}
    cpu_off = result["cpu_us_per_sample"]["off"]
    result["cpu_overhead_vs_off_us"] = {m: result["cpu_us_per_sample"][m] - cpu_off for m in ("usage", "log")}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    for m in modes:
        s = result["scores_per_s"][m]
        print(f"{m:>6}: {s['median']:>9,.0f} scores/s ({s['min']:,.0f}-{s['max']:,.0f}), "
              f"{result['cpu_us_per_sample'][m]:.1f} CPU us/sample")
    print("overhead vs off: " + ", ".join(f"{m} {v:.1%}" for m, v in result["overhead_vs_off"].items()))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
