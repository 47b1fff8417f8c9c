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
