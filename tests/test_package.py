"""Packaging promises: a light import, and the CLI runs end to end."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.quick


def test_import_is_light():
    code = (
        "import sys, threading, verl_async_rm\n"
        "heavy = [m for m in ('ray', 'torch', 'verl', 'openai', 'transformers', 'aiohttp') if m in sys.modules]\n"
        "print(heavy, threading.active_count())"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[] 1"  # no heavy module, no thread started


def test_cli_scores_a_file_with_summary(tmp_path):
    rows = [{"solution_str": f"#### {i % 3}", "ground_truth": "1", "uid": i // 2} for i in range(10)]
    src = tmp_path / "in.jsonl"
    src.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    cmd = [
        sys.executable, "-m", "verl_async_rm", "score", "--input", str(src), "--group-size", "2",
        "--reward-file", str(ROOT / "verl_async_rm" / "user_rewards" / "gsm8k.py"), "--reward-name", "compute_score",
        "--set", "max_concurrency=4", "--output", str(tmp_path / "out.jsonl"), "--summary-json", str(tmp_path / "s.json"),
    ]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "summary:" in result.stdout and "samples_per_s" in result.stdout
    scored = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert [r["score"] for r in scored] == [float(i % 3 == 1) for i in range(10)]
    assert json.loads((tmp_path / "s.json").read_text())["samples"] == 10


def test_cli_bad_config_is_a_clear_error(tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text('{"solution_str": "x"}\n')
    cmd = [sys.executable, "-m", "verl_async_rm", "score", "--input", str(src),
           "--reward-file", str(ROOT / "verl_async_rm" / "user_rewards" / "gsm8k.py"), "--set", "max_concurency=4"]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "max_concurency" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize("reward, code", [("fails_on_tenth", 0), ("fails_on_odd", 3)])
def test_cli_summary_names_failures_and_exits_non_zero_past_the_budget(tmp_path, reward, code):
    """10% failures: the policy handles them (exit 0), and the summary shows their kind and first
    messages. 50%+ failures: past max_failure_rate, scoring stops with exit 3 and says why; the
    output holds the rows scored until then, and no row without a score."""
    rows = [{"solution_str": str(i)} for i in range(40)]
    src = tmp_path / "in.jsonl"
    src.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    cmd = [sys.executable, "-m", "verl_async_rm", "score", "--input", str(src), "--reward-file",
           str(ROOT / "tests" / "rewards" / "examples.py"), "--reward-name", reward, "--set", "max_concurrency=1",
           "--set", "max_failure_rate=0.3", "--output", str(tmp_path / "out.jsonl")]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert result.returncode == code, result.stderr
    assert "failures_by_kind" in result.stdout and "{'error':" in result.stdout
    scored = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert all(r["score"] is not None for r in scored)
    if code:  # the error gives the kinds and the first messages
        assert "scoring stopped: FailureBudgetExceeded" in result.stderr and "of 40 samples failed" in result.stderr
        assert "failure kinds: error x" in result.stderr and "cannot judge response 1" in result.stderr
        assert any(r["score"] == 1.0 for r in scored) and len(scored) < 40
        assert f"the output holds only the {len(scored)} rows scored" in result.stderr
        assert "Traceback" not in result.stderr
    else:  # below the budget: scored by the policy, the summary names them
        assert "failure 1" in result.stdout and "cannot judge response 9" in result.stdout
        assert len(scored) == 40
