"""The benchmark scripts run end to end at small sizes (their numbers are not asserted here:
speed targets live in the benchmarks, not in timed tests). bench/e2e.py --quick, which runs verl's
trainer, and its plumbing are tested in tests/benchmarks/test_e2e_report.py."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import ROOT


@pytest.mark.local
@pytest.mark.parametrize(
    "script, keys, options",
    [
        # sizes below --quick's (no number is asserted: every part of the script runs, on fewer samples, one round)
        ("agent_throughput.py", {"throughput_scores_per_s", "get_wakeup", "in_flight", "targets_met", "machine", "command"},
         ["--rounds", "1", "--samples", "128", "--latency-samples", "16", "--in-flight", "64"]),
        # bench/fault_suite.py --quick --fault agent: run and checked by tests/judge_ops/test_fault_suite.py
        # one latency tail of --quick's three: each tail runs the same code (both orders) on a longer sleep
        ("mini_batch_order.py", {"rows", "compute_per_step_s", "machine", "command"}, ["--tails", "0.4"]),
        ("hot_path.py", {"memory", "deadline", "summary", "targets", "machine", "command"}, []),
    ],
)
def test_benchmark_script_runs_and_writes_json(tmp_path, script, keys, options):
    out = tmp_path / "result.json"
    result = subprocess.run(
        [sys.executable, str(ROOT / "bench" / script), "--quick", "--out", str(out), *options],
        capture_output=True, text=True, timeout=600, cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    written = json.loads(out.with_name("result_quick.json").read_text())
    assert keys <= set(written)


@pytest.mark.local
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
            "python -m verl_async_rm_rig.cpu_backend.entry"} <= names, names
    # the demo's light driver (cpu_backend/light_driver.py): the driver never loaded torch, the
    # TaskRunner's work ran in its host actor, and the check sees torch where it is loaded
    processes = written["by_process"]
    assert processes["python -m verl_async_rm_rig.cpu_backend.entry"]["loading_torch"] == 0  # our entry point, as the rig runs it
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
    assert {"gcs_server", "python -m verl_async_rm_rig.cpu_backend.shared_cluster"} <= names
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


@pytest.mark.local
@pytest.mark.slow
def test_e2e_anchor_plan_from_the_command_line():
    """bench/e2e.py --anchor --dry-run: issue 43's whole plan (verl's colocate_async with its reward loop
    and with async_agent, beside stock and this package's strategies, in judge_real too) and its
    estimate, without running anything; contradictory or bad arguments are refused by name (exit 2)."""
    def e2e(*args):
        return subprocess.run([sys.executable, str(ROOT / "bench" / "e2e.py"), *args],
                              capture_output=True, text=True, timeout=300, cwd=ROOT)

    plan = e2e("--anchor", "--dry-run")
    assert plan.returncode == 0, plan.stderr[-2000:]
    lines = [line.split() for line in plan.stdout.splitlines() if line.startswith("  v1 seed")]
    assert {line[4] for line in lines} == {"baseline", "both", "tail_auto", "verl_colocate_async", "colocate_async_agent"}
    assert {line[3] for line in lines} == {"zero", "tail_1x", "heavy_2.5x", "judge_real"}
    assert "min at" in plan.stdout
    for bad, named in ((["--anchor", "--quick"], "--anchor"), (["--recommended", "verl_colocate_async", "--dry-run"], "--recommended"),
                       (["--decode-s", "-1", "--dry-run"], "--decode-s")):
        refused = e2e(*bad)
        assert refused.returncode == 2 and named in refused.stderr and "Traceback" not in refused.stderr, refused.stderr
