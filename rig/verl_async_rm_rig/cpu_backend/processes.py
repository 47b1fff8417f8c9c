"""Finding, signalling and ending the processes of one CPU run (psutil; no verl or Ray import).

A run's processes are its driver's process tree plus the Ray processes that belong to it wherever
they are parented: those naming the run's scratch dir on their command line (its own cluster's
daemons, started with ``_temp_dir`` there) or carrying it in their environment as
``VERL_ASYNC_RM_CPU_TMPDIR`` (every worker: the variable is in the run's runtime env, which is how
a run on a shared cluster, whose workers are the shared raylet's children, is told apart).
"""

from __future__ import annotations

import os
import signal
import subprocess

from . import TMP_DIR_ENV


def process_tree(proc: subprocess.Popen) -> list:
    """The process and everything it started (on a cluster of its own: Ray GCS, raylet, workers)."""
    import psutil

    try:
        parent = psutil.Process(proc.pid)
        return parent.children(recursive=True) + [parent]
    except psutil.NoSuchProcess:
        return []


def marked_processes(scratch_dir: str) -> list:
    """Processes (other than this one) that name ``scratch_dir`` on their command line or carry it as
    ``VERL_ASYNC_RM_CPU_TMPDIR`` in their environment."""
    import psutil

    me, found = os.getpid(), []
    for p in psutil.process_iter(["pid", "cmdline"]):
        try:
            if p.info["pid"] == me:
                continue
            if any(scratch_dir in (a or "") for a in (p.info["cmdline"] or [])) or \
                    p.environ().get(TMP_DIR_ENV) == scratch_dir:
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            pass
    return found


def run_processes(proc: subprocess.Popen, scratch_dir: str) -> list:
    """Every live process of a run, once each: its driver's tree and its marked Ray processes."""
    return list({p.pid: p for p in process_tree(proc) + marked_processes(scratch_dir)}.values())


def kill_tree(proc: subprocess.Popen, grace_s: float = 10) -> None:
    """End the process and everything it started: SIGTERM, then SIGKILL after ``grace_s`` (0: at once)."""
    import psutil

    procs = process_tree(proc)
    if grace_s > 0:
        for p in procs:
            try:
                p.send_signal(signal.SIGTERM)
            except psutil.NoSuchProcess:
                pass
    _, alive = psutil.wait_procs(procs, timeout=grace_s) if grace_s > 0 else ([], procs)
    kill_and_reap(alive)


def kill_and_reap(procs: list) -> None:
    """SIGKILL, then wait until they are gone: the next run the demo lets train must not share the
    cores with this one's exit."""
    import psutil

    for p in procs:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(procs, timeout=10)


def signal_run(proc: subprocess.Popen, scratch_dir: str, sig: int) -> None:
    """Send ``sig`` to every process of the run until no new one appears (a process started while we
    signal is caught by the next pass)."""
    import psutil

    done: set[int] = set()
    for _ in range(5):
        fresh = {p.pid: p for p in run_processes(proc, scratch_dir) if p.pid not in done}
        if not fresh:
            break
        for pid, p in fresh.items():
            try:
                p.send_signal(sig)
            except psutil.NoSuchProcess:
                pass
            done.add(pid)


def reap_leftovers(scratch_dir: str) -> None:
    """Kill the run's processes that outlived its driver (Ray's, on its own or a shared cluster)."""
    kill_and_reap(marked_processes(scratch_dir))
