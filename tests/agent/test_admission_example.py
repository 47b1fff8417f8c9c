"""The guide's admission-order example (docs/guide/judge-operations.md, "Admission order"), run as written
against the loopback judge it starts: under ``deadline`` a validation pass queued behind a training batch
is scored first, under ``fifo`` after it."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import re
import shlex

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.local


def _section() -> str:
    guide = (ROOT / "docs" / "guide" / "judge-operations.md").read_text()
    return guide.split("### Admission order", 1)[1].split("\n### ", 1)[0]


def test_the_guides_admission_example_runs_as_written():
    from verl_async_rm_rig.judge_server import JudgeServer, parse_config

    section = _section()
    server_line = section.split("```bash\n", 1)[1].split("```", 1)[0].strip().rstrip("&").strip()
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    assert server_line.startswith("python -m verl_async_rm_rig.judge_server")
    config = parse_config(shlex.split(server_line)[3:])
    assert f"127.0.0.1:{config.port}/v1" in code
    with JudgeServer(dataclasses.replace(config, port=0)) as server:
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(compile(code.replace(f"127.0.0.1:{config.port}", f"127.0.0.1:{server.port}"), "guide", "exec"), {})
        served = server.stats().outcomes
    waited = {order: float(s) for order, s in re.findall(r"admission_order=(\w+): the validation pass was scored after ([\d.]+) s",
                                                           out.getvalue())}
    assert set(waited) == {"fifo", "deadline"}, out.getvalue()
    assert served["ok"] == 2 * 48  # every sample of both runs, once
    # FIFO serves the 40 training samples first (20 rounds of 50 ms at 2 at a time), deadline the 8
    # validation samples (4 rounds) after the 2 calls already running: about 1.4 s against 0.3 s.
    assert waited["deadline"] < waited["fifo"] / 2, waited
