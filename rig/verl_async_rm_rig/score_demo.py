"""``python -m verl_async_rm_rig score-demo``: the agent alone, no training: a generated set of GSM8K-style
responses scored through the product's own command (``verl-async-rm score``) behind a slow simulated judge
(the shipped GSM8K reward's optional latency), so the concurrency shows in seconds."""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from verl_async_rm import cli
from verl_async_rm_rig.demo_data import make_responses, write_jsonl


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m verl_async_rm_rig score-demo", description=__doc__)
    parser.add_argument("--problems", type=int, default=256)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--latency-lo", type=float, default=0.1)
    parser.add_argument("--latency-hi", type=float, default=2.0)
    parser.add_argument("--max-concurrency", type=int, default=512)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", help="folder for responses.jsonl and scored.jsonl (default: a temp folder)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    out = Path(args.out or tempfile.mkdtemp(prefix="verl_async_rm_score_demo_"))
    responses = write_jsonl(make_responses(args.problems, args.group_size, args.seed), out / "responses.jsonl")
    samples = args.problems * args.group_size
    print(
        f"score-demo: {args.problems} problems x {args.group_size} responses = {samples} samples, "
        f"simulated judge latency uniform {args.latency_lo}-{args.latency_hi}s, cap {args.max_concurrency}\n"
        f"      (a sequential loop would wait about {samples * (args.latency_lo + args.latency_hi) / 2:.0f}s)"
    )
    status = cli.main([
        "score", "--input", str(responses), "--reward-file", "pkg://verl_async_rm.user_rewards.gsm8k",
        "--reward-name", "compute_score_async", "--group-size", str(args.group_size),
        "--set", f"max_concurrency={args.max_concurrency}",
        "--kwarg", f"latency_lo={args.latency_lo}", "--kwarg", f"latency_hi={args.latency_hi}",
        "--output", str(out / "scored.jsonl"), "--no-verdict-log",
    ])
    print(f"scored responses: {out / 'scored.jsonl'}")
    return status
