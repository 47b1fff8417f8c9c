"""Judge replay, end to end on the loopback judge: a committed verdict log re-judged by a deliberately
different judge (``verl-async-rm replay``, docs/guide/judge-operations.md#judge-replay).

The past run: 256 GSM8K test problems (tests/data/gsm8k/test.jsonl) x 4 responses built
deterministically (the right answer or a slip of -10..+5, in the formats models write), judged in 8
steps of 32 groups by ``JudgeReward`` against the loopback judge's exact-match scoring. Its input and
verdict log are committed under bench/results/replay/ (made once, ``--make-log``); every run of this
script replays that log with the loopback judge's ``partial`` scoring (0.5 for an answer off by at
most 2) and writes bench/results/replay.json (the report and the command) and replay.png.

    python bench/replay_demo.py              # replay the committed log (~15 s)
    python bench/replay_demo.py --make-log   # make the past run's input and log again first
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "rig"))

from verl_async_rm.agent import RewardAgent  # noqa: E402
from verl_async_rm.cli import _shown_command, main as cli  # noqa: E402
from verl_async_rm.user_rewards import llm_judge  # noqa: E402
from verl_async_rm_rig.judge_server import JudgeServer, JudgeServerConfig, partial_credit_judge  # noqa: E402

GSM8K = ROOT / "tests" / "data" / "gsm8k" / "test.jsonl"
RESULTS = ROOT / "bench" / "results"
PAST = RESULTS / "replay"
INPUT = PAST / "responses.jsonl"
OLD_LOG = PAST / "exact_judge.verdicts.jsonl"
PROBLEMS, GROUP, STEPS = 256, 4, 8
FORMATS = ("#### {a}", "The answer is {a}.", "\\boxed{{{a}}}", "So the total is {a}.")
SLIPS = (-10, -2, -1, 1, 2, 5)
PRICES = ["--set", "price_input_per_million=0.15", "--set", "price_output_per_million=0.6"]  # a small hosted judge's


def responses() -> list[dict]:
    """The past run's rows: per problem 4 responses, each right with probability 0.5, else a slip."""
    rows = []
    with GSM8K.open() as f:
        problems = [json.loads(line) for _, line in zip(range(PROBLEMS), f)]
    for p, problem in enumerate(problems):
        truth = int(problem["answer"].split("####")[-1].strip().replace(",", ""))
        rng = random.Random(p)
        for k in range(GROUP):
            answer = truth if rng.random() < 0.5 else truth + rng.choice(SLIPS)
            last_step = re.sub(r"<<[^>]*>>", "", problem["answer"].split("####")[0].strip().splitlines()[-1])
            rows.append({"solution_str": f"{last_step} {rng.choice(FORMATS).format(a=answer)}", "ground_truth": str(truth),
                         "data_source": "openai/gsm8k", "uid": f"gsm8k-test-{p}", "extra_info": {"index": p, "sample": k}})
    return rows


def judge_kwargs(server: JudgeServer) -> dict:
    return {"base_url": server.base_url, "model": "judge-stub", "api_key": "loopback"}


def make_log() -> None:
    """The past run: one ticket (a training step's batch) per 32 groups, the exact-match judge."""
    rows = responses()
    PAST.mkdir(parents=True, exist_ok=True)
    INPUT.write_text("".join(json.dumps(r) + "\n" for r in rows))
    OLD_LOG.unlink(missing_ok=True)
    per_step = len(rows) // STEPS
    with JudgeServer(JudgeServerConfig()) as exact, RewardAgent.from_file(
            llm_judge.__file__, "JudgeReward", {"verdict_log": str(OLD_LOG), "max_concurrency": 32,
                                                "price_input_per_million": 0.15, "price_output_per_million": 0.6},
            reward_kwargs=judge_kwargs(exact)) as agent:
        for step in range(STEPS):
            agent.get_all(agent.submit(rows[step * per_step:(step + 1) * per_step], GROUP))
    print(f"wrote {INPUT} and {OLD_LOG} ({OLD_LOG.stat().st_size / 1e6:.2f} MB)")


def replay() -> dict:
    with tempfile.TemporaryDirectory() as folder, JudgeServer(JudgeServerConfig(judge=partial_credit_judge)) as partial:
        report_path = Path(folder) / "replay.json"
        args = ["replay", "--log", str(OLD_LOG.relative_to(ROOT)), "--input", str(INPUT.relative_to(ROOT)),
                "--reward-file", "pkg://verl_async_rm.user_rewards.llm_judge", "--reward-name", "JudgeReward",
                *[f"--kwarg={k}={v}" for k, v in judge_kwargs(partial).items()], "--set", "max_concurrency=32",
                *PRICES, "--output", str(report_path), "--plot", str(RESULTS / "replay.png"), "--quiet"]
        code = cli(args)
        if code != 0:
            raise SystemExit(f"replay failed: exit {code}")
        report = json.loads(report_path.read_text())
    report["run"] = {"bench_command": "python bench/replay_demo.py",
                     "replay_command": _shown_command([*args[:-5], "--output", "bench/results/replay.json",
                                                       "--plot", "bench/results/replay.png"]),
                     "old_judge": "loopback judge, exact match (verl_async_rm_rig.judge_server.default_judge)",
                     "new_judge": "loopback judge, partial credit (verl_async_rm_rig.judge_server.partial_credit_judge)",
                     "resumed": report["run"]["resumed"], "error": report["run"]["error"]}
    (RESULTS / "replay.json").write_text(json.dumps(report, indent=1) + "\n")
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--make-log", action="store_true", help="make the past run's input and verdict log again")
    args = parser.parse_args(argv)
    if args.make_log or not OLD_LOG.exists():
        make_log()
    report = replay()
    figures = report["agreement"]
    print(json.dumps({k: figures[k] for k in ("compared", "pearson", "spearman", "ranking_agreement", "sign_agreement")}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
