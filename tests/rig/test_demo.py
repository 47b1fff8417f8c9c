"""The training demo, short: three of its four lanes (the bound, verl's colocate_async with its reward
loop, the recommended configuration; the last two each behind its own loopback judge with a rate
limit, 500s and hangs), two steps each, started together on one shared Ray cluster and trained one at
a time; the table, the JSON, the wall-time breakdown and the timeline produced, and nothing left
running.

Not the ``sync`` lane (one lane's start-up and loop less, ~30 s of CI): its configuration is checked in
tests/rig/test_demo_parts.py (the default lanes, the sync lane's trainer mode and reward manager), and
verl's stock sync trainer with ``async_agent`` behind a loopback judge trains in tests/helpers/verl_modes.py
(the ``sync`` run). ``--lanes`` picks them, so the command's option is run here too."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import ROOT
from verl_async_rm_rig.demo import COLUMNS

pytestmark = [pytest.mark.trainer, pytest.mark.slow]

LANES = ["zero_latency", "colocate_async", "recommended"]


def test_demo_runs_and_reports(tmp_path):
    cmd = [sys.executable, "-m", "verl_async_rm_rig", "demo", "--steps", "2", "--lanes", ",".join(LANES), "--quiet",
           "--out", str(tmp_path)]
    clusters_before = _processes_mentioning("/tmp/vrs")  # shared clusters' temp dirs (shared_cluster.py)
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=1200, cwd=ROOT)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    report = json.loads((tmp_path / "demo.json").read_text())
    assert [row["lane"] for row in report["table"]] == LANES == list(report["runs"])
    assert all(row["loop_time_s"] > 0 for row in report["table"])
    assert all(len(report["runs"][lane]["step_times"]) == 2 for lane in LANES)
    # what each lane ran: verl's own reward loop in colocate_async, the agent elsewhere
    lanes = report["lanes"]
    assert (lanes["colocate_async"]["trainer_mode"], lanes["colocate_async"]["reward_manager"]) == ("colocate_async", "rate_limited")
    assert lanes["recommended"]["reward_manager"] == "async_agent"
    assert lanes["recommended"]["mode"] == report["recommended"]
    assert all({key for key, _, _ in COLUMNS} <= set(row) for row in report["table"])  # every column, every lane
    assert report["command"] == f"python -m verl_async_rm_rig demo --steps 2 --lanes {','.join(LANES)} --quiet --out {tmp_path}"
    rows = {row["lane"]: row for row in report["table"]}
    for lane in LANES[1:]:  # behind judge_real: the judge's view of the loop, and what the updates trained on
        row, run_ = rows[lane], report["runs"][lane]
        assert row["judge_requests_per_sample"] >= 1 and row["judge_429s"] is not None
        assert row["trained_failed_zero"] is not None and row["final_toy_reward"] is not None
        assert run_["judge_server"]["requests"] > 0 and run_["judge_calls"]
        assert all(kind in ("429", "failed") for _, kind in run_["judge_marks"])
        assert row["reward_wait_exposed_s"] is not None and row["reward_wait_exposed_s"] >= 0
    assert rows["zero_latency"]["judge_429s"] is None and report["runs"]["zero_latency"]["judge_marks"] == []
    assert report["pace_check"]["compute_s"] == report["compute_s"] and report["pace_check"]["measured_step_s"] > 0
    assert (tmp_path / "timeline.png").stat().st_size > 10_000
    # The measured loops never shared the cores: each began after the previous run had exited.
    walls = [report["runs"][lane]["wall"] for lane in LANES]
    assert all(w["startup_s"] > 0 and w["train_s"] >= w["loop_s"] > 0 for w in walls)
    # six verl processes and more, each (their RSS: the drop in the machine's available memory, also
    # recorded, moves with whatever else the machine runs meanwhile)
    assert all(w["rss_at_gate_mb"] > 500 and "memory_per_run_at_gate_gib" in w for w in walls)
    assert all(later["loop_started_at"] >= earlier["ended_at"] for earlier, later in zip(walls, walls[1:]))
    # The judge's calls during each loop were logged, placed on the loop's clock: none before it began.
    assert all(0 <= start <= end for lane in LANES for start, end in report["runs"][lane]["judge_calls"])
    assert "trained on failed 0" in result.stdout and "timeline:" in result.stdout and "judge_real:" in result.stdout
    # The model and data were built once, by a run's TaskRunner after its verl imports, not by the
    # demo before the runs could start (cpu_backend/assets.py).
    assert report["assets_built_by"] == "a run's TaskRunner" and 0 < report["wall_breakdown_s"]["assets_build"] < 60
    assert len(list((tmp_path / "assets").glob("built-seed*.json"))) == 1
    # The lanes ran as jobs of one shared Ray cluster, and the demo left no process of theirs or of it.
    assert report["ray_clusters"] == "shared"
    assert not _processes_mentioning(str(tmp_path)) and _processes_mentioning("/tmp/vrs") == clusters_before


def _processes_mentioning(text: str) -> list:
    """Live processes naming ``text`` on their command line or in an environment value (a lane's
    workers carry their run's paths there; the shared cluster's daemons its temp dir)."""
    import os

    import psutil

    found = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        try:
            if p.info["pid"] != os.getpid() and (any(text in a for a in p.info["cmdline"] or [])
                                                  or any(text in v for v in p.environ().values())):
                found.append((p.pid, p.info["cmdline"]))
        except psutil.Error:
            pass
    return found
