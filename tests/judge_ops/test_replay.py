"""Judge replay (issue 46 item 3): ``verl-async-rm replay`` and the drift check (verl_async_rm/replay.py,
replay_agreement.py).

- the agreement arithmetic, with Hypothesis: a judge agrees fully with itself; a strictly increasing
  transform keeps Spearman at 1, a positive affine one also keeps GRPO's ranking (a nonlinear one
  need not: shown); a group of equal scores pushes no member up;
- selection by step and by seeded group sample (whole groups, reproducible);
- bad input at every entry is refused with the argument named, exit 2, before any request (a
  counting reward: "nothing was sent" is a count); a replay log of another reward is refused;
- the drift check returns verl metrics every N steps and asks the judge afresh each time;
- against two loopback judges: a replay SIGKILLed mid-run resumes, every selected sample is judged
  once (the server's counts), and the report equals an uninterrupted replay's.
"""

from __future__ import annotations

import json
import math
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from verl_async_rm.agent import RewardAgent
from verl_async_rm.cli import main
from verl_async_rm.replay import DriftCheck, Selection, judged_samples, load_selected, parse_steps, select
from verl_async_rm.replay_agreement import ScorePair, advantage_signs, agreement, positive_members
from verl_async_rm.verdict_log import read_log

# -- the arithmetic -----------------------------------------------------------------------------------
scores = st.floats(min_value=-10, max_value=10, allow_nan=False).map(lambda x: round(x, 3))
groups_of_scores = st.lists(st.lists(scores, min_size=1, max_size=6), min_size=1, max_size=8)


def pairs_of(groups: list[list[float]], transform=lambda x: x) -> list[ScorePair]:
    return [ScorePair(1 + g % 2, g, s, transform(s)) for g, members in enumerate(groups) for s in members]


@pytest.mark.quick
@settings(max_examples=100, deadline=None)
@given(groups_of_scores)
def test_a_judge_agrees_fully_with_itself(groups):
    figures = agreement(pairs_of(groups))
    assert figures["mean_abs_diff"] == 0 and figures["exact_agreement"] == 1
    if figures["groups_ranked"]:
        assert figures["ranking_agreement"] == 1 and figures["sign_agreement"] == 1
    if len({s for g in groups for s in g}) > 1:
        assert figures["pearson"] == pytest.approx(1) and figures["spearman"] == pytest.approx(1)
    else:  # no variance: a correlation is undefined, said as None rather than a made-up 1 or 0
        assert figures["pearson"] is None and figures["spearman"] is None


@pytest.mark.quick
@settings(max_examples=100, deadline=None)
@given(groups_of_scores, st.sampled_from([math.exp, lambda x: x ** 3, lambda x: math.atan(x) + 5]))
def test_a_strictly_increasing_transform_keeps_spearman_at_1(groups, transform):
    if len({s for g in groups for s in g}) > 1:
        assert agreement(pairs_of(groups, transform))["spearman"] == pytest.approx(1)


@pytest.mark.quick
@settings(max_examples=100, deadline=None)
@given(groups_of_scores, st.floats(min_value=0.1, max_value=5), st.floats(min_value=-3, max_value=3))
def test_a_positive_affine_transform_keeps_the_grpo_ranking(groups, scale, shift):
    figures = agreement(pairs_of(groups, lambda x: scale * x + shift))
    if figures["groups_ranked"]:
        assert figures["ranking_agreement"] == 1 and figures["sign_agreement"] == 1


@pytest.mark.quick
def test_a_nonlinear_transform_can_change_who_is_above_the_mean():
    """Why the ranking figure exists beside Spearman: same order, other members pushed up."""
    old = [0.0, 0.5, 0.6]
    new = [math.exp(10 * s) for s in old]
    figures = agreement([ScorePair(1, "g", a, b) for a, b in zip(old, new)])
    assert figures["spearman"] == pytest.approx(1) and figures["ranking_agreement"] == 0
    assert positive_members(old) == {1, 2} and positive_members(new) == {2}


@pytest.mark.quick
@given(st.floats(min_value=-1e6, max_value=1e6, allow_nan=False), st.integers(min_value=1, max_value=16))
def test_a_group_of_equal_scores_pushes_no_member_up(value, size):
    assert positive_members([value] * size) == frozenset() and advantage_signs([value] * size) == [0] * size


@pytest.mark.quick
def test_failed_samples_and_groups_of_one_are_left_out_of_what_they_cannot_measure():
    pairs = [ScorePair(1, "a", 1.0, 1.0), ScorePair(1, "a", 0.0, None), ScorePair(1, "b", 1.0, 0.0),
             ScorePair(2, "c", 0.0, 0.0), ScorePair(2, "c", 1.0, 1.0)]
    figures = agreement(pairs)
    assert figures["compared"] == 4 and figures["not_compared"] == 1
    assert figures["groups_ranked"] == 1 and figures["ranking_agreement"] == 1  # only c has two compared members


# -- a past run's log ------------------------------------------------------------------------------------
EXACT = "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n" \
        "    return 1.0 if solution_str.endswith(f'<{ground_truth}>') else 0.0\n"
COUNTING_PARTIAL = '''
import os, re, signal, time

def compute_score(data_source, solution_str, ground_truth, extra_info=None, calls=None, bias=0.0, terminate_at=None,
                  **judge_settings):  # base_url, api_key: accepted as a judge would, unused
    with open(calls, "a") as f:
        f.write(solution_str + "\\n")
    with open(calls) as f:
        made = sum(1 for _ in f)
    if made == terminate_at:  # a scheduler's SIGTERM, landing in the re-judging loop
        time.sleep(0.2)
        os.kill(os.getpid(), signal.SIGTERM)
    elif terminate_at is not None and terminate_at < made <= terminate_at + 3:
        # The next calls after the signal are slow, so the main thread (which handles it) gets to run
        # before the rest are settled, however busy the machine (the outcome is asserted either way).
        time.sleep(0.5)
    got = int(re.findall(r"<(-?\\d+)>", solution_str)[-1])
    return max(0.0, 1.0 - abs(got - int(ground_truth)) / 4) + bias
'''


def rows_for(steps: int, groups: int, size: int) -> list[dict]:
    """Per step, ``groups`` prompts of ``size`` responses, some right, some off by 1..3; uids repeat
    across steps (as verl's do not, but a log must not rely on that)."""
    return [{"solution_str": f"s{step} answer <{g + (k * (g + step)) % 4}>", "ground_truth": str(g), "uid": f"q{g}",
             "data_source": "t", "extra_info": {"step": step, "k": k}}
            for step in range(steps) for g in range(groups) for k in range(size)]


class Past:
    """A past run: its input, its verdict log (the exact reward, one ticket per step), a new reward."""

    def __init__(self, folder: Path, steps: int = 3, groups: int = 4, size: int = 4, keep_inputs: bool = False):
        """``keep_inputs``: the run keeps what it judged beside its log (``verdict_log_inputs``)."""
        self.dir = folder
        self.rows = rows_for(steps, groups, size)
        self.input = folder / "in.jsonl"
        self.input.write_text("".join(json.dumps(r) + "\n" for r in self.rows))
        self.log = folder / "old.verdicts.jsonl"
        (folder / "exact.py").write_text(EXACT)
        settings = {"verdict_log": str(self.log), "verdict_log_inputs": keep_inputs}
        with RewardAgent.from_file(str(folder / "exact.py"), "compute_score", settings) as agent:
            per_step = groups * size
            for step in range(steps):
                agent.get_all(agent.submit(self.rows[step * per_step:(step + 1) * per_step], size))
        self.reward = folder / "partial.py"
        self.reward.write_text(COUNTING_PARTIAL)
        self.calls_file = folder / "calls.txt"

    @property
    def calls(self) -> int:
        return len(self.calls_file.read_text().splitlines()) if self.calls_file.exists() else 0

    def replay(self, *extra: str, output: str = "report.json") -> list[str]:
        return ["replay", "--log", str(self.log), "--input", str(self.input), "--reward-file", str(self.reward),
                "--kwarg", f"calls={self.calls_file}", "--output", str(self.dir / output), "--quiet", *extra]


@pytest.fixture
def past(tmp_path) -> Past:
    return Past(tmp_path)


@pytest.mark.quick
def test_a_replay_reports_agreement_per_step_and_resumes_from_its_own_log(past, capsys):
    assert main(past.replay()) == 0
    out = capsys.readouterr().out
    report = json.loads((past.dir / "report.json").read_text())
    assert past.calls == 48 and report["selection"]["samples_selected"] == 48
    assert [s["step"] for s in report["steps"]] == [1, 2, 3] and "per step:" in out and "ranking_agreement" in out
    total = report["agreement"]
    assert total["compared"] == 48 and 0 < total["spearman"] < 1 and total["mean_new"] > total["mean_old"]
    assert len(report["points"]) == 48 and report["run"]["command"][:2] == ["verl-async-rm", "replay"]
    # the same command again: every answer comes from the replay's verdict log, nothing is sent
    assert main(past.replay()) == 0
    again = json.loads((past.dir / "report.json").read_text())
    assert past.calls == 48 and again["run"]["resumed"] == 48
    assert {k: v for k, v in again.items() if k != "run"} == {k: v for k, v in report.items() if k != "run"}


@pytest.mark.quick
def test_sigterm_writes_the_report_of_what_was_judged_and_the_same_command_completes_it(past, capsys):
    class Terminated(Exception):
        pass

    def guard(signum, frame):  # had the CLI not handled SIGTERM itself, the test fails here, not killed
        raise Terminated

    previous = signal.signal(signal.SIGTERM, guard)
    try:
        code = main(past.replay("--set", "max_concurrency=1", "--kwarg", "terminate_at=20"))
    finally:
        signal.signal(signal.SIGTERM, previous)
    err = capsys.readouterr().err
    report = json.loads((past.dir / "report.json").read_text())
    assert code == 143 and "error: SIGTERM: interrupted" in err and "rerun the same command" in err, err
    assert 20 <= report["agreement"]["compared"] < 48 and report["run"]["interrupted"]
    before = past.calls  # the same command (the call count is past 20: no second SIGTERM)
    assert main(past.replay("--set", "max_concurrency=1", "--kwarg", "terminate_at=20")) == 0
    assert past.calls - before == 48 - report["agreement"]["compared"]  # only what the first run had not settled
    assert json.loads((past.dir / "report.json").read_text())["agreement"]["compared"] == 48


@pytest.mark.quick
def test_the_report_records_the_command_without_secrets(past):
    assert main(past.replay("--kwarg", "api_key=sk-secret", "--kwarg=base_url=https://u:pw@judge/v1?key=s",
                            "--set", "max_concurrency=8")) == 0
    command = json.loads((past.dir / "report.json").read_text())["run"]["command"]
    assert "sk-secret" not in str(command) and "pw" not in str(command) and "key=s" not in str(command)
    assert "api_key=<hidden>" in command and "--kwarg=base_url=https://judge/v1" in command and "max_concurrency=8" in command


@pytest.mark.quick
def test_selection_by_step_and_by_seeded_whole_groups(past):
    samples = judged_samples(read_log(past.log))
    assert [s.step for s in samples] == [1] * 16 + [2] * 16 + [3] * 16
    assert {s.step for s in select(samples, Selection(steps=parse_steps("2-3")))} == {2, 3}
    assert parse_steps("1,3-5, 7") == {1, 3, 4, 5, 7}
    drawn = select(samples, Selection(groups=5, seed=1))
    groups = {s.group for s in drawn}
    assert len(groups) == 5 and len(drawn) == 20  # whole groups: 4 members each; q0 of step 1 is not q0 of step 2
    assert drawn == select(samples, Selection(groups=5, seed=1)) and drawn != select(samples, Selection(groups=5, seed=2))
    assert len({s.group for s in select(samples, Selection(sample_frac=0.5, seed=0))}) == 6
    assert len(select(samples, Selection(groups=100))) == 48


@pytest.mark.quick
def test_a_request_is_one_sample_its_last_success_and_old_failures_are_not_replayed():
    """As a resume reads the log: a failure sent again and answered is a success; a success later
    replaced (a rerun without resume) is the last one; a failure never answered has no score to compare."""
    from verl_async_rm.verdict_log import ReadResult

    def record(request, score, ticket, failure=None):
        return {"key": request, "request": request, "reward": "r", "sample": f"{request}{ticket}", "ticket": ticket,
                "uid": "u", "score": score, "failure": failure}

    log = ReadResult([record("a", None, "t1", "timeout"), record("b", 0.0, "t1"), record("c", None, "t1", "429"),
                      record("a", 1.0, "t2"), record("b", 0.5, "t2")], False, [])
    samples = {s.request: s for s in judged_samples(log)}
    assert (samples["a"].score, samples["a"].step) == (1.0, 2) and samples["b"].score == 0.5
    assert samples["c"].score is None and samples["c"].failure == "429"
    assert [s.request for s in select(list(samples.values()), Selection())] == ["a", "b"]


@pytest.mark.quick
def test_a_replay_of_some_groups_judges_only_them(past):
    assert main(past.replay("--steps", "2", "--groups", "2", "--seed", "3")) == 0
    report = json.loads((past.dir / "report.json").read_text())
    assert past.calls == 8 and report["selection"]["groups_selected"] == 2 and [s["step"] for s in report["steps"]] == [2]


def _corrupt(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


@pytest.mark.quick
@pytest.mark.parametrize("change, named", [
    (lambda p: ["--log", str(p.dir / "nope.jsonl")], "--log {dir}/nope.jsonl: no such file"),
    (lambda p: ["--log", str(p.dir)], "is a directory"),
    (lambda p: ["--log", str(_corrupt(p.dir / "empty.jsonl", ""))], "holds no verdicts"),
    (lambda p: ["--log", str(_corrupt(p.dir / "bad.jsonl", "{}\n{}\n"))], "not a verdict log record"),
    (lambda p: ["--log", str(_corrupt(p.dir / "t.jsonl", p.log.read_text().replace('"score": 1.0', '"score": "1"', 1)))],
     "'score' is a str"),
    (lambda p: ["--input", str(p.dir / "nope.jsonl")], "--input {dir}/nope.jsonl: no such file"),
    (lambda p: ["--input", str(_corrupt(p.dir / "other.jsonl", json.dumps({"solution_str": "x", "ground_truth": "1"}) + "\n"))],
     "48 of the 48 selected samples are not in it"),
    (lambda p: ["--steps", "4"], "--steps: the log has no step 4 (it has steps 1-3)"),
    (lambda p: ["--old-reward", "0123456789abcdef"], "--old-reward 0123456789abcdef: no answers of it"),
    (lambda p: ["--output", str(p.dir / "no" / "r.json")], "--output {dir}/no/r.json: the folder"),
    (lambda p: ["--plot", str(p.dir)], "--plot {dir} is a directory"),
    (lambda p: ["--verdict-log", str(p.log)], "--verdict-log and --log name the same file"),
    (lambda p: ["--output", str(p.input)], "--output and --input name the same file"),
    (lambda p: ["--set", "verdict_log=x.jsonl"], "--set verdict_log: the replay keeps its own verdict log"),
    (lambda p: ["--set", "max_concurrency=0"], "max_concurrency"),
    (lambda p: ["--groups", "2", "--sample-frac", "0.5"], "--groups and --sample-frac both draw groups"),
])
def test_bad_input_is_refused_naming_it_before_any_request(past, capsys, change, named):
    code = main(past.replay(*change(past)))
    err = capsys.readouterr().err
    assert code == 2 and past.calls == 0, err
    assert named.format(dir=past.dir) in err and "Traceback" not in err


@pytest.mark.quick
@pytest.mark.parametrize("args, named", [
    (["--steps", "3-1"], "argument --steps"), (["--steps", "x"], "argument --steps"), (["--steps", "0"], "argument --steps"),
    (["--groups", "0"], "argument --groups"), (["--sample-frac", "1.5"], "argument --sample-frac"),
    (["--sample-frac", "0"], "argument --sample-frac"),
])
def test_bad_replay_arguments_exit_2_naming_the_argument(past, capsys, args, named):
    with pytest.raises(SystemExit) as exit_:
        main(past.replay(*args))
    assert exit_.value.code == 2 and named in capsys.readouterr().err and past.calls == 0


@pytest.mark.quick
def test_a_log_of_several_rewards_needs_the_one_named_and_a_replay_log_of_another_reward_is_refused(past, capsys):
    mixed = past.dir / "mixed.jsonl"
    mixed.write_text(past.log.read_text())
    (past.dir / "other.py").write_text(EXACT + "# another reward\n")
    with RewardAgent.from_file(str(past.dir / "other.py"), "compute_score",
                               {"verdict_log": str(mixed), "verdict_log_resume": False}) as agent:
        agent.get_all(agent.submit(past.rows[:4], 4))
    assert main(past.replay("--log", str(mixed))) == 2
    err = capsys.readouterr().err
    assert "holds the answers of 2 rewards" in err and "exact.py:compute_score" in err and "other.py:compute_score" in err
    old_id = read_log(past.log).rewards[0]["reward"]
    assert main(past.replay("--log", str(mixed), "--old-reward", old_id)) == 0 and past.calls == 48
    capsys.readouterr()
    # the replay's own log, resumed by a changed reward: refused, both named (its answers are not this reward's)
    assert main(past.replay("--log", str(mixed), "--old-reward", old_id, "--kwarg", "bias=0.1")) == 2
    err = capsys.readouterr().err
    assert "RewardChanged" in err or "was written by another reward" in err
    assert past.calls == 48


# -- the drift check ---------------------------------------------------------------------------------------
@pytest.mark.quick
def test_the_drift_check_reports_verl_metrics_every_n_steps_asking_the_judge_afresh(past):
    calibration = load_selected(past.log, past.input, Selection(groups=3, seed=0))
    judge = str(past.dir / "exact.py")
    check = DriftCheck(calibration, lambda settings: RewardAgent.from_file(judge, "compute_score", settings), every_n_steps=5)
    assert check(1) == {} and check(4) == {}
    metrics = check(5)
    assert metrics["async_rm/drift/spearman"] == pytest.approx(1) and metrics["async_rm/drift/ranking_agreement"] == 1
    assert metrics["async_rm/drift/not_compared"] == 0 and all(isinstance(v, float) for v in metrics.values())
    drifted = DriftCheck(calibration, lambda settings: RewardAgent.from_file(
        str(past.reward), "compute_score", settings, reward_kwargs={"calls": str(past.calls_file)}), every_n_steps=2)
    first, second = drifted(2), drifted(4)
    assert past.calls == 24 and first == second and first["async_rm/drift/mean_abs_diff"] > 0  # asked twice, not cached
    with pytest.raises(ValueError, match="every_n_steps"):
        DriftCheck(calibration, lambda s: None, every_n_steps=0)
    with pytest.raises(ValueError, match="afresh"):
        DriftCheck(calibration, lambda s: None, every_n_steps=1, config={"cache": True})


# -- against two loopback judges, killed and resumed ----------------------------------------------------
def replay_command(folder: Path, old_log: Path, server, output: str) -> list[str]:
    from verl_async_rm.user_rewards import llm_judge

    return [sys.executable, "-m", "verl_async_rm", "replay", "--log", str(old_log), "--input", str(folder / "in.jsonl"),
            "--reward-file", llm_judge.__file__, "--reward-name", "JudgeReward", "--kwarg", f"base_url={server.base_url}",
            "--kwarg", "model=judge-stub", "--kwarg", "api_key=k", "--set", "max_concurrency=4",
            "--set", "verdict_log_fsync_s=0", "--set", "price_input_per_million=1", "--set", "price_output_per_million=4",
            "--output", str(folder / output), "--quiet"]


@pytest.mark.local
@pytest.mark.slow
def test_a_replay_killed_mid_run_resumes_judging_each_sample_once_to_the_same_report(tmp_path):
    from verl_async_rm_rig.demo_data import make_responses, write_jsonl
    from verl_async_rm_rig.judge_server import JudgeServer, JudgeServerConfig, partial_credit_judge
    from verl_async_rm.user_rewards import llm_judge

    rows = make_responses(24, 4, seed=2)
    write_jsonl(rows, tmp_path / "in.jsonl")
    old_log = tmp_path / "old.verdicts.jsonl"
    items = [{k: r[k] for k in ("solution_str", "ground_truth", "data_source", "extra_info", "uid")} for r in rows]
    with JudgeServer(JudgeServerConfig()) as exact, \
            JudgeServer(JudgeServerConfig(judge=partial_credit_judge, latency=(0.05, 0.1), seed=1)) as partial:
        settings_ = {"verdict_log": str(old_log)}
        with RewardAgent.from_file(llm_judge.__file__, "JudgeReward", settings_,
                                   reward_kwargs={"base_url": exact.base_url, "model": "judge-stub", "api_key": "k"}) as agent:
            for step in range(3):  # three steps of 8 groups
                agent.get_all(agent.submit(items[step * 32:(step + 1) * 32], 4))

        assert main(replay_command(tmp_path, old_log, partial, "whole.json")[3:]) == 0  # uninterrupted, in process
        assert partial.stats().requests == 96
        partial.reset_stats()

        cut_log = tmp_path / "cut.json.verdicts.jsonl"
        process = subprocess.Popen(replay_command(tmp_path, old_log, partial, "cut.json"), stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE)
        try:
            deadline = time.monotonic() + 60
            while not (cut_log.exists() and cut_log.read_bytes().count(b"\n") >= 1 + 30):  # its reward record, 30 verdicts
                assert process.poll() is None, process.communicate()
                assert time.monotonic() < deadline, "the replay never logged enough verdicts"
                time.sleep(0.02)
            process.send_signal(signal.SIGKILL)
            process.communicate(timeout=60)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
        sent_before_kill = partial.stats().requests
        logged = {r["request"] for r in read_log(cut_log).records if r["failure"] is None}
        assert 30 <= len(logged) < 96 and not (tmp_path / "cut.json").exists()

        resumed = subprocess.run(replay_command(tmp_path, old_log, partial, "cut.json"), capture_output=True, text=True,
                                 timeout=120)
        assert resumed.returncode == 0, resumed.stderr
        sent_on_resume = partial.stats().requests - sent_before_kill
    # what the killed run had settled was not sent again; only the unsettled ones were (in flight at the kill)
    assert sent_on_resume == 96 - len(logged)
    records = [r for r in read_log(cut_log).records if r["failure"] is None]
    assert len(records) == 96 and len({r["request"] for r in records}) == 96  # each judged once, in the log
    whole, cut = (json.loads((tmp_path / name).read_text()) for name in ("whole.json", "cut.json"))
    assert cut["run"]["resumed"] == len(logged)
    assert {k: v for k, v in cut.items() if k != "run"} == {k: v for k, v in whole.items() if k != "run"}
    figures = whole["agreement"]
    assert figures["compared"] == 96 and figures["pearson"] < 1 and figures["ranking_agreement"] < 1
    assert whole["cost"]["new"]["input_tokens"] > 0 and whole["cost"]["new"]["cost"] > 0


# -- the guide's example ---------------------------------------------------------------------------------
def guide_example() -> list[str]:
    """The commands of the guide's replay example (its first bash block), continuation lines joined."""
    from tests.conftest import ROOT

    text = (ROOT / "docs" / "guide" / "judge-operations.md").read_text()
    block = text.split("## Judge replay", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    return [line.split("#")[0].strip().rstrip("&").strip()
            for line in block.replace("\\\n", " ").splitlines() if line.strip() and not line.startswith("#")]


@pytest.mark.local
def test_the_guides_replay_example_runs_as_written(tmp_path, monkeypatch, capsys):
    import shlex

    from tests.conftest import ROOT
    from verl_async_rm_rig.judge_server import JUDGES, JudgeServer, JudgeServerConfig

    commands = guide_example()
    servers = [shlex.split(c) for c in commands if c.startswith("python -m verl_async_rm_rig.judge_server")]
    ours = [c for c in commands if c.startswith("verl-async-rm ")]
    assert len(servers) == 2 and [c.split()[1] for c in ours] == ["score", "replay"]
    judges = [s[s.index("--judge") + 1] if "--judge" in s else "exact" for s in servers]
    monkeypatch.chdir(tmp_path)
    with JudgeServer(JudgeServerConfig(judge=JUDGES[judges[0]])) as first, \
            JudgeServer(JudgeServerConfig(judge=JUDGES[judges[1]])) as second:
        for command in ours:
            for server, spec in zip((first, second), servers):
                command = command.replace(f"127.0.0.1:{spec[spec.index('--port') + 1]}", f"127.0.0.1:{server.port}")
            command = command.replace("bench/results/", f"{ROOT}/bench/results/")
            assert main(shlex.split(command)[1:]) == 0, capsys.readouterr().err
    report = json.loads((tmp_path / "replay.json").read_text())
    assert report["selection"]["groups_selected"] == 64 and report["agreement"]["compared"] == 256
    assert 0 < report["agreement"]["ranking_agreement"] < 1 and (tmp_path / "replay.png").stat().st_size > 0


@pytest.mark.quick
def test_the_committed_bench_log_joins_its_input_and_its_report_is_of_it():
    from tests.conftest import ROOT

    results = ROOT / "bench" / "results"
    selected = load_selected(results / "replay" / "exact_judge.verdicts.jsonl", results / "replay" / "responses.jsonl")
    report = json.loads((results / "replay.json").read_text())
    assert len(selected.chosen) == 1024 and selected.groups == 256 and {s.step for s in selected.chosen} == set(range(1, 9))
    assert [[s.step, s.score] for s in selected.chosen] == [p[:2] for p in report["points"]]
    assert report["agreement"]["compared"] == 1024 and report["run"]["bench_command"] == "python bench/replay_demo.py"


@pytest.mark.local
def test_a_replay_stopped_by_its_budget_reports_what_was_judged_and_a_larger_budget_completes_it(tmp_path, capsys):
    """The user's limits and budget apply to the replay: past the token budget it stops (exit 3) with
    a report of what was judged; the same command with a larger budget resumes and pays only the rest."""
    from verl_async_rm_rig.demo_data import make_responses, write_jsonl
    from verl_async_rm_rig.judge_server import JudgeServer, JudgeServerConfig, partial_credit_judge
    from verl_async_rm.user_rewards import llm_judge

    rows = make_responses(8, 4, seed=3)
    write_jsonl(rows, tmp_path / "in.jsonl")
    old_log = tmp_path / "old.verdicts.jsonl"
    with JudgeServer(JudgeServerConfig()) as exact, JudgeServer(JudgeServerConfig(judge=partial_credit_judge)) as partial:
        assert main(["score", "--input", str(tmp_path / "in.jsonl"), "--group-size", "4", "--reward-file", llm_judge.__file__,
                     "--reward-name", "JudgeReward", "--kwarg", f"base_url={exact.base_url}", "--kwarg", "model=judge-stub",
                     "--kwarg", "api_key=k", "--verdict-log", str(old_log)]) == 0
        command = replay_command(tmp_path, old_log, partial, "report.json")[3:]
        assert main([*command, "--set", "token_budget=1500", "--set", "reserve_output_tokens=4"]) == 3
        out, err = capsys.readouterr()
        report = json.loads((tmp_path / "report.json").read_text())
        stopped_at = partial.stats().requests
        assert "BudgetExceeded" in err and "per step:" in out and 0 < stopped_at < 32
        refused = sum(report["failures_by_kind"].values())  # logged as failures of the budget's kind
        assert refused == 32 - report["agreement"]["compared"] > 0 and report["run"]["error"]
        assert report["agreement"]["not_compared"] == refused
        assert main(command) == 0
        assert partial.stats().requests == 32  # the rest only
    assert json.loads((tmp_path / "report.json").read_text())["agreement"]["compared"] == 32
