"""Fault-injection suite: the agent against the loopback judge server, through the real openai client.

10,000 samples (groups of 8) by default. The server limits requests as real APIs do, with a token
bucket (capacity 100, 120 requests/s: 429 + Retry-After past it) that the agent must discover (its
own requests_per_minute, 9,000 = 150/s, is above it), and injects 5% 500, 2% hangs far longer than
the timeout, 1% malformed bodies and 1% spurious 429s. Prints the figures and writes
bench/results/fault_suite.json:
    python bench/fault_suite.py [--samples N] [--quick]
The test suite runs the same function and asserts on the figures (tests/test_fault_suite.py).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from verl_async_rm.user_rewards.llm_judge import JudgeReward  # noqa: E402
from verl_async_rm import RewardAgent  # noqa: E402
from verl_async_rm_rig.judge_server import JudgeServer, JudgeServerConfig  # noqa: E402
from verl_async_rm.limits import rate_bound  # noqa: E402

RESULTS = ROOT / "bench" / "results"


def expected_score(index: int) -> float:
    return 0.0 if index % 3 == 0 else 1.0


def make_items(samples: int, group_size: int) -> list[dict]:
    items = []
    for i in range(samples):
        truth = 100 + i
        answer = truth + 1 if expected_score(i) == 0.0 else truth
        items.append({"solution_str": f"so the result is #### {answer}", "ground_truth": str(truth), "uid": i // group_size})
    return items


def run_fault_suite(
    samples: int = 10_000,
    group_size: int = 8,
    cap: int = 64,
    requests_per_minute: float | None = 9_000,
    request_timeout: float = 1.0,
    ticket_deadline: float = 300.0,
    rates: dict | None = None,
    latency: tuple[float, float] = (0.0, 0.01),
    retry_after: float = 0.05,
    max_attempts: int = 6,
    bucket: tuple[int, float] = (100, 120.0),
    seed: int = 0,
    progress: bool = False,
) -> dict:
    rates = rates or {"rate_429": 0.01, "rate_500": 0.05, "rate_hang": 0.02, "rate_malformed": 0.01}
    server_config = JudgeServerConfig(latency=latency, retry_after_s=retry_after, hang_seconds=3600.0, seed=seed,
                                      bucket_capacity=bucket[0], bucket_refill_per_s=bucket[1], **rates)
    agent_config = {
        "max_concurrency": cap,
        "request_timeout": request_timeout,
        "ticket_deadline": ticket_deadline,
        "max_attempts": max_attempts,
        "backoff_initial": 0.02,
        "backoff_max": 1.0,
        "requests_per_minute": requests_per_minute,
    }
    items = make_items(samples, group_size)
    seen: Counter[int] = Counter()
    misaligned = flagged = 0
    failure_kinds: Counter[str] = Counter()
    with JudgeServer(server_config) as server:
        judge = JudgeReward(base_url=server.base_url, api_key="test", model="judge-stub", timeout=request_timeout * 4)
        with RewardAgent(judge, agent_config) as agent:
            start = time.perf_counter()
            ticket = agent.submit(items, group_size)
            while chunk := agent.get(ticket, group_size * 32, timeout=ticket_deadline + 30):
                for pos, index in enumerate(chunk.indices):
                    seen[index] += 1
                    if chunk.extra_info["reward_failed"][pos]:
                        flagged += 1
                        failure_kinds[chunk.extra_info["reward_failure"][pos]] += 1
                    elif chunk.scores[pos] != expected_score(index):
                        misaligned += 1
                if progress:
                    print(f"\r{sum(seen.values())}/{samples} samples", end="", file=sys.stderr, flush=True)
            wall = time.perf_counter() - start
            metrics = agent.metrics()
        stats = server.stats()
    if progress:
        print(file=sys.stderr)
    window_1s = stats.max_requests_in_window(1.0)
    window_10s = stats.max_requests_in_window(10.0)
    return {
        "samples": samples,
        "group_size": group_size,
        "returned": sum(seen.values()),
        "lost": samples - len(seen),
        "duplicated": sum(count - 1 for count in seen.values() if count > 1),
        "misaligned_scores": misaligned,
        "failed_samples_flagged": flagged,
        "failed_by_kind": dict(failure_kinds),
        "server_requests": stats.requests,
        "faults_injected": {k: v for k, v in stats.outcomes.items() if k != "ok" and v},
        "server_ok": stats.outcomes.get("ok", 0),
        "agent_completed": metrics["completed"],
        "agent_attempt_errors": metrics["attempt_errors_by_kind"],
        "retries": metrics["retries"],
        "throttled": metrics["throttled"],
        "cap": cap,
        "server_peak_concurrency": stats.peak_in_flight,
        "agent_peak_in_flight": metrics["peak_in_flight"],
        "requests_per_minute_limit": requests_per_minute,
        "max_requests_in_1s": window_1s,
        "bound_1s": rate_bound(requests_per_minute, 1.0) if requests_per_minute else None,
        "max_requests_in_10s": window_10s,
        "bound_10s": rate_bound(requests_per_minute, 10.0) if requests_per_minute else None,
        "ticket_deadline_s": ticket_deadline,
        "wall_s": wall,
        "latency_p50_s": metrics["latency_p50"],
        "latency_p95_s": metrics["latency_p95"],
        "latency_max_s": metrics["latency_max"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=10_000)
    parser.add_argument("--cap", type=int, default=64)
    parser.add_argument("--rpm", type=float, default=9_000)
    parser.add_argument("--quick", action="store_true", help="1,000 samples")
    parser.add_argument("--out", default=str(RESULTS / "fault_suite.json"))
    args = parser.parse_args()
    if args.quick:
        args.samples = 1_000
        args.out = args.out.replace(".json", "_quick.json")
    figures = run_fault_suite(samples=args.samples, cap=args.cap, requests_per_minute=args.rpm, progress=True)
    figures["command"] = " ".join(["bench/fault_suite.py", *sys.argv[1:]])
    width = max(map(len, figures))
    for key, value in figures.items():
        shown = f"{value:.3f}" if isinstance(value, float) and not math.isnan(value) else value
        print(f"{key:<{width}}  {shown}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(figures, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()


def markdown(figures: dict) -> str:
    """The README's fault-suite table, from this benchmark's JSON."""
    server, agent = figures["faults_injected"], figures["agent_attempt_errors"]
    faults = ", ".join(f"{count:,}x {kind}" for kind, count in sorted(server.items(), key=lambda kv: -kv[1]))
    errors = ", ".join(f"{count:,} {kind}" for kind, count in sorted(agent.items(), key=lambda kv: -kv[1]))
    rows = [
        ("samples returned / lost / duplicated / misaligned scores",
         f"{figures['returned']:,} / {figures['lost']} / {figures['duplicated']} / {figures['misaligned_scores']}"),
        ("server requests; what it answered besides a score", f"{figures['server_requests']:,}; {faults}"),
        ("agent attempt errors (equal to the server's, kind by kind; `http_429` = `429` + `rate_limited`)", errors),
        ("retries; samples still failed after retries", f"{figures['retries']:,}; {figures['failed_samples_flagged']}"),
        ("peak concurrency at the server vs cap", f"{figures['server_peak_concurrency']} vs {figures['cap']}"),
        ("most requests in any 1 s / 10 s window vs the agent's own limiter's bound",
         f"{figures['max_requests_in_1s']:,} vs {figures['bound_1s']:,} / {figures['max_requests_in_10s']:,} vs {figures['bound_10s']:,}"),
        ("wall time", f"{figures['wall_s']:.0f} s (deadline {figures['ticket_deadline_s']:.0f} s)"),
    ]
    return "\n".join(["| figure | value |", "|---|---|", *(f"| {a} | {b} |" for a, b in rows)])
