"""The group ledger: which samples form a GRPO group, what each one ended as, and which groups are
ready to hand out. Pure book-keeping: no I/O, no asyncio, no verl; tested exhaustively.

A group is *settled* when it is closed (its membership is final) and every member has an outcome;
*ready* once the failure policy and the user's group hook have turned it into scores; *taken* when
a ``get`` hands it out. Two kinds of owner use the same ``Group``:
- a **ticket** (a submitted batch): its groups are closed at submit (every uid has exactly
  ``group_size`` samples); ready groups leave in completion order, whole, through ``take(n)``;
- the **stream** (verl's per-sample path): groups with open membership, closed when they reach
  their size or when the caller closes them; each member is answered on its own.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Hashable, Iterable, Mapping, Sequence

from verl_async_rm.outcomes import Outcome, ScoredChunk


@dataclass(frozen=True)
class SettledGroup:
    key: Hashable
    indices: list[int]  # ascending for tickets; arrival positions for the stream
    outcomes: list[Outcome]  # aligned with indices


@dataclass(frozen=True)
class GroupResult:
    key: Hashable
    indices: list[int]
    scores: list[float]
    extras: list[dict]  # per sample, aligned with indices
    latencies: list[float] | None = None  # per sample: submit -> settled, seconds
    ready_after: float = 0.0  # submit -> group ready (policy and hook done), seconds
    ready_at: float = 0.0  # the agent's clock when it became ready (comparable within one machine)


def stream_key(uid: Hashable, attempt: Hashable | None = None) -> Hashable:
    """A streamed group's key: its uid, and which dispatch of the prompt (verl may generate a prompt
    again under the same uid: each attempt is a group of its own). ``key[1]`` is the uid either way."""
    return ("uid", uid) if attempt is None else ("uid", uid, attempt)


class Group:
    """The members of one group and their outcomes. ``expected``: the size that closes it.
    ``rest``: the outcome of every member without one of its own (a deadline settles them all at
    once, without a step per member)."""

    __slots__ = ("key", "expected", "members", "outcomes", "closed", "rest")

    def __init__(self, key: Hashable, expected: int, members: Sequence[int] = (), closed: bool = False):
        self.key = key
        self.expected = expected
        self.members: list[int] = list(members)
        self.outcomes: dict[int, Outcome] = {}
        self.closed = closed or len(self.members) >= expected
        self.rest: Outcome | None = None

    def add(self, member: int) -> None:
        if self.closed:
            raise ValueError(f"group {self.key[1]!r} is closed")
        self.members.append(member)
        self.closed = len(self.members) >= self.expected

    def settle(self, member: int, outcome: Outcome) -> bool:
        """Record a member's outcome; True once the group is settled."""
        if member in self.outcomes or self.rest is not None:
            raise ValueError(f"sample {member} of group {self.key[1]!r} settled twice")
        self.outcomes[member] = outcome
        return self.complete

    def close(self) -> bool:
        """No more members (the caller decided); True if that settles the group."""
        self.closed = True
        return self.complete

    @property
    def complete(self) -> bool:
        return self.closed and (self.rest is not None or len(self.outcomes) == len(self.members))

    def is_settled(self, member: int) -> bool:
        return member in self.outcomes or self.rest is not None

    @property
    def unsettled(self) -> int:
        """Members without an outcome, those still to join an open group included: how far the group
        is from being handed over (the admission order serves the closest first)."""
        if self.rest is not None:
            return 0
        size = len(self.members) if self.closed else max(self.expected, len(self.members))
        return size - len(self.outcomes)

    def settled(self) -> SettledGroup:
        if self.rest is None:
            return SettledGroup(self.key, list(self.members), [self.outcomes[m] for m in self.members])
        return SettledGroup(self.key, list(self.members), [self.outcomes.get(m, self.rest) for m in self.members])


class UniformGroups:
    """Ready groups that all resolve alike: every member failed the same way before any of them
    settled on its own (a deadline that found them queued), so one score and one extra info
    stand for all of them. One entry in a ticket's ready queue, however many groups; each group's
    ``GroupResult`` is built only as a ``take`` hands it out (the deadline itself does no work per
    sample). The extra info is one dict shared by the groups' results: read, never written."""

    __slots__ = ("groups", "score", "extra", "latency", "ready_after", "ready_at", "_columns")

    def __init__(self, groups: Iterable[Group], score: float, extra: dict, latency: float, ready_after: float,
                 ready_at: float):
        self.groups: deque[Group] = deque(groups)
        self.score, self.extra, self.latency = score, extra, latency
        self.ready_after, self.ready_at = ready_after, ready_at
        self._columns: dict[int, tuple[list, list, list]] = {}  # per group size: scores, extras, latencies

    def pop(self) -> GroupResult:
        """The next group's result. Groups of one size share their (never written) score, extra
        and latency lists: a deadline over 40,000 groups of one builds 40,000 results, not 160,000
        objects (which also wakes the cyclic collector far less)."""
        group = self.groups.popleft()
        size = len(group.members)
        columns = self._columns.get(size)
        if columns is None:
            columns = self._columns[size] = ([self.score] * size, [self.extra] * size, [self.latency] * size)
        return GroupResult(group.key, group.members, *columns, self.ready_after, self.ready_at)


def _check_size(size, what: str) -> int:
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ValueError(f"{what} must be a positive integer, got {size!r}")
    return size


class TicketLedger:
    """The groups of one ticket, and its ready queue.

    ``group_size`` is one size for every uid, or a mapping uid -> size (batches whose prompts ask
    for different sample counts). A ticket is *closed* (its membership final: ``submit``) or *open*
    (``open_ticket``): samples are added as they come (a rollout finishing), a group settles once it
    has all its members and their outcomes, and ``close`` ends membership (a group still short of
    its size then settles with the members it has).
    """

    def __init__(self, samples: Sequence[tuple[int, Hashable | None]], group_size: int | Mapping[Hashable, int],
                 *, open: bool = False):
        """``samples``: (index, uid) per sample."""
        if isinstance(group_size, Mapping):
            self._sizes: Mapping[Hashable, int] | None = {uid: _check_size(n, f"group size of {uid!r}") for uid, n in group_size.items()}
            self.group_size: int | None = None  # mixed sizes
        else:
            self._sizes = None
            self.group_size = _check_size(group_size, "group_size")
        self.open = open
        self._groups: dict[Hashable, Group] = {}
        self._group_of: dict[int, Group] = {}
        self._unsettled: dict[Hashable, Group] = {}  # in the order they were formed
        self._ready: deque[GroupResult | UniformGroups] = deque()
        self._uniform_entries = 0  # UniformGroups in _ready
        self.total_groups = 0
        self.total_samples = 0
        self.taken_groups = 0
        self.taken_samples = 0
        self._add(samples, strict=not open)

    def _size_of(self, uid: Hashable | None, index: int) -> int:
        if uid is None:
            if self.group_size not in (None, 1):
                raise ValueError(f"sample {index} has no uid, but group_size={self.group_size}: a uid is needed to form groups")
            return 1
        if self._sizes is None:
            return self.group_size
        if uid not in self._sizes:
            raise ValueError(f"sample {index} has uid {uid!r}, which the group sizes do not name")
        return self._sizes[uid]

    def add(self, samples: Sequence[tuple[int, Hashable | None]]) -> None:
        """New members of an open ticket."""
        if not self.open:
            raise ValueError("the ticket is closed: no samples can be added")
        self._add(samples, strict=False)

    def _add(self, samples: Sequence[tuple[int, Hashable | None]], strict: bool) -> None:
        """``strict`` (a closed batch): every group must come out exactly its size. All checked first:
        a bad batch changes nothing."""
        batch: dict[Hashable, list[int]] = {}
        sizes: dict[Hashable, int] = {}
        seen: set[int] = set()
        group_of = self._group_of
        for index, uid in samples:
            if index in seen or index in group_of:
                raise ValueError(f"sample index {index} appears twice in one ticket")
            seen.add(index)
            key = ("uid", uid) if uid is not None else ("sample", index)
            members = batch.get(key)
            if members is None:  # a group's size depends on its uid only: asked once per group
                batch[key] = [index]
                sizes[key] = self._size_of(uid, index)
            else:
                members.append(index)
        for key, indices in batch.items():
            group = self._groups.get(key)
            have = len(group.members) if group is not None else 0
            if have + len(indices) > sizes[key] or (strict and have + len(indices) != sizes[key]):
                raise ValueError(
                    f"group {key[1]!r} has {have + len(indices)} samples (indices {sorted(indices)[:8]}...), "
                    f"but its size is {sizes[key]}: every uid needs exactly its group size of samples"
                )
        for key, indices in batch.items():
            group = self._groups.get(key)
            if group is None:  # (a submitted batch: every group is new, built whole)
                indices.sort()
                group = self._groups[key] = self._unsettled[key] = Group(key, sizes[key], indices)
                self.total_groups += 1
            else:
                for index in indices:
                    group.add(index)
                group.members.sort()
            for index in indices:
                group_of[index] = group
            self.total_samples += len(indices)

    def close(self) -> list[SettledGroup]:
        """No more samples: groups short of their size settle with the members they have."""
        self.open = False
        settled = []
        for group in self._groups.values():
            if not group.closed and group.close():
                del self._unsettled[group.key]
                settled.append(group.settled())
        return settled

    # -- settling -------------------------------------------------------------------------------
    def settle(self, index: int, outcome: Outcome) -> SettledGroup | None:
        """Record one sample's outcome; return its group once the group is fully settled."""
        group = self._group_of.get(index)
        if group is None:
            raise KeyError(f"sample index {index} is not part of this ticket")
        if not group.settle(index, outcome):
            return None
        del self._unsettled[group.key]
        return group.settled()

    def settle_rest(self, outcome: Outcome) -> tuple[list[Group], list[SettledGroup]]:
        """Every sample without an outcome ends with ``outcome`` (a deadline; membership is final).
        Returns the groups none of whose members had an outcome (they all resolve alike:
        ``mark_ready_uniform``) and the settled form of the others. No call per sample or per
        untouched group: a deadline over a backlog of 40,000 must not take a step per sample."""
        if self.open:
            raise ValueError("close the ticket before settling the rest of its samples")
        groups = list(self._unsettled.values())
        self._unsettled.clear()
        for group in groups:
            group.rest = outcome
        untouched = [group for group in groups if not group.outcomes]
        touched = [group.settled() for group in groups if group.outcomes]
        return untouched, touched

    def is_settled(self, index: int) -> bool:
        return self._group_of[index].is_settled(index)

    def group_of(self, index: int) -> Group:
        """The group sample ``index`` belongs to (its ``closed``: the membership is final)."""
        return self._group_of[index]

    @property
    def all_settled(self) -> bool:
        return not self.open and not self._unsettled

    # -- handing out ----------------------------------------------------------------------------
    def mark_ready(self, group: GroupResult) -> None:
        self._ready.append(group)

    def mark_ready_uniform(self, groups: UniformGroups) -> None:
        """Many groups ready at once, resolved alike (their results are built as they are taken)."""
        if groups.groups:
            self._ready.append(groups)
            self._uniform_entries += 1

    @property
    def ready_groups(self) -> int:
        if not self._uniform_entries:
            return len(self._ready)
        return sum(len(entry.groups) if type(entry) is UniformGroups else 1 for entry in self._ready)

    @property
    def remaining_samples(self) -> int:
        """Samples not handed out yet (of those added so far, for an open ticket)."""
        return self.total_samples - self.taken_samples

    @property
    def exhausted(self) -> bool:
        return not self.open and self.taken_groups == self.total_groups

    def check_request(self, n: int | None) -> None:
        if n is None:
            return
        if isinstance(n, bool) or not isinstance(n, int) or n <= 0:
            raise ValueError(f"get(n) needs a positive integer n, got {n!r}")
        if self.group_size is not None and n % self.group_size:
            raise ValueError(f"n={n} is not a multiple of the group size {self.group_size}: get returns whole groups")

    def take(self, n: int | None) -> list[GroupResult] | None:
        """Whole ready groups, in completion order, totalling ``n`` samples: exactly ``n`` with one
        group size, at least ``n`` with mixed sizes (the group that reaches it is not cut). All
        remaining ones when fewer remain, or when ``n`` is None, once the ticket is closed and they
        are all ready. None when not enough are ready yet: nothing is consumed then."""
        self.check_request(n)
        if self._uniform_entries:
            self._build_uniform(n)
        remaining = self.total_groups - self.taken_groups
        count = 0
        if n is None:
            if self.open or len(self._ready) < remaining:
                return None
            count = remaining
        else:
            samples = 0
            for group in self._ready:
                samples += len(group.indices)
                count += 1
                if samples >= n:
                    break
            if samples < n and (self.open or count < remaining):
                return None
        taken = [self._ready.popleft() for _ in range(count)]
        self.taken_groups += count
        self.taken_samples += sum(len(group.indices) for group in taken)
        return taken

    def _build_uniform(self, n: int | None) -> None:
        """Build the results of uniformly resolved groups in front of the ready queue, as many as a
        ``take(n)`` could hand out (all of them for ``n=None``): the cost of a deadline's groups
        is paid as they are handed out, not when the deadline settles them."""
        ready, front, samples = self._ready, [], 0
        while ready and (n is None or samples < n):
            entry = ready.popleft()
            if type(entry) is not UniformGroups:
                front.append(entry)
                samples += len(entry.indices)
                continue
            while entry.groups and (n is None or samples < n):
                result = entry.pop()
                front.append(result)
                samples += len(result.indices)
            if entry.groups:
                ready.appendleft(entry)
                break
            self._uniform_entries -= 1
        ready.extendleft(reversed(front))

    def put_back(self, groups: list[GroupResult]) -> None:
        """Undo a ``take`` whose taker never received it (timed out or cancelled at that moment):
        the groups go back to the front, in their order, for the next ``take``."""
        self._ready.extendleft(reversed(groups))
        self.taken_groups -= len(groups)
        self.taken_samples -= sum(len(group.indices) for group in groups)


class StreamGroups:
    """Groups assembled one sample at a time (verl's per-sample path): open until they reach their
    size or the caller closes them. A member that arrives after its group was closed short starts a
    new group under the same key (counted in ``split_groups``): never lost, never waiting forever.

    A member may name its *session* (verl's ``session_id``: one of the ``rollout.n`` rollouts of a
    prompt). A session that ends without ever handing the reward a sample (its rollout failed) is
    *withdrawn*: its group's size drops by one, so the group closes with the members it will really
    get, at once, instead of waiting out a timer. Withdrawal and joining come from different
    processes in any order: a withdrawal that arrives before its group's first member is kept until
    the group opens; one for a session that did join changes nothing."""

    # Withdrawals for groups not open (not yet, or never: every session failed, or the group closed
    # before a late one came): bounded, the oldest forgotten first. A forgotten one can only make a
    # group wait for its timer, never mix groups.
    MAX_PENDING_WITHDRAWALS = 100_000

    def __init__(self) -> None:
        self._open: dict[Hashable, Group] = {}
        self._closed_short: dict[Hashable, None] = {}  # keys closed before their size, recent first-in
        self._joined: dict[Hashable, set] = {}  # sessions that joined, per open group
        self._withdrawn: dict[Hashable, set] = {}  # sessions that never will, per open group
        self._pending: dict[Hashable, set] = {}  # withdrawals for groups not open
        self.split_groups = 0
        self.withdrawn_sessions = 0  # withdrawals that shrank a group (or will, when it opens)

    def add(self, key: Hashable, size: int, session: Hashable | None = None) -> tuple[Group, int]:
        """Join group ``key`` (expected ``size``, less its withdrawn sessions); returns the group and
        the member's position."""
        group = self._open.get(key)
        if group is None:
            if key in self._closed_short:
                del self._closed_short[key]
                self.split_groups += 1
            withdrawn = self._pending.pop(key, set())
            if session in withdrawn:  # it did hand a sample over after all: it counts
                withdrawn.discard(session)
                self.withdrawn_sessions -= 1
            group = self._open[key] = Group(key, max(1, size - len(withdrawn)))
            self._joined[key], self._withdrawn[key] = set(), withdrawn
        elif session is not None and session in self._withdrawn[key]:
            self._withdrawn[key].discard(session)
            self.withdrawn_sessions -= 1
            group.expected += 1
        if session is not None:
            self._joined[key].add(session)
        position = len(group.members)
        group.add(position)
        if group.closed:
            self._forget(key)
        return group, position

    def withdraw(self, key: Hashable, session: Hashable) -> Group | None:
        """Session ``session`` of group ``key`` will never join. Returns the open group when it now
        has every member it will get (the caller closes it: ``close``), else None."""
        group = self._open.get(key)
        if group is None:
            pending = self._pending.setdefault(key, set())
            if session not in pending:
                pending.add(session)
                self.withdrawn_sessions += 1
            while len(self._pending) > self.MAX_PENDING_WITHDRAWALS:
                self.withdrawn_sessions -= len(self._pending.pop(next(iter(self._pending))))
            return None
        if session in self._joined[key] or session in self._withdrawn[key]:
            return None
        self._withdrawn[key].add(session)
        self.withdrawn_sessions += 1
        group.expected -= 1
        return group if len(group.members) >= group.expected else None

    def close(self, group: Group) -> bool:
        """Close a group short of its size; True if that settles it."""
        if self._open.get(group.key) is group:
            self._forget(group.key)
            if len(group.members) < group.expected:
                self._closed_short[group.key] = None
                if len(self._closed_short) > 100_000:  # bounded memory: forget the oldest
                    del self._closed_short[next(iter(self._closed_short))]
        return group.close()

    def _forget(self, key: Hashable) -> None:
        del self._open[key]
        self._joined.pop(key, None)
        self._withdrawn.pop(key, None)

    @property
    def open_groups(self) -> int:
        return len(self._open)


def assemble_chunk(groups: Iterable[GroupResult]) -> ScoredChunk:
    """Flatten groups into one chunk with indices ascending; extra-info keys are the union, missing
    values None, so every list stays aligned with ``indices``."""
    rows: list[tuple[int, float, dict, float | None]] = []
    count, ready_after, ready_at = 0, 0.0, 0.0
    for group in groups:
        count += 1
        ready_after = max(ready_after, group.ready_after)
        ready_at = max(ready_at, group.ready_at)
        latencies = group.latencies or [None] * len(group.indices)
        rows.extend(zip(group.indices, group.scores, group.extras, latencies))
    rows.sort(key=lambda row: row[0])
    keys: dict[str, None] = {}
    for row in rows:
        keys.update(dict.fromkeys(row[2]))
    return ScoredChunk(
        indices=[r[0] for r in rows],
        scores=[r[1] for r in rows],
        extra_info={k: [r[2].get(k) for r in rows] for k in keys},
        groups=count,
        latencies=[r[3] for r in rows],
        ready_after=ready_after,
        ready_at=ready_at,
    )
