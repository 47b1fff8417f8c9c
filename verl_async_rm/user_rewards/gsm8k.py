"""GSM8K reward: extract the final answer from what a model actually writes and compare numerically.

Recognised answer statements: ``#### 18``, ``\\boxed{18}``, ``The answer is 18``, ``A: 18``. The LAST
statement in the text wins, whatever its kind (a model that writes "the answer is 7" and then corrects
itself with a final "A: 18" answered 18); without any, the last number in the text. Commas, ``$``,
units and a trailing period are tolerated.

Optional simulated latency, as in the recipe's experiment (uniform 1-40 s there): pass
``latency_lo``/``latency_hi`` seconds as reward kwargs. ``compute_score`` sleeps in its thread;
``compute_score_async`` sleeps on the event loop (cheaper for thousands of concurrent requests).
"""

from __future__ import annotations

import asyncio
import random
import re
import time

_NUMBER = r"(?:-\$|\$-|-|\$)?\s*\d[\d,]*(?:\.\d+)?"  # -5, $5, -$5, $-5
_PATTERNS = [
    re.compile(r"####\s*(" + _NUMBER + ")"),
    re.compile(r"\\boxed\{\s*(" + _NUMBER + r")[^}]*\}"),
    re.compile(r"answer\s+is\s*:?\s*(" + _NUMBER + ")", re.IGNORECASE),
    re.compile(r"(?:^|\n)\s*A\s*:\s*(" + _NUMBER + ")"),
]
_ANY_NUMBER = re.compile(_NUMBER)


def _to_number(text: str) -> float | None:
    cleaned = text.replace(",", "").replace("$", "").replace(" ", "").rstrip(".")
    try:
        return float(cleaned)
    except ValueError:
        return None


def extract_answer(text: str) -> float | None:
    """The model's final numeric answer, or None if it wrote no number."""
    statements = [(m.start(1), m.group(1)) for pattern in _PATTERNS for m in pattern.finditer(text)]
    if statements:
        return _to_number(max(statements)[1])  # the last statement in the text, whatever its kind
    numbers = _ANY_NUMBER.findall(text)
    return _to_number(numbers[-1]) if numbers else None


def parse_ground_truth(ground_truth) -> float:
    if isinstance(ground_truth, (int, float)):
        return float(ground_truth)
    text = str(ground_truth)
    value = extract_answer(text) if "####" in text else _to_number(text.strip())
    if value is None:
        raise ValueError(f"ground truth {ground_truth!r} is not a number")
    return value


def score_answer(solution_str: str, ground_truth) -> float:
    answer = extract_answer(solution_str)
    expected = parse_ground_truth(ground_truth)
    return float(answer is not None and abs(answer - expected) <= 1e-6 * max(1.0, abs(expected)))


def _latency(latency_lo: float | None, latency_hi: float | None) -> float:
    if latency_hi is None or latency_hi <= 0:
        return 0.0
    lo = latency_lo or 0.0
    if not 0 <= lo <= latency_hi:
        raise ValueError(f"need 0 <= latency_lo <= latency_hi, got {lo}, {latency_hi}")
    return random.uniform(lo, latency_hi)


def compute_score(data_source, solution_str, ground_truth, extra_info=None, latency_lo=None, latency_hi=None, **_):
    delay = _latency(latency_lo, latency_hi)
    if delay:
        time.sleep(delay)
    return score_answer(solution_str, ground_truth)


async def compute_score_async(
    data_source, solution_str, ground_truth, extra_info=None, latency_lo=None, latency_hi=None, **_
):
    delay = _latency(latency_lo, latency_hi)
    if delay:
        await asyncio.sleep(delay)
    return score_answer(solution_str, ground_truth)
