"""Score a JSONL file of responses through the agent: progress while groups finish, a summary at the end."""

from __future__ import annotations

import json
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Mapping

import numpy as np
from tqdm import tqdm

from verl_async_rm.agent import RewardAgent, as_item
from verl_async_rm.errors import RewardError

ITEM_KEYS = ("solution_str", "ground_truth", "data_source", "extra_info", "uid")
FIRST_FAILURES = 3  # failure messages shown in the summary


REFERENCE_KEY = "ground_truth"


def read_items(path: Path, response_key: str = "solution_str",
               ground_truth_key: str = REFERENCE_KEY) -> tuple[list[dict], list[dict]]:
    """Rows as read, and the items the agent scores (checked here, so a bad row is named by its line
    before anything is paid for). A ``ground_truth_key`` other than the default is required in
    every row: the user said where the reference is."""
    rows, items = [], []
    with path.open() as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{line_no}: not valid JSON ({exc.msg})") from None
            if not isinstance(row, dict):
                raise ValueError(f"{path}:{line_no}: a row must be a JSON object, got {type(row).__name__}")  # noqa: TRY004 - bad input, as every error here
            if response_key not in row:
                raise ValueError(f"{path}:{line_no}: no {response_key!r} field (keys: {sorted(row)})")
            if ground_truth_key != REFERENCE_KEY and ground_truth_key not in row:
                raise ValueError(f"{path}:{line_no}: no {ground_truth_key!r} field (--ground-truth-key; keys: {sorted(row)})")
            item = {key: row[key] for key in ITEM_KEYS if key in row and key != REFERENCE_KEY}
            item["solution_str"] = row[response_key]
            if ground_truth_key in row:
                item[REFERENCE_KEY] = row[ground_truth_key]
            item["index"] = len(items)
            try:
                as_item(item, item["index"])
            except (TypeError, ValueError) as exc:
                raise ValueError(f"{path}:{line_no}: {exc}") from None
            rows.append(row)
            items.append(item)
    if not items:
        raise ValueError(f"{path} holds no rows: nothing to score")
    return rows, items


def missing_reference_warning(rows: list[dict], items: list[dict], response_key: str) -> str | None:
    """What to say when rows carry no reference: a reward comparing against ``ground_truth`` then
    scores every such row as wrong, with no failure anywhere (rc 0, ``failed 0``, mean 0)."""
    missing = without_reference(items)
    if not missing:
        return None
    others = sorted({key for row in rows for key in row} - set(ITEM_KEYS) - {response_key})
    hint = (f"; the rows carry {others}: if one of them is the reference, pass --ground-truth-key NAME"
            if others else "")
    if missing == len(items):
        return (f"no row has a {REFERENCE_KEY!r} field: the reward gets ground_truth=None for every row, "
                f"and a reward that compares against it scores them all as wrong{hint}")
    return f"{missing} of {len(items)} rows have no {REFERENCE_KEY!r} field (the reward gets ground_truth=None for them){hint}"


def without_reference(items: list[dict]) -> int:
    return sum(REFERENCE_KEY not in item for item in items)


def check_writable(path: Path, what: str) -> None:
    """Refuse an output path that cannot be written, before the first request is paid for. Tried
    by opening it for appending (then removed again if the probe created it): permission bits
    alone say nothing for root or on a read-only mount."""
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"{what} {path} is a directory; name a file, e.g. {path / 'scored.jsonl'}")
    folder = path.parent
    if not folder.is_dir():
        raise ValueError(f"{what} {path}: the folder {folder} does not exist")
    existed = path.exists()
    try:
        with path.open("a"):
            pass
    except OSError as exc:
        raise ValueError(f"{what} {path} cannot be written: {exc.strerror or exc}") from None
    if not existed:
        path.unlink(missing_ok=True)


def score_file(
    input_path: Path,
    reward_path: str,
    reward_name: str,
    *,
    group_size: int = 1,
    config: Mapping | None = None,
    reward_kwargs: Mapping | None = None,
    output_path: Path | None = None,
    response_key: str = "solution_str",
    ground_truth_key: str = REFERENCE_KEY,
    progress: bool = True,
    verdict_log: Path | None = None,
    resume: bool = False,
    accept_reward_change: bool = False,
    warn: Callable[[str], None] | None = None,
) -> dict:
    """Score every row; returns the summary. If scoring stops (``RewardError``: the failure budget,
    the ``raise`` policy, the judge budget) or is interrupted (Ctrl-C: ``interrupted`` in the
    summary), the summary says why under ``error``, and the output holds the rows of the groups
    scored until then, and only those (a row with a null score would read as scored by a reader
    that skips nulls). ``verdict_log``: every settled sample is appended there as it settles (a
    kill loses nothing settled); ``resume``: samples already scored in it are answered from it,
    not sent again, so a rerun completes an interrupted one; ``accept_reward_change``: even if another
    reward (or another version of this one) wrote it. ``warn``: told about rows without a
    reference (default: ``warnings.warn``)."""
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1:
        raise ValueError(f"group_size must be a positive integer, got {group_size!r}")
    rows, items = read_items(Path(input_path), response_key, ground_truth_key)
    if output_path is not None:
        check_writable(Path(output_path), "output")
    reference_warning = missing_reference_warning(rows, items, response_key)
    if reference_warning is not None:
        (warn or (lambda message: warnings.warn(message, UserWarning, stacklevel=3)))(reference_warning)
    config = dict(config or {})
    if verdict_log is not None:
        config["verdict_log"] = str(verdict_log)
        config["verdict_log_resume"] = resume
        config["verdict_log_accept_reward_change"] = accept_reward_change
    scores: list[float | None] = [None] * len(items)
    extras: list[dict] = [{} for _ in items]
    groups = max(1, len(items) // group_size)
    chunk_size = group_size * max(1, groups // 200)  # ~200 progress updates whatever the size
    error: RewardError | None = None
    interrupted = False
    start = time.perf_counter()
    agent = RewardAgent.from_file(reward_path, reward_name, config, reward_kwargs=reward_kwargs)
    try:
        ticket = agent.submit(items, group_size)
        with tqdm(total=len(items), unit="sample", desc="scoring", disable=not progress) as bar:
            try:
                while chunk := agent.get(ticket, chunk_size):
                    for position, index in enumerate(chunk.indices):
                        scores[index] = chunk.scores[position]
                        extras[index] = {k: v[position] for k, v in chunk.extra_info.items() if v[position] is not None}
                    bar.update(len(chunk))
            except RewardError as exc:
                error = exc
            except KeyboardInterrupt:  # keep every score computed; closing the agent flushes the log
                interrupted = True
        metrics = agent.metrics()
        wall = time.perf_counter() - start
        if output_path is not None:  # before closing: a second Ctrl-C while the agent closes loses no scores
            with Path(output_path).open("w") as f:
                for row, score, extra in zip(rows, scores, extras):
                    if score is not None:  # groups are handed over whole: these are whole groups
                        f.write(json.dumps({**row, "score": score, "reward_extra_info": extra}, default=str) + "\n")
    finally:
        try:
            agent.close()
        except KeyboardInterrupt:  # pressed again while the agent closes: what was kept is written already
            interrupted = True
    values = np.array([s for s in scores if s is not None], dtype=float)
    failures = [extra["reward_error"] for extra in extras if extra.get("reward_failed")]
    summary = {
        "samples": len(items),
        "scored": int(sum(s is not None for s in scores)),
        "groups": len(items) // group_size,
        "mean_score": float(values.mean()) if len(values) else float("nan"),
        "failed": metrics["failed"],
        "failures_by_kind": metrics["failures_by_kind"],
        "first_failures": failures[:FIRST_FAILURES],
        "retries": metrics["retries"],
        "throttled": metrics["throttled"],
        "peak_in_flight": metrics["peak_in_flight"],
        "latency_p50_s": metrics["latency_p50"],
        "latency_p95_s": metrics["latency_p95"],
        "latency_max_s": metrics["latency_max"],
        "wall_time_s": wall,
        "samples_per_s": len(items) / wall if wall > 0 else float("inf"),
        "input_tokens": metrics["input_tokens"],
        "output_tokens": metrics["output_tokens"],
        "cost": metrics["cost"],
        "estimated_cost": metrics["estimated_cost"],
    }
    judges: dict = {}
    for key, value in metrics.items():  # a judge list's figures (engine/fallback.py): per judge
        if key.startswith("judge/"):
            _, name, figure = key.split("/", 2)
            judges.setdefault(name, {})[figure] = value
    if judges:
        summary["judges"] = judges
    calibration = {key.split("/", 1)[1]: value for key, value in metrics.items() if key.startswith("calibration/")}
    if calibration:
        summary["calibration"] = calibration
    if reference_warning is not None:
        summary["rows_without_reference"] = without_reference(items)
    if verdict_log is not None:
        summary["resumed"] = metrics["resumed"]
        summary["verdict_log"] = str(verdict_log)
    kept = (f"; the output holds only the {summary['scored']} rows scored" if output_path is not None
            and summary["scored"] < len(items) else "")
    if error is not None:
        summary["error"] = f"{type(error).__name__}: {error}{kept}"
    if interrupted:
        summary["interrupted"] = True
        summary["error"] = (f"interrupted: {summary['scored']} of {len(items)} scores kept{kept}"
                            + (f"; rerun with --resume to complete (verdict log {verdict_log})" if verdict_log else ""))
    return summary
