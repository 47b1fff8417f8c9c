"""Fault-injection suite: the agent against the loopback judge server, through the real openai client.

10,000 samples (groups of 8) by default. The server limits requests as real APIs do, with a token
bucket (capacity 100, 120 requests/s: 429 + Retry-After past it) that the agent must discover (its
own requests_per_minute, 9,000 = 150/s, is above it), and injects 5% 500, 2% hangs far longer than
the timeout, 1% malformed bodies and 1% spurious 429s. Prints the figures and writes
bench/results/fault_suite.json.

Judge-operations faults, each written to its own bench/results/fault_suite_<name>.json:
- verdict-log-resume: ``verl-async-rm score`` with a group judge (one HTTP call per group) SIGKILLed
  twice mid-run, each time resumed from its verdict log, then completed: every row scored exactly
  once and right, no group the log held judged again, no run hung.
- limiter-killed: two jobs sharing limits (``shared_limits``, a local Ray) score against the loopback
  judge while the limiter actor is killed several times mid-run; each job must find a re-created
  limiter and lose, duplicate or hang nothing.
- budget: 2,000 requests submitted at once (max_concurrency 2,000) against a token budget they cannot
  all fit, the judge reporting the worst usage a byte-level tokenizer can give each prompt; the
  charged total must stay within the budget plus one request's true cost (one run per budget).

    python bench/fault_suite.py [--fault all|agent|verdict-log-resume|limiter-killed|budget] [--samples N] [--quick]
The test suite runs the same functions and asserts on the figures (tests/judge_ops/test_fault_suite.py).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from verl_async_rm import RewardAgent  # noqa: E402
from verl_async_rm.limits import rate_bound  # noqa: E402
from verl_async_rm.user_rewards import group_judge  # noqa: E402
from verl_async_rm.user_rewards.llm_judge import JudgeReward  # noqa: E402
from verl_async_rm.verdict_log import read_log  # noqa: E402
from verl_async_rm_rig.judge_server import JudgeServer, JudgeServerConfig, default_judge, group_prompt  # noqa: E402

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


def _group_rows(groups: int, group_size: int) -> list[dict]:
    """Group g answers "reference 1000 + g"; a member is right unless its index is a multiple of 3."""
    rows = []
    for i in range(groups * group_size):
        truth = 1000 + i // group_size
        answer = truth if expected_score(i) == 1.0 else truth + 1
        rows.append({"solution_str": f"so the result is #### {answer}", "ground_truth": str(truth), "uid": i // group_size,
                     "extra_info": {"row": i}})
    return rows


def _settled_groups(log: Path, group_size: int) -> set[str]:
    """References of the groups whose every member the log holds a verdict for."""
    members: Counter[str] = Counter()
    seen: set[tuple[str, str]] = set()
    for record in read_log(log).records:
        request = (record["uid"], record.get("request", record["key"]))
        if record.get("failure") is None and record.get("stage") is None and request not in seen:
            seen.add(request)
            members[str(1000 + int(record["uid"]))] += 1
    return {group for group, count in members.items() if count >= group_size}


def run_verdict_log_resume_fault(
    groups: int = 96,
    group_size: int = 4,
    kill_after: tuple[int, ...] = (24, 56),
    latency: tuple[float, float] = (0.05, 0.1),
    rate_500: float = 0.05,
    timeout_s: float = 180.0,
) -> dict:
    """``verl-async-rm score`` with a group judge, SIGKILLed once ``kill_after[k]`` groups are in its
    verdict log (each kill hits a run resumed from the kills before), then resumed to the end. The
    server records which group every judged call was for: a group judged by a run that started with
    all its members in the log is *duplicated* (paid twice); a row the final output lacks, or scores
    wrongly, is *lost*; a run that does not end within ``timeout_s`` is *hung*."""
    rows = _group_rows(groups, group_size)
    judged: list[tuple[int, str]] = []  # (run, the group's reference) per call the judge answered
    run = 0

    def recording_judge(messages: list[dict]) -> str:
        judged.append((run, group_prompt(messages)[0].strip()))
        return default_judge(messages)

    hung = killed = 0
    duplicated_calls = 0
    runs = []
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="fault_vlog_") as folder, \
            JudgeServer(JudgeServerConfig(latency=latency, rate_500=rate_500, seed=7, judge=recording_judge)) as server:
        folder = Path(folder)
        (folder / "in.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        out, log = folder / "out.jsonl", folder / "out.jsonl.verdicts.jsonl"
        command = [sys.executable, "-m", "verl_async_rm", "score", "--input", str(folder / "in.jsonl"),
                   "--reward-file", group_judge.__file__, "--reward-name", "GroupJudgeReward", "--group-size", str(group_size),
                   "--kwarg", f"base_url={server.base_url}", "--kwarg", "model=judge-stub", "--kwarg", "api_key=k",
                   "--set", "max_concurrency=4", "--set", "max_attempts=8", "--set", "backoff_initial=0.02",
                   "--set", "verdict_log_fsync_s=0", "--output", str(out)]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
        for run, stop_at in enumerate([*kill_after, None]):
            held = _settled_groups(log, group_size) if log.exists() else set()
            errors = folder / f"stderr{run}.txt"  # a file, not a pipe: progress bars must not fill a pipe and stall the run
            with errors.open("wb") as stderr:
                process = subprocess.Popen(command + (["--resume"] if run else []), stdout=subprocess.DEVNULL,
                                           stderr=stderr, env=env)
            began = time.monotonic()
            try:
                while process.poll() is None and time.monotonic() - began < timeout_s:
                    if stop_at is not None and log.exists() and len(_settled_groups(log, group_size)) >= stop_at:
                        process.send_signal(signal.SIGKILL)
                        killed += 1
                        break
                    time.sleep(0.01)
                code = process.wait(timeout=max(1.0, timeout_s - (time.monotonic() - began)))
            except subprocess.TimeoutExpired:
                hung += 1
                process.kill()
                code = process.wait()
            this_run = [group for r, group in judged if r == run]
            duplicated_calls += sum(1 for group in this_run if group in held)
            runs.append({"run": run, "resumed": bool(run), "killed": code == -signal.SIGKILL, "exit_code": code,
                         "groups_in_log_at_start": len(held), "group_calls_judged": len(this_run),
                         "wall_s": time.monotonic() - began,
                         "stderr_tail": errors.read_text(errors="replace")[-300:] if code not in (0, -signal.SIGKILL) else ""})
        final = [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []
        stats = server.stats()
    scored = [r for r in final if r.get("score") is not None]
    seen = Counter(r["extra_info"]["row"] for r in scored)
    lost = len(rows) - len(seen)
    wrong = sum(1 for r in scored if r["score"] != expected_score(r["extra_info"]["row"]))
    return {
        "fault": "verdict-log-resume",
        "samples": len(rows),
        "groups": groups,
        "group_size": group_size,
        "kills": killed,
        "kill_after_groups_logged": list(kill_after),
        "returned": len(scored),
        "lost": lost,
        "duplicated": sum(count - 1 for count in seen.values() if count > 1),
        "misaligned_scores": wrong,
        "duplicated_group_calls": duplicated_calls,  # groups judged again although the log held all their verdicts
        "hung": hung,
        "final_exit_code": runs[-1]["exit_code"],
        "group_calls_judged": len(judged),
        "group_calls_needed": groups,
        "group_calls_lost_to_kills": len(judged) - len({group for _, group in judged}),  # answered, not yet logged
        "server_requests": stats.requests,
        "faults_injected": {k: v for k, v in stats.outcomes.items() if k != "ok" and v},
        "runs": runs,
        "wall_s": time.perf_counter() - start,
    }


def _collect(agent, ticket: str, chunk: int, timeout: float, seen: Counter) -> tuple[int, int, BaseException | None]:
    """Reads ``ticket`` to its end into ``seen``: (misaligned scores, flagged failures, the error that
    ended it, if any). A ``get`` that times out is a hang: returned as the error."""
    misaligned = flagged = 0
    try:
        while result := agent.get(ticket, chunk, timeout=timeout):
            for pos, index in enumerate(result.indices):
                seen[index] += 1
                if result.extra_info["reward_failed"][pos]:
                    flagged += 1
                elif result.scores[pos] != expected_score(index):
                    misaligned += 1
    except Exception as exc:  # noqa: BLE001 - the figures say what ended it (TimeoutError: hung)
        return misaligned, flagged, exc
    return misaligned, flagged, None


def run_limiter_killed(
    samples_per_job: int = 1_500,
    jobs: int = 2,
    cap: int = 16,
    kills: int = 3,
    kill_every_s: float = 1.0,
    latency: tuple[float, float] = (0.01, 0.05),
    ticket_deadline: float = 300.0,
    seed: int = 0,
) -> dict:
    """Jobs sharing one endpoint's limits while its limiter actor is killed ``kills`` times mid-run."""
    import secrets
    import threading

    import ray

    from verl_async_rm.shared_limits import ACTOR_PREFIX

    started_ray = not ray.is_initialized()
    if started_ray:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, namespace="fault_suite")
    endpoint = f"fault-suite-{secrets.token_hex(4)}"
    namespace = "verl_async_rm"

    def limiter():
        try:
            return ray.get_actor(ACTOR_PREFIX + endpoint, namespace=namespace)
        except ValueError:
            return None

    config = {"max_concurrency": cap, "request_timeout": 10.0, "ticket_deadline": ticket_deadline,
              "shared_limits": {"endpoint": endpoint, "heartbeat_s": 0.1}}
    items = [make_items(samples_per_job, 1) for _ in range(jobs)]
    seen = [Counter() for _ in range(jobs)]
    results: list = [None] * jobs
    killed_at, recovered_after = [], []
    try:
        with JudgeServer(JudgeServerConfig(latency=latency, seed=seed)) as server:
            agents = [RewardAgent(JudgeReward(base_url=server.base_url, api_key="test", model="judge-stub", timeout=30),
                                  config) for _ in range(jobs)]
            try:
                start = time.perf_counter()
                tickets = [agent.submit(batch, 1) for agent, batch in zip(agents, items)]
                readers = [threading.Thread(target=lambda j=j: results.__setitem__(
                    j, _collect(agents[j], tickets[j], 64, ticket_deadline + 30, seen[j]))) for j in range(jobs)]
                for reader in readers:
                    reader.start()
                for kill in range(1, kills + 1):
                    time.sleep(kill_every_s)  # each kill hits a limiter every job is registered with
                    victim = limiter()
                    if victim is None:
                        continue
                    ray.kill(victim)
                    killed = time.perf_counter()
                    killed_at.append(killed - start)
                    while min(agent.metrics()["shared_reattached"] for agent in agents) < kill:
                        if time.perf_counter() - killed > 60:
                            break
                        time.sleep(0.02)
                    recovered_after.append(time.perf_counter() - killed)
                for reader in readers:
                    reader.join()
                wall = time.perf_counter() - start
                metrics = [agent.metrics() for agent in agents]
            finally:
                for agent in agents:
                    agent.close()
            stats = server.stats()
        survivor = limiter()
        if survivor is not None:
            ray.kill(survivor)
    finally:
        if started_ray:
            ray.shutdown()
    samples = samples_per_job * jobs
    errors = [None if r is None or r[2] is None else f"{type(r[2]).__name__}: {r[2]}" for r in results]
    return {
        "fault": "limiter-killed",
        "jobs": jobs,
        "samples": samples,
        "returned": sum(sum(c.values()) for c in seen),
        "lost": samples - sum(len(c) for c in seen),
        "duplicated": sum(count - 1 for c in seen for count in c.values() if count > 1),
        "hung": sum(samples_per_job - len(c) for c, e in zip(seen, errors) if e and e.startswith("TimeoutError")),
        "misaligned_scores": sum(r[0] for r in results if r is not None),
        "failed_samples_flagged": sum(r[1] for r in results if r is not None),
        "ticket_errors": errors,
        "kills": len(killed_at),
        "killed_at_s": killed_at,
        "every_job_registered_again_after_s": recovered_after,
        "shared_reattached": [m["shared_reattached"] for m in metrics],
        "shared_local_fallbacks": [m["shared_local_fallbacks"] for m in metrics],
        "cap": cap,
        "server_peak_concurrency": stats.peak_in_flight,
        "server_requests": stats.requests,
        "ticket_deadline_s": ticket_deadline,
        "wall_s": wall,
    }


def run_budget(
    samples: int = 2_000,
    concurrency: int = 2_000,
    token_budget: int = 60_000,
    reserve_output_tokens: int = 8,
    latency: tuple[float, float] = (0.0, 0.05),
    ticket_deadline: float = 300.0,
    seed: int = 0,
) -> dict:
    """``samples`` requests submitted at once, ``concurrency`` allowed in flight, against a budget near
    or below what they cost. The judge reports each prompt's worst case for a byte-level tokenizer
    (a token per UTF-8 byte, plus OpenAI's 3 per message and 3 to prime the reply): the largest usage
    the shipped judge's estimate is meant to cover."""
    import threading

    from verl_async_rm.errors import BudgetExceeded

    costs: list[int] = []
    lock = threading.Lock()

    def worst_case_usage(messages: list[dict], reply: str) -> tuple[int, int]:
        prompt = sum(len(str(m.get("content", "")).encode()) + 3 for m in messages) + 3
        completion = min(reserve_output_tokens, max(1, len(reply.split())))
        with lock:
            costs.append(prompt + completion)
        return prompt, completion

    # Responses of varied length, some in a script of 3 bytes a character (a byte-level tokenizer's
    # worst case is in bytes, not characters).
    items = make_items(samples, 1)
    for i, item in enumerate(items):
        item["solution_str"] = ("推理 " * (i % 11)) + ("step " * (i % 5)) + item["solution_str"]
    config = {"max_concurrency": concurrency, "token_budget": token_budget, "reserve_output_tokens": reserve_output_tokens,
              "request_timeout": 60.0, "ticket_deadline": ticket_deadline}
    seen: Counter[int] = Counter()
    with JudgeServer(JudgeServerConfig(latency=latency, seed=seed, usage=worst_case_usage)) as server:
        judge = JudgeReward(base_url=server.base_url, api_key="test", model="judge-stub", timeout=120)
        with RewardAgent(judge, config) as agent:
            start = time.perf_counter()
            ticket = agent.submit(items, 1)
            misaligned, flagged, error = _collect(agent, ticket, 1, ticket_deadline + 30, seen)
            wall = time.perf_counter() - start
            metrics = agent.metrics()
        stats = server.stats()
    charged = metrics["input_tokens"] + metrics["output_tokens"] + metrics["estimated_input_tokens"] + metrics["estimated_output_tokens"]
    refused = metrics["failures_by_kind"].get("budget", 0)
    largest = max(costs, default=0)
    return {
        "fault": "budget",
        "samples": samples,
        "max_concurrency": concurrency,
        "token_budget": token_budget,
        "reserve_output_tokens": reserve_output_tokens,
        "returned": sum(seen.values()),
        "refused_by_budget": refused,
        "lost": samples - len(seen) - refused,
        "duplicated": sum(count - 1 for count in seen.values() if count > 1),
        "hung": 0 if not isinstance(error, TimeoutError) else samples - len(seen) - refused,
        "misaligned_scores": misaligned,
        "failed_samples_flagged": flagged,
        "stopped_by": f"{type(error).__name__}: {error}" if error is not None else None,
        "stopped_by_budget": isinstance(error, BudgetExceeded),
        "charged_tokens": charged,
        "judge_reported_tokens": sum(costs),
        "largest_request_true_cost": largest,
        "crossed_by": max(0, charged - token_budget),
        "within_budget_plus_one_request": charged <= token_budget + largest,
        "budget_overruns": metrics["budget_overruns"],
        "agent_peak_in_flight": metrics["peak_in_flight"],
        "server_peak_concurrency": stats.peak_in_flight,
        "server_requests": stats.requests,
        "ticket_deadline_s": ticket_deadline,
        "wall_s": wall,
    }


def _print(figures: dict) -> None:
    width = max(map(len, figures))
    for key, value in figures.items():
        shown = f"{value:.3f}" if isinstance(value, float) and not math.isnan(value) else value
        print(f"{key:<{width}}  {shown}")


def _show_and_write(figures: dict, out: str) -> None:
    """Print a fault's figures (each run's, for a fault of several runs) and write them as JSON to ``out``."""
    several = set(figures) <= {"runs", "command"}  # a fault of several runs (budget: one per budget)
    for run in figures["runs"] if several else [figures]:
        _print(run)
        print()
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(figures, indent=2))
    print(f"wrote {out}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fault", choices=["all", "agent", "verdict-log-resume", "limiter-killed", "budget"],
                        default="all", help="run one fault alone (each writes its own JSON; agent: the HTTP faults)")
    parser.add_argument("--samples", type=int, default=10_000)
    parser.add_argument("--cap", type=int, default=64)
    parser.add_argument("--rpm", type=float, default=9_000)
    parser.add_argument("--quick", action="store_true", help="1,000 samples")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    command = " ".join(["bench/fault_suite.py", *sys.argv[1:]])
    quick = "_quick" if args.quick else ""
    if args.fault in ("all", "agent"):
        if args.quick:
            args.samples = 1_000
        figures = run_fault_suite(samples=args.samples, cap=args.cap, requests_per_minute=args.rpm, progress=True)
        figures["command"] = command
        out = args.out or str(RESULTS / "fault_suite.json")
        _show_and_write(figures, out.replace(".json", "_quick.json") if args.quick else out)
    if args.fault in ("all", "verdict-log-resume"):
        figures = run_verdict_log_resume_fault(**({"groups": 32, "kill_after": (8, 16)} if args.quick else {}))
        figures["command"] = command
        _show_and_write(figures, str(RESULTS / f"fault_suite_verdict_log_resume{quick}.json"))
    if args.fault in ("all", "limiter-killed"):
        figures = run_limiter_killed()
        figures["command"] = command
        _show_and_write(figures, str(RESULTS / f"fault_suite_limiter_killed{quick}.json"))
    if args.fault in ("all", "budget"):
        figures = {"runs": [run_budget(token_budget=budget) for budget in (60_000, 400_000)], "command": command}
        _show_and_write(figures, str(RESULTS / f"fault_suite_budget{quick}.json"))


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
