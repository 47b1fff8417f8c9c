"""Issue 15 item 4, done-when: two jobs, separate drivers, on a two-node Ray cluster started here
(``ray start --head`` + a second raylet), against one rate-limited loopback judge: the server never
sees more than the shared limit, and both jobs score every sample.

The cluster is this test's own (its own ports and temp dir; started in new process groups and
stopped by them, leftovers found by the temp dir in their command line and killed by pid): it does
not touch the session's Ray (``ray_session``), so test order does not matter."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT
from verl_async_rm_rig.judge_server import JudgeServer, JudgeServerConfig
from verl_async_rm.lease_table import window_bucket

pytestmark = [pytest.mark.local, pytest.mark.slow]  # not "ray": it starts its own cluster, never the session's
CAP, RPM, SAMPLES, LATENCY, PERMIT_TTL = 4, 240, 40, 1.0, 2.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ray_cli() -> str:
    return str(Path(sys.executable).with_name("ray"))


class TwoRayletCluster:
    def __init__(self, temp_dir: str):
        self.temp_dir = temp_dir
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.starters: list[subprocess.Popen] = []

    def _start(self, *args: str, log: str) -> None:
        env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}
        with open(Path(self.temp_dir) / log, "w") as out:  # --block: the starter owns its processes
            self.starters.append(subprocess.Popen([ray_cli(), "start", "--block", "--num-cpus=1",
                                                   "--node-ip-address=127.0.0.1", *args],
                                                  stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True))

    def start(self, attempts: int = 3) -> None:
        """Ray gives a raylet a fixed 30 s to register (ray/_private/node.py): on a loaded machine a
        start can time out, so a failed start is stopped and tried again."""
        for attempt in range(attempts):
            try:
                return self._start_once()
            except RuntimeError:
                self.stop()
                self.starters.clear()
                if attempt == attempts - 1:
                    raise

    def _start_once(self) -> None:
        self._start("--head", f"--port={self.port}", "--include-dashboard=false", f"--temp-dir={self.temp_dir}",
                    "--ray-client-server-port=" + str(free_port()), log="head.log")
        self._wait_nodes(1)
        self._start(f"--address={self.address}", log="worker.log")
        self._wait_nodes(2)

    def _wait_nodes(self, n: int, timeout: float = 180.0) -> None:
        code = (f"import ray; ray.init(address={self.address!r}, log_to_driver=False); "
                "print(sum(1 for x in ray.nodes() if x['Alive']))")
        deadline = time.time() + timeout
        while time.time() < deadline:
            for starter in self.starters:
                if starter.poll() is not None:
                    raise RuntimeError(f"ray start exited ({starter.returncode}); logs in {self.temp_dir}")
            out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                                 env={**os.environ, "RAY_AUTH_MODE": "disabled"})
            if out.returncode == 0 and out.stdout.strip().splitlines() and int(out.stdout.strip().splitlines()[-1]) >= n:
                return
            time.sleep(1)
        raise TimeoutError(f"the cluster did not reach {n} nodes in {timeout}s; logs in {self.temp_dir}")

    def stop(self) -> None:
        for starter in reversed(self.starters):
            try:
                os.killpg(starter.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        deadline = time.time() + 5
        for starter in self.starters:
            try:
                starter.wait(max(0.1, deadline - time.time()))
            except subprocess.TimeoutExpired:
                pass
            try:
                os.killpg(starter.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        deadline = time.time() + 15  # SIGKILL is not instant: a dying process keeps its /proc entry a moment
        while (leftovers := self._leftovers()) and time.time() < deadline:
            for pid in leftovers:  # a process that left the group (e.g. a worker that setsid'd)
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.2)

    def _leftovers(self) -> list[int]:
        found = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    cmdline = (entry / "cmdline").read_bytes().decode(errors="replace")
                except OSError:
                    continue
                if self.temp_dir in cmdline or f":{self.port}" in cmdline:
                    found.append(int(entry.name))
        return found


@pytest.fixture
def cluster():
    temp_dir = tempfile.mkdtemp(prefix="rm2n")  # short: Ray's socket paths have a length limit
    cluster = TwoRayletCluster(temp_dir)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
        assert not cluster._leftovers(), "processes of the test's cluster survived its teardown"


@pytest.mark.timeout(600)
def test_two_jobs_on_two_raylets_never_exceed_the_shared_limit_together(cluster, tmp_path):
    config = {"max_concurrency": CAP, "requests_per_minute": RPM, "max_attempts": 5,
              "shared_limits": {"endpoint": "judge-a", "namespace": f"limits_{cluster.port}", "permit_ttl": PERMIT_TTL}}
    server_config = JudgeServerConfig(latency=LATENCY, rpm_limit=RPM, rpm_window_s=60.0)
    with JudgeServer(server_config) as server:
        jobs = [subprocess.Popen([sys.executable, "-m", "tests.helpers.shared_limits_job", "--address", cluster.address,
                                  "--base-url", server.base_url, "--node", str(node), "--samples", str(SAMPLES),
                                  "--config", json.dumps(config), "--barrier", str(tmp_path)],
                                 cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                 env={**os.environ, "RAY_AUTH_MODE": "disabled", "PYTHONPATH": str(ROOT)})
                for node in (0, 1)]
        try:
            outputs = [job.communicate(timeout=540) for job in jobs]
        finally:
            for job in jobs:
                job.kill()
        stats = server.stats()
    results = []
    for job, (out, err) in zip(jobs, outputs):
        assert job.returncode == 0, err[-3000:]
        results.append(json.loads(out.strip().splitlines()[-1]))
    # Both complete every sample, each scored right by the judge.
    for result in results:
        assert result["scores"] == [1.0] * SAMPLES and result["failed"] == 0
    assert results[0]["node"] != results[1]["node"]  # one agent per raylet
    overlap = min(r["end"] for r in results) - max(r["start"] for r in results)
    assert overlap > 0.5 * min(r["end"] - r["start"] for r in results)  # they ran together, not in turn
    # The server's view: never more in flight than the shared cap, and no 429 from its own
    # 240-per-minute limiter; in every 10-s window at most what the shared bucket allows (two
    # unshared jobs could send ~1.7x that).
    assert stats.requests == 2 * SAMPLES and stats.outcomes["ok"] == 2 * SAMPLES
    assert stats.peak_in_flight <= CAP and stats.outcomes["rate_limited"] == 0
    assert stats.peak_in_flight == CAP  # the cap was reached: the bound was under pressure
    bucket = window_bucket(RPM, PERMIT_TTL)
    print(json.dumps({"peak_in_flight": stats.peak_in_flight, "max_requests_in_10s": stats.max_requests_in_window(10.0),
                      "bound_10s": bucket.capacity + bucket.drain_per_s * (10.0 + PERMIT_TTL),
                      "max_requests_in_60s": stats.max_requests_in_window(60.0), "overlap_s": overlap,
                      "durations_s": [r["end"] - r["start"] for r in results]}))
    assert stats.max_requests_in_window(10.0) <= bucket.capacity + bucket.drain_per_s * (10.0 + PERMIT_TTL)
