"""The per-sample stream: samples that arrive one at a time (verl's ``run_single``), each answered
with its own score once its whole group is resolved.

- **Joining** (``join``): a sample joins group ``uid`` (one dispatch of a prompt: ``attempt``),
  open until it reaches ``group_size`` (less its withdrawn sessions) or stops growing for
  ``group_wait``; then it is closed with the members it has (``engine/ledger.py``'s
  ``StreamGroups``). A sample without uid is a group of one.
- **Withdrawal** (``withdraw``): a rollout session that ended without a sample for the reward
  shrinks its group, which resolves at once once it has every other member.
- **Resolution and delivery**: a settled group is resolved (failure policy, group hook:
  ``engine/resolution.py``) and each member is answered with its own ``(score, extra)``, or with
  the exception that ended the group.
- **The deadline**: ``ticket_deadline`` counts per member from its arrival; an unfinished member
  settles as a ``deadline`` failure through the engine's one settle path.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from dataclasses import dataclass
from typing import Callable, Hashable

from verl_async_rm.engine.group_judge import GroupCall, GroupCallOwner
from verl_async_rm.engine.ledger import Group, GroupResult, StreamGroups, stream_key
from verl_async_rm.engine.pipeline import Sample
from verl_async_rm.errors import AgentClosed
from verl_async_rm.items import RewardItem
from verl_async_rm.outcomes import Failed, Outcome

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StreamStatistics:
    open_groups: int  # streamed groups still gathering members
    withdrawn_sessions: int  # sessions that ended without a sample and shrank their group


class StreamMember:
    """A sample of the per-sample path: its group, its place in it, and where its answer goes."""

    __slots__ = ("label", "group", "position", "answer", "arrived_at", "deadline", "sample", "serial", "opening",
                 "validation")

    def __init__(self, label: str, group: Group, position: int, answer: Callable[[object], None], arrived_at: float,
                 serial: str = "", opening: int = 0, validation: bool = False):
        self.label = label  # the reward's, for error messages
        self.group = group
        self.opening = opening  # its group's number in the engine's count of tickets and groups as they opened
        self.position = position
        self.answer = answer  # answer((score, extra)) or answer(exception)
        self.arrived_at = arrived_at
        self.deadline: asyncio.TimerHandle | None = None
        self.sample: Sample | None = None
        self.serial = serial  # names it in the verdict log (a ticket's samples: ticket and index)
        self.validation = validation  # of a validation pass (stamped by our agent-loop managers: group_sizes.py)

    def describe(self, item: RewardItem) -> str:
        kind, uid = self.group.key[:2]  # a streamed group's key may name its attempt too (stream_key)
        of = f"group {uid!r}" if kind == "uid" else "a sample without uid"
        return f"{self.label} on a sample of {of}"

    def log_fields(self, item: RewardItem, now: float) -> tuple[float, None, Hashable, str]:
        """What the verdict log records of it: latency, ticket (none), uid, sample id."""
        kind, uid = self.group.key[:2]
        return now - self.arrived_at, None, uid if kind == "uid" else None, self.serial

    def admission_rank(self, item: RewardItem) -> tuple[bool, int, int, int]:
        """Where it ranks under ``admission_order: deadline`` (engine/admission_order.py): as a sample
        of a ticket opened with its group, validation or training as its caller said."""
        return not self.validation, self.opening, 0, self.group.unsettled


class SampleStream:
    """The engine's streamed groups (``groups``), their members, ``group_wait`` timers and running
    group hooks."""

    def __init__(self, engine):
        """``engine``: the ``ScoringEngine`` (``engine/core.py``) these samples are scored by: its
        pipeline, counters, one settle path, group resolution and judge operations."""
        self.engine = engine
        self.loop, self.config, self.reward = engine.loop, engine.config, engine.reward
        self.metrics, self.pipeline, self.judge, self.resolution = engine.metrics, engine.pipeline, engine.judge, engine.resolution
        self.count_recent = engine.count_recent
        self.groups = StreamGroups()
        self.members: dict[Group, list[StreamMember]] = {}
        self.waits: dict[Group, asyncio.TimerHandle] = {}
        self.hooks: set[asyncio.Task] = set()
        self._numbers = itertools.count()

    def join(
        self, item: RewardItem, uid: Hashable | None, group_size: int, group_wait: float | None,
        answer: Callable[[object], None], session: Hashable | None = None, attempt: Hashable | None = None,
        validation: bool = False,
    ) -> None:
        """Score ``item`` as a member of group ``uid`` (expected size ``group_size``); ``answer`` gets
        ``(score, extra)`` once the whole group is resolved, or the exception that ended it. A group
        that gets no new member for ``group_wait`` seconds is resolved with the members it has.
        ``session``: which of the group's rollouts this sample is (see ``withdraw``); ``attempt``:
        which dispatch of the prompt, so that a prompt generated again under the same uid forms a
        group of its own and never mixes with an earlier attempt's members. ``validation``: of a
        validation pass (its rank under ``admission_order: deadline``)."""
        if self.engine.closed is not None:
            raise AgentClosed("the reward agent is closed")
        self.judge.check_budget()
        if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1:
            raise ValueError(f"group_size must be a positive integer, got {group_size!r}")
        if not isinstance(validation, bool):
            raise ValueError(f"validation must be true or false, got {validation!r}")
        now = self.loop.time()
        key: Hashable = stream_key(uid, attempt) if uid is not None else ("sample", object())
        split_before = self.groups.split_groups
        group, position = self.groups.add(key, group_size if uid is not None else 1, session if uid is not None else None)
        if self.groups.split_groups != split_before:
            self.metrics.split_groups += 1
            _log.warning(
                "group %r got a member after group_wait (%ss) had closed it short of %d samples: the wait is "
                "shorter than the spread of its generation times; it continues as a new group", uid, group_wait, group_size,
            )
        members = self.members.setdefault(group, [])
        opening = members[0].opening if members else next(self.engine.openings)
        member = StreamMember(self.reward.label, group, position, answer, now, f"{self.engine.id}/s{next(self._numbers)}",
                              opening, validation)
        members.append(member)
        wait = self.waits.pop(group, None)
        if wait is not None:
            wait.cancel()
        if not group.closed and group_wait is not None:
            self.waits[group] = self.loop.call_at(now + group_wait, self._close_group, group)
        sample = member.sample = Sample(item, member)
        self.metrics.submitted += 1
        if self.config.ticket_deadline is not None:
            member.deadline = self.loop.call_at(now + self.config.ticket_deadline, self._expire_member, member)
        if not self.reward.is_group_judge:
            self.pipeline.enqueue([sample])
        elif group.closed:
            self._judge_group(group)

    def _judge_group(self, group: Group) -> None:
        samples = [m.sample for m in self.members.get(group, []) if m.sample is not None]
        if samples and samples[0].group_call is None and not all(s.settled for s in samples):
            owner = GroupCallOwner(self.reward.label, group.key, len(samples), None)
            self.pipeline.enqueue([GroupCall(samples, owner)])

    async def score(self, item: RewardItem, uid: Hashable | None, group_size: int, group_wait: float | None,
                    session: Hashable | None = None, attempt: Hashable | None = None, validation: bool = False):
        """``join`` for a caller on this loop: awaits the answer."""
        future = self.loop.create_future()

        def answer(value: object) -> None:
            if not future.done():
                future.set_exception(value) if isinstance(value, BaseException) else future.set_result(value)

        self.join(item, uid, group_size, group_wait, answer, session, attempt, validation)
        return await future

    def withdraw(self, uid: Hashable, session: Hashable, attempt: Hashable | None = None) -> None:
        """Session ``session`` of group ``uid`` (dispatch ``attempt``) ended without a sample for the
        reward (verl's rollout session failed): the group is whole without it. A group that has every
        other member is resolved now, not when ``group_wait`` runs out."""
        group = self.groups.withdraw(stream_key(uid, attempt), session)
        if group is not None:
            wait = self.waits.pop(group, None)
            if wait is not None:
                wait.cancel()
            self._close_group(group)

    def _close_group(self, group: Group) -> None:
        self.waits.pop(group, None)
        if self.groups.close(group):
            self._resolve(group)
        elif self.reward.is_group_judge:
            self._judge_group(group)

    def _expire_member(self, member: StreamMember) -> None:
        member.deadline = None
        sample = member.sample
        if sample is not None and not sample.settled:
            self.pipeline.abandon(sample)
            message = f"unfinished at the deadline ({self.config.ticket_deadline}s after it arrived)"
            self.engine.settle(sample, Failed("deadline", f"{sample.where()} {message}", sample.attempts))

    # -- settling, resolution, delivery -------------------------------------------------------------
    def settled(self, member: StreamMember, outcome: Outcome, failed: bool, now: float) -> None:
        """A member has its outcome (the engine's settle path counted and logged it)."""
        self.metrics.latencies.append(now - member.arrived_at)
        if self.count_recent(failed, outcome):
            return
        if member.group.settle(member.position, outcome):
            self._resolve(member.group)

    def _resolve(self, group: Group) -> None:
        members = self.members.get(group, [])
        deadline = min((m.arrived_at for m in members), default=self.loop.time()) + (self.config.ticket_deadline or float("inf"))

        def deliver(result: GroupResult | BaseException) -> None:
            self.members.pop(group, None)
            for member in members:
                if member.deadline is not None:
                    member.deadline.cancel()
                if isinstance(result, BaseException):
                    member.answer(result)
                else:
                    at = result.indices.index(member.position)
                    member.answer((result.scores[at], result.extras[at]))

        where = f"{self.reward.label}.post_process_scores on group {group.key[1]!r}"
        self.resolution.resolve(group.settled(), deliver, deadline, where, self.hooks,
                                sample_of=lambda position: next(m.sample for m in members if m.position == position))

    def statistics(self) -> StreamStatistics:
        return StreamStatistics(self.groups.open_groups, self.groups.withdrawn_sessions)

    # -- failing everything -------------------------------------------------------------------------
    def unsettled(self) -> list[Sample]:
        """The samples of every waiting member that have no outcome yet."""
        return [m.sample for members in self.members.values() for m in members
                if m.sample is not None and not m.sample.settled]

    def fail_all(self, error: BaseException) -> None:
        """Every waiting member is answered with ``error``; its unsettled sample is abandoned (counted
        as cancelled), running group hooks are cancelled."""
        for task in list(self.hooks):
            task.cancel()
        for group, members in list(self.members.items()):
            self.members.pop(group, None)
            wait = self.waits.pop(group, None)
            if wait is not None:
                wait.cancel()
            self.groups.close(group)
            for member in members:
                if member.deadline is not None:
                    member.deadline.cancel()
                if member.sample is not None and not member.sample.settled:
                    member.sample.settled = True
                    self.metrics.cancelled += 1
                    self.pipeline.abandon(member.sample)
                member.answer(error)
