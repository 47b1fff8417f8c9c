"""Failure policies: how a group with failed rewards becomes a list of scores. Pure.

Order in the agent: the policy runs first, then the user's ``post_process_scores`` sees the group's
complete numeric scores (failed samples already filled, flagged in their extra info).

- ``neutral``: a failed sample gets the mean of its group's successful scores, so under a group
  baseline (GRPO, RLOO, ...) it contributes zero advantage; a group without any success gets
  ``neutral_value`` for every sample, so the whole group contributes nothing.
- ``fill``: a failed sample gets ``fill_value``.
- ``raise``: the ticket fails with the first failure, the sample named.
- ``mask``: the failed sample is to contribute nothing to training. The agent cannot drop a sample
  from a loss, so it answers as ``neutral`` does (every consumer that ignores the flag sees a
  harmless value) and the sample is flagged ``reward_failed``; the trainer strategies then exclude
  it from the loss, its normalisation and its group's statistics (``verl_async_rm/masking.py``).

Each policy is a small value object with one question to answer: what score does a failed sample
of this group get? (``None``: none, raise.) The config names one; ``failure_policy`` builds it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

from verl_async_rm.engine.ledger import GroupResult, SettledGroup
from verl_async_rm.errors import RewardError
from verl_async_rm.outcomes import Failed, Scored

PolicyName = Literal["neutral", "fill", "raise", "mask"]
POLICIES: tuple[str, ...] = ("neutral", "fill", "raise", "mask")


class FailurePolicy(Protocol):
    name: str
    # True: a failed sample is to leave training altogether (its loss, the loss's normalisation, its
    # group's statistics), which only the trainer strategies can do (masking.py); asked, never the name.
    masks_loss: bool

    def substitute(self, successes: list[float]) -> float | None:
        """The score of a failed sample in a group with these successful scores; None: raise."""


@dataclass(frozen=True)
class Neutral:
    neutral_value: float = 0.0
    name: str = "neutral"
    masks_loss: bool = False

    def substitute(self, successes: list[float]) -> float:
        return sum(successes) / len(successes) if successes else self.neutral_value


@dataclass(frozen=True)
class Fill:
    fill_value: float = 0.0
    name: str = "fill"
    masks_loss: bool = False

    def substitute(self, successes: list[float]) -> float:
        return self.fill_value


@dataclass(frozen=True)
class Mask(Neutral):
    """The stand-in score is ``neutral``'s; what makes it ``mask`` is that the strategies read the
    ``reward_failed`` flag and train on the sample not at all."""

    name: str = "mask"
    masks_loss: bool = True


@dataclass(frozen=True)
class Raise:
    name: str = "raise"
    masks_loss: bool = False

    def substitute(self, successes: list[float]) -> None:
        return None


def failure_policy(name: str, *, fill_value: float = 0.0, neutral_value: float = 0.0) -> FailurePolicy:
    if name == "neutral":
        return Neutral(neutral_value)
    if name == "fill":
        return Fill(fill_value)
    if name == "raise":
        return Raise()
    if name == "mask":
        return Mask(neutral_value)
    raise ValueError(f"unknown failure policy {name!r}; choose one of {POLICIES}")


def failure_extra(failure: Failed) -> dict:
    return {"reward_failed": 1, "reward_failure": failure.kind, "reward_error": failure.message}


def resolve_group(group: SettledGroup, policy: FailurePolicy) -> GroupResult:
    """Scores for a settled group; ``RewardError`` (the first failure named) when the policy raises."""
    successes = [o.score for o in group.outcomes if isinstance(o, Scored)]
    substitute = None
    if len(successes) < len(group.outcomes):
        substitute = policy.substitute(successes)
        if substitute is None:
            first = next(o for o in group.outcomes if isinstance(o, Failed))
            raise RewardError(first.message)
    scores, extras = [], []
    for outcome in group.outcomes:
        if isinstance(outcome, Scored):
            scores.append(outcome.score)
            extras.append({**outcome.extra, "reward_failed": 0})
        else:
            scores.append(substitute)
            extras.append(failure_extra(outcome))
    return GroupResult(group.key, group.indices, scores, extras)
