"""Where a demo lane's start-up goes: the CPU seconds each process of one run has spent by the time
it waits at its start gate (Ray, verl's workers, validation done), the run alone on the machine.

    python bench/startup_profile.py                 # the `both` lane, v0; bench/results/startup_profile.json
    python bench/startup_profile.py --mode baseline --trainer v1

The demo starts five such runs; on 2 cores their start-ups are CPU-bound, so the sum of these CPU
seconds (not one run's wall time) is what the demo's start-up phase costs. Processes are sampled
every 0.2 s (psutil: user + system of the process and its reaped children); a process that ends
between samples keeps its last sample.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import psutil

from verl_async_rm import demo
from verl_async_rm.cpu_backend.launch import CPURunConfig, RunningTrainer, prepare_assets

ROOT = Path(__file__).resolve().parents[1]


def process_name(cmdline: list[str]) -> str:
    """Ray actors show as ``ray::Name``; the trainer's driver by its module; Ray's daemons by file."""
    if cmdline and cmdline[0].startswith("ray::"):
        return cmdline[0].split()[0]
    joined = " ".join(cmdline)
    if " -m " in joined:
        return "python -m " + joined.split(" -m ", 1)[1].split()[0]
    for part in cmdline:  # Ray's daemons: the first argument naming a Ray binary or a script
        if "ray" in part or part.endswith(".py"):
            return Path(part).name
    return Path(cmdline[0]).name if cmdline else "?"


def profile(mode: str, trainer: str, poll_s: float = 0.2) -> dict:
    with tempfile.TemporaryDirectory(prefix="startup_profile") as tmp:
        out = Path(tmp)
        assets = prepare_assets(CPURunConfig(out_dir=str(out / "assets")))
        cfg = demo.lane_config(out / mode, assets, mode, 8, 0, demo.uniform_judge((0.05, 2.0)), trainer, start_gate=True)
        started = time.monotonic()
        lane = RunningTrainer(cfg)
        seen: dict[int, tuple[str, float]] = {}
        try:
            while True:
                try:
                    root = psutil.Process(lane.proc.pid)
                    procs = [root, *root.children(recursive=True)]
                except psutil.NoSuchProcess:
                    procs = []
                for proc in procs:
                    try:
                        times = proc.cpu_times()
                        seen[proc.pid] = (process_name(proc.cmdline()),
                                          times.user + times.system + times.children_user + times.children_system)
                    except psutil.Error:
                        pass
                if lane.at_gate or lane.poll():
                    break
                time.sleep(poll_s)
            if not lane.at_gate:
                raise RuntimeError(f"the run ended before its start gate; its log is in {cfg.out_dir}")
            wall = time.monotonic() - started
        finally:
            lane.close()
    by_name: dict[str, dict] = {}
    for name, cpu in seen.values():
        entry = by_name.setdefault(name, {"processes": 0, "cpu_s": 0.0})
        entry["processes"] += 1
        entry["cpu_s"] = round(entry["cpu_s"] + cpu, 2)
    return {"mode": mode, "trainer": trainer, "wall_to_gate_s": round(wall, 1),
            "cpu_s": round(sum(e["cpu_s"] for e in by_name.values()), 1),
            "by_process": dict(sorted(by_name.items(), key=lambda kv: -kv[1]["cpu_s"]))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mode", default="both", choices=list(demo.MODES))
    parser.add_argument("--trainer", default="v0", choices=["v0", "v1"])
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "startup_profile.json"))
    args = parser.parse_args()
    result = profile(args.mode, args.trainer)
    result |= {"command": " ".join(["python", "bench/startup_profile.py", *sys.argv[1:]]),
               "machine": {"python": platform.python_version(), "cpus": os.cpu_count(), "platform": platform.platform()}}
    print(f"{args.mode} ({args.trainer}): at its start gate after {result['wall_to_gate_s']} s, "
          f"{result['cpu_s']} CPU s in all")
    for name, entry in result["by_process"].items():
        print(f"  {entry['cpu_s']:6.2f} CPU s  {entry['processes']} x {name}")
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(f"results: {args.out}")


if __name__ == "__main__":
    main()
