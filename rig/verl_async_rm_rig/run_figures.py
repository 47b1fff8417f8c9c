"""What one end-to-end run's files say, beyond verl's metrics (parsed data in, figures out; the two
readers of verl's dumps and the judge log are here too).

bench/e2e.py and the demo (demo.py: its lanes are the benchmark's runs) read the files and hand their
contents here:

- the step clock (cpu_backend/start_gate.py): each step's wall-clock start, from which the
  training-loop time runs from the start gate to the last step's end, so what a trainer does between
  the gate and step 1 (0.7-5 s for the strategies' set-up; verl's warm-up batches) and between steps
  counts, and the judge calls are drawn where they happened;
- the loopback judge server's per-request records (judge_real): what the judge saw during the
  training loop (requests, 429s, goodput against its token bucket);
- verl's rollout dumps (``trainer.rollout_data_dir``, ``trainer.validation_data_dir``) joined with the
  judge log (``judge_calls.jsonl``): the samples the updates trained on a failed call's 0, and the
  toy reward the policy really earns (the toy task's own score of every dumped response, whatever
  the judge answered or failed to).
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Iterable, Optional, Sequence

from verl_async_rm_rig.cpu_backend.judged_toy import sample_key
from verl_async_rm_rig.cpu_backend.toy_task import score_text

SCORE_EPS = 1e-6  # verl dumps rm_scores as float32: the toy score's float64 agrees to ~1e-7
THROTTLED = ("429", "rate_limited", "storm")  # the judge server's outcomes answered with HTTP 429


# ------------------------------------------------------------------------------------------------
# the step clock
# ------------------------------------------------------------------------------------------------

def step_offsets(loop_start: float, step_starts: Sequence[float], step_times: Sequence[float]) -> Optional[list[float]]:
    """Each step's start in seconds from the loop's start (the gate), or None when the clock does not
    cover every step (v0's trainer has none; a clock with another count of lines is not trusted)."""
    if not step_starts or len(step_starts) != len(step_times):
        return None
    offsets = [start - loop_start for start in step_starts]
    if offsets[0] < -0.5 or any(b < a for a, b in zip(offsets, offsets[1:])):
        raise ValueError(f"the step clock is not after the gate and in order: {offsets}")
    return [max(0.0, o) for o in offsets]


def loop_wall(offsets: Sequence[float], step_times: Sequence[float]) -> float:
    """The training loop from the gate to the last step's end: every step's timer, the time before
    step 1 and the time between steps."""
    return float(offsets[-1] + step_times[-1])


# ------------------------------------------------------------------------------------------------
# the judge server's view of the loop (judge_real)
# ------------------------------------------------------------------------------------------------

def judge_window(records: Iterable[tuple[float, Optional[str], Optional[float]]], start: float, end: float,
                 capacity: float, refill_per_s: float, trained_samples: int) -> dict:
    """The judge server's requests that arrived in the loop ``[start, end]`` (``records``: (arrived,
    outcome, finished) in the server's clock; ``start``/``end`` in the same clock).

    - goodput: answered (``ok``) requests over the most the bucket admits in the window
      (capacity + refill x duration), the share of the server's limit that became scores;
    - 429s after the first second: of the requests that arrived after ``start + 1``, the share
      answered 429 (the opening burst into a full bucket is the client's first probe);
    - requests per trained sample: every request of the window (retries, refusals) over the samples
      the updates trained on."""
    mine = [(a, o) for a, o, _ in records if start <= a <= end]
    duration = max(0.0, end - start)
    late = [o for a, o in mine if a > start + 1.0]
    answered = sum(o == "ok" for _, o in mine)
    allowance = capacity + refill_per_s * duration
    outcomes: dict[str, int] = defaultdict(int)
    for _, o in mine:
        outcomes[str(o)] += 1
    return {
        "requests": len(mine), "answered": answered, "throttled": sum(o in THROTTLED for _, o in mine),
        "outcomes": dict(sorted(outcomes.items())),
        "goodput_of_limit": answered / allowance if allowance > 0 else None,
        "throttled_after_first_second": (sum(o in THROTTLED for o in late) / len(late)) if late else 0.0,
        "requests_per_trained_sample": len(mine) / trained_samples if trained_samples else None,
        "window_s": round(duration, 3), "limit_per_s": refill_per_s, "burst": capacity,
    }


# ------------------------------------------------------------------------------------------------
# rollout dumps and the judge log
# ------------------------------------------------------------------------------------------------

def calls_by_key(calls: Iterable[dict]) -> dict[str, list[str]]:
    """Judge-log outcomes per sample key (lines without a key, the simulated judge's, are left out)."""
    out: dict[str, list[str]] = defaultdict(list)
    for call in calls:
        if call.get("key"):
            out[call["key"]].append(call.get("outcome", "?"))
    return dict(out)


def true_score(row: dict) -> float:
    """The toy task's own score of a dumped response: what a judge that answered would have given."""
    return float(score_text(row["output"], str(row["gts"])))


def trained_on_failures(rows: Iterable[dict], outcomes_by_key: dict[str, list[str]]) -> dict:
    """Of the rows the updates trained on (verl's rollout dump): those whose score is a failed call's 0.

    A row is counted when its dumped score is 0 and either the toy task scores its response above 0
    (an answering judge never gives it 0: the 0 is a failure's), or every judge call for its response
    failed (no answer to give it). A row whose response scores 0 anyway and whose response was both
    answered and failed (the same text sampled twice) cannot be told apart: counted as ``ambiguous``.
    ``scored_off``: rows whose dumped score is not the toy score at all (any failure's fill value, 0
    or another); ``unjoined``: rows the judge log has no call for (the log is incomplete)."""
    figures = {"rows": 0, "failed_scored_zero": 0, "ambiguous": 0, "scored_off": 0, "unjoined": 0}
    for row in rows:
        figures["rows"] += 1
        truth, dumped = true_score(row), float(row["score"])
        if abs(dumped - truth) > SCORE_EPS:
            figures["scored_off"] += 1
        key_outcomes = outcomes_by_key.get(sample_key(row["output"], row["gts"]))
        if outcomes_by_key and key_outcomes is None:
            figures["unjoined"] += 1
        if abs(dumped) > SCORE_EPS:
            continue
        if truth > SCORE_EPS:
            figures["failed_scored_zero"] += 1
        elif key_outcomes and "ok" not in key_outcomes:
            figures["failed_scored_zero"] += 1
        elif key_outcomes and any(o != "ok" for o in key_outcomes):
            figures["ambiguous"] += 1
    return figures


def read_dumps(folder: Path) -> dict[int, list[dict]]:
    """verl's dump folder: step -> its rows. Rows split on "\n" alone: verl writes them with
    ensure_ascii=False, and a sampled response may hold U+2028, on which str.splitlines also splits."""
    out = {}
    for path in folder.glob("*.jsonl") if folder.is_dir() else []:
        if path.stem.isdigit():
            out[int(path.stem)] = [json.loads(line) for line in path.read_text(encoding="utf-8").split("\n") if line]
    return out


def read_jsonl(path: Path) -> list[dict]:
    """A JSONL log's rows (the judge log), a line cut by a killed writer left out."""
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().split("\n"):
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # the empty tail, or a line cut by a killed writer
    return rows


def mean_true_score(rows: Sequence[dict]) -> Optional[float]:
    return sum(true_score(r) for r in rows) / len(rows) if rows else None


def dump_figures(train_dumps: dict[int, list[dict]], val_dumps: dict[int, list[dict]], calls: list[dict],
                 final_steps: int) -> dict:
    """Per run: the trained-on-failures counts over every step's dump, the toy reward the policy
    earned (true score) over the last ``final_steps`` steps' batches and in the last validation,
    and the judge log's calls per split."""
    by_key = calls_by_key(calls)
    steps = sorted(train_dumps)
    rows = [row for step in steps for row in train_dumps[step]]
    last = [row for step in steps[-final_steps:] for row in train_dumps[step]]
    val_steps = sorted(val_dumps)
    per_split: dict[str, int] = defaultdict(int)
    for call in calls:
        per_split[str(call.get("split"))] += 1
    return {
        **trained_on_failures(rows, by_key),
        "toy_final_true": mean_true_score(last),
        "val_first_true": mean_true_score(val_dumps[val_steps[0]]) if val_steps else None,
        "val_final_true": mean_true_score(val_dumps[val_steps[-1]]) if len(val_steps) > 1 else None,
        "judge_calls_by_split": dict(per_split),
    }
