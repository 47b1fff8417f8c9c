"""Turn whatever a user's ``compute_score`` returned into ``(score, extra)``, or say clearly why not.

Accepted: a real number or bool; a dict with ``"score"`` (other keys become per-sample extra info);
the recipe's tuple ``(score, prompt, explanation)``. Everything else is an error: a silent 0 would
enter training as a real reward.
"""

from __future__ import annotations

import math
import numbers
from typing import Any, Callable

from verl_async_rm.errors import RewardFunctionError

ACCEPTED = "a number, a bool, a dict with 'score', or a (score, prompt, explanation) tuple"


Where = str | Callable[[], str]  # a label, or a function making it (only called on error)


def _label(where: Where) -> str:
    return where() if callable(where) else where


def _as_score(value: Any, where: Where) -> float:
    # numbers.Real covers int, float, bool and numpy's scalar types without importing numpy.
    if isinstance(value, numbers.Real):
        score = float(value)
        if not math.isfinite(score):
            raise RewardFunctionError(f"{_label(where)} returned a non-finite score {score!r}")
        return score
    if hasattr(value, "item") and getattr(value, "shape", None) == ():  # 0-d array / tensor
        return _as_score(value.item(), where)
    raise RewardFunctionError(f"{_label(where)} returned {type(value).__name__} {value!r}; expected {ACCEPTED}")


def normalize_score(value: Any, where: Where) -> tuple[float, dict]:
    """``where`` names the function and the sample, e.g. ``"gsm8k.compute_score on sample 12 (uid 'a')"``."""
    if value.__class__ is float and math.isfinite(value):  # the common case, without the ABC check
        return value, {}
    if isinstance(value, dict):
        if "score" not in value:
            raise RewardFunctionError(f"{_label(where)} returned a dict without a 'score' key (keys: {sorted(value)})")
        extra = {k: v for k, v in value.items() if k != "score"}
        return _as_score(value["score"], where), extra
    if isinstance(value, tuple):
        if len(value) != 3:
            raise RewardFunctionError(
                f"{_label(where)} returned a tuple of {len(value)} items; the recipe's form is (score, prompt, explanation)"
            )
        score, prompt, explanation = value
        return _as_score(score, where), {"prompt": prompt, "explanation": explanation}
    return _as_score(value, where), {}


def normalize_group_scores(values: Any, expected: int, where: str) -> list[float]:
    """Validate what ``post_process_scores`` returned for a group of ``expected`` samples."""
    try:
        values = list(values)
    except TypeError:
        raise RewardFunctionError(f"{where} returned {type(values).__name__}, not a list of scores") from None
    if len(values) != expected:
        raise RewardFunctionError(f"{where} returned {len(values)} scores for a group of {expected}")
    return [_as_score(v, f"{where} (position {i})") for i, v in enumerate(values)]
