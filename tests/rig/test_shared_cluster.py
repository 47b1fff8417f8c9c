"""One Ray cluster for the demo's lanes (cpu_backend/shared_cluster.py): what a run's workers must be
told through its runtime env and what it may not change; the launcher's overrides for a run on it;
and, on a real cluster, two runs that park frozen at their gates, keep their own named actors (also
TransferQueue's, named in a fixed namespace) and environment, and leave nothing behind."""

from __future__ import annotations

import os
import time

import psutil
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.conftest import ROOT
from verl_async_rm_rig.cpu_backend import TMP_DIR_ENV
from verl_async_rm_rig.cpu_backend.launch import (CPURunConfig, RunningTrainer, base_env, build_overrides,
                                              job_runtime_env_vars, park_at_gates)
from verl_async_rm_rig.cpu_backend.processes import marked_processes
from verl_async_rm_rig.cpu_backend.shared_cluster import SharedCluster

names = st.text("ABCDEFGHIJ_", min_size=1, max_size=6)
values = st.text("abc/01", max_size=4)


@pytest.mark.quick
@given(common=st.dictionaries(names, values), changed=st.dictionaries(names, values))
def test_the_runtime_env_carries_exactly_what_the_run_sets_differently(common, changed):
    run_env = {**common, **changed}
    job_env = job_runtime_env_vars(run_env, common)
    assert {**common, **job_env} == run_env  # a worker started with the common env plus these sees the run's
    assert all(common.get(k) != v for k, v in job_env.items())  # and nothing it had already


@pytest.mark.quick
def test_a_run_cannot_change_rays_settings_or_unset_a_variable_on_a_shared_cluster():
    common = {"A": "1", "RAY_AUTH_MODE": "disabled"}
    with pytest.raises(ValueError, match=r"cannot change Ray's settings \['RAY_prestart_worker_first_driver'\]"):
        job_runtime_env_vars({**common, "RAY_prestart_worker_first_driver": "0"}, common)
    with pytest.raises(ValueError, match=r"cannot change Ray's settings \['RAY_AUTH_MODE'\]"):
        job_runtime_env_vars({"A": "1"}, common)
    with pytest.raises(ValueError, match=r"cannot unset \['A'\]"):
        job_runtime_env_vars({"RAY_AUTH_MODE": "disabled"}, common)


@pytest.mark.quick
@pytest.mark.parametrize("kwargs, message", [
    ({"num_cpus": 0, "num_gpus": 1}, "num_cpus and num_gpus >= 1"),
    ({"num_cpus": 8, "num_gpus": 0}, "num_cpus and num_gpus >= 1"),
    ({"num_cpus": 8, "num_gpus": 1, "ray_settings": {"OMP_NUM_THREADS": "2"}}, r"RAY_\* variables.*OMP_NUM_THREADS"),
])
def test_a_shared_cluster_refuses_bad_settings_before_starting_anything(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SharedCluster(**kwargs)


@pytest.mark.quick
def test_a_run_on_a_shared_cluster_connects_instead_of_starting_one(tmp_path):
    cfg = CPURunConfig(out_dir=str(tmp_path), model_dir=str(tmp_path), train_file="t.parquet", val_file="v.parquet",
                       ray_address="192.0.2.2:6380")
    own = build_overrides(CPURunConfig(out_dir=str(tmp_path), model_dir=str(tmp_path), train_file="t.parquet",
                                       val_file="v.parquet"), ray_tmp_dir="/tmp/vrcx")
    shared = build_overrides(cfg, ray_tmp_dir="/tmp/vrcx", runtime_env_vars={"VERL_FILE_LOGGER_PATH": "/o/m.jsonl",
                                                                             TMP_DIR_ENV: "/tmp/vrcx"})
    ray_init = [o for o in shared if "ray_kwargs.ray_init." in o and ".runtime_env." not in o]
    assert ray_init == ['+ray_kwargs.ray_init.address="192.0.2.2:6380"']  # Ray refuses num_cpus & co. when connecting
    assert any(o.startswith("+ray_kwargs.ray_init.num_gpus") for o in own) and "+ray_kwargs.ray_init.address=local" in own
    env_vars = [o for o in shared if ".runtime_env.env_vars." in o]
    assert len(env_vars) == len({o.split("=", 1)[0] for o in env_vars})  # each once (hydra refuses a second '+')
    assert f'+ray_kwargs.ray_init.runtime_env.env_vars.{TMP_DIR_ENV}="/tmp/vrcx"' in env_vars
    assert '+ray_kwargs.ray_init.runtime_env.env_vars.VERL_FILE_LOGGER_PATH="/o/m.jsonl"' in env_vars


@pytest.mark.quick
def test_base_env_drops_another_clusters_address_and_a_runs_own_settings():
    env = base_env({"RAY_ADDRESS": "10.0.0.1:6379", TMP_DIR_ENV: "/tmp/old", "KEEP": "x", "OMP_NUM_THREADS": "4"})
    assert "RAY_ADDRESS" not in env and TMP_DIR_ENV not in env
    assert env["KEEP"] == "x" and env["OMP_NUM_THREADS"] == "4" and env["RAY_AUTH_MODE"] == "disabled"
    # Ray's idle prestarted workers, which no run uses: off unless the environment asks for them
    assert env["RAY_prestart_worker_first_driver"] == "0"
    assert base_env({"RAY_prestart_worker_first_driver": "1"})["RAY_prestart_worker_first_driver"] == "1"


def _wait_for(condition, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.05)


def _alive(p) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _status(procs) -> set[str]:
    out = set()
    for p in procs:
        try:
            out.add(p.status())
        except psutil.NoSuchProcess:
            pass
    return out


@pytest.mark.local
def test_two_runs_on_one_cluster_park_frozen_keep_their_own_actors_and_leave_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    with SharedCluster(num_cpus=4, num_gpus=2) as cluster:
        raylet = [p for p in marked_processes(cluster.temp_dir) if "raylet" in " ".join(p.cmdline())]
        assert raylet
        lanes = [RunningTrainer(CPURunConfig(
            out_dir=str(tmp_path / f"run{i}"), model_dir=str(tmp_path), train_file="t.parquet", val_file="v.parquet",
            entry_module="tests.helpers.fake_ray_job", start_gate=True, timeout_s=120, ray_address=cluster.address,
            # the checkout's rig before an installed one: the job imports the CPU backend under test
            extra_env={"PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "rig")])})) for i in range(2)]
        try:
            park_at_gates(lanes, poll_s=0.05)
            assert all(lane.at_gate and lane.frozen for lane in lanes)
            # each run's named actor lives in a worker of the shared raylet, not under its driver...
            workers = [[p for p in lane.processes() if p.pid != lane.proc.pid] for lane in lanes]
            assert all(workers) and not {p.pid for p in workers[0]} & {p.pid for p in workers[1]}
            # ...and is frozen with it. SIGSTOP takes effect when the kernel next schedules a process: on a
            # loaded machine its status may read "running" for a moment after the signal, so wait for it
            # (a worker never frozen stays "running" and fails here)
            _wait_for(lambda: all(_status(w) == {psutil.STATUS_STOPPED} for w in workers))
            assert all(_status(w) == {psutil.STATUS_STOPPED} for w in workers)
            assert psutil.STATUS_STOPPED not in _status(raylet)  # the shared daemons are not
            results = []
            for lane, its_workers in zip(lanes, workers):
                lane.open_gate()
                results.append(lane.wait(poll_s=0.05))
                # ended with it (the shared raylet reaps its killed workers: on a loaded machine, a moment later)
                _wait_for(lambda: not any(_alive(p) for p in its_workers))
                assert not any(_alive(p) for p in its_workers)
        finally:
            for lane in lanes:
                lane.close()
        temp_dir = cluster.temp_dir
    for lane, result in zip(lanes, results):
        assert result.ok, open(result.log_path).read()[-3000:]
        seen = result.metrics[0]["data"]
        # the same actor name in both runs, each its own (anonymous namespaces), each with its run's environment
        assert seen["probe/metrics_path"] == lane.metrics_path
        # and TransferQueue's controller, named in its fixed namespace: each run finds its own, never the
        # first run's (frozen at its gate while the second trains: verl's v1 runs hung on it)
        assert seen["probe/tq_metrics_path"] == lane.metrics_path
    assert results[0].metrics[0]["data"]["probe/namespace"] != results[1].metrics[0]["data"]["probe/namespace"]
    deadline = time.monotonic() + 10
    while marked_processes(temp_dir) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not marked_processes(temp_dir) and not any(marked_processes(lane.ray_tmp_dir) for lane in lanes)


@pytest.mark.local
def test_a_cluster_that_does_not_start_in_time_is_ended_with_all_it_started():
    holders = []

    class Watched(SharedCluster):  # the constructor raises: its holder and temp dir are recorded on the way
        def _read_address(self, timeout_s):
            holders.append((self.proc, self.temp_dir))
            return super()._read_address(timeout_s)

    started = time.monotonic()
    with pytest.raises(RuntimeError, match="did not start within 0.01 s"):
        Watched(num_cpus=2, num_gpus=1, start_timeout_s=0.01)
    assert time.monotonic() - started < 40
    # only this cluster's processes: its holder, and whatever names its own temp dir (the holder's command
    # line, Ray's daemons and workers under it). Another test's shared cluster (bench/startup_profile.py's,
    # on the other worker under `pytest -n 2`) may run meanwhile: it is none of this test's business.
    [(holder, temp_dir)] = holders
    assert holder.poll() is not None  # ended (and reaped)
    assert not marked_processes(temp_dir)


KILLED_PARENT = """
import sys, time
from verl_async_rm_rig.cpu_backend.shared_cluster import SharedCluster
cluster = SharedCluster(num_cpus=2, num_gpus=1)
print(cluster.temp_dir, flush=True)
time.sleep(600)
"""


@pytest.mark.local
def test_the_cluster_ends_when_the_process_that_started_it_is_killed():
    # The holder reads its stdin until EOF: a parent killed with SIGKILL (no clean-up code runs) closes
    # the pipe, and the holder shuts the cluster down (docs/cpu-backend.md: Ray's daemons).
    import signal
    import subprocess
    import sys

    from verl_async_rm_rig.cpu_backend.processes import reap_leftovers

    parent = subprocess.Popen([sys.executable, "-c", KILLED_PARENT], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    temp_dir = parent.stdout.readline().strip()
    try:
        assert temp_dir.startswith("/tmp/vrs") and marked_processes(temp_dir)  # the cluster runs
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=10)
        deadline = time.monotonic() + 30
        while marked_processes(temp_dir) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not marked_processes(temp_dir)
        deadline = time.monotonic() + 10
        while os.path.exists(temp_dir) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not os.path.exists(temp_dir)  # and its temp dir with them
    finally:  # a failure must not leave a cluster behind for the rest of the session
        parent.kill()
        if temp_dir.startswith("/tmp/vrs"):
            reap_leftovers(temp_dir)


@pytest.mark.local
def test_transfer_queues_named_actors_are_looked_up_and_created_in_the_jobs_own_namespace(monkeypatch):
    """verl's v1 trainer finds TransferQueue's controller by name in the fixed namespace
    ``transfer_queue``: the CPU backend's patch makes it each job's, and leaves other namespaces."""
    import ray
    import transfer_queue.interface as interface

    from verl_async_rm_rig.cpu_backend import tq_namespace

    assert tq_namespace.install() and tq_namespace.install()  # idempotent: wrapped once
    assert isinstance(interface.ray, tq_namespace.JobNamespacedRay) and not isinstance(interface.ray._ray, tq_namespace.JobNamespacedRay)
    assert isinstance(interface.TransferQueueController, tq_namespace.JobNamespacedActorClass)
    monkeypatch.setattr(ray, "get_runtime_context", lambda: type("Context", (), {"get_job_id": lambda self: "03000000"})())
    looked_up, created = [], []
    monkeypatch.setattr(ray, "get_actor", lambda name, namespace=None: looked_up.append((name, namespace)))
    interface.ray.get_actor("TransferQueueController", namespace="transfer_queue")
    interface.ray.get_actor("other", namespace="mine")
    assert looked_up == [("TransferQueueController", "transfer_queue_03000000"), ("other", "mine")]
    controller = interface.TransferQueueController._actor_class
    monkeypatch.setattr(controller, "options", lambda **kw: created.append(kw))
    interface.TransferQueueController.options(name="TransferQueueController", namespace="transfer_queue")
    assert created == [{"name": "TransferQueueController", "namespace": "transfer_queue_03000000"}]
