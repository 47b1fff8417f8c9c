"""Command line: ``verl-async-rm score ...`` (score a file of responses), ``verl-async-rm log`` (read a verdict log) and
``verl-async-rm replay`` (re-judge a verdict log with another reward, report the agreement)."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from verl_async_rm.score_file import check_writable, score_file


def _key_value(text: str) -> tuple[str, Any]:
    """An argparse type: ``key=value``, the value parsed as YAML (``8`` -> int, ``null`` -> None).
    Refused by argparse itself (exit 2, the option named) when malformed."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"expects KEY=VALUE, got {text!r}")
    try:
        return key.strip(), yaml.safe_load(value)
    except yaml.YAMLError as exc:
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise argparse.ArgumentTypeError(f"{text!r}: the value is not valid YAML ({problem})") from None


def _positive_int(text: str) -> int:
    return _int_at_least(text, 1, "a positive integer")


def _non_negative_int(text: str) -> int:
    return _int_at_least(text, 0, "a non-negative integer")


def _int_at_least(text: str, least: int, what: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expects {what}, got {text!r}") from None
    if value < least:
        raise argparse.ArgumentTypeError(f"expects {what}, got {value}")
    return value


EXIT_SCORING_STOPPED = 3  # (2: bad arguments or input)
EXIT_INTERRUPTED = 130  # Ctrl-C, as shells report SIGINT


class _Stop:
    """Which signal stopped the run: the exit status is 128 + its number, as shells report it."""

    def __init__(self) -> None:
        self.signum: int = signal.SIGINT
        self.terminated = False

    @property
    def exit_status(self) -> int:
        return 128 + self.signum


@contextlib.contextmanager
def _terminate_as_interrupt() -> Iterator[_Stop]:
    """SIGTERM (what schedulers, ``kill`` and ``timeout`` send) stops the run as Ctrl-C does: the
    groups scored so far are written and the run says so. Only the first SIGTERM interrupts: the
    ones after it would cut the writing of what was kept. A SIGTERM ignored by whoever started us
    (``nohup``-style) stays ignored."""
    stop = _Stop()
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGTERM) is signal.SIG_IGN:
        yield stop
        return

    def on_terminate(signum, frame) -> None:
        if stop.terminated:
            return
        stop.signum, stop.terminated = signum, True
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, on_terminate)
    try:
        yield stop
    finally:
        signal.signal(signal.SIGTERM, previous)


def _check_paths(named: dict, written: tuple[str, ...]) -> None:
    """Every path a command reads or writes (flag -> path or None), checked before the first request is
    paid for: no two naming the same file (a run must never append to what it reads), and each of
    ``written`` writable."""
    seen: dict[str, str] = {}
    for flag, path in named.items():
        if path is None:
            continue
        real = os.path.realpath(path)
        if os.path.exists(real) and not os.path.isfile(real):  # /dev/stdout and the like: nothing to clash with
            continue
        if real in seen:
            raise ValueError(f"{flag} and {seen[real]} name the same file ({path}): name a different one")
        seen[real] = flag
    for flag in written:
        if named[flag] is not None:
            check_writable(Path(named[flag]), flag)


def _check_outputs(args, verdict_log: Path | None) -> None:
    from verl_async_rm.verdict_log import inputs_path

    kept = inputs_path(verdict_log) if verdict_log is not None and dict(args.set).get("verdict_log_inputs") is True else None
    _check_paths({"--input": args.input, "--output": args.output, "--summary-json": args.summary_json,
                  "--verdict-log": verdict_log, "the inputs kept beside --verdict-log": kept},
                 written=("--output", "--summary-json"))


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
    _check_outputs(args, verdict_log)
    warnings_given: list[str] = []

    def warn(message: str) -> None:
        warnings_given.append(message)
        print(f"warning: {message}", file=sys.stderr)

    with _terminate_as_interrupt() as stop:
        try:
            summary = score_file(
                Path(args.input),
                args.reward_file,
                args.reward_name,
                group_size=args.group_size,
                config=dict(args.set),
                reward_kwargs=dict(args.kwarg),
                output_path=Path(args.output) if args.output else None,
                response_key=args.response_key,
                ground_truth_key=args.ground_truth_key,
                verdict_log=verdict_log,
                resume=args.resume,
                accept_reward_change=args.accept_reward_change,
                warn=warn,
            )
        except KeyboardInterrupt:  # while the reward loaded, or the output was being written: no summary
            print("error: interrupted before the output was complete"
                  + (f"; every settled verdict is in {verdict_log}: rerun with --resume" if verdict_log else ""),
                  file=sys.stderr)
            return stop.exit_status
        print("summary:")
        _print_summary(summary)
        if args.summary_json:
            Path(args.summary_json).write_text(json.dumps(summary, indent=2))
        for message in warnings_given:  # again, below the summary: it is what explains a mean of 0
            print(f"warning: {message}", file=sys.stderr)
        if summary.get("interrupted"):
            print(("error: SIGTERM: " if stop.terminated else "error: ") + summary["error"], file=sys.stderr)
            return stop.exit_status
    if "error" in summary:
        print(f"error: scoring stopped: {summary['error']}", file=sys.stderr)
        return EXIT_SCORING_STOPPED
    return 0


def cmd_log(args) -> int:
    from verl_async_rm.verdict_log import read_log
    from verl_async_rm.verdict_report import render, summarize

    path = Path(args.path)
    if path.is_dir():
        logs = sorted(p.name for p in path.glob("*.verdicts.jsonl"))
        raise ValueError(f"log: {path} is a directory; name a verdict log file"
                         + (f", e.g. {path / logs[0]}" if logs else " (the default is <output>.verdicts.jsonl)"))
    result = read_log(path)
    try:
        summary = summarize(result.records, slowest=args.slowest)
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None
    if args.json:
        print(json.dumps({**summary, "torn_tail": result.torn_tail}, indent=2, default=str))
    else:
        print(render(summary, args.path, result.torn_tail))
    return 0


def _steps(text: str) -> frozenset[int]:
    from verl_async_rm.replay import parse_steps

    try:
        return parse_steps(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _share(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expects a share in (0, 1], got {text!r}") from None
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"expects a share in (0, 1], got {value}")
    return value


def _check_replay_paths(args, replay_log: Path) -> None:
    from verl_async_rm.verdict_log import inputs_path

    kept = str(inputs_path(args.log)) if args.input is None else None  # read instead of --input
    _check_paths({"--log": args.log, "--input": args.input, "the inputs kept beside --log": kept, "--output": args.output,
                  "--plot": args.plot, "--verdict-log": replay_log}, written=("--output", "--plot", "--verdict-log"))
    if args.plot is not None:
        from verl_async_rm.replay_plot import check_can_plot

        check_can_plot()


def _shown_command(argv: list[str]) -> list[str]:
    """The command as the report records it: ``--kwarg``/``--set`` values of secret-looking names
    hidden and credentials cut out of URLs, as the verdict log shows a reward's kwargs."""
    from verl_async_rm.verdict_log import shown

    out, after_option = [], False
    for arg in argv:
        option, inline, value = arg.partition("=") if arg.startswith(("--kwarg=", "--set=")) else (None, "", arg)
        if after_option or option is not None:
            key, sep, raw = value.partition("=")
            if sep:
                value = f"{key}={shown({key: raw})[key]}"
            arg = f"{option}={value}" if option is not None else value
        out.append(arg)
        after_option = arg in ("--kwarg", "--set")
    return ["verl-async-rm", *out]


def cmd_replay(args) -> int:
    from verl_async_rm.replay import Selection, render_replay, replay, write_report

    selection = Selection(args.steps, args.groups, args.sample_frac, args.seed)
    if args.input is not None and not Path(args.input).is_file():
        raise ValueError(f"--input {args.input}: no such file")
    replay_log = Path(args.verdict_log) if args.verdict_log else Path(f"{args.output}.verdicts.jsonl")
    _check_replay_paths(args, replay_log)

    def announce(selected) -> None:
        print(f"replaying {len(selected.chosen)} samples in {selected.groups} groups of {args.log} "
              f"(judged by {selected.old_reward_described})", file=sys.stderr, flush=True)

    with _terminate_as_interrupt() as stop:
        report = replay(Path(args.log), Path(args.input) if args.input is not None else None, args.reward_file, args.reward_name, replay_log,
                        selection=selection, old_reward=args.old_reward, config=dict(args.set),
                        reward_kwargs=dict(args.kwarg), response_key=args.response_key,
                        ground_truth_key=args.ground_truth_key, progress=not args.quiet, on_selected=announce)
        report["run"]["command"] = _shown_command(args.argv)
        write_report(report, Path(args.output))
        if args.plot is not None:
            from verl_async_rm.replay_plot import plot_replay

            plot_replay(report, Path(args.plot))
        print(render_replay(report))
        run = report["run"]
        if run["interrupted"]:
            print(("error: SIGTERM: " if stop.terminated else "error: ") + "interrupted: the report covers what was "
                  f"judged; rerun the same command to complete it (every answer is kept in {replay_log})", file=sys.stderr)
            return stop.exit_status
    if run["error"] is not None:
        print(f"error: re-judging stopped: {run['error']}; the report covers what was judged", file=sys.stderr)
        return EXIT_SCORING_STOPPED
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="verl-async-rm", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    score = sub.add_parser("score", help="score a JSONL file of responses through the agent")
    score.add_argument("--input", required=True, help="JSONL: solution_str, ground_truth, data_source, uid, extra_info")
    score.add_argument("--reward-file", required=True, help="path of the Python file with the reward")
    score.add_argument("--reward-name", default="compute_score", help="function or class in that file")
    score.add_argument("--group-size", type=_positive_int, default=1, help="samples per uid (GRPO group)")
    score.add_argument("--response-key", default="solution_str", help="JSON field holding the response")
    score.add_argument("--ground-truth-key", default="ground_truth",
                       help="JSON field holding the reference the reward gets as ground_truth (named: required in every row)")
    score.add_argument("--set", action="append", type=_key_value, default=[], metavar="KEY=VALUE",
                       help="agent setting (the value read as YAML), repeatable")
    score.add_argument("--kwarg", action="append", type=_key_value, default=[], metavar="KEY=VALUE",
                       help="reward kwarg (the value read as YAML), repeatable")
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
    log.add_argument("--slowest", type=_non_negative_int, default=5, help="how many of the slowest requests to show")
    log.add_argument("--json", action="store_true", help="print the summary as JSON")
    log.set_defaults(func=cmd_log)

    replay = sub.add_parser("replay", help="re-judge what a verdict log judged with another reward; report the agreement")
    replay.add_argument("--log", required=True, help="the verdict log of the run to replay")
    replay.add_argument("--input",
                        help="the JSONL file that run scored: a verdict record keeps only a hash of what it judged "
                        "(default: the inputs the run kept beside its log, with verdict_log_inputs=true)")
    replay.add_argument("--reward-file", required=True, help="path of the Python file with the new reward")
    replay.add_argument("--reward-name", default="compute_score", help="function or class in that file")
    replay.add_argument("--kwarg", action="append", type=_key_value, default=[], metavar="KEY=VALUE",
                        help="new reward kwarg (the value read as YAML), repeatable")
    replay.add_argument("--set", action="append", type=_key_value, default=[], metavar="KEY=VALUE",
                        help="agent setting: limits, budget, prices (the value read as YAML), repeatable")
    replay.add_argument("--old-reward", help="the id of the reward to replay, when the log holds several")
    replay.add_argument("--steps", type=_steps, help="only these steps (1-based, as `log` numbers them): 3-5,7")
    replay.add_argument("--groups", type=_positive_int, help="a sample of N whole GRPO groups (uid within a step)")
    replay.add_argument("--sample-frac", type=_share, help="a sample of this share of the groups")
    replay.add_argument("--seed", type=int, default=0, help="seed of the group sample")
    replay.add_argument("--response-key", default="solution_str", help="as `score --response-key`")
    replay.add_argument("--ground-truth-key", default="ground_truth", help="as `score --ground-truth-key`")
    replay.add_argument("--output", required=True, help="write the report here (JSON)")
    replay.add_argument("--verdict-log", help="the new reward's verdict log, resumed if it exists "
                                              "(default: <output>.verdicts.jsonl)")
    replay.add_argument("--plot", help="draw old vs new scores here (PNG; needs matplotlib)")
    replay.add_argument("--quiet", action="store_true", help="no progress bar")
    replay.set_defaults(func=cmd_replay)

    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # the report says how it was made
    try:
        return args.func(args)
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except (ValueError, OSError, AttributeError, TypeError, ImportError) as exc:  # OSError: FileNotFoundError, IsADirectoryError, ...
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
