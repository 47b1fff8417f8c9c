"""Where a demo lane's start-up goes: the CPU seconds each process of a run has spent by the time
it waits at its start gate (Ray, verl's workers, validation done), one run alone or several
starting together as the demo's do.

    python bench/startup_profile.py                 # a `both` lane alone, v0; bench/results/startup_profile.json
    python bench/startup_profile.py --modes baseline --trainer v1
    python bench/startup_profile.py --modes zero_latency,sync,colocate_async,recommended --trainer v1 \
        --out bench/results/startup_profile_demo.json      # the demo's lanes starting together

``--modes`` names the demo's lanes (demo.LANES) or any contestant as MODE[@REGIME] (demo.lane_of),
each started as the demo starts it (its judge server, for judge_real, in this process). The demo
starts several such runs; on 2 cores their start-ups are CPU-bound, so the sum of these CPU seconds
(not one run's wall time) is what the demo's start-up phase costs, and a run costs more among others
than alone (``--modes`` with the demo's lanes measures it as the demo pays it).
Processes are sampled every 0.2 s (psutil: user + system of the process and its reaped children); a process that ends
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

from verl_async_rm_rig import demo
from verl_async_rm_rig.cpu_backend.launch import CPURunConfig, RunningTrainer

ROOT = Path(__file__).resolve().parents[1]
SHARED = "shared Ray cluster"


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


def loads_torch(pid: int) -> bool:
    """Whether the process has torch's library mapped (it imported torch): the driver's should not
    (cpu_backend/light_driver.py). False for a process that has ended."""
    try:
        return any("libtorch" in Path(m.path).name for m in psutil.Process(pid).memory_maps(grouped=True))
    except psutil.Error:
        return False


def profile(modes: list[str], trainer: str, poll_s: float = 0.2, share_ray: bool = True) -> dict:
    """Start ``modes``' runs together, as the demo does (on one shared Ray cluster unless not
    ``share_ray``), each frozen at its gate as it arrives (so a parked run takes no CPU from the
    others); the CPU seconds of each process when all are parked. The shared cluster's own
    processes (its holder and Ray's daemons) count as the lane ``shared Ray cluster``."""
    with tempfile.TemporaryDirectory(prefix="startup_profile") as tmp:
        out = Path(tmp)
        # as the demo: the first run to reach its TaskRunner builds the model and data (assets.py)
        assets = CPURunConfig(out_dir=str(out / "assets"), assets_dir=str(out / "assets"))
        machine_before = psutil.cpu_times()
        started = time.monotonic()
        cluster = demo.shared_cluster(len(modes)) if share_ray else None
        lanes: dict[str, RunningTrainer] = {}
        running: list = []  # the demo's lanes (demo.StartedLane: a trainer and its judge server)
        seen: dict[tuple[str, int], tuple[str, float]] = {}

        def sample(lane_name: str, procs: list) -> None:
            for proc in procs:
                try:
                    times = proc.cpu_times()
                    seen[lane_name, proc.pid] = (process_name(proc.cmdline()), times.user + times.system
                                                 + times.children_user + times.children_system)
                except psutil.Error:
                    pass

        try:
            for mode in modes:
                running.append(demo.start_lane(out / mode, assets, demo.lane_of(mode), 8, 0, demo.COMPUTE_S,
                                               ray_address=cluster and cluster.address, trainer=trainer))
                lanes[mode] = running[-1].trainer
            while True:
                claimed: set[int] = set()
                for mode, lane in lanes.items():
                    procs = lane.processes()
                    claimed |= {p.pid for p in procs}
                    sample(mode, procs)
                    if lane.at_gate:
                        lane.freeze()
                if cluster is not None:
                    holder = psutil.Process(cluster.proc.pid)
                    sample(SHARED, [p for p in [holder, *holder.children(recursive=True)] if p.pid not in claimed])
                if all(lane.at_gate or lane.poll() for lane in lanes.values()):
                    break
                time.sleep(poll_s)
            wall = time.monotonic() - started
            machine = psutil.cpu_times()
            ended = [mode for mode, lane in lanes.items() if not lane.at_gate]
            if ended:
                raise RuntimeError(f"{ended} ended before the start gate; logs in {out}")
            torch_loaded = {pid: loads_torch(pid) for _, pid in seen}  # every run is parked: its processes live
        finally:
            for lane in running:
                lane.close()
            if cluster is not None:
                cluster.close()
    by_name: dict[str, dict] = {}
    by_lane: dict[str, float] = {}
    for (mode, pid), (name, cpu) in seen.items():
        entry = by_name.setdefault(name, {"processes": 0, "cpu_s": 0.0, "loading_torch": 0})
        entry["processes"] += 1
        entry["cpu_s"] = round(entry["cpu_s"] + cpu, 2)
        entry["loading_torch"] += int(bool(torch_loaded.get(pid)))
        by_lane[mode] = round(by_lane.get(mode, 0.0) + cpu, 2)
    busy = sum(getattr(machine, f) - getattr(machine_before, f) for f in ("user", "nice", "system", "irq", "softirq"))
    idle = sum(getattr(machine, f) - getattr(machine_before, f) for f in ("idle", "iowait"))
    return {"modes": modes, "trainer": trainer, "ray_clusters": "shared" if share_ray else "per_run",
            "wall_to_gate_s": round(wall, 1),
            "cpu_s": round(sum(e["cpu_s"] for e in by_name.values()), 1),
            # the whole machine over the same interval: CPU-bound start-ups leave ~no idle time
            "machine_busy_s": round(busy, 1), "machine_idle_s": round(idle, 1),
            "by_lane": by_lane,
            "by_process": dict(sorted(by_name.items(), key=lambda kv: -kv[1]["cpu_s"]))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--modes", default="both",
                        help=f"comma-separated runs started together: the demo's lanes ({','.join(demo.DEFAULT_LANES)}) "
                             f"or contestants as MODE[@REGIME]")
    parser.add_argument("--trainer", default="v0", choices=["v0", "v1"])
    parser.add_argument("--ray-clusters", choices=("shared", "per_run"), default="shared",
                        help="the runs share one Ray cluster (the demo's default) or each starts its own")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "startup_profile.json"))
    args = parser.parse_args()
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    try:
        for mode in modes:
            demo.lane_of(mode)
    except ValueError as exc:
        parser.error(f"--modes: {exc}")
    if not modes or len(set(modes)) != len(modes):
        parser.error(f"--modes: distinct runs, got {args.modes!r}")
    result = profile(modes, args.trainer, share_ray=args.ray_clusters == "shared")
    result |= {"command": " ".join(["python", "bench/startup_profile.py", *sys.argv[1:]]),
               "machine": {"python": platform.python_version(), "cpus": os.cpu_count(), "platform": platform.platform()}}
    print(f"{','.join(modes)} ({args.trainer}): all at their start gates after {result['wall_to_gate_s']} s, "
          f"{result['cpu_s']} CPU s in all (the machine: {result['machine_busy_s']} s busy, "
          f"{result['machine_idle_s']} s idle, summed over its cores)")
    for mode, cpu in result["by_lane"].items():
        print(f"  {cpu:6.1f} CPU s  {mode}")
    for name, entry in result["by_process"].items():
        print(f"  {entry['cpu_s']:6.2f} CPU s  {entry['processes']} x {name}")
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(f"results: {args.out}")


if __name__ == "__main__":
    main()
