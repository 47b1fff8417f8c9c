"""Judge fallback under an outage: two loopback judges (a "hosted" one first, a "selfhosted" one
second), the hosted one down (every request answered 500 at once) for a while mid-run. The agent
scores a few thousand samples through the real openai client with ``judges`` set; the run must lose
no sample, score none twice, and log the switch to the second judge and the return to the first.

Figures (bench/results/fallback.json, with the command that made them):
- lost: samples with no score (failed, or missing from the result); duplicated: samples the verdict
  log recorded more than once, and the judges' "ok" answers beyond one per sample;
- per judge: requests sent, samples scored, failures, the servers' own counts of what they answered;
- when the outage began and ended, and when the agent logged the switch and the return (seconds
  from the submit).

    python bench/fallback_run.py [--samples 3000] [--outage-at 2.0] [--outage-for 3.0] [--out bench/results/fallback.json]

tests/judge_ops/test_fallback_bench.py checks the report logic on made-up figures.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "rig"))

RESULTS = ROOT / "bench" / "results"
JUDGES = ("hosted", "selfhosted")


def expected_score(index: int) -> float:
    return 1.0 if index % 5 == index % 3 else 0.0


def make_items(samples: int) -> list[dict]:
    return [{"solution_str": f"the answer is {i % 5}", "ground_truth": str(i % 3)} for i in range(samples)]


class EventLog(logging.Handler):
    """The fallback's switch and return lines, with their time."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.events: list[tuple[float, str, str]] = []  # (monotonic time, judge, "down"|"up")

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        for judge in JUDGES:
            if f"judge {judge!r} is down" in message:
                self.events.append((time.monotonic(), judge, "down"))
            elif f"judge {judge!r} is back" in message:
                self.events.append((time.monotonic(), judge, "up"))


def summarize(*, samples: int, scores: list, failed_flags: list, log_samples: list[str], served_ok: dict[str, int],
              served: dict[str, dict], metrics: dict, events: list[tuple[float, str, str]], started: float,
              outage: tuple[float, float], elapsed: float) -> dict:
    """The run's figures from what it observed (pure: tested on made-up data)."""
    wrong = sum(1 for i, score in enumerate(scores) if score != expected_score(i))
    lost = (samples - len(scores)) + sum(1 for flag in failed_flags if flag)
    logged = Counter(log_samples)
    duplicated_in_log = sum(count - 1 for count in logged.values() if count > 1)
    ok_total = sum(served_ok.values())
    per_judge = {
        name: {
            "requests": metrics.get(f"judge/{name}/requests", 0),
            "scored": metrics.get(f"judge/{name}/scored", 0),
            "failures": metrics.get(f"judge/{name}/failures", 0),
            "switches": metrics.get(f"judge/{name}/switches", 0),
            "returns": metrics.get(f"judge/{name}/returns", 0),
            "server_answers": served.get(name, {}),
        }
        for name in JUDGES
    }
    return {
        "samples": samples,
        "lost": lost,
        "wrong_scores": wrong,
        "duplicated_in_verdict_log": duplicated_in_log,
        "duplicated_ok_answers": max(0, ok_total - samples),
        "logged_samples": len(logged),
        "scored_per_judge_sum": sum(judge["scored"] for judge in per_judge.values()),
        "per_judge": per_judge,
        "outage_s": [round(outage[0] - started, 3), round(outage[1] - started, 3)],
        "events": [{"t_s": round(t - started, 3), "judge": judge, "event": event} for t, judge, event in events],
        "elapsed_s": round(elapsed, 3),
        "samples_per_s": round(samples / elapsed, 1) if elapsed > 0 else None,
    }


def run(samples: int = 3000, outage_at: float = 2.0, outage_for: float = 3.0, concurrency: int = 32) -> dict:
    from verl_async_rm import RewardAgent
    from verl_async_rm.user_rewards.llm_judge import JudgeReward
    from verl_async_rm.verdict_log import read_log
    from verl_async_rm_rig.judge_server import JudgeServer, JudgeServerConfig

    handler = EventLog()
    logger = logging.getLogger("verl_async_rm.engine.fallback")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    with tempfile.TemporaryDirectory() as folder, \
            JudgeServer(JudgeServerConfig(latency=(0.02, 0.08), seed=0)) as hosted, \
            JudgeServer(JudgeServerConfig(latency=(0.05, 0.15), seed=1)) as selfhosted:
        log = Path(folder) / "verdicts.jsonl"
        config = {
            "max_concurrency": concurrency, "max_attempts": 3, "backoff_initial": 0.05, "backoff_max": 0.5,
            "failure_policy": "fill", "fill_value": -1.0, "verdict_log": str(log),
            "judges": [
                {"name": "hosted", "kwargs": {"base_url": hosted.base_url}, "failure_window": 20, "retry_after_s": 1.0},
                {"name": "selfhosted", "kwargs": {"base_url": selfhosted.base_url}},
            ],
        }
        with RewardAgent(JudgeReward, config, reward_kwargs={"model": "judge-stub", "base_url": hosted.base_url}) as agent:
            started = time.monotonic()
            outage = hosted.start_outage(outage_for, delay_s=outage_at)
            chunk = agent.get(agent.submit(make_items(samples)), timeout=600)
            elapsed = time.monotonic() - started
            metrics = agent.metrics()
        stats = {"hosted": hosted.stats(), "selfhosted": selfhosted.stats()}
        records = read_log(str(log)).records
    logger.removeHandler(handler)
    served = {name: {k: v for k, v in s.outcomes.items() if v} for name, s in stats.items()}
    return summarize(
        samples=samples, scores=list(chunk.scores), failed_flags=list(chunk.extra_info["reward_failed"]),
        log_samples=[r["sample"] for r in records], served_ok={n: s.outcomes["ok"] for n, s in stats.items()},
        served=served, metrics=metrics, events=handler.events, started=started, outage=outage, elapsed=elapsed,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=3000)
    parser.add_argument("--outage-at", type=float, default=2.0, help="seconds after the submit")
    parser.add_argument("--outage-for", type=float, default=3.0, help="seconds")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--out", default=str(RESULTS / "fallback.json"))
    args = parser.parse_args()
    figures = run(args.samples, args.outage_at, args.outage_for, args.concurrency)
    figures["command"] = " ".join(["python", "bench/fallback_run.py", *sys.argv[1:]])
    print(json.dumps(figures, indent=2))
    Path(args.out).write_text(json.dumps(figures, indent=2) + "\n")


if __name__ == "__main__":
    main()
