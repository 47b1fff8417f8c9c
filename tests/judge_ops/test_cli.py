"""``verl-async-rm score`` and ``log`` on bad input and when stopped (issue 45, items 6, 10, 13, 15):
a clear ``error:`` naming the argument, exit 2, no traceback; nothing paid for before the run can
keep what it pays for; an interrupted run writes what it scored and nothing that looks scored.

In process (``cli.main``) with a counting reward file written per test: it appends one line per
call, so "no request was made" is a count, not an absence of evidence.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from verl_async_rm.cli import main

COUNTING_REWARD = '''
import os, signal, time

def compute_score(data_source, solution_str, ground_truth, extra_info=None, calls=None, terminate_at=None):
    with open(calls, "a") as f:
        f.write(repr(ground_truth) + "\\n")
    with open(calls) as f:
        made = sum(1 for _ in f)
    if made == terminate_at:
        # Give the main thread ample time to be inside the scoring loop: the signal is meant to
        # land there, as a scheduler's does in a long run (the outcome is asserted either way).
        time.sleep(0.2)
        os.kill(os.getpid(), signal.SIGTERM)
    return 1.0 if solution_str.endswith(f"<{ground_truth}>") else 0.0
'''


def make_rows(groups: int, size: int, reference_key: str = "ground_truth") -> list[dict]:
    """Half of each group right (score 1), half wrong (0)."""
    return [{"solution_str": f"answer <{g if k % 2 == 0 else g + 1000}>", reference_key: str(g), "uid": f"q{g}",
             "data_source": "t", "extra_info": {"g": g, "k": k}} for g in range(groups) for k in range(size)]


def write_rows(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


class Run:
    """One test's files: the input (groups of ``group_size`` rows), the counting reward and its call log."""

    def __init__(self, tmp_path: Path, rows: list[dict], group_size: int = 2):
        self.dir = tmp_path
        self.group_size = group_size
        self.input = write_rows(tmp_path / "in.jsonl", rows)
        self.reward = tmp_path / "reward.py"
        self.reward.write_text(COUNTING_REWARD)
        self.calls_file = tmp_path / "calls.txt"

    @property
    def calls(self) -> int:
        return len(self.calls_file.read_text().splitlines()) if self.calls_file.exists() else 0

    def score(self, *extra: str) -> list[str]:
        return ["score", "--input", str(self.input), "--reward-file", str(self.reward), "--group-size", str(self.group_size),
                "--kwarg", f"calls={self.calls_file}", *extra]  # a --group-size in extra comes later: it wins


@pytest.fixture
def run(tmp_path) -> Run:
    return Run(tmp_path, make_rows(4, 2))


# -- item 6: every output path is checked before the first request -------------------------------------
@pytest.mark.quick
@pytest.mark.parametrize("where", ["a directory", "a missing folder"])
@pytest.mark.parametrize("flag", ["--output", "--summary-json"])
def test_an_unwritable_output_is_refused_before_any_request(run, capsys, where, flag):
    path = run.dir if where == "a directory" else run.dir / "no" / "such" / "out.jsonl"
    code = main(run.score("--no-verdict-log", flag, str(path)))
    err = capsys.readouterr().err
    assert code == 2 and run.calls == 0, err
    assert f"error: {flag} {path}" in err and "Traceback" not in err


@pytest.mark.quick
def test_outputs_that_name_the_same_file_are_refused(run, capsys):
    original = run.input.read_text()
    for clash in (["--output", str(run.input)], ["--output", str(run.dir / "o.jsonl"), "--verdict-log", str(run.dir / "o.jsonl")],
                  ["--output", str(run.dir / "o.jsonl"), "--summary-json", str(run.dir / "o.jsonl")]):
        assert main(run.score(*clash)) == 2
        assert "name the same file" in capsys.readouterr().err
    assert run.calls == 0 and run.input.read_text() == original and not (run.dir / "o.jsonl").exists()


@pytest.mark.quick
def test_the_write_probe_leaves_no_file_behind_and_a_good_run_writes_everything(run, capsys):
    out, summary = run.dir / "out.jsonl", run.dir / "s.json"
    # checked and probed, then the run fails later (no such reward): no empty file left to mistake for output
    assert main(run.score("--reward-name", "nope", "--no-verdict-log", "--output", str(out), "--summary-json", str(summary))) == 2
    assert "has no attribute 'nope'" in capsys.readouterr().err and not out.exists() and not summary.exists()
    assert main(run.score("--output", str(out), "--summary-json", str(summary))) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 8 and [r["score"] for r in rows] == [1.0, 0.0] * 4 and run.calls == 8
    assert json.loads(summary.read_text())["scored"] == 8


# -- item 10: clear errors, not tracebacks ---------------------------------------------------------------
@pytest.mark.quick
@pytest.mark.parametrize("args, named", [
    (["--group-size", "0"], "argument --group-size: expects a positive integer, got 0"),
    (["--group-size", "-3"], "argument --group-size"),
    (["--group-size", "two"], "argument --group-size"),
    (["--set", "max_concurrency=[1"], "argument --set: 'max_concurrency=[1': the value is not valid YAML"),
    (["--set", "max_concurrency"], "argument --set: expects KEY=VALUE"),
    (["--kwarg", "model"], "argument --kwarg: expects KEY=VALUE, got 'model'"),
    (["--kwarg", "=3"], "argument --kwarg: expects KEY=VALUE"),
])
def test_bad_score_arguments_exit_2_naming_the_argument(run, capsys, args, named):
    with pytest.raises(SystemExit) as exit_:
        main(run.score(*args))
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and named in err and run.calls == 0, err


@pytest.mark.quick
def test_an_empty_input_is_an_error_not_a_summary_of_nothing(run, capsys):
    run.input.write_text("\n  \n")
    assert main(run.score("--output", str(run.dir / "o.jsonl"))) == 2
    err = capsys.readouterr().err
    assert f"error: {run.input} holds no rows: nothing to score" in err and not (run.dir / "o.jsonl").exists()


@pytest.mark.quick
@pytest.mark.parametrize("field, value, named", [
    ("uid", [1, 2], "has a uid of type list"),
    ("extra_info", "text", "has extra_info of type str"),
])
def test_a_bad_row_is_named_by_its_line_before_any_request(run, capsys, field, value, named):
    rows = make_rows(2, 2)
    rows[2][field] = value
    write_rows(run.input, rows)
    assert main(run.score()) == 2
    err = capsys.readouterr().err
    assert f"error: {run.input}:3: batch item 2 {named}" in err and run.calls == 0, err


@pytest.mark.quick
def test_log_refuses_a_directory_a_malformed_record_and_a_negative_slowest(tmp_path, capsys):
    (tmp_path / "run.verdicts.jsonl").write_text(json.dumps({"key": "a", "ticket": "t", "score": 1.0, "failure": None,
                                                             "request_s": 0.5}) + "\n")
    assert main(["log", str(tmp_path)]) == 2
    assert f"error: log: {tmp_path} is a directory; name a verdict log file, e.g. {tmp_path / 'run.verdicts.jsonl'}" in capsys.readouterr().err

    bad = tmp_path / "bad.jsonl"
    for field, value in [("ticket", ["a", "b"]), ("score", "high"), ("request_s", {"s": 1}), ("failure", 3)]:
        bad.write_text(json.dumps({"key": "a", "ticket": "t", "score": 1.0, "failure": None}) + "\n"
                       + json.dumps({"key": "b", "ticket": "t", "score": 1.0, "failure": None, field: value}) + "\n")
        assert main(["log", str(bad)]) == 2
        err = capsys.readouterr().err
        assert f"error: {bad}: record 2 (key b): {field!r} is a {type(value).__name__}" in err, err

    with pytest.raises(SystemExit) as exit_:
        main(["log", str(tmp_path / "run.verdicts.jsonl"), "--slowest", "-1"])
    assert exit_.value.code == 2 and "argument --slowest: expects a non-negative integer, got -1" in capsys.readouterr().err
    assert main(["log", str(tmp_path / "run.verdicts.jsonl"), "--slowest", "0"]) == 0


# -- item 13: a reference under another name -------------------------------------------------------------
@pytest.mark.quick
def test_rows_without_a_reference_are_warned_about_and_ground_truth_key_reads_it(tmp_path, capsys):
    run = Run(tmp_path, make_rows(4, 2, reference_key="answer"))
    summary = tmp_path / "s.json"
    assert main(run.score("--summary-json", str(summary))) == 0
    err = capsys.readouterr().err
    warning = ("warning: no row has a 'ground_truth' field: the reward gets ground_truth=None for every row, and a reward "
               "that compares against it scores them all as wrong; the rows carry ['answer']: if one of them is the "
               "reference, pass --ground-truth-key NAME")
    assert err.count(warning) == 2, err  # before scoring, and again below the summary
    assert json.loads(summary.read_text())["rows_without_reference"] == 8

    assert main(run.score("--ground-truth-key", "answer", "--summary-json", str(summary))) == 0
    assert "warning" not in capsys.readouterr().err
    result = json.loads(summary.read_text())
    assert result["mean_score"] == 0.5 and "rows_without_reference" not in result

    rows = make_rows(2, 2, reference_key="answer")
    del rows[3]["answer"]
    write_rows(run.input, rows)
    calls = run.calls
    assert main(run.score("--ground-truth-key", "answer")) == 2
    assert f"error: {run.input}:4: no 'answer' field (--ground-truth-key" in capsys.readouterr().err and run.calls == calls


@pytest.mark.quick
def test_some_rows_without_a_reference_are_counted(tmp_path, capsys):
    rows = make_rows(2, 2)
    del rows[1]["ground_truth"]
    run = Run(tmp_path, rows)
    assert main(run.score()) == 0
    assert "warning: 1 of 4 rows have no 'ground_truth' field" in capsys.readouterr().err


# -- item 15: interrupted runs keep only what was scored; SIGTERM as Ctrl-C; broken reward files ---------
class _Terminated(Exception):
    """What SIGTERM raises here if the CLI installs no handler of its own (the old code): the test
    fails on it instead of the test process being killed."""


@pytest.mark.quick
def test_sigterm_writes_only_the_groups_scored_and_exits_143(tmp_path, capsys):
    run = Run(tmp_path, make_rows(10, 4), group_size=4)
    out = tmp_path / "out.jsonl"

    def guard(signum, frame):
        raise _Terminated

    previous = signal.signal(signal.SIGTERM, guard)
    try:
        code = main(run.score("--set", "max_concurrency=1", "--kwarg", "terminate_at=13",
                              "--output", str(out)))
        assert signal.getsignal(signal.SIGTERM) is guard  # the CLI's own handler is gone again
    finally:
        signal.signal(signal.SIGTERM, previous)
    err = capsys.readouterr().err
    assert code == 143, err
    written = [json.loads(line) for line in out.read_text().splitlines()]
    assert all(row["score"] is not None for row in written)  # no row that merely looks unscored
    assert len(written) < 40 and len(written) % 4 == 0
    by_group: dict[str, list[float]] = {}
    for row in written:
        by_group.setdefault(row["uid"], []).append(row["score"])
    assert all(scores == [1.0, 0.0, 1.0, 0.0] for scores in by_group.values())  # whole groups, right scores
    assert f"error: SIGTERM: interrupted: {len(written)} of 40 scores kept; the output holds only the {len(written)} rows scored" in err


@pytest.mark.quick
@pytest.mark.parametrize("source, named", [
    ("import math\nx = 1\nraise RuntimeError('no judge configured')\n", "RuntimeError: no judge configured (at broken.py:3)"),
    ("def compute_score(:\n", "SyntaxError: invalid syntax (broken.py, line 1)"),
    ("import a_module_that_is_not_installed_xyz\n", "ModuleNotFoundError: No module named 'a_module_that_is_not_installed_xyz' (at broken.py:1)"),
])
def test_a_reward_file_that_fails_at_import_is_an_error_exit_2(run, capsys, source, named):
    broken = run.dir / "broken.py"
    broken.write_text(source)
    code = main(["score", "--input", str(run.input), "--reward-file", str(broken)])
    err = capsys.readouterr().err
    assert code == 2 and f"error: reward file {broken} failed to import: {named}" in err, err


@pytest.mark.quick
def test_ctrl_c_while_the_agent_closes_loses_no_score(tmp_path):
    """A second Ctrl-C while the agent closes (close waits for stuck calls, up to its timeout):
    the output is written before the close, and the summary still comes back."""
    from verl_async_rm.score_file import score_file

    reward = tmp_path / "closing.py"
    reward.write_text(
        "import os, signal\n"
        "class Reward:\n"
        "    def compute_score(self, data_source, solution_str, ground_truth, extra_info=None):\n"
        "        return 1.0\n"
        "    def close(self):  # runs on the agent's loop while the caller waits in close()\n"
        "        os.kill(os.getpid(), signal.SIGUSR1)\n"
    )
    rows = make_rows(3, 2)
    write_rows(tmp_path / "in.jsonl", rows)

    def ctrl_c(signum, frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGUSR1, ctrl_c)
    try:
        summary = score_file(tmp_path / "in.jsonl", str(reward), "Reward", group_size=2,
                             output_path=tmp_path / "out.jsonl", progress=False)
    except KeyboardInterrupt:  # caught here: escaping, it would stop the whole pytest session
        pytest.fail("the Ctrl-C during close escaped score_file: no summary")
    finally:
        signal.signal(signal.SIGUSR1, previous)
    written = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert summary["interrupted"] and summary["scored"] == 6 and [r["score"] for r in written] == [1.0] * 6
