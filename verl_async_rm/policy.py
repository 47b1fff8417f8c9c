"""Failure policies: how a group with failed rewards becomes a list of scores. Pure functions.

Order in the agent: the policy runs first, then the user's ``post_process_scores`` sees the group's
complete numeric scores (failed samples already filled, flagged in their extra info).

- ``neutral``: a failed sample gets the mean of its group's successful scores, so under a group
  baseline (GRPO, RLOO, ...) it contributes zero advantage; a group without any success gets
  ``neutral_value`` for every sample, so the whole group contributes nothing.
- ``fill``: a failed sample gets ``fill_value``.
- ``raise``: the ticket fails with the first failure, the sample named.
"""

from __future__ import annotations

from typing import Literal

from verl_async_rm.groups import GroupResult, SettledGroup
from verl_async_rm.outcome import Failed, RewardError, Scored

FailurePolicy = Literal["neutral", "fill", "raise"]
POLICIES: tuple[str, ...] = ("neutral", "fill", "raise")


def failure_extra(failure: Failed) -> dict:
    return {"reward_failed": 1, "reward_failure": failure.kind, "reward_error": failure.message}


def resolve_group(
    group: SettledGroup, policy: FailurePolicy, *, fill_value: float = 0.0, neutral_value: float = 0.0
) -> GroupResult:
    successes = [o.score for o in group.outcomes if isinstance(o, Scored)]
    failures = [o for o in group.outcomes if isinstance(o, Failed)]
    if failures and policy == "raise":
        raise RewardError(failures[0].message) from failures[0].error
    if policy == "neutral":
        substitute = sum(successes) / len(successes) if successes else neutral_value
    elif policy == "fill":
        substitute = fill_value
    elif failures:
        raise ValueError(f"unknown failure policy {policy!r}; choose one of {POLICIES}")
    scores, extras = [], []
    for outcome in group.outcomes:
        if isinstance(outcome, Scored):
            scores.append(outcome.score)
            extras.append({**outcome.extra, "reward_failed": 0})
        else:
            scores.append(substitute)
            extras.append(failure_extra(outcome))
    return GroupResult(group.key, group.indices, scores, extras)
