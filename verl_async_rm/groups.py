"""Group assembly for one ticket: pure book-keeping, no I/O, no asyncio, no verl.

A ticket is one submitted batch. Its samples fall into GRPO groups by ``uid``; a group is *settled*
when every sample has an outcome, *ready* once the failure policy and the user's group hook have
turned it into scores, and *taken* when a ``get`` hands it out. Ready groups leave in completion
order; each ``take(n)`` hands out whole groups only.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Hashable, Iterable, Sequence

from verl_async_rm.outcome import Outcome, ScoredChunk


@dataclass(frozen=True)
class SettledGroup:
    key: Hashable
    indices: list[int]  # ascending
    outcomes: list[Outcome]  # aligned with indices


@dataclass(frozen=True)
class GroupResult:
    key: Hashable
    indices: list[int]  # ascending
    scores: list[float]
    extras: list[dict]  # per sample, aligned with indices
    latencies: list[float] | None = None  # per sample: ticket submit -> settled, seconds
    ready_after: float = 0.0  # ticket submit -> group ready (policy and hook done), seconds
    ready_at: float = 0.0  # time.monotonic() when it became ready (comparable within one machine)


def group_key(uid: Hashable | None, index: int, group_size: int) -> Hashable:
    if uid is not None:
        return ("uid", uid)
    if group_size != 1:
        raise ValueError(f"sample {index} has no uid, but group_size={group_size}: a uid is needed to form groups")
    return ("sample", index)


class TicketLedger:
    def __init__(self, samples: Sequence[tuple[int, Hashable | None]], group_size: int):
        """``samples``: (index, uid) per sample of the batch."""
        if not isinstance(group_size, int) or group_size < 1:
            raise ValueError(f"group_size must be a positive integer, got {group_size!r}")
        self.group_size = group_size
        self._group_of: dict[int, Hashable] = {}
        members: dict[Hashable, list[int]] = {}
        for index, uid in samples:
            if index in self._group_of:
                raise ValueError(f"sample index {index} appears twice in one batch")
            key = group_key(uid, index, group_size)
            self._group_of[index] = key
            members.setdefault(key, []).append(index)
        for key, indices in members.items():
            if len(indices) != group_size:
                raise ValueError(
                    f"group {key[1]!r} has {len(indices)} samples (indices {sorted(indices)[:8]}...), "
                    f"but group_size={group_size}: every uid needs exactly group_size samples"
                )
            indices.sort()
        self._members = members
        self._unsettled: dict[Hashable, int] = {key: group_size for key in members}
        self._outcomes: dict[int, Outcome] = {}
        self._ready: deque[GroupResult] = deque()
        self.total_groups = len(members)
        self.taken_groups = 0

    # -- settling -------------------------------------------------------------------------------
    def settle(self, index: int, outcome: Outcome) -> SettledGroup | None:
        """Record one sample's outcome; return its group once the group is fully settled."""
        key = self._group_of.get(index)
        if key is None:
            raise KeyError(f"sample index {index} is not part of this ticket")
        if key not in self._unsettled or index in self._outcomes:
            raise ValueError(f"sample index {index} settled twice")
        self._outcomes[index] = outcome
        self._unsettled[key] -= 1
        if self._unsettled[key]:
            return None
        del self._unsettled[key]
        indices = self._members[key]
        return SettledGroup(key, indices, [self._outcomes.pop(i) for i in indices])

    def is_settled(self, index: int) -> bool:
        key = self._group_of[index]
        return key not in self._unsettled or index in self._outcomes

    def unsettled_indices(self) -> list[int]:
        return [i for key in self._unsettled for i in self._members[key] if i not in self._outcomes]

    # -- handing out ----------------------------------------------------------------------------
    def mark_ready(self, group: GroupResult) -> None:
        self._ready.append(group)

    @property
    def remaining_samples(self) -> int:
        return (self.total_groups - self.taken_groups) * self.group_size

    @property
    def exhausted(self) -> bool:
        return self.taken_groups == self.total_groups

    def check_request(self, n: int | None) -> None:
        if n is None:
            return
        if isinstance(n, bool) or not isinstance(n, int) or n <= 0:
            raise ValueError(f"get(n) needs a positive integer n, got {n!r}")
        if n % self.group_size:
            raise ValueError(f"n={n} is not a multiple of the group size {self.group_size}: get returns whole groups")

    def take(self, n: int | None) -> list[GroupResult] | None:
        """Whole ready groups totalling ``n`` samples (all remaining ones if fewer remain; all if ``n`` is
        None), or None when not enough are ready yet. Nothing is consumed on None."""
        self.check_request(n)
        remaining = self.total_groups - self.taken_groups
        wanted = remaining if n is None else min(n // self.group_size, remaining)
        if len(self._ready) < wanted:
            return None
        self.taken_groups += wanted
        return [self._ready.popleft() for _ in range(wanted)]


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
