"""The training demo, short: three of its runs, two steps each; table, JSON and timeline produced."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import ROOT

pytestmark = [pytest.mark.trainer, pytest.mark.slow]


def test_demo_runs_and_reports(tmp_path):
    cmd = [sys.executable, "-m", "verl_async_rm", "demo", "--steps", "2", "--latency-hi", "0.5", "--quiet",
           "--modes", "zero_latency,baseline,both", "--out", str(tmp_path)]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=1200, cwd=ROOT)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    report = json.loads((tmp_path / "demo.json").read_text())
    assert [row["mode"] for row in report["table"]] == ["zero_latency", "baseline", "both"]
    assert all(row["loop_time_s"] > 0 for row in report["table"])
    assert report["runs"]["both"]["blocked"] and len(report["runs"]["baseline"]["step_times"]) == 2
    assert (tmp_path / "timeline.png").stat().st_size > 10_000
    assert "hidden" in result.stdout and "timeline:" in result.stdout
