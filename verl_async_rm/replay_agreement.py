"""How far two judges agree on the same samples: the arithmetic of ``verl-async-rm replay`` and of
the drift check (``verl_async_rm/replay.py``). Pure: lists of numbers in, a dict of plain numbers out.

What GRPO does with a group's scores is centre them on the group mean: a member above the mean is
pushed up (positive advantage), one below is pushed down. So beside correlation, the figures that
matter for training are whether the two judges pick the *same members* as above their group's mean
(``ranking_agreement``: share of groups where that set is identical) and whether every member's
advantage keeps its sign (``sign_agreement``: share of members; the sign is -1, 0 or +1).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Hashable, Iterable, Sequence

import numpy as np

# Two scores closer than this are equal, and so are a score and its group's mean: a group mean of
# three 1/3s is 0.333..4 in floating point, and a member must not read as above it.
TOLERANCE = 1e-9


@dataclass(frozen=True, slots=True)
class ScorePair:
    """One sample judged twice: its step, its GRPO group (any hashable), the old and the new score
    (None: that judge failed on it)."""

    step: int
    group: Hashable
    old: float | None
    new: float | None


def ranks(values: np.ndarray) -> np.ndarray:
    """Ranks 1..n, ties given their average rank (as Spearman's coefficient defines them)."""
    order = np.argsort(values, kind="stable")
    ranked = np.empty(len(values), dtype=float)
    ranked[order] = np.arange(1, len(values) + 1)
    _, inverse, counts = np.unique(values, return_inverse=True, return_counts=True)
    sums = np.bincount(inverse, weights=ranked)
    return sums[inverse] / counts[inverse]


def pearson(x: Sequence[float], y: Sequence[float]) -> float | None:
    """None when it is undefined: fewer than two pairs, or one side constant (no variance to correlate)."""
    a, b = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if len(a) < 2:
        return None
    da, db = a - a.mean(), b - b.mean()
    norm = math.sqrt(float(da @ da) * float(db @ db))
    if norm <= TOLERANCE * max(1.0, float(np.abs(a).max()), float(np.abs(b).max())):
        return None
    return max(-1.0, min(1.0, float(da @ db) / norm))


def spearman(x: Sequence[float], y: Sequence[float]) -> float | None:
    return pearson(ranks(np.asarray(x, dtype=float)), ranks(np.asarray(y, dtype=float))) if len(x) >= 2 else None


def advantage_signs(scores: Sequence[float]) -> list[int]:
    """The sign of each member's GRPO advantage: its score against its group's mean."""
    values = np.asarray(scores, dtype=float)
    centred = values - values.mean()
    return [0 if abs(c) <= TOLERANCE else (1 if c > 0 else -1) for c in centred]


def positive_members(scores: Sequence[float]) -> frozenset[int]:
    """Positions of the members GRPO pushes up: above their group's mean."""
    return frozenset(i for i, sign in enumerate(advantage_signs(scores)) if sign > 0)


def _mean(values: Iterable[float]) -> float | None:
    values = list(values)
    return float(math.fsum(values) / len(values)) if values else None


def agreement(pairs: Sequence[ScorePair]) -> dict:
    """The agreement figures of ``pairs`` (see the module docstring). Only samples both judges
    scored are compared; a group is ranked on its compared members, and only if it has two or more
    (one member has no advantage). A figure that is undefined for these pairs is None."""
    both = [p for p in pairs if p.old is not None and p.new is not None]
    old = [float(p.old) for p in both]
    new = [float(p.new) for p in both]
    groups: dict[Hashable, list[ScorePair]] = {}
    for pair in both:
        groups.setdefault(pair.group, []).append(pair)
    ranked = [members for members in groups.values() if len(members) >= 2]
    same_ranking = sum(positive_members([m.old for m in members]) == positive_members([m.new for m in members])
                       for members in ranked)
    signs_equal = sum(a == b for members in ranked
                      for a, b in zip(advantage_signs([m.old for m in members]), advantage_signs([m.new for m in members])))
    ranked_members = sum(len(members) for members in ranked)
    differences = [abs(a - b) for a, b in zip(old, new)]
    return {
        "samples": len(pairs),
        "compared": len(both),
        "not_compared": len(pairs) - len(both),  # a judge failed on it (or the replay stopped first)
        "pearson": pearson(old, new),
        "spearman": spearman(old, new),
        "mean_abs_diff": _mean(differences),
        "exact_agreement": _mean(float(d <= TOLERANCE) for d in differences),
        "mean_old": _mean(old),
        "mean_new": _mean(new),
        "groups_ranked": len(ranked),
        "ranking_agreement": same_ranking / len(ranked) if ranked else None,
        "sign_agreement": signs_equal / ranked_members if ranked_members else None,
    }


def agreement_by_step(pairs: Sequence[ScorePair]) -> list[dict]:
    """``agreement`` of each step, in step order: the drift over the run."""
    steps: dict[int, list[ScorePair]] = {}
    for pair in pairs:
        steps.setdefault(pair.step, []).append(pair)
    return [{"step": step, **agreement(steps[step])} for step in sorted(steps)]
