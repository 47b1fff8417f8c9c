"""bench/fallback_run.py: its report logic on made-up figures (quick), and the script end to end at a
small size (local: two loopback judges)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from bench.fallback_run import expected_score, summarize
from tests.conftest import ROOT


def _figures(**changes) -> dict:
    samples = 6
    values = dict(
        samples=samples, scores=[expected_score(i) for i in range(samples)], failed_flags=[0] * samples,
        log_samples=[f"t-{i}" for i in range(samples)], served_ok={"hosted": 4, "selfhosted": 2},
        served={"hosted": {"ok": 4, "outage": 7}, "selfhosted": {"ok": 2}},
        metrics={"judge/hosted/scored": 4, "judge/selfhosted/scored": 2, "judge/hosted/switches": 1,
                 "judge/hosted/returns": 1, "judge/hosted/requests": 11},
        events=[(101.5, "hosted", "down"), (104.0, "hosted", "up")], started=100.0, outage=(101.0, 103.0), elapsed=6.0,
    )
    values.update(changes)
    return summarize(**values)


@pytest.mark.quick
def test_the_fallback_reports_figures_count_lost_duplicated_and_time_the_events():
    clean = _figures()
    assert (clean["lost"], clean["wrong_scores"], clean["duplicated_in_verdict_log"], clean["duplicated_ok_answers"]) == (0, 0, 0, 0)
    assert clean["per_judge"]["hosted"]["requests"] == 11 and clean["per_judge"]["selfhosted"]["failures"] == 0
    assert clean["scored_per_judge_sum"] == 6 and clean["outage_s"] == [1.0, 3.0] and clean["samples_per_s"] == 1.0
    assert clean["events"] == [{"t_s": 1.5, "judge": "hosted", "event": "down"}, {"t_s": 4.0, "judge": "hosted", "event": "up"}]
    broken = _figures(scores=[expected_score(i) for i in range(5)], failed_flags=[0, 1, 0, 0, 0],
                      log_samples=["t-0", "t-0", "t-1", "t-1", "t-1"], served_ok={"hosted": 5, "selfhosted": 3})
    assert broken["lost"] == 2  # one missing, one failed
    assert broken["duplicated_in_verdict_log"] == 3 and broken["duplicated_ok_answers"] == 2
    assert _figures(scores=[1.0 - expected_score(0)] + [expected_score(i) for i in range(1, 6)])["wrong_scores"] == 1


@pytest.mark.local
def test_the_fallback_bench_runs_and_writes_its_json(tmp_path):
    out = tmp_path / "fallback.json"
    result = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "fallback_run.py"), "--samples", "300", "--outage-at", "0.3",
         "--outage-for", "0.8", "--out", str(out)], capture_output=True, text=True, timeout=300, cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    figures = json.loads(out.read_text())
    assert figures["lost"] == 0 and figures["duplicated_in_verdict_log"] == 0 and figures["duplicated_ok_answers"] == 0
    assert figures["command"].startswith("python bench/fallback_run.py")
