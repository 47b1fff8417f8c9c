"""A generated batch's rewards as agent tickets: submitted the moment generation ends, taken back as
whole groups (all, a mini-batch's worth, or group by group) with a fixed set of extra-info keys.

A request is one scored response; it may stand for several rows of the batch (v1: every output of a
multi-output session gets the score of the session's final output, as verl does). A submitted batch
with groups of several sizes (v1: failed sessions, per-prompt ``__rollout_n__``) goes as one ticket
per size; a step's open ticket (scoring while generating) names each uid's size, and a group a
failed session left short is settled with the members it has when the ticket closes. Any of these
batches can be taken group by group (``take_group``: the staleness pool); only a regular one
(``PendingRewards.regular``) can be cut into mini-batches of a fixed size.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Hashable, Mapping, Optional, Sequence

import numpy as np

from verl_async_rm.client import RewardClient
from verl_async_rm.cost import Prices, Usage, chunk_usage
from verl_async_rm.integration.agent_client import connect
from verl_async_rm.integration.decode import FIXED_EXTRA_KEYS, fixed_extra_columns
from verl_async_rm.integration.settings import AsyncAgentSettings
from verl_async_rm.strategies.timing import RewardTiming

GROUP_POLL_S = 0.02  # take_group over several tickets: each is asked in turn for up to this long


@dataclass
class _Ticket:
    ticket: str
    requests: Mapping[int, int]  # the ticket's sample index -> request (a list on the batch path)
    group_size: int  # the largest group's size when ``sized_per_uid``
    remaining: int  # of this batch's samples, not handed out yet
    sized_per_uid: bool = False  # opened with a size per uid: get(n=1) hands out the next whole group, any size


@dataclass(frozen=True)
class OpenStream:
    """A step's open ticket: the agent-loop workers add its samples as their rollouts finish."""

    ticket: str
    opened_at: float
    group_size: int | Mapping[Hashable, int]


@dataclass
class PendingRewards:
    tickets: list[_Ticket]
    rows_of: list[tuple]  # request -> the batch rows (v0: positions; v1: TransferQueue keys) it scores
    group_of: list[Hashable]  # request -> its group
    timing: RewardTiming
    latencies: list[float] = field(default_factory=list)
    group_latencies: list[float] = field(default_factory=list)  # per group taken: its slowest member's
    failed: int = 0
    uniform_groups: bool = True  # every group of the batch has the ticket's group size
    strays: int = 0  # samples scored on the ticket whose rows the batch does not have (v1: dropped groups)
    usage: Usage = Usage()  # the judge's reported tokens for this batch (cost.py)

    @property
    def samples(self) -> int:
        return len(self.rows_of)

    @property
    def regular(self) -> bool:
        """One ticket, one row per request: mini-batches of whole groups have a fixed size."""
        return (len(self.tickets) <= 1 and self.uniform_groups and not self.strays
                and all(len(rows) == 1 for rows in self.rows_of))

    @property
    def group_size(self) -> int:
        return self.tickets[0].group_size if self.tickets else 1

    @property
    def remaining(self) -> int:
        return sum(t.remaining for t in self.tickets)


@dataclass
class ScoredRows:
    """Scores of whole groups, expanded to rows: ``rows[i]`` (of group ``row_groups[i]``) gets
    ``scores[i]`` and the i-th value of every ``extra_info`` column."""

    rows: list
    scores: list[float]
    extra_info: dict[str, list]
    row_groups: list[Hashable]

    @classmethod
    def empty(cls, keys: Sequence[str]) -> ScoredRows:
        return cls([], [], {key: [] for key in keys}, [])

    @property
    def groups(self) -> list[Hashable]:
        """The groups these rows complete, in the order they came."""
        return list(dict.fromkeys(self.row_groups))

    def extend(self, other: ScoredRows) -> None:
        self.rows += other.rows
        self.scores += other.scores
        self.row_groups += other.row_groups
        for key, values in other.extra_info.items():
            self.extra_info[key] += values

    def split(self, groups: set) -> tuple[ScoredRows, ScoredRows]:
        """(the rows of ``groups``, the rest)."""
        taken, rest = ScoredRows.empty(self.extra_info), ScoredRows.empty(self.extra_info)
        for i, row in enumerate(self.rows):
            target = taken if self.row_groups[i] in groups else rest
            target.rows.append(row)
            target.scores.append(self.scores[i])
            target.row_groups.append(self.row_groups[i])
            for key in target.extra_info:
                target.extra_info[key].append(self.extra_info[key][i])
        return taken, rest


class BatchRewards:
    def __init__(self, settings: AsyncAgentSettings, tokenizer, client: Optional[RewardClient] = None):
        """``client``: the agent to talk to (default: the job's, ``agent_client.connect``)."""
        self.settings = settings
        self.client = connect(self.settings) if client is None else client
        self.tokenizer = tokenizer
        self.extra_keys = tuple(self.settings.extra_keys)
        agent = self.settings.agent
        self.prices = Prices.of(agent.price_input_per_million, agent.price_output_per_million)
        self.total_usage = Usage()  # every batch so far (cumulative cost in the step metrics)

    @property
    def fixed_keys(self) -> tuple[str, ...]:
        return (*FIXED_EXTRA_KEYS, *self.extra_keys)

    def submit(self, requests: list[dict], rows_of: Optional[Sequence[tuple]] = None, *, validation: bool = False,
               rows_per_mini_batch: Optional[int] = None) -> PendingRewards:
        """``requests`` as ``decode_requests`` builds them (``index`` = position in the list);
        ``rows_of[i]``: the rows request i scores (default: row i). Hints for the agent's
        ``admission_order: deadline`` (which request the judge gets first when its throughput binds):
        ``validation``, a validation batch (after training); ``rows_per_mini_batch`` (m), the rows are
        positions in verl's order and mini-batch k is rows [k*m, (k+1)*m): each request ranks with the
        first mini-batch that needs its group."""
        rows_of = [tuple(r) for r in rows_of] if rows_of is not None else [(i,) for i in range(len(requests))]
        group_of = [r["uid"] if r["uid"] is not None else ("sample", i) for i, r in enumerate(requests)]
        counts = Counter(group_of)
        by_size: dict[int, list[int]] = {}
        for i, group in enumerate(group_of):
            by_size.setdefault(counts[group], []).append(i)
        ranks = mini_batch_ranks(rows_of, group_of, rows_per_mini_batch) if rows_per_mini_batch else None
        # only hints given are passed: a client that knows no admission order is called as before
        hints = {"validation": True} if validation else {}
        submitted_at = time.monotonic()
        tickets = []
        for size, members in sorted(by_size.items()):
            batch = [{**requests[i], "index": local} for local, i in enumerate(members)]
            ticket_hints = hints if ranks is None else {**hints, "ranks": [ranks[i] for i in members]}
            tickets.append(_Ticket(self.client.submit(batch, size, **ticket_hints), dict(enumerate(members)), size,
                                   len(members)))
        return PendingRewards(tickets, list(rows_of), group_of, RewardTiming(submitted_at))

    # -- score while generating (streaming.py) ---------------------------------------------------
    def open_stream(self, group_size: int | Mapping[Hashable, int]) -> OpenStream:
        """Open the step's ticket before generation; its deadline counts from now."""
        return OpenStream(self.client.open_ticket(group_size), time.monotonic(), group_size)

    def close_stream(self, stream: OpenStream, rows_of: Mapping[int, tuple], group_of: Mapping[int, Hashable]) -> PendingRewards:
        """After generation: no more samples. ``rows_of[index]``: the batch rows sample ``index``
        scores; ``group_of[index]`` its group. Samples the workers added that the batch does not
        have (v1: a group verl dropped because one of its sessions failed) are counted as strays:
        they come back with the rest and are skipped."""
        self.client.close_ticket(stream.ticket)
        indices = sorted(rows_of)
        added = self.client.remaining(stream.ticket)  # nothing taken yet: every sample added
        missing = len(indices) - added
        if missing > 0:
            raise RuntimeError(f"{missing} generated samples never reached ticket {stream.ticket} "
                               "(the agent-loop workers add each one before it is reported done)")
        sizes = Counter(group_of[i] for i in indices)
        size = stream.group_size if isinstance(stream.group_size, int) else max(sizes.values(), default=1)
        uniform = all(n == size for n in sizes.values()) and (
            isinstance(stream.group_size, int) or all(stream.group_size.get(g) == n for g, n in sizes.items()))
        ticket = _Ticket(stream.ticket, {index: position for position, index in enumerate(indices)}, size, len(indices),
                         sized_per_uid=not isinstance(stream.group_size, int))
        return PendingRewards([ticket], [tuple(rows_of[i]) for i in indices], [group_of[i] for i in indices],
                              RewardTiming(stream.opened_at), uniform_groups=uniform, strays=added - len(indices))

    def abandon_stream(self, stream: OpenStream) -> None:
        """Generation failed: stop scoring what was added."""
        self.client.cancel(stream.ticket)

    def take_group(self, pending: PendingRewards, timeout: Optional[float]) -> Optional[ScoredRows]:
        """The next whole group of ``pending`` to be scored (with any others handed out with it), or
        None if none is within ``timeout`` (0: only one already scored; None: as long as it takes)
        or none is left. Any batch: groups of several sizes (one ticket per size, or an open ticket
        sized per uid), groups a failed session left short, several rows per request (the staleness
        pool takes every batch verl trains on this way)."""
        tickets = [t for t in pending.tickets if t.remaining]
        if len(tickets) <= 1:
            return self._take_group_of(pending, tickets[0], timeout) if tickets else None
        for ticket in tickets:  # several sizes (submitted batch): one scored already, in any of them
            got = self._take_group_of(pending, ticket, 0)
            if got is not None:
                return got
        if timeout == 0:
            return None
        end = None if timeout is None else time.monotonic() + timeout
        while True:  # the first to be scored, whichever ticket holds it: each asked in turn, briefly
            for ticket in [t for t in pending.tickets if t.remaining]:
                left = GROUP_POLL_S if end is None else min(GROUP_POLL_S, max(0.0, end - time.monotonic()))
                got = self._take_group_of(pending, ticket, left)
                if got is not None:
                    return got
            if not pending.remaining or (end is not None and time.monotonic() >= end):
                return None

    def _take_group_of(self, pending: PendingRewards, ticket: _Ticket, timeout: Optional[float]) -> Optional[ScoredRows]:
        """Whole groups of one ticket, the first to be scored and at least one of this batch's."""
        # One group: n=1 on a ticket sized per uid (the group that reaches n is never cut); with one
        # size, n is that size (a group left short when an open ticket closed may bring the next along).
        n = 1 if ticket.sized_per_uid else ticket.group_size
        end = None if timeout is None else time.monotonic() + timeout
        while ticket.remaining:
            left = None if end is None else max(0.0, end - time.monotonic())
            try:
                got = self._take(pending, ticket, n, left, exact=True)
            except TimeoutError:
                return None
            if got.rows:
                return got
            # only samples the batch does not have (strays, skipped): the batch's groups are still to come
        return None

    def take_if_all_scored(self, pending: PendingRewards) -> Optional[ScoredRows]:
        """Every remaining group of ``pending`` if all of them are scored already, else None with
        nothing taken (one ticket only: the pipeline's batches)."""
        return self.take_ready(pending, None)

    def take_ready(self, pending: PendingRewards, n: Optional[int]) -> Optional[ScoredRows]:
        """Whole groups totalling ``n`` requests (``None``: every remaining one) in completion order if
        they are scored already, else None with nothing taken (one ticket only)."""
        if len(pending.tickets) != 1:
            raise ValueError("taking a batch without waiting needs a batch of one group size (one ticket)")
        ticket = pending.tickets[0]
        if not ticket.remaining:
            return None
        try:
            return self._take(pending, ticket, n, timeout=0)
        except TimeoutError:
            return None

    def take(self, pending: PendingRewards, n: Optional[int] = None) -> ScoredRows:
        """Whole groups totalling ``n`` requests in completion order (one ticket only), or everything
        left (``n`` None), blocking until they are scored."""
        if n is not None and len(pending.tickets) != 1:
            raise ValueError("taking part of a batch needs a batch of one group size")
        out = ScoredRows.empty(self.fixed_keys)
        for ticket in pending.tickets:
            if ticket.remaining:
                out.extend(self._take(pending, ticket, n))
        return out

    def _take(self, pending: PendingRewards, ticket: _Ticket, n: Optional[int], timeout: Optional[float] = None,
              exact: bool = False) -> ScoredRows:
        start = time.monotonic()
        # With strays, whole groups "totalling n" may include some: a blocking take of part of a batch
        # takes all of it then (an irregular batch is trained whole), so nothing of it is left behind;
        # ``exact``: the caller asks for whole groups and skips strays itself (take_group).
        if timeout is None:
            chunk = self.client.get(ticket.ticket, None if pending.strays and not exact else n)
        else:
            chunk = self.client.get(ticket.ticket, n, timeout)
        pending.timing.blocked += time.monotonic() - start
        pending.timing.settled_at.append(pending.timing.submitted_at + chunk.ready_after)
        ours = [p for p, local in enumerate(chunk.indices) if local in ticket.requests]
        pending.latencies += [chunk.latencies[p] for p in ours if chunk.latencies[p] is not None]
        slowest: dict = {}  # a chunk holds whole groups: a group's latency is its slowest member's
        for p in ours:
            if chunk.latencies[p] is not None:
                group = pending.group_of[ticket.requests[chunk.indices[p]]]
                slowest[group] = max(slowest.get(group, 0.0), chunk.latencies[p])
        pending.group_latencies += list(slowest.values())
        ticket.remaining -= len(ours)
        extra = fixed_extra_columns(chunk.scores, chunk.extra_info, self.extra_keys)
        pending.failed += int(sum(extra["reward_failed"][p] for p in ours))
        usage = chunk_usage(chunk.extra_info)  # the judge's reported usage (cost.py)
        pending.usage += usage
        self.total_usage += usage
        out = ScoredRows.empty(self.fixed_keys)
        for position in ours:
            request = ticket.requests[chunk.indices[position]]
            for row in pending.rows_of[request]:
                out.rows.append(row)
                out.scores.append(chunk.scores[position])
                out.row_groups.append(pending.group_of[request])
                for key in out.extra_info:
                    out.extra_info[key].append(extra[key][position])
        return out

    def cancel(self, pending: PendingRewards) -> int:
        """A batch that will never be trained on (generated past the last step): stop its calls."""
        return sum(self.client.cancel(t.ticket) for t in pending.tickets if t.remaining)


def mini_batch_ranks(rows_of: Sequence[tuple], group_of: Sequence[Hashable], rows_per_mini_batch: int) -> list[int]:
    """Per request, the first mini-batch that needs its group (a group is scored, and advantaged,
    whole): the lowest of its members' rows (positions in verl's order), over ``rows_per_mini_batch``."""
    first_row: dict[Hashable, int] = {}
    for rows, group in zip(rows_of, group_of):
        lowest = min(rows)
        first_row[group] = min(lowest, first_row.get(group, lowest))
    return [first_row[group] // rows_per_mini_batch for group in group_of]


def object_array(values) -> np.ndarray:
    """A 1-d object array of ``values`` (np.array would build a 2-d array from equal-length lists)."""
    values = list(values)
    array = np.empty(len(values), dtype=object)
    array[:] = values
    return array


def reorder(scored: ScoredRows, order: Sequence[Any]) -> tuple[list[float], dict[str, list]]:
    """Scores and extra info of ``scored`` in the row order ``order`` (every row scored)."""
    where = {row: i for i, row in enumerate(scored.rows)}
    missing = [row for row in order if row not in where]
    if missing:
        raise KeyError(f"rows without a score: {missing[:5]}")
    positions = [where[row] for row in order]
    return [scored.scores[p] for p in positions], {k: [v[p] for p in positions] for k, v in scored.extra_info.items()}
