"""Back-pressure against a real rate limiter (issue 11, item 13): the agent with its DEFAULT settings
(no requests_per_minute configured) against the loopback judge, through the real openai client.

1. A token bucket of 30 requests per 10 s (capacity 30, refill 3/s), refusing with 429 and
   Retry-After = the time until a token exists, as real APIs do. 200 samples.
   Reported: samples lost, goodput (accepted requests / the most the server could accept over the
   run), and the share of requests refused among those the agent sent after it had seen its first
   429 (the opening burst, already on its way, cannot be recalled; the server's own view, which
   counts it, is reported beside).
2. A 20 s storm of 429s (Retry-After 2 s) in the middle of a 400-sample run at cap 16: requests per
   Retry-After window during the storm (the first window also holds requests already on their way),
   and how soon after it the agent is back at its full cap.
Prints the figures and writes bench/results/backpressure.json:
    python bench/backpressure.py [--quick]
The test suite runs the same functions, smaller (tests/agent/test_rate_limited_judge.py).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import openai

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from verl_async_rm import RewardAgent  # noqa: E402
from verl_async_rm_rig.judge_server import JudgeServer, JudgeServerConfig  # noqa: E402
from verl_async_rm.user_rewards.llm_judge import JudgeReward  # noqa: E402

RESULTS = ROOT / "bench" / "results"


class SeenByTheAgent(JudgeReward):
    """JudgeReward that logs, per request, when the agent sent it, when its answer came back and
    whether it was a 429: the agent's side of the exchange, to set against the server's."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.log: list[tuple[float, float, bool]] = []  # (sent, answered, throttled)

    async def compute_score(self, *args, **kwargs):
        sent = time.monotonic()
        throttled = False
        try:
            return await super().compute_score(*args, **kwargs)
        except openai.RateLimitError:
            throttled = True
            raise
        finally:
            self.log.append((sent, time.monotonic(), throttled))


def judge_items(n: int) -> list[dict]:
    return [{"solution_str": f"#### {i % 3}", "ground_truth": str(i % 3)} for i in range(n)]


def token_bucket_run(samples: int = 200, capacity: int = 30, refill: float = 3.0, latency=(0.02, 0.1),
                     whole_seconds: bool = False) -> dict:
    config = JudgeServerConfig(bucket_capacity=capacity, bucket_refill_per_s=refill, latency=latency,
                               retry_after_whole_seconds=whole_seconds)
    with JudgeServer(config) as server:
        judge = SeenByTheAgent(base_url=server.base_url, api_key="k", model="m")
        with RewardAgent(judge) as agent:  # DEFAULT settings: no requests_per_minute
            started = time.monotonic()
            chunk = agent.get_all(agent.submit(judge_items(samples), 1), timeout=3 * samples / refill + 60)
            wall = time.monotonic() - started
            metrics = agent.metrics()
        stats = server.stats()
    ok = [r.arrived for r in stats.records if r.outcome == "ok"]
    first = min(r.arrived for r in stats.records)
    seen_at = min((answered for _, answered, throttled in judge.log if throttled), default=None)
    later = [throttled for sent, _, throttled in judge.log if seen_at is not None and sent > seen_at]
    return {
        "samples": samples,
        "server_limit": f"token bucket: capacity {capacity}, {refill:g}/s" + (" (Retry-After in whole seconds)" if whole_seconds else ""),
        "lost": int(sum(chunk.extra_info["reward_failed"])),
        "scores_right": chunk.scores == [1.0] * samples,
        "accepted": len(ok),
        "goodput": len(ok) / (capacity + refill * (ok[-1] - first)),
        "refused_after_the_agent_saw_a_429": (sum(later) / len(later)) if later else 0.0,
        "requests_sent_after_it": len(later),
        "refused_after_the_first_429_server_view": stats.throttled_share_after_first_throttle(),
        "learned_pace_per_s": metrics["pace_per_s"],  # the pace at the end (its curve probes above the rate)
        "learned_service_rate_per_s": metrics["service_rate_per_s"],  # the service's rate as measured
        "wall_s": wall,
        "ideal_s": (samples - capacity) / refill,
    }


def storm_run(samples: int = 400, cap: int = 16, latency: float = 0.5, storm_s: float = 20.0, retry_after: float = 2.0,
              lead_in: float = 3.0) -> dict:
    with JudgeServer(JudgeServerConfig(latency=latency)) as server:
        judge = JudgeReward(base_url=server.base_url, api_key="k", model="m")
        with RewardAgent(judge, {"max_concurrency": cap}) as agent:  # otherwise the defaults
            ticket = agent.submit(judge_items(samples), 1)
            storm_start, storm_end = server.start_storm(storm_s, retry_after_s=retry_after, delay_s=lead_in)
            chunk = agent.get_all(ticket, timeout=storm_s + 120)
        stats = server.stats()
    first_429 = min(r.arrived for r in stats.records if r.outcome == "storm")
    windows = stats.arrivals_per_window(first_429, storm_end, retry_after)
    reached_at = None
    for step in range(1, 101):  # when, after the storm, the cap was first full again
        if stats.peak_in_flight_between(storm_end, storm_end + step * 0.1) >= cap:
            reached_at = round(step * 0.1, 1)
            break
    return {
        "samples": samples,
        "cap": cap,
        "storm": f"{storm_s:g} s of 429 with Retry-After {retry_after:g} s, from {lead_in:g} s into the run",
        "lost": int(sum(chunk.extra_info["reward_failed"])),
        "requests_per_retry_after_window": windows,
        "full_cap_again_after_s": reached_at,
        "storm_started_before_first_429": storm_start <= first_429 < storm_end,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="60 samples, a 6 s storm")
    parser.add_argument("--out", default=str(RESULTS / "backpressure.json"))
    args = parser.parse_args()
    if args.quick:
        runs = {"token_bucket": token_bucket_run(60), "storm": storm_run(120, storm_s=6.0, lead_in=1.0)}
        args.out = args.out.replace(".json", "_quick.json")
    else:
        runs = {
            "token_bucket": token_bucket_run(),
            "token_bucket_whole_seconds": token_bucket_run(whole_seconds=True),
            "storm": storm_run(),
        }
    for name, figures in runs.items():
        print(f"{name}:")
        for key, value in figures.items():
            print(f"  {key:<42} {round(value, 3) if isinstance(value, float) else value}")
    report = {"command": " ".join(["python bench/backpressure.py", *sys.argv[1:]]), **runs}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())


def markdown(report: dict) -> str:
    """The back-pressure table of docs/results.md, from this benchmark's JSON."""
    rows = []
    for name in ("token_bucket", "token_bucket_whole_seconds"):
        r = report[name]
        rows.append(
            f"| {r['server_limit']}, {r['samples']} samples | {r['lost']} | {r['goodput']:.1%} | "
            f"{r['refused_after_the_agent_saw_a_429']:.1%} of {r['requests_sent_after_it']} "
            f"({r['refused_after_the_first_429_server_view']:.0%} counting the opening burst) | "
            f"{r['learned_pace_per_s']:.2f}/s | {r['wall_s']:.1f} s (ideal {r['ideal_s']:.1f} s) |"
        )
    storm = report["storm"]
    lines = [
        "| service | lost | goodput | refused once the agent had seen a 429 | learned pace | wall time |",
        "|---|---|---|---|---|---|",
        *rows,
        "",
        f"A storm ({storm['storm']}), {storm['samples']} samples at cap {storm['cap']}: {storm['lost']} lost; requests "
        f"per Retry-After window during it {storm['requests_per_retry_after_window']}; the full cap again "
        f"{storm['full_cap_again_after_s']} s after it.",
    ]
    return "\n".join(lines)
