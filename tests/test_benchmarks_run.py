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
