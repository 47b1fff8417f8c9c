"""The benchmark scripts run end to end at small sizes (their numbers are not asserted here:
speed targets live in the benchmarks, not in timed tests). bench/e2e.py --quick, which runs verl's
trainer, and its plumbing are tested in tests/test_e2e_report.py."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import ROOT


@pytest.mark.parametrize(
    "script, keys",
    [
        ("agent_throughput.py", {"throughput_scores_per_s", "get_wakeup", "in_flight", "targets_met", "machine", "command"}),
        ("fault_suite.py", {"lost", "duplicated", "faults_injected", "server_peak_concurrency", "command"}),
        ("mini_batch_order.py", {"rows", "compute_per_step_s", "machine", "command"}),
        ("hot_path.py", {"memory", "deadline", "summary", "targets", "machine", "command"}),
    ],
)
def test_benchmark_script_runs_and_writes_json(tmp_path, script, keys):
    out = tmp_path / "result.json"
    result = subprocess.run(
        [sys.executable, str(ROOT / "bench" / script), "--quick", "--out", str(out)],
        capture_output=True, text=True, timeout=600, cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    written = json.loads(out.with_name("result_quick.json").read_text())
    assert keys <= set(written)


def test_startup_profile_names_each_process_of_a_lane(tmp_path):
    """One demo lane (`both`) to its start gate: every verl process and this package's reward agent
    are counted, with CPU seconds that add up to the total, and verl's reward-loop worker is not
    started (the strategies score through the agent)."""
    out = tmp_path / "startup.json"
    result = subprocess.run([sys.executable, str(ROOT / "bench" / "startup_profile.py"), "--out", str(out)],
                            capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-2000:]
    written = json.loads(out.read_text())
    names = set(written["by_process"])
    assert {"ray::RewardAgentActor", "ray::WorkerDict", "ray::TaskRunnerHost.run",
            "python -m verl_async_rm.main_ppo"} <= names, names
    # the demo's light driver (cpu_backend/light_driver.py): the driver never loaded torch, the
    # TaskRunner's work ran in its host actor, and the check sees torch where it is loaded
    processes = written["by_process"]
    assert processes["python -m verl_async_rm.main_ppo"]["loading_torch"] == 0
    assert processes["ray::WorkerDict"]["loading_torch"] >= 1 and processes["ray::TaskRunnerHost.run"]["loading_torch"] == 1
    assert "ray::AsyncRewardTaskRunner.run" not in names
    assert "ray::RewardLoopWorker" not in names  # a strategy run (`both`): the agent scores, verl's would idle
    # the CPU backend's router (cpu_backend/router.py) took verl's place, beside the light server actor class
    assert {"ray::LightLoadBalancer", "ray::HFCPUServerActor"} <= names and "ray::GlobalRequestLoadBalancer" not in names
    # the rollout engine lives in verl's trainer worker (cpu_backend/engine_link.py): the replica's actor
    # only relays to it, and never loads torch
    assert processes["ray::HFCPUServerActor"]["loading_torch"] == 0
    assert all(entry["cpu_s"] >= 0 and entry["processes"] >= 1 for entry in written["by_process"].values())
    assert written["cpu_s"] == pytest.approx(sum(e["cpu_s"] for e in written["by_process"].values()), abs=0.2)
    assert written["cpu_s"] == pytest.approx(sum(written["by_lane"].values()), abs=0.2)
    # as in the demo, the lane ran on a shared Ray cluster (cpu_backend/shared_cluster.py): its workers
    # (the shared raylet's children) count for the lane, Ray's daemons and the holder for the cluster
    assert written["ray_clusters"] == "shared" and list(written["by_lane"]) == ["both", "shared Ray cluster"]
    assert {"gcs_server", "python -m verl_async_rm.cpu_backend.shared_cluster"} <= names
    assert written["by_lane"]["both"] > sum(processes[n]["cpu_s"] for n in ("ray::WorkerDict", "ray::TaskRunnerHost.run"))
    assert written["machine_busy_s"] > 0 and written["machine_idle_s"] >= 0
    assert 0 < written["wall_to_gate_s"] and {"command", "machine"} <= set(written)


@pytest.mark.quick
def test_startup_profile_process_names():
    from bench.startup_profile import process_name

    assert process_name(["ray::WorkerDict" + " " * 40, ""]) == "ray::WorkerDict"  # Ray pads an actor's title
    assert process_name(["/venv/bin/python", "-m", "verl_async_rm.main_ppo", "a=b"]) == "python -m verl_async_rm.main_ppo"
    assert process_name(["/venv/bin/python", "-u", "/venv/lib/ray/_private/log_monitor.py", "--x"]) == "log_monitor.py"
    assert process_name(["/venv/lib/python3.11/site-packages/ray/core/src/ray/raylet/raylet", "--a"]) == "raylet"
