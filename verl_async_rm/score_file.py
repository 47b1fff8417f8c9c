"""Score a JSONL file of responses through the agent: progress while groups finish, a summary at the end."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Mapping

import numpy as np
from tqdm import tqdm

from verl_async_rm.agent import RewardAgent
from verl_async_rm.outcome import RewardError

ITEM_KEYS = ("solution_str", "ground_truth", "data_source", "extra_info", "uid")
FIRST_FAILURES = 3  # failure messages shown in the summary


def read_items(path: Path, response_key: str = "solution_str") -> tuple[list[dict], list[dict]]:
    rows, items = [], []
    with path.open() as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{line_no}: not valid JSON ({exc.msg})") from None
            if response_key not in row:
                raise ValueError(f"{path}:{line_no}: no {response_key!r} field (keys: {sorted(row)})")
            item = {key: row[key] for key in ITEM_KEYS if key in row}
            item["solution_str"] = row[response_key]
            item["index"] = len(items)
            rows.append(row)
            items.append(item)
    return rows, items


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
    progress: bool = True,
    verdict_log: Path | None = None,
    resume: bool = False,
    accept_reward_change: bool = False,
) -> dict:
    """Score every row; returns the summary. If scoring stops (``RewardError``: the failure budget,
    the ``raise`` policy, the judge budget) or is interrupted (Ctrl-C: ``interrupted`` in the
    summary), the summary says why under ``error``, and the output still holds every score computed
    until then (the others are null). ``verdict_log``: every settled sample is appended there as it
    settles (a kill loses nothing settled); ``resume``: samples already scored in it are answered
    from it, not sent again, so a rerun completes an interrupted one; ``accept_reward_change``: even
    if another reward (or another version of this one) wrote it."""
    rows, items = read_items(Path(input_path), response_key)
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
    with RewardAgent.from_file(reward_path, reward_name, config, reward_kwargs=reward_kwargs) as agent:
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
    if output_path is not None:
        with Path(output_path).open("w") as f:
            for row, score, extra in zip(rows, scores, extras):
                f.write(json.dumps({**row, "score": score, "reward_extra_info": extra}, default=str) + "\n")
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
    if verdict_log is not None:
        summary["resumed"] = metrics["resumed"]
        summary["verdict_log"] = str(verdict_log)
    if error is not None:
        summary["error"] = f"{type(error).__name__}: {error}"
    if interrupted:
        summary["interrupted"] = True
        summary["error"] = (f"interrupted: {summary['scored']} of {len(items)} scores kept"
                            + (f"; rerun with --resume to complete (verdict log {verdict_log})" if verdict_log else ""))
    return summary
