"""Group judges: one call scores a whole GRPO group (``compute_group_score(group)``).

A ranking or comparing judge sees every member of a group at once and returns one score (or score
dict) per member. Here such a call is one *request* of the ordinary request pipeline, so it lives
under the same rules as a per-sample call, with nothing duplicated:

- **limits**: one call takes one concurrency slot and one request of ``requests_per_minute``; its
  tokens (``tokens_per_minute``) are the sum of its members' estimates (``group_tokens``);
- **retries, 429 back-off, request_timeout**: the pipeline's, applied to the call as a whole;
- **deadline and failure policies**: a failed call (after its retries) fails every member with the
  same failure kind and message; the members then go through the engine's one settle path, so the
  failure budgets count each member and the failure policy applies per member, per group, as for
  per-sample rewards. A deadline settles the members; once all of a call's members are settled
  from outside (deadline, cancel, close) the call itself is abandoned;
- **streaming**: results still leave as whole groups (a group judge's group is one call).

A group is judged only once its membership is final: at submit for a closed ticket, when its last
member arrives (or ``close``) for an open ticket, when it reaches its size (or ``group_wait`` closes
it) on the per-sample stream. A group closed short of its size is judged with the members it has:
``compute_group_score`` gets a list of any length >= 1 and must return exactly that many scores.

What it returns is validated loudly, per call: not a sequence, the wrong length, or a member's
score not a finite number fails every member as ``invalid`` (counted by the failure budgets, so a
judge that always answers wrongly stops the run with a message naming it).

Not supported, refused when the agent is built: ``executor='process'`` (a group judge is an I/O
client, not a CPU-heavy scorer) and ``cache=True`` (a group's verdicts depend on the whole group).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Callable, Hashable

from verl_async_rm.engine.executors import AsyncCalls, ThreadCalls
from verl_async_rm.engine.pipeline import Sample
from verl_async_rm.errors import RewardFunctionError
from verl_async_rm.items import RewardItem, unsendable_text
from verl_async_rm.loader import GROUP_METHOD, UserReward
from verl_async_rm.outcomes import Failed, Outcome, Scored
from verl_async_rm.reward_returns import normalize_score


class GroupRequest:
    """What a group call sends: the members' items, in the order the judge sees them."""

    __slots__ = ("key", "items")

    def __init__(self, key: Hashable, items: list[RewardItem]):
        self.key = key
        self.items = items


class GroupCallOwner:
    """Names a group call in error messages."""

    __slots__ = ("label", "key", "size", "ticket")

    def __init__(self, label: str, key: Hashable, size: int, ticket: str | None):
        self.label, self.key, self.size, self.ticket = label, key, size, ticket

    def describe(self, item: Any) -> str:
        kind, uid = self.key[:2]  # a streamed group's key may name its attempt too (stream_key)
        of = f"group {uid!r}" if kind == "uid" else "a sample without uid"
        where = f", ticket {self.ticket}" if self.ticket is not None else ""
        return f"{self.label}.{GROUP_METHOD} on {of} ({self.size} samples{where})"


class GroupCall(Sample):
    """A request of the pipeline that stands for ``members`` (their own samples never enter it)."""

    __slots__ = ("members",)

    def __init__(self, members: list[Sample], owner: GroupCallOwner):
        super().__init__(GroupRequest(owner.key, [m.item for m in members]), owner)
        self.members = members
        for member in members:
            member.group_call = self

    def scored(self, value: Any) -> Outcome:
        return GroupScored(normalize_group_verdicts(value, len(self.members), self.where), self.attempts + 1)

    def admission_rank(self) -> tuple:
        """Its group's rank: its first member's (engine/admission_order.py)."""
        return self.members[0].admission_rank()

    def unsendable(self) -> str | None:
        """One member no request can carry makes the whole call unsendable (it sends them all)."""
        for member in self.members:
            problem = unsendable_text(member.item)
            if problem is not None:
                return f"sample {member.item.index}: {problem}"
        return None


@dataclass(slots=True)
class GroupScored:
    """A group call's answer: (score, extra) per member, aligned with ``GroupCall.members``."""

    verdicts: list[tuple[float, dict]]
    attempts: int = 1


def normalize_group_verdicts(value: Any, expected: int, where: str | Callable[[], str]) -> list[tuple[float, dict]]:
    """One (score, extra) per member from what ``compute_group_score`` returned: a list (or tuple,
    or 1-d array) of ``expected`` entries, each what ``compute_score`` may return (a number, a
    dict with ``"score"``, the recipe's 3-tuple)."""
    label = where() if callable(where) else where
    if isinstance(value, (str, bytes, dict)) or not hasattr(value, "__len__") or not hasattr(value, "__iter__"):
        raise RewardFunctionError(f"{label} returned {type(value).__name__}, not a list of one score per member")
    values = list(value)
    if len(values) != expected:
        raise RewardFunctionError(f"{label} returned {len(values)} scores for a group of {expected}: one per member, in order")
    return [normalize_score(v, f"{label} (member {i})") for i, v in enumerate(values)]


def member_outcomes(call: GroupCall, outcome: Outcome | GroupScored) -> list[tuple[Sample, Outcome]]:
    """What each member of ``call`` ends as: its own verdict, or the call's failure (same kind and message)."""
    if isinstance(outcome, GroupScored):
        return [(m, Scored(score, extra, outcome.attempts)) for m, (score, extra) in zip(call.members, outcome.verdicts)]
    if isinstance(outcome, Failed):
        return [(m, Failed(outcome.kind, outcome.message, outcome.attempts)) for m in call.members]
    raise TypeError(f"a group call ended as {type(outcome).__name__}")  # a cached Scored: the cache is refused


class AsyncGroupCalls(AsyncCalls):
    def __init__(self, reward: UserReward):
        self._fn = reward.group_fn

    def start(self, request: GroupRequest, token=None):
        return self._fn(list(request.items))


class ThreadGroupCalls(ThreadCalls):
    def __init__(self, reward: UserReward, loop: asyncio.AbstractEventLoop, max_threads: int):
        super().__init__(reward, loop, max_threads, name="group-judge")
        self._fn = reward.group_fn

    def _call(self, request: GroupRequest):  # on a worker thread
        return self._fn(list(request.items))


def check_group_judge_config(reward: UserReward, executor: str, cache: bool) -> None:
    if executor == "process":
        raise ValueError(f"{reward.label} is a group judge ({GROUP_METHOD}): executor='process' is not supported "
                         "(a judge is an I/O client; use the default 'thread' executor or an async method)")
    if cache:
        raise ValueError(f"{reward.label} is a group judge ({GROUP_METHOD}): cache=True is not supported "
                         "(a member's verdict depends on the whole group, not on its own request)")


def group_executor(reward: UserReward, workers: int, loop: asyncio.AbstractEventLoop):
    return AsyncGroupCalls(reward) if reward.score_is_async else ThreadGroupCalls(reward, loop, workers)


def group_tokens(estimator: Callable[[RewardItem], float]) -> Callable[[Any], float]:
    """Tokens of a request for ``tokens_per_minute``: a group call's are its members'."""

    def tokens(item: Any) -> float:
        if isinstance(item, GroupRequest):
            return sum(float(estimator(member)) for member in item.items)
        return estimator(item)

    return tokens
