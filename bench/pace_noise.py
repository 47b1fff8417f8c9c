"""The machine's noise floor under bench/e2e.py: the SAME run, several times, back to back.

One e2e run (trainer, seed, regime, mode: same model, data, judge and sampling draws, so the same
work) is started ``--repeats`` times as one start-up group and trained one at a time, exactly as
bench/e2e.py trains a group (the others frozen at their gates). Per repeat: the loop time (the e2e
figure), the CPU seconds the run's processes spent in its training (psutil, the trainer's process
tree sampled every 0.2 s: user + system), and the e2e's same-work probe (``timing_s/old_log_prob``).

What it is for: an e2e pair compares runs that train minutes apart. If identical runs differ as much
as the runs of a pair, a pair's figure carries that noise: a hidden fraction's error is about the
loop-time spread divided by the wait it is a fraction of (printed against ``--wait``, the e2e's
median wait, stock loop minus the mode's instant-judge loop). The CPU column tells a slower machine
(same work, more CPU seconds: a contended core) from a run that did more work (more CPU in some
process of its own).

    python bench/pace_noise.py                                   # v1 `both`, instant judge, 4 repeats
    python bench/pace_noise.py --mode both --regime tail_1x --repeats 4 --wait 8.5
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import psutil  # noqa: E402

from bench import e2e  # noqa: E402


def tree_cpu(pid: int) -> dict[int, float]:
    """CPU seconds (user + system) of a process and its descendants, by pid, now."""
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return {}
    out = {}
    for proc in procs:
        try:
            times = proc.cpu_times()
            out[proc.pid] = times.user + times.system
        except psutil.Error:
            pass
    return out


def cpu_spent(before: dict[int, float], samples: list[dict[int, float]]) -> float:
    """CPU seconds spent since ``before``: each process's last sample minus its value in ``before``
    (0 for a process started since); a process that ended between samples keeps its last one."""
    last: dict[int, float] = {}
    for sample in samples:
        last.update(sample)
    return sum(cpu - before.get(pid, 0.0) for pid, cpu in last.items())


def summarise(repeats: list[dict], wait_s: Optional[float]) -> dict:
    """Spread of the repeats' loop times and CPU seconds; with ``wait_s``, what that spread means for
    a hidden fraction (loop-time range over the wait)."""
    loops = [r["loop_time_s"] for r in repeats]
    cpus = [r["cpu_s"] for r in repeats]
    out = {"loop_time_s": e2e.spread(loops), "loop_max_over_min": round(max(loops) / min(loops), 3),
           "cpu_s": e2e.spread(cpus), "cpu_max_over_min": round(max(cpus) / min(cpus), 3)}
    if wait_s:
        out["wait_s"] = wait_s
        out["hidden_fraction_range_from_noise"] = round((max(loops) - min(loops)) / wait_s, 3)
    return out


def measure(run: e2e.Run, repeats: int, steps: int, compute_s: float, work: Path) -> list[dict]:
    from verl_async_rm_rig.cpu_backend import launch
    from verl_async_rm_rig.cpu_backend.launch import CPURunConfig, prepare_assets

    assets = prepare_assets(CPURunConfig(out_dir=str(work / f"assets_seed{run.seed}"), seed=run.seed))
    settings = e2e.run_settings(run, compute_s, 0.0)
    jobs = [e2e.Job(run, settings, work / f"repeat{i}", assets) for i in range(repeats)]
    trainers = []
    out = []
    try:
        for job in jobs:
            trainers.append(launch.start(e2e.run_config(job, steps, start_gate=True), progress=False))
        launch.park_at_gates(trainers)
        for position, (job, trainer) in enumerate(zip(jobs, trainers)):
            if trainer.gate_reached_s is None:
                raise RuntimeError(f"repeat {position} ended before training; log: {trainer.log_path}")
            before = tree_cpu(trainer.proc.pid)
            samples = []
            trainer.open_gate()
            while not trainer.poll():
                samples.append(tree_cpu(trainer.proc.pid))
                time.sleep(0.2)
            outcome = e2e.outcome_of(job, steps, trainer.result(), 0.0, {})
            same_work = outcome.extra.get(e2e.SAME_WORK_KEY)
            out.append({"position": position, "loop_time_s": round(outcome.summary.loop_time, 3),
                        "cpu_s": round(cpu_spent(before, samples), 2),
                        "same_work_s": round(statistics.median(same_work), 4) if same_work else None})
            print(f"repeat {position}: loop {out[-1]['loop_time_s']:.2f} s, CPU {out[-1]['cpu_s']:.1f} s, "
                  f"same-work probe {out[-1]['same_work_s']}", flush=True)
    finally:
        for trainer in trainers:
            trainer.close()
    return out


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trainer", default="v1", choices=["v1", "v0"])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--regime", default="zero", choices=list(e2e.REGIMES))
    parser.add_argument("--mode", default="both", choices=list(e2e.MODES))
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--compute", type=float, default=1.075, help="C in seconds (the regime's unit; e2e's --compute)")
    parser.add_argument("--wait", type=float, help="the e2e's median wait (s): what the spread means for a hidden fraction")
    parser.add_argument("--work", default="/tmp/pace_noise_runs")
    parser.add_argument("--out", default=str(e2e.RESULTS / "pace_noise.json"))
    args = parser.parse_args(argv)
    if args.repeats < 2:
        parser.error("--repeats: at least 2 (a spread needs two runs)")
    run = e2e.Run(args.trainer, args.seed, args.regime, args.mode)
    repeats = measure(run, args.repeats, args.steps, args.compute, Path(args.work))
    report = {
        "command": " ".join(["python bench/pace_noise.py", *(argv if argv is not None else sys.argv[1:])]),
        "run": {"trainer": run.trainer, "seed": run.seed, "regime": run.regime, "mode": run.mode, "steps": args.steps,
                "compute_s": args.compute},
        "source_fingerprint": e2e.source_fingerprint(),
        "repeats": repeats,
        "summary": summarise(repeats, args.wait),
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count(), "platform": platform.platform()},
    }
    summary = report["summary"]
    print(f"loop {summary['loop_time_s']} (max/min {summary['loop_max_over_min']}); CPU {summary['cpu_s']} "
          f"(max/min {summary['cpu_max_over_min']})"
          + (f"; as a share of a {args.wait} s wait: {summary['hidden_fraction_range_from_noise']:.0%}" if args.wait else ""))
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    print(f"results: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
