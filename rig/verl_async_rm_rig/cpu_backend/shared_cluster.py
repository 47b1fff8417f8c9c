"""One local Ray cluster for several CPU runs that start together (the demo's lanes).

Why: a run that starts its own cluster pays for Ray's daemons (GCS, raylet, dashboard and its
agent, runtime-env agent, log monitor, autoscaler monitor): ~5 CPU-s a run on a usual hour, ~9 on
a slow one (``bench/results/startup_profile_demo*.json``), and on 2 cores the demo's five start-ups
are CPU-bound, so four of those five sets are wall time. With this cluster each run is one Ray
job: its driver connects (``ray_kwargs.ray_init.address``), its workers get the run's environment
through the job's runtime env (``launch.job_runtime_env_vars``), and its named actors live in the
job's own anonymous namespace (the rollout server's ``hf_cpu_server_0_0`` exists once per run
without colliding).

The cluster is held by a small child process (``python -m verl_async_rm_rig.cpu_backend.shared_cluster``)
that starts it with ``ray.init`` and prints the address; it shuts the cluster down when its stdin
closes, so the cluster ends with the launcher even if the launcher is killed. Why not ``ray start
--head``: its daemons outlive whatever started them, and its address is printed for people (or left
in a file under its temp dir); ``ray.init`` in a child we hold by a pipe gives both for free. The
launcher finds a run's workers by the run's scratch dir in their environment
(``RunningTrainer.processes``, processes.py), to freeze them at the start gate and to end them with
the run.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import threading
from typing import Mapping, Optional

from .launch import base_env
from .processes import kill_tree, reap_leftovers

ADDRESS_PREFIX = "ray-address "
START_TIMEOUT_S = 120.0


class SharedCluster:
    """A local Ray cluster with ``num_cpus`` logical CPUs and ``num_gpus`` fake GPUs (verl's placement
    groups ask one per run), started in a holder process with the runs' common environment
    (``launch.base_env()``) plus ``ray_settings`` (Ray's ``RAY_*`` variables, read by its daemons);
    ``close()`` ends it and every process it started. Use as a context manager."""

    def __init__(self, num_cpus: int, num_gpus: int, ray_settings: Optional[Mapping[str, str]] = None,
                 start_timeout_s: float = START_TIMEOUT_S):
        if num_cpus < 1 or num_gpus < 1:
            raise ValueError(f"a shared cluster needs num_cpus and num_gpus >= 1, got {num_cpus}, {num_gpus}")
        ray_settings = dict(ray_settings or {})
        not_ray = sorted(k for k in ray_settings if not k.startswith("RAY_"))
        if not_ray:
            raise ValueError(f"ray_settings are Ray's RAY_* variables; a run's own go in its CPURunConfig: {not_ray}")
        # the runs' common environment (their own differences travel in their runtime envs) and Ray's settings
        self.env = {**base_env(), **ray_settings}
        # Short path: Ray puts unix sockets under it (108-byte limit).
        self.temp_dir = tempfile.mkdtemp(prefix="vrs", dir="/tmp")
        cmd = [sys.executable, "-m", __name__, str(num_cpus), str(num_gpus), self.temp_dir]
        self.log_path = os.path.join(self.temp_dir, "holder.log")
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log,
                                     env=self.env, start_new_session=True, text=True)
        self.address = self._read_address(start_timeout_s)

    def _read_address(self, timeout_s: float) -> str:
        found: list[str] = []

        def read() -> None:
            for line in self.proc.stdout:
                if line.startswith(ADDRESS_PREFIX):
                    found.append(line[len(ADDRESS_PREFIX):].strip())
                    return

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        reader.join(timeout_s)
        if not found:
            self._log.flush()
            with open(self.log_path) as f:
                tail = f.read()[-2000:]
            self.close()  # removes the log with the rest of the temp dir
            raise RuntimeError(f"the shared Ray cluster did not start within {timeout_s:g} s; its log:\n{tail}")
        return found[0]

    def close(self) -> None:
        """Shut the cluster down (the holder's ``ray.shutdown``), then kill whatever of it is left."""
        if self.proc.stdin and not self.proc.stdin.closed:
            self.proc.stdin.close()  # the holder's signal to shut the cluster down
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            kill_tree(self.proc, grace_s=0)
        reap_leftovers(self.temp_dir)
        if not self._log.closed:
            self._log.close()
        shutil.rmtree(self.temp_dir, ignore_errors=True)

    def __enter__(self) -> "SharedCluster":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def hold(num_cpus: int, num_gpus: int, temp_dir: str) -> None:
    """The holder: start the cluster, print its address, keep it until stdin closes."""
    import ray

    # include_dashboard=False: no dashboard UI (Ray still starts its API server for the job APIs).
    ray.init(num_cpus=num_cpus, num_gpus=num_gpus, include_dashboard=False, _temp_dir=temp_dir,
             log_to_driver=False)
    print(f"{ADDRESS_PREFIX}{ray.get_runtime_context().gcs_address}", flush=True)
    try:
        sys.stdin.read()
    finally:
        ray.shutdown()
        # the launcher removes it too; this covers a launcher killed before its clean-up could run
        shutil.rmtree(temp_dir, ignore_errors=True)


if __name__ == "__main__":
    hold(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3])
