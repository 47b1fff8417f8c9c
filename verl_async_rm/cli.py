"""Command line: ``verl-async-rm score ...`` (score a file of responses) and ``verl-async-rm log`` (read a verdict log)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import yaml

from verl_async_rm.score_file import score_file


def _pairs(values: list[str], what: str) -> dict:
    """``key=value`` pairs; values parsed as YAML scalars (``8`` -> int, ``null`` -> None)."""
    out = {}
    for text in values:
        key, sep, value = text.partition("=")
        if not sep or not key:
            raise SystemExit(f"--{what} expects key=value, got {text!r}")
        out[key.strip()] = yaml.safe_load(value)
    return out


EXIT_SCORING_STOPPED = 3  # (2: bad arguments or input)
EXIT_INTERRUPTED = 130  # Ctrl-C, as shells report SIGINT


def _print_summary(summary: dict) -> None:
    width = max(map(len, summary))
    for key, value in summary.items():
        if key == "first_failures":
            for number, message in enumerate(value, 1):
                print(f"  {'failure ' + str(number):<{width}}  {message}")
            continue
        shown = f"{value:.4g}" if isinstance(value, float) else value
        print(f"  {key:<{width}}  {shown}")


def _verdict_log_path(args) -> Path | None:
    if args.accept_reward_change and not args.resume:
        raise ValueError("--accept-reward-change is for --resume (it lets a resume reuse another reward's verdict log)")
    if args.no_verdict_log:
        if args.resume:
            raise ValueError("--resume needs the verdict log (drop --no-verdict-log)")
        return None
    if args.verdict_log:
        path = Path(args.verdict_log)
    elif args.output:
        path = Path(f"{args.output}.verdicts.jsonl")
    else:
        if args.resume:
            raise ValueError("--resume needs --verdict-log or --output (the log defaults to <output>.verdicts.jsonl)")
        return None
    if args.resume and not path.exists():
        raise ValueError(f"--resume: no verdict log at {path} to resume from")
    return path


def cmd_score(args) -> int:
    verdict_log = _verdict_log_path(args)
    summary = score_file(
        Path(args.input),
        args.reward_file,
        args.reward_name,
        group_size=args.group_size,
        config=_pairs(args.set, "set"),
        reward_kwargs=_pairs(args.kwarg, "kwarg"),
        output_path=Path(args.output) if args.output else None,
        response_key=args.response_key,
        verdict_log=verdict_log,
        resume=args.resume,
        accept_reward_change=args.accept_reward_change,
    )
    print("summary:")
    _print_summary(summary)
    if args.summary_json:
        Path(args.summary_json).write_text(json.dumps(summary, indent=2))
    if summary.get("interrupted"):
        print(f"error: {summary['error']}", file=sys.stderr)
        return EXIT_INTERRUPTED
    if "error" in summary:
        print(f"error: scoring stopped: {summary['error']}", file=sys.stderr)
        return EXIT_SCORING_STOPPED
    return 0


def cmd_log(args) -> int:
    from verl_async_rm.verdict_log import read_log
    from verl_async_rm.verdict_report import render, summarize

    result = read_log(args.path)
    summary = summarize(result.records, slowest=args.slowest)
    if args.json:
        print(json.dumps({**summary, "torn_tail": result.torn_tail}, indent=2, default=str))
    else:
        print(render(summary, args.path, result.torn_tail))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="verl-async-rm", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    score = sub.add_parser("score", help="score a JSONL file of responses through the agent")
    score.add_argument("--input", required=True, help="JSONL: solution_str, ground_truth, data_source, uid, extra_info")
    score.add_argument("--reward-file", required=True, help="path of the Python file with the reward")
    score.add_argument("--reward-name", default="compute_score", help="function or class in that file")
    score.add_argument("--group-size", type=int, default=1, help="samples per uid (GRPO group)")
    score.add_argument("--response-key", default="solution_str", help="JSON field holding the response")
    score.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="agent setting, repeatable")
    score.add_argument("--kwarg", action="append", default=[], metavar="KEY=VALUE", help="reward kwarg, repeatable")
    score.add_argument("--output", help="write each row with its score here (JSONL)")
    score.add_argument("--summary-json", help="write the summary here")
    score.add_argument("--verdict-log", help="append every settled sample here (default: <output>.verdicts.jsonl)")
    score.add_argument("--no-verdict-log", action="store_true", help="keep no verdict log")
    score.add_argument("--resume", action="store_true",
                       help="answer samples already scored in the verdict log from it (complete an interrupted run)")
    score.add_argument("--accept-reward-change", action="store_true",
                       help="with --resume: reuse a verdict log written by another reward, or another version of this "
                            "one (refused otherwise, both named)")
    score.set_defaults(func=cmd_score)

    log = sub.add_parser("log", help="read a verdict log: per-step summaries, failure kinds, slowest requests, cost")
    log.add_argument("path")
    log.add_argument("--slowest", type=int, default=5, help="how many of the slowest requests to show")
    log.add_argument("--json", action="store_true", help="print the summary as JSON")
    log.set_defaults(func=cmd_log)

    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, FileNotFoundError, AttributeError, TypeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
