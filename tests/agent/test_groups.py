"""Pure group assembly and failure policies: exhaustive with Hypothesis."""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from verl_async_rm.engine.ledger import GroupResult, SettledGroup, StreamGroups, TicketLedger, assemble_chunk
from verl_async_rm.errors import RewardError
from verl_async_rm.failure_policy import Fill, Neutral, Raise, failure_policy, resolve_group
from verl_async_rm.outcomes import Failed, Scored

pytestmark = pytest.mark.quick


@st.composite
def ticket_plans(draw):
    group_size = draw(st.integers(1, 6))
    groups = draw(st.integers(0, 10))
    n = group_size * groups
    # uids deliberately not in index order: samples of a group are scattered across the batch
    layout = draw(st.permutations(list(range(n))))
    uid_of = {index: f"g{position // group_size}" for position, index in enumerate(layout)}
    settle_order = draw(st.permutations(list(range(n))))
    chunk_groups = draw(st.lists(st.integers(1, 4), min_size=1, max_size=12))
    return group_size, uid_of, settle_order, chunk_groups


@settings(max_examples=300, deadline=None)
@given(ticket_plans(), st.lists(st.booleans(), max_size=40))
def test_every_sample_once_whole_groups_sorted(plan, give_backs):
    """Whatever the settle order and chunk sizes, and whether a taker gives a hand-over back (it timed
    out at that moment), every sample is handed out exactly once, in whole groups."""
    group_size, uid_of, settle_order, chunk_groups = plan
    give_back = iter(give_backs)
    ledger = TicketLedger(sorted(uid_of.items()), group_size)
    taken: list[int] = []
    requests = itertools.cycle(chunk_groups)
    want = next(requests) * group_size
    for index in settle_order:
        group = ledger.settle(index, Scored(float(index)))
        if group is not None:
            assert all(uid_of[i] == uid_of[index] for i in group.indices)
            assert group.indices == sorted(group.indices)
            ledger.mark_ready(GroupResult(group.key, group.indices, [o.score for o in group.outcomes], [{}] * group_size))
        got = ledger.take(want)  # the pending get is retried after every event, as the engine does
        if got is not None and next(give_back, False):
            ledger.put_back(got)  # the taker timed out as it was served: the groups go back, in order
            again = ledger.take(want)
            assert [g.indices for g in again] == [g.indices for g in got]
            got = again
        if got is not None:
            chunk = assemble_chunk(got)
            assert chunk.indices == sorted(chunk.indices)
            assert chunk.scores == [float(i) for i in chunk.indices]  # each sample keeps its own score
            assert len(chunk) == min(want, len(uid_of) - len(taken))
            for g in got:
                assert len({uid_of[i] for i in g.indices}) == 1 and len(g.indices) == group_size
            taken += chunk.indices
            want = next(requests) * group_size
    rest = ledger.take(None)
    assert rest is not None
    taken += assemble_chunk(rest).indices
    assert sorted(taken) == sorted(uid_of)  # exactly once each
    assert ledger.exhausted and ledger.take(group_size) == []


@given(st.integers(1, 5), st.integers(1, 30))
def test_take_refuses_partial_groups(group_size, n):
    ledger = TicketLedger([(i, i // group_size) for i in range(group_size * 3)], group_size)
    if n % group_size:
        with pytest.raises(ValueError, match="not a multiple of the group size"):
            ledger.take(n)
    else:
        assert ledger.take(n) is None  # nothing ready yet, nothing consumed
        assert ledger.remaining_samples == group_size * 3


def test_bad_batches_are_clear_errors():
    with pytest.raises(ValueError, match="group 'a' has 1 samples"):
        TicketLedger([(0, "a"), (1, "b"), (2, "b")], 2)
    with pytest.raises(ValueError, match="appears twice"):
        TicketLedger([(0, "a"), (0, "a")], 2)
    with pytest.raises(ValueError, match="has no uid"):
        TicketLedger([(0, None), (1, None)], 2)
    with pytest.raises(ValueError, match="positive integer"):
        TicketLedger([], 0)
    ledger = TicketLedger([(0, None), (1, None)], 1)  # validation batches: no uid, groups of one
    assert ledger.total_groups == 2
    with pytest.raises(ValueError, match="settled twice"):
        ledger.settle(0, Scored(1.0))
        ledger.settle(0, Scored(1.0))
    with pytest.raises(KeyError):
        ledger.settle(7, Scored(1.0))
    for bad in (0, -4, 1.5, True):
        with pytest.raises(ValueError):
            ledger.take(bad)


def test_chunk_extra_info_aligned_with_missing_keys_as_none():
    chunk = assemble_chunk(
        [GroupResult("b", [3, 5], [1.0, 2.0], [{"x": 1}, {}]), GroupResult("a", [0, 9], [3.0, 4.0], [{}, {"y": 2}])]
    )
    assert chunk.indices == [0, 3, 5, 9]
    assert chunk.scores == [3.0, 1.0, 2.0, 4.0]
    assert chunk.extra_info == {"x": [None, 1, None, None], "y": [None, None, None, 2]}
    assert chunk.groups == 2


outcomes = st.lists(
    st.one_of(
        st.floats(-5, 5, allow_nan=False).map(Scored),
        st.sampled_from(["timeout", "http_500"]).map(lambda k: Failed(k, f"sample failed: {k}")),
    ),
    min_size=1,
    max_size=8,
)


@given(outcomes, st.floats(-1, 1), st.floats(-1, 1))
def test_failure_policies(group_outcomes, fill_value, neutral_value):
    group = SettledGroup("g", list(range(len(group_outcomes))), group_outcomes)
    ok = [o.score for o in group_outcomes if isinstance(o, Scored)]
    failed = [isinstance(o, Failed) for o in group_outcomes]

    neutral = resolve_group(group, Neutral(neutral_value))
    expected_sub = sum(ok) / len(ok) if ok else neutral_value
    for o, score, extra, f in zip(group_outcomes, neutral.scores, neutral.extras, failed):
        assert extra["reward_failed"] == int(f)
        assert math.isclose(score, expected_sub if f else o.score)
        if f:
            assert extra["reward_failure"] == o.kind and o.message in extra["reward_error"]
    if ok:  # zero advantage: the group mean is unchanged by the substitutes
        assert math.isclose(sum(neutral.scores) / len(neutral.scores), sum(ok) / len(ok), abs_tol=1e-9)

    filled = resolve_group(group, Fill(fill_value))
    assert [s for s, f in zip(filled.scores, failed) if f] == [fill_value] * sum(failed)

    if any(failed):
        with pytest.raises(RewardError, match="sample failed"):
            resolve_group(group, Raise())
    else:
        assert resolve_group(group, Raise()).scores == ok


def test_policies_are_built_from_their_names():
    assert failure_policy("neutral", neutral_value=0.5) == Neutral(0.5)
    assert failure_policy("fill", fill_value=-1) == Fill(-1)
    assert failure_policy("raise") == Raise()
    with pytest.raises(ValueError, match="unknown failure policy"):
        failure_policy("zero")


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["a", "b", "c"]), st.sampled_from(["join", "close", "settle"])), max_size=60),
       st.integers(1, 4))
def test_streamed_groups_resolve_once_with_every_member(events, size):
    """Open membership: members join one at a time, a group closes at its size or when closed early,
    and settles once every member of it has an outcome; a member after an early close starts a new
    group (counted), so nothing waits forever and no member is lost or answered twice."""
    stream = StreamGroups()
    entries: dict[str, list[list]] = {}  # key -> every group under it: [group, unsettled positions]
    joined = settled = 0
    resolved: list[int] = []
    for key, event in events:
        groups = entries.setdefault(key, [])
        if event == "join":
            group, position = stream.add(("uid", key), size)
            if not groups or groups[-1][0] is not group:
                groups.append([group, []])
            groups[-1][1].append(position)
            joined += 1
        elif groups and event == "close" and not groups[-1][0].closed:
            if stream.close(groups[-1][0]):
                resolved.append(len(groups[-1][0].members))
        elif event == "settle":
            for group, unsettled in groups:
                if unsettled:
                    settled += 1
                    if group.settle(unsettled.pop(0), Scored(1.0)):
                        resolved.append(len(group.members))
                        assert group.settled().indices == list(range(len(group.members)))  # arrival order
                    break
    for groups in entries.values():  # finish: close and settle everything left
        for group, unsettled in groups:
            if not group.closed and stream.close(group):
                resolved.append(len(group.members))
            while unsettled:
                settled += 1
                if group.settle(unsettled.pop(0), Scored(1.0)):
                    resolved.append(len(group.members))
    assert sum(resolved) == joined == settled
    assert all(1 <= n <= size for n in resolved)
    assert stream.open_groups == 0


@st.composite
def open_ticket_plans(draw):
    """Groups of mixed sizes; samples added in random batches, settled in random order, some groups
    left short (a session that produced fewer outputs), takes of random n, close at a random point."""
    sizes = draw(st.lists(st.integers(1, 4), min_size=1, max_size=8))
    present = [draw(st.integers(1, size)) for size in sizes]  # members that will actually arrive
    samples = [(index, f"g{g}") for g, count in enumerate(present) for index in [None] * count]
    samples = [(i, uid) for i, (_, uid) in enumerate(samples)]
    order = draw(st.permutations(samples))
    events = draw(st.lists(st.sampled_from(["add", "settle", "take"]), min_size=len(samples) * 3, max_size=len(samples) * 6))
    takes = draw(st.lists(st.integers(1, 6), min_size=1, max_size=20))
    return {f"g{g}": size for g, size in enumerate(sizes)}, present, order, events, takes


@settings(max_examples=300, deadline=None)
@given(open_ticket_plans())
def test_open_tickets_hand_out_every_sample_once_whole_groups_at_least_n(plan):
    sizes, present, order, events, takes = plan
    ledger = TicketLedger([], sizes, open=True)
    uid_of = dict(order)
    added, settled_idx, taken = [], [], []
    to_add, to_settle = list(order), []
    requests = iter(takes * 100)
    want = next(requests)

    def resolve(group):
        ledger.mark_ready(GroupResult(group.key, group.indices, [float(i) for i in group.indices], [{}] * len(group.indices)))

    def try_take():
        nonlocal want
        got = ledger.take(want)
        if got is None:
            return
        chunk = assemble_chunk(got)
        assert chunk.scores == [float(i) for i in chunk.indices]
        closed_and_all = not ledger.open
        assert len(chunk) >= want or closed_and_all  # at least n, unless it is the rest of a closed ticket
        for g in got:
            uid = uid_of[g.indices[0]]
            assert {uid_of[i] for i in g.indices} == {uid}
            assert len(g.indices) == sizes[uid] or not ledger.open  # short groups only after close
        taken.extend(chunk.indices)
        want = next(requests)

    for event in events:
        if event == "add" and to_add:
            index, uid = to_add.pop()
            ledger.add([(index, uid)])
            added.append(index)
            to_settle.append(index)
        elif event == "settle" and to_settle:
            index = to_settle.pop(0)
            group = ledger.settle(index, Scored(float(index)))
            settled_idx.append(index)
            if group is not None:
                resolve(group)
        try_take()
    for index, uid in reversed(to_add):  # the rest arrives, then generation ends
        ledger.add([(index, uid)])
        to_settle.append(index)
    for group in ledger.close():
        resolve(group)
    with pytest.raises(ValueError, match="closed"):
        ledger.add([(10_000, "g0")])
    for index in to_settle:
        group = ledger.settle(index, Scored(float(index)))
        if group is not None:
            resolve(group)
    rest = ledger.take(None)
    assert rest is not None
    taken.extend(assemble_chunk(rest).indices)
    assert sorted(taken) == sorted(uid_of)  # every sample exactly once
    assert ledger.exhausted and ledger.take(None) == []


def test_mixed_group_sizes_are_checked_per_uid():
    ledger = TicketLedger([(0, "a"), (1, "a"), (2, "b")], {"a": 2, "b": 1})
    assert ledger.total_groups == 2
    with pytest.raises(ValueError, match="its size is 1"):
        TicketLedger([(0, "a"), (1, "a")], {"a": 1})
    with pytest.raises(ValueError, match="do not name"):
        TicketLedger([(0, "c")], {"a": 1})
    with pytest.raises(ValueError, match="closed"):
        ledger.add([(3, "b")])
    opened = TicketLedger([], {"a": 2}, open=True)
    opened.add([(0, "a")])
    with pytest.raises(ValueError, match="its size is 2"):
        opened.add([(1, "a"), (2, "a")])  # a bad batch adds nothing
    assert opened.total_samples == 1


@settings(max_examples=300, deadline=None)
@given(ticket_plans(), st.integers(0, 60), st.lists(st.booleans(), max_size=40))
def test_a_deadline_settles_the_rest_at_once_and_every_sample_is_handed_out_once(plan, settled_before, give_backs):
    """Issue 45 item 8, the ledger's part: at the deadline the samples without an outcome all get one
    (``settle_rest``: no step per sample); groups none of whose members had settled are ready as one
    uniform entry, built group by group as takes reach it. Whatever settled before, whatever the
    chunk sizes and hand-overs given back: every sample exactly once, in whole groups, each
    untouched group wholly failed, and the ready count right at every step."""
    from verl_async_rm.engine.ledger import UniformGroups

    group_size, uid_of, settle_order, chunk_groups = plan
    give_back = iter(give_backs)
    ledger = TicketLedger(sorted(uid_of.items()), group_size)
    expected_ready = 0
    for index in settle_order[:settled_before]:  # what finished on its own before the deadline
        group = ledger.settle(index, Scored(float(index)))
        if group is not None:
            ledger.mark_ready(GroupResult(group.key, group.indices, [o.score for o in group.outcomes], [{}] * group_size))
            expected_ready += 1
    deadline = Failed("deadline", "unfinished at the ticket deadline", 0)
    untouched, touched = ledger.settle_rest(deadline)
    assert ledger.all_settled and ledger.settle_rest(deadline) == ([], [])
    assert len(untouched) + len(touched) + expected_ready == len(uid_of) // group_size
    for group in touched:  # a partly settled group: its own outcomes, the deadline for the rest
        assert any(isinstance(o, Scored) for o in group.outcomes) and deadline in group.outcomes
        ledger.mark_ready(resolve_group(group, Fill(-1.0)))
    ledger.mark_ready_uniform(UniformGroups(untouched, -1.0, {"reward_failed": 1}, 9.0, 9.0, 10.0))
    untouched_indices = {i for group in untouched for i in group.members}
    taken: list[int] = []
    for groups_wanted in itertools.cycle(chunk_groups):
        assert ledger.ready_groups == len(uid_of) // group_size - len(taken) // group_size
        got = ledger.take(groups_wanted * group_size)
        if got is not None and next(give_back, False):
            ledger.put_back(got)
            again = ledger.take(groups_wanted * group_size)
            assert [g.indices for g in again] == [g.indices for g in got]
            got = again
        if not got:
            break
        for result in got:
            assert len(result.indices) == group_size and len({uid_of[i] for i in result.indices}) == 1
            if result.indices[0] in untouched_indices:
                assert result.scores == [-1.0] * group_size and result.latencies == [9.0] * group_size
        taken += assemble_chunk(got).indices
    assert sorted(taken) == sorted(uid_of) and ledger.exhausted
