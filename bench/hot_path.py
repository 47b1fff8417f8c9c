"""The engine's hot path at scale (issue 45, items 4 and 8), each measurement in a fresh process:

1. **Memory** (item 4): 10 tickets of 100,000 samples (groups of 8), drained by ``get(ticket, 512)``,
   at the DEFAULT settings (``request_timeout`` 120 s: a ticket drains in a few seconds, so every
   finished request used to stay until its timeout was due), zero-latency rewards, sync and async.
   Per ticket: the process's peak RSS so far (``ru_maxrss``: what the machine must provide; it
   grows with every ticket while finished requests are kept) and its RSS after the ticket (what
   the allocator kept of that peak). Target: flat, the peak after every later ticket within 10% of
   the peak during the first.
2. **Deadline over a backlog** (item 8): a 2 s ``ticket_deadline`` over 10k / 20k / 40k samples
   queued behind a reward that never answers (cap 64, groups of one: the issue's set-up): seconds
   from the ``submit`` call until ``get_all`` returns every sample (the submit call's own seconds
   beside: checking and recording 40k samples, before and while the deadline starts; the machine's
   load average with each run). Target: deadline + 0.5 s at 40k.

``--base REV`` measures a checkout of REV the same way, in alternation with this tree (the machine
is shared: alternating puts both under the same load), for the before/after in one JSON; its
memory over 3 tickets only (``--base-tickets``): a revision that keeps every finished request
would need ~2 GB for 10 on a machine shared with others.
    python bench/hot_path.py --base 3e8ce97       # the revision before the fixes
    python bench/hot_path.py --quick              # small sizes: checks it runs
Writes bench/results/hot_path.json (hot_path_quick.json with --quick).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
RSS_FLAT_WITHIN = 0.10
DEADLINE_S = 2.0
DEADLINE_SLACK_S = 0.5

MEMORY = r'''
import json, resource, sys
sys.path.insert(0, REPO)
import psutil
from verl_async_rm import RewardAgent

def zero_sync(data_source, solution_str, ground_truth, extra_info=None):
    return 1.0

async def zero_async(data_source, solution_str, ground_truth, extra_info=None):
    return 1.0

process = psutil.Process()
after, peak = [], []
with RewardAgent(zero_sync if KIND == "sync" else zero_async) as agent:  # the default settings
    idle = process.memory_info().rss
    for _ in range(TICKETS):
        items = [{"solution_str": f"response {i}", "ground_truth": "x", "data_source": "bench", "uid": i // 8,
                  "extra_info": {"i": i}} for i in range(SIZE)]
        ticket = agent.submit(items, 8)
        got = 0
        while chunk := agent.get(ticket, 512):
            got += len(chunk)
        assert got == SIZE
        del items, chunk
        after.append(process.memory_info().rss)
        peak.append(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
print(json.dumps({"idle_mb": idle / 2**20, "after_each_ticket_mb": [rss / 2**20 for rss in after],
                  "peak_after_each_ticket_mb": [rss / 2**20 for rss in peak]}))
'''

DEADLINE = r'''
import asyncio, json, sys, time
sys.path.insert(0, REPO)
from verl_async_rm import RewardAgent

async def never_answers(data_source, solution_str, ground_truth, extra_info=None):
    await asyncio.sleep(3600)

config = {"max_concurrency": 64, "ticket_deadline": DEADLINE_S, "request_timeout": DEADLINE_S, "max_failure_rate": 1.0}
with RewardAgent(never_answers, config) as agent:
    items = [{"solution_str": "x", "uid": i, "extra_info": {"i": i}} for i in range(QUEUED)]
    started = time.monotonic()
    ticket = agent.submit(items, 1)
    submitted = time.monotonic()
    chunk = agent.get_all(ticket, timeout=120)
    returned = time.monotonic()
assert len(chunk) == QUEUED and set(chunk.extra_info["reward_failure"]) == {"deadline"}
print(json.dumps({"returned_after_s": returned - started, "submit_call_s": submitted - started}))
'''


def run(code: str, repo: str, **names) -> dict:
    header = "".join(f"{name}={value!r}\n" for name, value in {"REPO": repo, **names}.items())
    out = subprocess.run([sys.executable, "-c", header + code], capture_output=True, text=True, cwd=tempfile.gettempdir(),
                         timeout=900)
    if out.returncode != 0:
        raise RuntimeError(f"measurement failed: {out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def memory(repo: str, kind: str, tickets: int, size: int) -> dict:
    load = os.getloadavg()[0]
    figures = run(MEMORY, repo, KIND=kind, TICKETS=tickets, SIZE=size)
    peak = figures["peak_after_each_ticket_mb"]
    return {
        "reward": kind,
        "idle_mb": round(figures["idle_mb"], 1),
        "peak_after_each_ticket_mb": [round(mb, 1) for mb in peak],
        "after_each_ticket_mb": [round(mb, 1) for mb in figures["after_each_ticket_mb"]],
        "peak_last_over_first": round(peak[-1] / peak[0], 3),
        "flat_within_10_percent": peak[-1] <= (1 + RSS_FLAT_WITHIN) * peak[0],
        "load_average_1min": round(load, 1),
    }


def deadline(repo: str, queued: int) -> dict:
    load = os.getloadavg()[0]
    figures = run(DEADLINE, repo, QUEUED=queued, DEADLINE_S=DEADLINE_S)
    return {"queued": queued, "returned_after_s": round(figures["returned_after_s"], 3),
            "submit_call_s": round(figures["submit_call_s"], 3), "load_average_1min": round(load, 1)}


def measure(repos: dict[str, str], quick: bool, rounds: int, base_tickets: int) -> dict:
    tickets, size = (3, 10_000) if quick else (10, 100_000)
    sizes = (2_000, 4_000) if quick else (10_000, 20_000, 40_000)
    out: dict = {"memory": {name: [] for name in repos}, "deadline": {name: [] for name in repos}}
    for _ in range(rounds):
        for name, repo in repos.items():  # alternating: both sides under the same machine load
            for kind in ("async", "sync"):
                figures = memory(repo, kind, min(tickets, base_tickets) if name == "base" else tickets, size)
                out["memory"][name].append(figures)
                print(f"[{name}] memory, {kind} reward: peak RSS after each ticket {figures['peak_after_each_ticket_mb']} MB "
                      f"(last / first {figures['peak_last_over_first']}); RSS after each ticket "
                      f"{figures['after_each_ticket_mb']} MB", flush=True)
            for queued in sizes:
                figures = deadline(repo, queued)
                out["deadline"][name].append(figures)
                print(f"[{name}] deadline {DEADLINE_S} s over {queued:,} queued: returned after "
                      f"{figures['returned_after_s']} s (submit call {figures['submit_call_s']} s; load "
                      f"{figures['load_average_1min']})", flush=True)
    return out


def summary(results: dict) -> dict:
    out = {}
    for name, runs in results["memory"].items():
        out[f"{name}_memory_flat_within_10_percent"] = all(run["flat_within_10_percent"] for run in runs)
        out[f"{name}_memory_peak_last_over_first"] = max(run["peak_last_over_first"] for run in runs)
    for name, runs in results["deadline"].items():
        by_size: dict[int, list[float]] = {}
        for run in runs:
            by_size.setdefault(run["queued"], []).append(run["returned_after_s"])
        out[f"{name}_deadline_returned_after_s"] = {
            str(size): {"median": round(statistics.median(times), 3), "max": round(max(times), 3)}
            for size, times in sorted(by_size.items())}
        largest = max(by_size)
        out[f"{name}_deadline_within_{DEADLINE_SLACK_S}_s_at_{largest}"] = max(by_size[largest]) <= DEADLINE_S + DEADLINE_SLACK_S
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", default=None, help="also measure this revision (in a temporary worktree)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--base-tickets", type=int, default=3, help="tickets of the base's memory runs")
    parser.add_argument("--quick", action="store_true", help="3 tickets of 10k, deadlines over 2k / 4k")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    out = Path(args.out or RESULTS / "hot_path.json")
    if args.quick:
        out = out.with_name(out.stem + "_quick.json")
    repos = {"this_tree": str(ROOT)}
    base = None
    if args.base:
        base = tempfile.mkdtemp(prefix="hot_path_base_")
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "-f", "--detach", base, args.base], check=True,
                       capture_output=True)
        repos = {"base": base, **repos}
    try:
        results = measure(repos, args.quick, 1 if args.quick else args.rounds, args.base_tickets)
    finally:
        if base is not None:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", base], capture_output=True)
    report = {
        "command": " ".join(["python bench/hot_path.py", *sys.argv[1:]]),
        "base": args.base,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "load_average_at_end": os.getloadavg()},
        "targets": {"rss_flat_within": RSS_FLAT_WITHIN, "deadline_s": DEADLINE_S, "returned_within_s": DEADLINE_S + DEADLINE_SLACK_S},
        "summary": summary(results),
        **results,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    print(json.dumps(report["summary"], indent=2))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
