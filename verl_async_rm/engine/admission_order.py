"""``admission_order: deadline``: the request pipeline's queue ranked by what the trainer will block
on next, instead of first in, first out (``fifo``, the default, keeps the plain deque, untouched).

The queue only matters when the judge's throughput binds (the concurrency cap, a rate limit, a
429 pause, a budget's reservations): the pump then starts the sample the queue puts first
(``pipeline.py``). The rank, smallest first:

1. validation before training (a ticket submitted or opened with ``validation=True``, a streamed
   sample joined with it): verl's trainers, v0 and v1, run a validation pass inside their loop and
   go on when it is scored (``fit`` calls ``_validate``), so while validation requests are queued
   they are what the trainer blocks on; the training requests queued beside them are for steps it
   takes after (generated ahead: colocate_async, a pipeline one step ahead);
2. the older ticket first, the one the trainer blocks on next (tickets and the per-sample stream's
   groups are numbered in one sequence as they open: ``ScoringEngine.openings``);
3. the caller's rank within its ticket (``submit(..., ranks=...)``: e.g. the mini-batch that needs
   the sample first; 0 without one);
4. the fewer unsettled members its group has, the sooner (the groups closest to completion: a
   group is handed over only whole), counted when the sample is first queued;
5. the order samples were first queued.

A sample keeps its rank for life: a retry after its wait, and a request refused with a 429, go
back in at their own rank, not at the back (nor, as under FIFO, a throttled one at the very front).

**No starvation.** A sample queued ``max_passover_s`` ago or longer is promoted: the oldest such
sample is the head, whatever its rank. So once a sample has waited ``max_passover_s``, no sample
queued after it starts before it; it waits only for the samples queued before it that are still
waiting (what FIFO would have made it wait for). Admitted one at a time, a sample starts at most
``max_passover_s`` after it was queued plus one admission, plus one admission per older sample
still waiting then. When everything queued has waited that long (the judge is that far behind),
the order is FIFO's.

Two views of one set of entries: a heap by rank, and a deque by queueing time for the promotion.
An entry is live while its sample is queued and the entry is the sample's latest; a sample that
was abandoned while queued (a deadline, a cancel: only its state is set, as under FIFO), left
through the other view, or was queued again since, leaves dead entries, dropped as they reach the
front of their view, and all at once when the dead could outnumber the live (``_compact``).
"""

from __future__ import annotations

import heapq
import itertools
import operator
from collections import deque
from typing import Callable, Iterator, Sequence

from verl_async_rm.engine.pipeline import QUEUED, Sample
from verl_async_rm.items import RewardItem

COMPACT_SLACK = 2048  # entries the views may hold beyond twice the live ones before a compaction


class RankedQueue:
    """The admission queue under ``admission_order: deadline``. It has the deque verbs the pipeline
    uses (``append``, ``appendleft``, ``extend``, ``[0]``, ``popleft``, truth, ``len``, iteration),
    so the pump is one piece of code over either queue, and the FIFO deque pays nothing for this one.

    A sample ranks itself (``Sample.admission_rank``: its owner's (training, not validation; opened
    as, caller's rank, unsettled members of its group)); the queue adds the order it was first queued in."""

    def __init__(self, clock: Callable[[], float], max_passover_s: float):
        self.clock = clock
        self.max_passover_s = max_passover_s
        self._by_rank: list[tuple[tuple, int, Sample]] = []  # a heap of (rank, entry, sample)
        self._by_time: deque[tuple[float, int, Sample]] = deque()  # (queued at, entry, sample), oldest first
        self._entries = itertools.count()  # tells a sample's latest entry from its dead ones
        self._arrivals = itertools.count()
        self._head: Sample | None = None  # what the last ``[0]`` returned: what ``popleft`` removes
        self._compact_at = COMPACT_SLACK

    # -- the deque's verbs ---------------------------------------------------------------------------
    def append(self, sample: Sample) -> None:
        """Queue ``sample`` at its rank, which it is given the first time it is queued."""
        rank = getattr(sample, "ranked_as", None)  # the slot is unset until then: FIFO never stores it
        if rank is None:
            rank = sample.ranked_as = (*sample.admission_rank(), next(self._arrivals))
        entry = sample.queue_entry = next(self._entries)
        heapq.heappush(self._by_rank, (rank, entry, sample))
        self._by_time.append((self.clock(), entry, sample))
        if len(self._by_rank) + len(self._by_time) > self._compact_at:
            self._compact()

    appendleft = append  # a throttled request goes back at its own rank too

    def extend(self, samples: Sequence[Sample]) -> None:
        for sample in samples:
            self.append(sample)

    def __getitem__(self, index: int) -> Sample:
        """The head (``[0]`` only, as the pump peeks): the longest-waiting sample once it has waited
        ``max_passover_s``, else the first by rank."""
        if index != 0:
            raise IndexError("a ranked queue shows its head only")
        if not self:
            raise IndexError("the queue is empty")
        queued_at, _, oldest = self._by_time[0]
        self._head = oldest if self.clock() - queued_at >= self.max_passover_s else self._by_rank[0][2]
        return self._head

    def popleft(self) -> Sample:
        """Remove the head the last ``[0]`` returned: the pump pops the sample it peeked at, with
        nothing queued in between (so no clock is read again: the head cannot change under it)."""
        sample, self._head = self._head, None
        sample.queue_entry = None  # both its entries are dead now
        return sample

    def __bool__(self) -> bool:
        self._drop_dead_heads()
        return bool(self._by_rank)

    def __len__(self) -> int:
        """Entries, dead ones not dropped yet included (the deque counts abandoned samples alike)."""
        return len(self._by_rank)

    def __iter__(self) -> Iterator[Sample]:
        return (sample for _, sample in self.waiting())

    # -- reading and housekeeping --------------------------------------------------------------------
    def waiting(self) -> Iterator[tuple[float, Sample]]:
        """(when it was queued, sample) for every sample queued now, the longest-waiting first."""
        for queued_at, entry, sample in self._by_time:
            if sample.state == QUEUED and sample.queue_entry == entry:
                yield queued_at, sample

    def _drop_dead_heads(self) -> None:
        """After this, both views start with a live entry, or both are empty of live ones (every live
        entry is in both)."""
        by_rank, by_time = self._by_rank, self._by_time
        while by_rank and not _live(by_rank[0]):
            heapq.heappop(by_rank)
        while by_time and not _live(by_time[0]):
            by_time.popleft()

    def _compact(self) -> None:
        """Drop every dead entry. Dead ones otherwise wait to reach a front: behind a sample waiting
        out ``max_passover_s`` while thousands pass it, or, in the heap, a promoted or abandoned
        sample of a low rank; each holds its sample (and its ticket) in memory. Called once the
        views hold twice the live entries they held at the last compaction plus ``COMPACT_SLACK``,
        so each entry is visited O(1) times."""
        self._by_rank = [entry for entry in self._by_rank if _live(entry)]
        heapq.heapify(self._by_rank)
        self._by_time = deque(entry for entry in self._by_time if _live(entry))
        self._compact_at = 4 * len(self._by_rank) + COMPACT_SLACK


def _live(entry: tuple) -> bool:
    sample = entry[2]
    return sample.state == QUEUED and sample.queue_entry == entry[1]


def caller_ranks(items: Sequence[RewardItem], ranks: Sequence[int] | None) -> dict[int, int] | None:
    """A ticket's ranks (one per item, smaller first) by sample index, checked: bad input raises at
    ``submit``, before anything is queued."""
    if ranks is None:
        return None
    ranks = list(ranks)
    if len(ranks) != len(items):
        raise ValueError(f"ranks has {len(ranks)} entries for {len(items)} items: one rank per item")
    by_index = {}
    for item, rank in zip(items, ranks):
        if isinstance(rank, bool):
            raise ValueError(f"the rank of sample {item.index} is {rank!r}: ranks are integers")
        try:
            by_index[item.index] = operator.index(rank)  # numpy integers too
        except TypeError:
            raise ValueError(f"the rank of sample {item.index} is {rank!r}: ranks are integers") from None
    return by_index
