"""``verl-async-rm log <path>``: what the judge said, read back from a verdict log (verdict_log.py).
Pure summaries of the records, and their printing."""

from __future__ import annotations

import math
from collections import Counter
from typing import Iterable

import numpy as np

STREAM = "(per-sample path)"  # records without a ticket: the reward loop's samples, one at a time


def sample_outcomes(records: Iterable[dict]) -> list[dict]:
    """One record per sample, as it ended: a group hook's failure (``"stage": "hook"``) replaces the
    failure fields of its sample's record (found by ``sample``); the judge's timing and usage stay."""
    samples: list[dict] = []
    at: dict[str, int] = {}
    for record in records:
        sample = record.get("sample")
        if record.get("stage") == "hook" and sample in at:
            base = samples[at[sample]]
            samples[at[sample]] = {**base, "failure": record.get("failure"), "error": record.get("error")}
            continue
        if sample is not None:
            at[sample] = len(samples)
        samples.append(record)
    return samples


def _stats(records: list[dict]) -> dict:
    scores = [r["score"] for r in records if r.get("failure") is None and r.get("score") is not None]
    latencies = np.array([r["latency_s"] for r in records if r.get("latency_s") is not None], dtype=float)
    tokens_in = sum(r.get("input_tokens") or 0 for r in records)
    tokens_out = sum(r.get("output_tokens") or 0 for r in records)
    costs = [r["cost"] for r in records if r.get("cost") is not None]
    return {
        "samples": len(records),
        "scored": len(scores),
        "failed": len(records) - len(scores),
        "mean_score": float(np.mean(scores)) if scores else math.nan,
        "input_tokens": tokens_in,
        "output_tokens": tokens_out,
        "cost": float(math.fsum(costs)),
        "latency_p50_s": float(np.percentile(latencies, 50)) if len(latencies) else math.nan,
        "latency_p95_s": float(np.percentile(latencies, 95)) if len(latencies) else math.nan,
        "latency_max_s": float(latencies.max()) if len(latencies) else math.nan,
    }


# The fields the summary computes with, and what they must hold (null aside). A record that breaks
# them (hand-edited, or another program's JSON lines) is refused by name, not met by a TypeError
# deep in numpy or a dict lookup.
FIELD_TYPES: dict[str, tuple[type, ...]] = {
    "ticket": (str,), "failure": (str,), "verdict": (str,),
    "score": (int, float), "latency_s": (int, float), "request_s": (int, float), "cost": (int, float),
    "input_tokens": (int,), "output_tokens": (int,),
}


def record_problem(record: dict) -> str | None:
    for name, types in FIELD_TYPES.items():
        value = record.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, types)):
            expected = " or ".join(t.__name__ for t in types)
            return f"{name!r} is a {type(value).__name__} ({value!r:.60}); a verdict log has a {expected} or null there"
    return None


def summarize(records: Iterable[dict], slowest: int = 5, examples: int = 2) -> dict:
    """Totals, one entry per step (ticket, in order of first appearance), failure kinds with their
    first messages, and the slowest requests. A record with a field of the wrong type raises
    ValueError, naming the record (its number among the records) and the field."""
    records = list(records)
    for number, record in enumerate(records, 1):
        problem = record_problem(record)
        if problem is not None:
            raise ValueError(f"record {number} (key {str(record.get('key'))[:16]}): {problem}")
    if slowest < 0:
        raise ValueError(f"slowest must be >= 0, got {slowest}")
    records = sample_outcomes(records)
    steps: dict[str, list[dict]] = {}
    for record in records:
        steps.setdefault(record.get("ticket") or STREAM, []).append(record)
    kinds = Counter(r["failure"] for r in records if r.get("failure") is not None)
    messages: dict[str, list[str]] = {}
    for record in records:
        kind = record.get("failure")
        if kind is not None and len(messages.setdefault(kind, [])) < examples:
            messages[kind].append(str(record.get("error")))
    timed = [r for r in records if r.get("request_s") is not None]  # sent -> answered; queueing apart
    timed.sort(key=lambda r: r["request_s"], reverse=True)
    return {
        "total": _stats(records),
        "steps": [{"step": number, "ticket": ticket, **_stats(rows)} for number, (ticket, rows) in enumerate(steps.items(), 1)],
        "failures_by_kind": dict(kinds.most_common()),
        "failure_examples": messages,
        "slowest": [
            {key: r.get(key) for key in ("ticket", "index", "uid", "request_s", "latency_s", "attempts", "failure", "score", "verdict")}
            for r in timed[:slowest]
        ],
    }


def _fmt(value) -> str:
    if isinstance(value, float):
        return "nan" if math.isnan(value) else f"{value:.4g}"
    return str(value)


def render(summary: dict, path: str, torn_tail: bool) -> str:
    total = summary["total"]
    lines = [f"verdict log {path}: {total['samples']} samples" + (" (a torn last line was skipped)" if torn_tail else "")]
    lines.append("  " + "  ".join(f"{k}={_fmt(v)}" for k, v in total.items() if k != "samples"))
    lines.append("per step:")
    header = ("step", "ticket", "samples", "failed", "mean_score", "input_tokens", "output_tokens", "cost", "latency_p95_s")
    rows = [[_fmt(step[k]) for k in header] for step in summary["steps"]]
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)]
    lines.append("  " + "  ".join(h.rjust(w) for h, w in zip(header, widths)))
    lines += ["  " + "  ".join(c.rjust(w) for c, w in zip(row, widths)) for row in rows]
    lines.append("failures by kind:" + ("" if summary["failures_by_kind"] else " none"))
    for kind, count in summary["failures_by_kind"].items():
        lines.append(f"  {kind}: {count}")
        lines += [f"    e.g. {message[:300]}" for message in summary["failure_examples"].get(kind, [])]
    lines.append("slowest requests (last attempt, sent to answered):")
    for r in summary["slowest"]:
        verdict = "" if r["verdict"] is None else f"  verdict={r['verdict'][:80]!r}"
        outcome = f"failed ({r['failure']})" if r["failure"] else f"score={_fmt(r['score'])}"
        lines.append(f"  {_fmt(r['request_s'])}s (submit to settled {_fmt(r['latency_s'])}s)  ticket={r['ticket']} index={r['index']} uid={r['uid']!r} "
                     f"attempts={r['attempts']} {outcome}{verdict}")
    return "\n".join(lines)
