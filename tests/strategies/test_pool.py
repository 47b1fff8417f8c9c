"""The pool of scored groups (strategies/staleness_pool.py): every group trained once or dropped, never
staler than ``max_staleness``, oldest ready first, a straggler never holding a step that has enough
ready groups; and the auto lookahead rule. Pure, Hypothesis, fast."""

from __future__ import annotations

import math
import random
import statistics

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from verl_async_rm.strategies.staleness_pool import (
    GroupPool,
    auto_lookahead,
    auto_staleness_bound,
    first_overdue,
    short_of_supply,
    supply_lookahead,
)

pytestmark = pytest.mark.quick


def simulate(groups_per_step, steps, lookahead, max_staleness, on_stale, seed, ready_fraction, supply=False,
             supply_steps=None, lost=0.0, raise_to=None, rule=None):
    """Steps 1..steps; batch b (G groups) is generated for step b, ``lookahead`` steps early; before
    each selection a random part of the pending groups has been scored; a wait scores one more (the
    awaited group, or a random one). ``supply``: the v1 trainer's rule, a batch more (born at the
    latest step generated for) while the pool is ``short_of_supply`` for ``supply_steps`` of
    lookahead (default: ``lookahead``; under on_stale=wait by whole batches, as the trainer asks).
    ``lost``: the chance that every session of a prompt failed in generation (it joins rowless: ready
    at once, nothing to train, as verl's sampler counts it).
    ``raise_to``: step -> the bound raised to before that step (max_staleness=auto); ``rule``: the
    supply's depth recomputed each step as the trainer does, ``supply_lookahead(rule, lookahead,
    the bound in force)``. Each log entry records the bound its step ran under."""
    supply_steps = lookahead if supply_steps is None else supply_steps
    rng = random.Random(seed)
    pool = GroupPool(groups_per_step, max_staleness, on_stale)
    generated, log, extra, born_of, rowless = 0, [], 0, {}, set()

    def add(batch, born):
        keys = [(batch, i) for i in range(groups_per_step)]
        empty = [key for key in keys if lost and rng.random() < lost]
        if len(empty) == len(keys):  # a batch with no row at all: verl's sampler raises (stock v1 too)
            empty.pop(rng.randrange(len(empty)))
        pool.add(keys, born=born, rowless=empty)
        born_of.update(dict.fromkeys(keys, born))
        rowless.update(empty)

    for step in range(1, steps + 1):
        if raise_to and step in raise_to:
            pool.raise_bound(raise_to[step])
        if rule is not None:
            supply_steps = supply_lookahead(rule, lookahead, pool.max_staleness)
        while generated < min(step + lookahead, steps):  # top up: batches for steps ..step+lookahead
            generated += 1
            add(generated, generated)
        while supply and short_of_supply(len(pool.groups), groups_per_step, supply_steps, steps - step + 1,
                                         whole_batches=on_stale == "wait"):
            extra += 1
            add(steps + extra, max(generated, step))
        if supply:
            slack = groups_per_step - 1 if on_stale == "wait" else 0  # whole batches only
            assert len(pool.groups) + slack >= groups_per_step * min(1 + supply_steps, steps - step + 1)
        for key in pool.pending():
            if rng.random() < ready_fraction:
                pool.scored(key)
        ready_at_start = {k for k, g in pool.groups.items() if g.ready}
        waits, dropped, bound_waits = 0, [], 0
        while True:
            choice = pool.select(step, steps)
            dropped += list(choice.drop)
            if choice.starved:  # drops ate the supply: one batch more, for this step
                extra += 1
                add(steps + extra, step)
                continue
            if not choice.waiting:
                break
            waits += 1
            bound_waits += choice.for_bound
            pending = pool.pending()
            pool.scored(choice.wait_for if choice.wait_for is not None else rng.choice(pending))
        log.append(dict(step=step, take=choice.take, dropped=dropped, waits=waits, bound_waits=bound_waits,
                        ready_at_start=ready_at_start, bound=pool.max_staleness, rowless=rowless & set(choice.take)))
    return pool, log, extra, born_of


@settings(max_examples=60, deadline=None)
@given(g=st.integers(1, 5), steps=st.integers(1, 8), k=st.integers(0, 3), s=st.integers(0, 3),
       on_stale=st.sampled_from(["wait", "drop"]), seed=st.integers(0, 10**6), ready=st.floats(0, 1))
def test_every_group_once_never_too_stale_oldest_first(g, steps, k, s, on_stale, seed, ready):
    pool, log, extra, born_of = simulate(g, steps, k, s, on_stale, seed, ready)
    assert on_stale == "drop" or not extra
    taken = [key for entry in log for key in entry["take"]]
    dropped = [key for entry in log for key in entry["dropped"]]
    assert len(taken) == len(set(taken)) and not set(taken) & set(dropped)  # nothing twice
    assert pool.dropped == len(dropped) and (on_stale == "drop" or not dropped)
    every = {(b, i) for b in range(1, steps + extra + 1) for i in range(g)}
    assert set(taken) | set(dropped) | set(pool.groups) == every  # nothing lost
    for entry in log:
        step = entry["step"]
        assert all(step - born_of[key] <= s for key in entry["take"])  # bounded staleness
        # a full step every time: the pool always holds enough groups (generation runs ahead)
        assert len(entry["take"]) == g
        # oldest first among the groups ready when the step chose: nothing ready and older than a
        # taken group (that was not due) was left behind
        age = lambda key: (born_of[key], key)  # noqa: E731 - birth step, then generation order
        left = [key for key in entry["ready_at_start"] if key not in entry["take"] and key not in entry["dropped"]]
        chosen_freely = [key for key in entry["take"] if step - born_of[key] < s]  # due groups are forced
        for key in left:
            assert all(age(key) > age(taken) for taken in chosen_freely)
        for key in entry["dropped"]:
            assert step - born_of[key] >= s


@settings(max_examples=80, deadline=None)
@given(g=st.integers(1, 5), steps=st.integers(1, 10), k=st.integers(0, 3), s=st.integers(0, 3),
       seed=st.integers(0, 10**6), ready=st.floats(0, 1))
def test_supply_batches_under_drop_keep_every_promise(g, steps, k, s, seed, ready):
    """on_stale=drop with the supply rule (two batches may share a birth step): still every group
    once or dropped, nothing lost, never staler than max_staleness, every step full."""
    pool, log, extra, born_of = simulate(g, steps, k, s, "drop", seed, ready, supply=True)
    taken = [key for entry in log for key in entry["take"]]
    dropped = [key for entry in log for key in entry["dropped"]]
    assert len(taken) == len(set(taken)) and not set(taken) & set(dropped)
    assert pool.dropped == len(dropped)
    every = {(b, i) for b in range(1, steps + 1) for i in range(g)} | {(steps + e, i) for e in range(1, extra + 1) for i in range(g)}
    assert set(taken) | set(dropped) | set(pool.groups) == every
    for entry in log:
        assert len(entry["take"]) == g
        assert all(entry["step"] - born_of[key] <= s for key in entry["take"])


@settings(max_examples=120, deadline=None)
@given(g=st.integers(1, 5), steps=st.integers(1, 12), k=st.integers(0, 2), s=st.integers(0, 3),
       rule=st.integers(0, 8), seed=st.integers(0, 10**6), ready=st.floats(0, 1), lost=st.sampled_from([0.0, 0.25, 0.6]))
def test_supply_batches_under_wait_drop_nothing_and_keep_every_promise(g, steps, k, s, rule, seed, ready, lost):
    """on_stale=wait with the supply rule (the pool as deep as ``supply_lookahead`` lets, whole
    batches), with or without prompts every session of which failed (rowless, counted as verl's
    sampler counts them): every group trained once or still in the pool, never staler than
    max_staleness, none dropped, not even at max_staleness=0, and no refill needed; every step
    train_batch_size prompts with rows among them (one group more when the oldest would all be
    rowless)."""
    depth = supply_lookahead(rule, k, s)
    pool, log, extra, born_of = simulate(g, steps, k, s, "wait", seed, ready, supply=True, supply_steps=depth, lost=lost)
    taken = [key for entry in log for key in entry["take"]]
    dropped = [key for entry in log for key in entry["dropped"]]
    assert len(taken) == len(set(taken)) and not set(taken) & set(dropped) and pool.dropped == len(dropped)
    assert not dropped
    assert set(taken) | set(pool.groups) == set(born_of)
    for entry in log:
        take, empty = entry["take"], entry["rowless"]
        assert len(take) == g or (len(take) == g + 1 and set(take[:g]) <= empty and take[g] not in empty)
        assert set(take) - empty  # something to train
        assert all(entry["step"] - born_of[key] <= s for key in take)


@settings(max_examples=120, deadline=None)
@given(g=st.integers(1, 5), steps=st.integers(1, 12), k=st.integers(0, 2), s=st.integers(0, 3),
       rule=st.integers(0, 8), seed=st.integers(0, 10**6), ready=st.floats(0, 1),
       on_stale=st.sampled_from(["wait", "drop"]),
       raises=st.dictionaries(st.integers(2, 12), st.integers(0, 6), max_size=4))
def test_a_bound_raised_mid_run_keeps_every_promise(g, steps, k, s, rule, seed, ready, on_stale, raises):
    """max_staleness=auto raises the bound between steps (never lowers it: a lower value is ignored)
    with the supply recomputed under it, as the v1 trainer does: every group trained once, dropped
    or still in the pool; none dropped under wait (the refill case aside: s=0 is not reached, the
    bound only grows from s); each step full and never staler than the bound it ran under."""
    pool, log, extra, born_of = simulate(g, steps, k, s, on_stale, seed, ready, supply=True, raise_to=raises, rule=rule)
    taken = [key for entry in log for key in entry["take"]]
    dropped = [key for entry in log for key in entry["dropped"]]
    assert len(taken) == len(set(taken)) and not set(taken) & set(dropped) and pool.dropped == len(dropped)
    assert set(taken) | set(dropped) | set(pool.groups) == set(born_of)
    assert on_stale == "drop" or not dropped
    bound = s
    for entry in log:
        bound = max([bound] + [b for step, b in raises.items() if step <= entry["step"]])
        assert entry["bound"] == bound  # raised, never lowered
        assert len(entry["take"]) == g
        assert all(entry["step"] - born_of[key] <= entry["bound"] for key in entry["take"])


@settings(max_examples=300, deadline=None)
@given(deadline=st.floats(0.01, 100), computes=st.lists(st.floats(0.001, 20), max_size=16), current=st.integers(0, 8))
def test_the_auto_bound_outlasts_the_deadline_and_never_falls(deadline, computes, current):
    bound = auto_staleness_bound(deadline, computes, current)
    assert bound >= current
    if computes:
        median = statistics.median(computes)
        assert bound * median >= deadline * (1 - 1e-9)  # carried this long, the deadline has fired
        assert bound == current or (bound - 1) * median < deadline  # and no longer than that
    else:
        assert bound == current  # nothing measured yet
    assert auto_staleness_bound(deadline * 2, computes, current) >= bound  # monotone in the deadline


def test_under_the_auto_bound_no_step_waits_for_a_group_the_deadline_settles():
    """The arithmetic behind max_staleness=auto, with the real pool rules: steps of compute C, batch b
    generated at the start of step b - k, each group scored L <= D seconds later (a hang: exactly D,
    when the deadline settles it). Under the bound ceil(D / C) no step waits for a due group. With
    generation one step ahead (k = 1) that bound has a step to spare (a batch is scored from a step
    before its own; on-policy, supply batches have none): two steps less, and the step a hang comes
    due in waits for it."""
    C, D, G, STEPS = 1.0, 4.6, 3, 14
    rng = random.Random(7)
    latency = {(b, i): (D if (b, i) in {(3, 1), (8, 0)} else rng.uniform(0, 1.5 * C)) for b in range(1, STEPS + 2) for i in range(G)}

    def due_waits(bound: int, K: int) -> int:
        pool, generated, waits = GroupPool(G, bound, "wait"), 0, 0
        ready_at = {}
        for step in range(1, STEPS + 1):
            now = (step - 1) * C
            while generated < min(step + K, STEPS):
                generated += 1
                pool.add([(generated, i) for i in range(G)], born=generated)
                ready_at.update({(generated, i): now + latency[(generated, i)] for i in range(G)})
            while True:
                for key in pool.pending():
                    if ready_at[key] <= now:
                        pool.scored(key)
                choice = pool.select(step, STEPS)
                if not choice.waiting:
                    break
                waits += choice.wait_for is not None
                pending = pool.pending() if choice.wait_for is None else [choice.wait_for]
                now = max(now, min(ready_at[key] for key in pending))  # the clock runs while the step waits
        return waits

    assert auto_staleness_bound(D, [C] * 5, 1) == 5
    assert due_waits(5, K=1) == 0 and due_waits(4, K=1) == 0
    assert due_waits(3, K=1) >= 1


def test_a_step_waits_rather_than_leave_more_due_later_than_the_steps_can_train():
    """on_stale=wait, one group a step, bound 2: three unscored groups born at step 1 must all be
    trained by step 3. Taking the ready younger group at step 1 would leave three for steps 2 and 3,
    and one would have to pass the bound or be dropped: the step waits for a score first (counted
    as a bound wait), then trains the oldest. At the run's last step no later step needs the room."""
    def pool():
        p = GroupPool(1, max_staleness=2, on_stale="wait")
        p.add(["a", "b", "x"], born=1)
        p.add(["c"], born=2)
        p.scored("c")
        return p
    waiting = pool()
    choice = waiting.select(1)
    assert choice.waiting and choice.for_bound and choice.wait_for is None and not choice.take
    waiting.scored("b")
    assert waiting.select(1).take == ("b",)
    assert pool().select(1, last_step=1).take == ("c",)  # the last step: nothing later to keep room for
    assert pool().select(1, last_step=3).waiting  # steps 2 and 3 cannot take a, b and x
    assert pool().select(1, last_step=2).take == ("c",)  # no step 3: they are not due by the end


@settings(max_examples=300, deadline=None)
@given(step=st.integers(0, 5), deadlines=st.lists(st.integers(1, 12), max_size=14), per_step=st.integers(1, 4),
       last=st.one_of(st.none(), st.integers(0, 12)))
def test_first_overdue_is_where_earliest_deadline_first_falls_behind(step, deadlines, per_step, last):
    """``first_overdue`` (a count) names the first step at which scheduling the groups earliest
    deadline first, step by step, leaves one past its deadline (for deadlines after ``step``: the
    pool never keeps a group past its deadline), and None when it never does."""
    deadlines = [d for d in deadlines if d > step]
    left, s, late = sorted(deadlines), step, None
    while left and late is None:
        s += 1
        if last is not None and s > last:
            break
        left = left[per_step:]
        if any(d <= s for d in left):
            late = s
    assert first_overdue(step, deadlines, per_step, last) == late


def test_a_step_does_not_wait_when_no_group_it_could_wait_for_would_help():
    """Groups that cannot all meet their deadlines although every one is scored (only a broken
    supply makes such a pool): the step does not wait (nothing pending would help; a wait for
    "any" group would never end) and the excess is dropped when due, counted."""
    pool = GroupPool(1, max_staleness=1, on_stale="wait")
    pool.add(["a", "b", "c"], born=1)
    for key in "abc":
        pool.scored(key)
    assert pool.select(1).take == ("a",)
    choice = pool.select(2)
    assert choice.take == ("b",) and choice.drop == ("c",) and pool.dropped == 1


def test_more_ready_groups_due_than_a_step_trains_on_drop_the_excess_oldest_kept():
    """Two batches born at one step (a supply batch), none taken before they are due: the step
    trains on the oldest train_batch_size of them and drops the rest, counted. Under wait the
    supply rule and the bound waits keep this from happening (above); only a refill after failed
    sessions at max_staleness=0 can, and then the excess is dropped the same way."""
    pool = GroupPool(2, max_staleness=1, on_stale="drop")
    pool.add(["a", "b"], born=1)
    pool.add(["c", "d"], born=1)  # the supply batch
    pool.add(["e", "f"], born=2)
    for key in "abcdef":
        pool.scored(key)
    choice = pool.select(2)
    assert choice.take == ("a", "b") and set(choice.drop) == {"c", "d"} and pool.dropped == 2
    waiting = GroupPool(2, max_staleness=0, on_stale="wait")
    waiting.add(["a"], born=2)  # a failed session left one group of a batch: the step was starved
    waiting.add(["b", "c"], born=2)  # the refill, for the same step
    for key in "abc":
        waiting.scored(key)
    choice = waiting.select(2)
    assert choice.take == ("a", "b") and choice.drop == ("c",) and waiting.dropped == 1


@settings(max_examples=80, deadline=None)
@given(g=st.integers(1, 5), steps=st.integers(1, 12), ahead=st.integers(0, 2), s=st.integers(0, 3),
       rule=st.integers(0, 8), seed=st.integers(0, 10**6))
def test_a_supply_within_the_staleness_bound_drops_nothing_when_every_score_is_in(g, steps, ahead, s, rule, seed):
    """Every score in before each step: a pool supplied for ``supply_lookahead`` steps (whatever the
    auto rule says) trains every group in time, none dropped, and every step is full."""
    depth = supply_lookahead(rule, ahead, s)
    assert depth <= rule and depth <= ahead + s
    pool, log, extra, _ = simulate(g, steps, ahead, s, "drop", seed, 1.0, supply=True, supply_steps=depth)
    assert pool.dropped == 0 and all(len(entry["take"]) == g for entry in log)


def test_a_supply_one_step_deeper_than_the_bound_drops_scored_groups():
    """Why the cap: one step deeper, groups with their scores in come due more at once than a step
    trains on, and the surplus is dropped (the heavy-tail benchmark lost 8-10 groups a run so)."""
    deeper, *_ = simulate(4, 10, 1, 2, "drop", 0, 1.0, supply=True, supply_steps=supply_lookahead(9, 1, 2) + 1)
    assert deeper.dropped > 0


@pytest.mark.parametrize("pool_groups, k, left, short", [(15, 1, 10, True), (16, 1, 10, False), (8, 1, 1, False),
                                                         (7, 1, 1, True), (8, 0, 5, False), (0, 2, 0, False)])
def test_short_of_supply(pool_groups, k, left, short):
    assert short_of_supply(pool_groups, 8, k, left) is short


@settings(max_examples=50, deadline=None)
@given(g=st.integers(1, 4), steps=st.integers(2, 8), k=st.integers(1, 3), s=st.integers(1, 3), seed=st.integers(0, 10**6))
def test_a_straggler_does_not_hold_a_step_that_has_enough_ready_groups(g, steps, k, s, seed):
    """Every batch is scored at once except one straggler that never answers: with batches ahead,
    a step waits only when a straggler is due (carried max_staleness times already) or too few
    groups are ready at all; it never trains on a straggler."""
    rng = random.Random(seed)
    pool = GroupPool(g, s, "wait")
    generated, stragglers = 0, set()
    for step in range(1, steps + 1):
        while generated < steps + k and generated < step + k:
            generated += 1
            keys = [(generated, i) for i in range(g)]
            pool.add(keys, born=generated)
            straggler = rng.choice(keys)
            stragglers.add(straggler)
            for key in keys:
                if key != straggler:
                    pool.scored(key)
        enough_ready = sum(group.ready for group in pool.groups.values()) >= g
        choice = pool.select(step)
        if any(key in pool.groups and step - key[0] >= s for key in stragglers):
            assert choice.waiting and choice.wait_for in stragglers
            return
        if not enough_ready:
            assert choice.waiting and choice.wait_for is None
            return
        assert not choice.waiting and len(choice.take) == g and not set(choice.take) & stragglers
        assert pool.carried == len([key for key in stragglers if key[0] <= step])


def test_due_groups_wait_or_drop():
    pool = GroupPool(2, max_staleness=0, on_stale="wait")
    pool.add(["a", "b"], born=1)
    pool.scored("a")
    assert pool.select(1).wait_for == "b"  # staleness 0 allowed: b cannot be carried
    dropping = GroupPool(2, max_staleness=0, on_stale="drop")
    dropping.add(["a", "b"], born=1)
    dropping.add(["c", "d"], born=2)
    for key in "acd":
        dropping.scored(key)
    choice = dropping.select(1)
    assert choice.drop == ("b",) and choice.take == ("a", "c") and dropping.dropped == 1
    with pytest.raises(ValueError, match="on_stale"):
        GroupPool(2, 1, "skip")


def test_carried_groups_are_counted_once():
    pool = GroupPool(2, max_staleness=2)
    pool.add(["a", "b"], born=1)
    pool.add(["c", "d"], born=2)
    pool.add(["e", "f"], born=3)
    for key in "acdef":
        pool.scored(key)
    assert pool.select(1).take == ("a", "c") and pool.carried == 1  # b carried
    assert pool.select(2).take == ("d", "e") and pool.carried == 1  # still b, counted once
    assert pool.select(3).wait_for == "b"  # 3 - 1 = 2: due now


@given(latency=st.floats(0, 100), compute=st.floats(0.01, 50), cap=st.integers(0, 4))
def test_auto_lookahead_covers_the_latency_within_its_clamp(latency, compute, cap):
    k = auto_lookahead(latency, compute, max_steps=cap)
    assert 0 <= k <= cap
    if k < cap:  # not clamped: k steps of compute cover the latency, k - 1 do not
        assert k * compute >= latency - 1e-6
        assert k == 0 or (k - 1) * compute < latency + 1e-6
    assert auto_lookahead(latency * 2, compute, max_steps=cap) >= k  # monotone in latency


def test_auto_lookahead_before_any_measurement():
    assert auto_lookahead(math.nan, 1.0, max_steps=4) == 1
    assert auto_lookahead(1.0, 0.0, max_steps=0) == 0
