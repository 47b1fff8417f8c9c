"""A run that keeps what it judged (``verdict_log_inputs``) replays without ``--input``.

- a log written with its inputs kept replays with no ``--input`` to the report ``--input`` gives;
- a log without them and no ``--input`` is refused (exit 2) saying which setting keeps them;
- one line per request however often it is logged (repeats, retried failures, a resume), huge
  responses included; a resume with the setting newly on keeps the inputs of what it reuses, and
  the reward id (the resume identity) does not change;
- the training paths (a streamed ticket as the trainer strategies use it, the per-sample path as
  verl's ``run_single`` uses it) keep them;
- values JSON cannot hold: numpy values kept as numbers and lists (re-hash to the same request);
  a dict whose key order changes as JSON text is reported, never joined; a torn last line is skipped.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from tests.judge_ops.test_replay import Past
from verl_async_rm.agent import RewardAgent
from verl_async_rm.cli import main
from verl_async_rm.config import AgentConfig
from verl_async_rm.replay import Selection, load_selected
from verl_async_rm.verdict_log import (
    inputs_path,
    read_log,
    read_logged_inputs,
    request_key,
)


class PastWithInputs(Past):
    """``Past`` whose run kept its inputs beside its log."""

    def __init__(self, folder: Path, keep: bool = True, **shape):
        self.keep = keep
        super().__init__(folder, keep_inputs=keep, **shape)

    def replay(self, *extra: str, output: str = "report.json", with_input: bool = False) -> list[str]:
        args = super().replay(*extra, output=output)
        if not with_input:
            at = args.index("--input")
            del args[at:at + 2]
        return args


def _write_past(folder: Path, keep: bool) -> PastWithInputs:
    return PastWithInputs(folder, keep=keep)


@pytest.fixture
def kept(tmp_path) -> PastWithInputs:
    return _write_past(tmp_path, keep=True)


def _without_run(report: dict) -> dict:
    return {k: v for k, v in report.items() if k != "run"}


@pytest.mark.quick
def test_a_log_with_its_inputs_replays_without_input_to_the_report_input_gives(kept, capsys):
    sidecar = inputs_path(kept.log)
    assert sidecar.name == "old.verdicts.inputs.jsonl" and len(sidecar.read_text().splitlines()) == 48
    assert main(kept.replay(output="without.json")) == 0
    calls = kept.calls
    assert main(kept.replay(output="with.json", with_input=True)) == 0
    without = json.loads((kept.dir / "without.json").read_text())
    with_input = json.loads((kept.dir / "with.json").read_text())
    assert calls == 48 and kept.calls == 96  # both judged every sample (their own replay logs)
    assert _without_run(without) == _without_run(with_input) and without["agreement"]["compared"] == 48
    assert without["run"]["input"] == str(inputs_path(kept.log)) and with_input["run"]["input"] == str(kept.input)
    # the sidecar is itself a valid --input file
    assert main(kept.replay("--input", str(inputs_path(kept.log)), output="sidecar.json")) == 0
    assert _without_run(json.loads((kept.dir / "sidecar.json").read_text())) == _without_run(with_input)
    # the drift check's calibration reads them too
    calibration = load_selected(kept.log, None, Selection(groups=2, seed=0))
    assert len(calibration.chosen) == 8 and all(s.request in calibration.items for s in calibration.chosen)


@pytest.mark.quick
def test_a_log_without_inputs_and_no_input_is_refused_naming_the_setting(tmp_path, capsys):
    past = _write_past(tmp_path, keep=False)
    assert main(past.replay()) == 2
    err = capsys.readouterr().err
    assert f"--log {past.log} keeps no inputs" in err and "reward.async_agent.verdict_log_inputs=true" in err
    assert "--input" in err and "Traceback" not in err and past.calls == 0
    with pytest.raises(ValueError, match="verdict_log_inputs=true"):
        load_selected(past.log, None)


@pytest.mark.quick
def test_inputs_missing_from_the_sidecar_are_refused_before_any_request(kept, capsys):
    sidecar = inputs_path(kept.log)
    lines = sidecar.read_text().splitlines(keepends=True)
    sidecar.write_text("".join(lines[:40]))
    assert main(kept.replay()) == 2
    err = capsys.readouterr().err
    assert "8 of the 48 selected samples have no kept input" in err and kept.calls == 0, err
    # a line whose body was changed no longer hashes to its request: reported as such, never used
    sidecar.write_text("".join(lines).replace('"data_source": "t"', '"data_source": "u"', 1))
    assert main(kept.replay()) == 2
    assert "no longer hashes to their request" in capsys.readouterr().err and kept.calls == 0


@pytest.mark.quick
def test_one_line_per_request_however_often_it_is_logged_and_huge_responses(tmp_path):
    reward = tmp_path / "r.py"
    reward.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                      "    if solution_str.startswith('fail'):\n        raise RuntimeError('judge down')\n"
                      "    return float(len(solution_str) % 7)\n")
    log = tmp_path / "run.verdicts.jsonl"
    huge = "x" * 3_000_000 + " tail"  # a 3 MB response
    rows = [{"solution_str": huge, "ground_truth": "1", "uid": "a"}, {"solution_str": huge, "ground_truth": "1", "uid": "a"},
            {"solution_str": "short", "ground_truth": "1", "uid": "b"}, {"solution_str": "fail me", "uid": "b"}]
    settings = {"verdict_log": str(log), "verdict_log_inputs": True, "max_attempts": 1, "max_failure_rate": 1.0}
    with RewardAgent.from_file(str(reward), "compute_score", settings) as agent:
        agent.get_all(agent.submit(rows, 2))
        agent.get_all(agent.submit(rows, 2))  # the same batch again (verdict_log_resume: answered from the log)
    with RewardAgent.from_file(str(reward), "compute_score", {**settings, "verdict_log_resume": False}) as agent:
        agent.get_all(agent.submit(rows, 2))  # judged again, appended: still no second copy
    sidecar = inputs_path(log)
    lines = sidecar.read_bytes().splitlines()
    assert len(lines) == 3  # 3 distinct requests (the huge one twice in a batch), the failed one included
    assert 3_000_000 < sidecar.stat().st_size < 3_001_000  # one copy of the huge body
    records = read_log(log).records
    assert len(records) == 12  # three agents judged the batch (the resume plan is read when an agent starts)
    assert all("solution_str" not in json.dumps(r) for r in records)  # the log itself stays small
    assert log.stat().st_size < 20_000
    kept = read_logged_inputs(sidecar, {r["request"] for r in records})
    assert len(kept.items) == 3 and not kept.mismatched
    assert {item["solution_str"] for item in kept.items.values()} == {huge, "short", "fail me"}


@pytest.mark.quick
def test_a_resume_with_the_setting_newly_on_keeps_the_inputs_of_what_it_reuses_and_the_same_reward_id(tmp_path):
    past = _write_past(tmp_path, keep=False)
    before = read_log(past.log).rewards[0]["reward"]
    with RewardAgent.from_file(str(tmp_path / "exact.py"), "compute_score",
                               {"verdict_log": str(past.log), "verdict_log_inputs": True}) as agent:
        agent.get_all(agent.submit(past.rows[:16], 4))
        assert agent.metrics()["resumed"] == 16  # nothing sent: the identity did not change
    log = read_log(past.log)
    assert {r["reward"] for r in log.rewards} == {before}
    assert len(inputs_path(past.log).read_text().splitlines()) == 16
    assert main(past.replay("--steps", "1")) == 0  # step 1's inputs are kept: it replays without --input


@pytest.mark.quick
def test_the_training_paths_keep_their_inputs(tmp_path):
    """A streamed ticket (``open_ticket``/``add``, the trainer strategies') and the per-sample path
    (``score_in_group``, verl's ``run_single``), with verl-like extra info (numpy values)."""
    np = pytest.importorskip("numpy")
    reward = tmp_path / "r.py"
    reward.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                      "    return 1.0 if ground_truth in solution_str else 0.0\n")
    log = tmp_path / "train.verdicts.jsonl"
    settings = {"verdict_log": str(log), "verdict_log_inputs": True}

    def item(k: int) -> dict:
        return {"data_source": "openai/gsm8k", "solution_str": f"the answer is {k % 3}", "ground_truth": "1",
                "uid": f"p{k // 2}", "index": k,
                "extra_info": {"index": np.int64(k), "score_hint": np.float32(0.5), "split": "train",
                               "tokens": np.arange(3)}}

    with RewardAgent.from_file(str(reward), "compute_score", settings) as agent:
        ticket = agent.open_ticket(2)
        for k in range(4):
            agent.add(ticket, [item(k)])
        agent.close_ticket(ticket)
        assert len(agent.get_all(ticket).scores) == 4

        async def per_sample() -> list:
            return await asyncio.gather(*(agent.ascore_in_group({**item(k), "index": 0}, f"q{k // 2}", 2)
                                          for k in range(4, 8)))

        assert len(asyncio.run(per_sample())) == 4
    records = read_log(log).records
    assert len(records) == 8 and {r["ticket"] is None for r in records} == {True, False}
    kept = read_logged_inputs(inputs_path(log), {r["request"] for r in records})
    assert len(kept.items) == 8 and not kept.mismatched  # numpy values kept in their JSON form, same hash
    first = kept.items[records[0]["request"]]
    assert first["extra_info"] == {"index": 0, "score_hint": 0.5, "split": "train", "tokens": [0, 1, 2]}
    assert first["data_source"] == "openai/gsm8k" and first["ground_truth"] == "1"


@pytest.mark.quick
def test_a_value_json_cannot_hold_as_it_was_is_reported_and_a_torn_last_line_skipped(tmp_path):
    reward = tmp_path / "r.py"
    reward.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n    return 1.0\n")
    log = tmp_path / "run.verdicts.jsonl"
    rows = [{"solution_str": "a", "extra_info": {"m": {10: "x", 9: "y"}}},  # int keys: their order changes as text
            {"solution_str": "b\udcff", "extra_info": {"o": object.__new__(type("Thing", (), {"__repr__": lambda s: "<T>"}))}}]
    with RewardAgent.from_file(str(reward), "compute_score", {"verdict_log": str(log), "verdict_log_inputs": True}) as agent:
        agent.get_all(agent.submit(rows))
    requests = [r["request"] for r in sorted(read_log(log).records, key=lambda r: r["index"])]
    sidecar = inputs_path(log)
    with sidecar.open("ab") as f:
        f.write(b'{"request": "' + b"0" * 64 + b'", "data_so')  # a write cut by a kill
    kept = read_logged_inputs(sidecar, requests + ["0" * 64])
    assert kept.mismatched == {requests[0]}  # reported, not joined
    assert kept.items[requests[1]]["extra_info"] == {"o": "<T>"} and kept.items[requests[1]]["solution_str"] == "b\udcff"
    assert request_key(*kept.items[requests[1]].values()) == requests[1]


@pytest.mark.quick
def test_the_setting_needs_a_verdict_log():
    with pytest.raises(ValueError, match="verdict_log_inputs keeps what was judged beside the verdict log"):
        AgentConfig.from_mapping({"verdict_log_inputs": True})
    assert AgentConfig().verdict_log_inputs is False


@pytest.mark.quick
def test_score_keeps_them_with_the_setting_and_refuses_an_output_on_the_sidecar(tmp_path, capsys):
    rows = tmp_path / "in.jsonl"
    rows.write_text("".join(json.dumps({"solution_str": f"answer <{k}>", "ground_truth": "1", "uid": "u"}) + "\n"
                            for k in range(2)))
    (tmp_path / "exact.py").write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                                       "    return 1.0 if solution_str.endswith(f'<{ground_truth}>') else 0.0\n")
    base = ["score", "--input", str(rows), "--reward-file", str(tmp_path / "exact.py"), "--group-size", "2",
            "--set", "verdict_log_inputs=true"]
    sidecar = tmp_path / "out.jsonl.verdicts.inputs.jsonl"
    assert main([*base, "--output", str(tmp_path / "out.jsonl"), "--summary-json", str(sidecar)]) == 2
    assert "name the same file" in capsys.readouterr().err and not sidecar.exists()
    assert main([*base, "--output", str(tmp_path / "out.jsonl")]) == 0
    assert len(sidecar.read_text().splitlines()) == 2 and sidecar == inputs_path(tmp_path / "out.jsonl.verdicts.jsonl")


@pytest.mark.quick
def test_a_group_judges_members_are_not_kept_and_its_log_is_refused_without_input_naming_why(tmp_path, capsys):
    from tests.judge_ops.test_verdict_log_trust import RankingJudge, rows

    log = tmp_path / "group.verdicts.jsonl"
    with RewardAgent(RankingJudge(), {"verdict_log": str(log), "verdict_log_inputs": True}) as agent:
        assert len(agent.get(agent.submit(rows(8), 4), timeout=60).scores) == 8
    assert len(read_log(log).records) == 8 and inputs_path(log).read_text() == ""
    (tmp_path / "r.py").write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                                   "    return 1.0\n")
    assert main(["replay", "--log", str(log), "--reward-file", str(tmp_path / "r.py"), "--output",
                 str(tmp_path / "r.json"), "--quiet"]) == 2
    assert "not for a group judge's members" in capsys.readouterr().err
