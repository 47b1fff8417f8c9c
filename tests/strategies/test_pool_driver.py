"""The staleness pool in a trainer (strategies/pool_driver.py) against a real agent in this process, with
open tickets fed sample by sample as a streaming agent-loop worker feeds them: a slow group is
carried, the step takes the ready ones, staleness is counted per row, a resume leaves out exactly
what was trained. The same driver runs on verl's v1 trainer in tests/strategies/test_strategies.py."""

from __future__ import annotations

import time

import pytest

from tests.strategies.test_seam_scheduler import N, rewards
from verl_async_rm.strategies.pool_driver import PoolDriver, choose_lookahead, due_wait_hint
from verl_async_rm.strategies.scheduler import GeneratedBatch

pytestmark = pytest.mark.local
GROUPS = 3  # per batch (= train_batch_size)


def streamed_batch(client_rewards, batch_no: int, delays: list[float], weights_step: int) -> GeneratedBatch:
    """A batch of GROUPS groups of N samples, added one by one to an open ticket (as the workers do),
    rows named (batch, group, sample); the score of a sample is its group number."""
    stream = client_rewards.open_stream(N)
    rows_of, group_of = {}, {}
    for g, delay in enumerate(delays):
        uid = f"b{batch_no}g{g}"
        for s in range(N):
            index = g * N + s
            client_rewards.client.add(stream.ticket, [{"index": index, "solution_str": f"{uid}-{s}", "ground_truth": g,
                                                       "data_source": "t", "extra_info": {"delay": delay}, "uid": uid}])
            rows_of[index], group_of[index] = ((batch_no, g, s),), uid
    pending = client_rewards.close_stream(stream, rows_of, group_of)
    return GeneratedBatch(None, pending, 0, {"drawn": batch_no}, weights_step,
                          positions={f"b{batch_no}g{g}": g for g in range(len(delays))})


def test_a_slow_group_is_carried_and_the_step_takes_ready_ones():
    rw = rewards(extra_keys=())
    driver = PoolDriver(rw, GROUPS, max_staleness=1, on_stale="wait")
    # step 1 with one batch ahead: batch 1 (group 1 slow), batch 2 (all fast)
    driver.add(streamed_batch(rw, 1, [0.0, 2.0, 0.0], weights_step=0), born=1, position_of={"b1g0": 0, "b1g1": 1, "b1g2": 2})
    driver.add(streamed_batch(rw, 2, [0.0, 0.0, 0.0], weights_step=0), born=2, position_of={"b2g0": 0, "b2g1": 1, "b2g2": 2})
    time.sleep(0.5)
    start = time.monotonic()
    step1 = driver.next_step(1, generate_more=lambda: False)
    # did not wait for the slow group: waiting for it takes 1.5 s more (its 2 s less the 0.5 s slept);
    # the 1 s bound leaves a neighbour-loaded machine room
    assert time.monotonic() - start < 1.0
    groups = sorted({(b, g) for b, g, _ in step1.rows})
    assert groups == [(1, 0), (1, 2), (2, 0)]  # the ready ones, oldest first
    assert len(step1.rows) == GROUPS * N and step1.scored.rows == step1.rows
    assert step1.metrics["async_rm/groups_carried"] == 1 and step1.metrics["async_rm/staleness/max"] == 0
    assert step1.metrics["async_rm/pool_wait_due_s"] == 0.0
    # the checkpoint after step 1: regenerate from batch 1, which had groups 0 and 2 trained; batch 2 group 0
    state, live = driver.resume_state(None)
    assert state == {"drawn": 1} and live == [{"born": 1, "trained": [0, 2]}, {"born": 2, "trained": [0]}]
    # step 2: batch 1's slow group is due (carried once = max_staleness): the step waits for it
    driver.add(streamed_batch(rw, 3, [0.0, 0.0, 0.0], weights_step=1), born=3, position_of={"b3g0": 0, "b3g1": 1, "b3g2": 2})
    step2 = driver.next_step(2, generate_more=lambda: False)
    groups2 = sorted({(b, g) for b, g, _ in step2.rows})
    assert (1, 1) in groups2 and groups2 == [(1, 1), (2, 1), (2, 2)]
    assert {step2.staleness_of_row[row] for row in step2.rows if row[0] == 1} == {1}  # 2 - 1 - weights step 0
    # the wait was for the due group: counted apart, and all of the step's wait
    assert 0.2 < step2.metrics["async_rm/pool_wait_due_s"] <= step2.metrics["async_rm/pool_wait_s"]
    assert not set(step1.rows) & set(step2.rows)
    driver.abandon()


def test_after_the_last_step_the_pools_calls_are_cancelled_and_its_batches_kept_for_a_resume():
    """The run's last step leaves groups in the pool (the supply's depth): their calls still out are
    cancelled, and a checkpoint still names their batches for a resume."""
    rw = rewards(extra_keys=())
    driver = PoolDriver(rw, GROUPS, max_staleness=1, on_stale="wait")
    driver.add(streamed_batch(rw, 1, [0.0, 0.0, 0.0], weights_step=0), born=1, position_of={"b1g0": 0, "b1g1": 1, "b1g2": 2})
    driver.add(streamed_batch(rw, 2, [0.0, 30.0, 30.0], weights_step=0), born=1, position_of={"b2g0": 0, "b2g1": 1, "b2g2": 2})
    step = driver.next_step(1, generate_more=lambda: False, last_step=1)
    assert sorted({(b, g) for b, g, _ in step.rows}) == [(1, 0), (1, 1), (1, 2)]
    assert driver.stop_scoring() == 2 * N  # two slow groups of N calls each; the fast group is in
    assert driver.stop_scoring() == 0  # nothing left to stop
    state, live = driver.resume_state(None)
    assert state == {"drawn": 2} and live == [{"born": 1, "trained": []}]


def test_resume_leaves_out_what_was_trained():
    rw = rewards(extra_keys=())
    driver = PoolDriver(rw, GROUPS, max_staleness=1, on_stale="wait", skip={0: {0, 2}, 1: {0}})
    driver.add(streamed_batch(rw, 1, [0.0, 0.0, 0.0], weights_step=1), born=1, position_of={"b1g0": 0, "b1g1": 1, "b1g2": 2})
    driver.add(streamed_batch(rw, 2, [0.0, 0.0, 0.0], weights_step=1), born=2, position_of={"b2g0": 0, "b2g1": 1, "b2g2": 2})
    assert sorted(driver.pool.groups) == [(0, "b1g1"), (1, "b2g1"), (1, "b2g2")]
    assert sorted({(b, s) for b, _, s in driver.skipped_rows}) == [(1, s) for s in range(N)] + [(2, s) for s in range(N)]
    step = driver.next_step(2, generate_more=lambda: False)
    assert sorted({(b, g) for b, g, _ in step.rows}) == [(1, 1), (2, 1), (2, 2)]
    assert driver.live == [] and step.metrics["async_rm/pool_groups"] == 0


def test_a_wait_for_a_due_group_is_explained_once_it_outweighs_a_quarter_of_the_step():
    assert due_wait_hint(0.2, step_compute_s=1.0, max_staleness=2) is None  # a group scored just late
    assert due_wait_hint(0.04, step_compute_s=0.01, max_staleness=2) is None  # tiny steps: 50 ms floor
    hint = due_wait_hint(3.0, step_compute_s=1.0, max_staleness=2)
    assert "3.00 s" in hint and "max_staleness=2" in hint and "ticket_deadline / step time" in hint and "on_stale=drop" in hint


def test_auto_lookahead_from_measurements():
    assert choose_lookahead([], [], max_steps=1) == 1  # nothing measured: one ahead
    assert choose_lookahead([0.1] * 10, [1.0, 1.0], max_steps=4) == 1
    assert choose_lookahead([2.5] * 10, [1.0], max_steps=4) == 3
    assert choose_lookahead([2.5] * 10, [1.0], max_steps=1) == 1
    assert choose_lookahead([0.0] * 10, [1.0], max_steps=1) == 0


def test_auto_lookahead_measures_each_group_by_its_slowest_member():
    """A group is usable once its slowest member is scored: the latencies handed to the auto rule are
    one per group, the slowest member's, not one per sample."""
    rw = rewards(extra_keys=())
    stream = rw.open_stream(N)
    rows_of, group_of = {}, {}
    for g in range(GROUPS):
        for s in range(N):
            index, delay = g * N + s, (0.4 if (g, s) == (1, 2) else 0.0)  # one slow member, in group 1
            rw.client.add(stream.ticket, [{"index": index, "solution_str": f"g{g}-{s}", "ground_truth": g,
                                           "data_source": "t", "extra_info": {"delay": delay}, "uid": f"g{g}"}])
            rows_of[index], group_of[index] = ((g, s),), f"g{g}"
    pending = rw.close_stream(stream, rows_of, group_of)
    driver = PoolDriver(rw, GROUPS, max_staleness=0, on_stale="wait")
    driver.add(GeneratedBatch(None, pending, 0, None, 0, positions={f"g{g}": g for g in range(GROUPS)}), born=1,
               position_of={f"g{g}": g for g in range(GROUPS)})
    driver.next_step(1, generate_more=lambda: False)
    latencies = driver.new_latencies()
    assert len(latencies) == GROUPS and len(pending.latencies) == GROUPS * N
    assert sorted(latencies)[-1] >= 0.4 > sorted(latencies)[-2]


# -- batches of every shape verl's v1 trainer trains on ----------------------------------------------


def irregular_batch(client_rewards, batch_no: int, sessions: list[int], delays: list[float], weights_step: int,
                    failed=frozenset(), stream: bool = True) -> GeneratedBatch:
    """Group g runs ``sessions[g]`` sessions (per-prompt ``__rollout_n__``); session (g, s) in ``failed``
    sends nothing (verl keeps the group without it; every session of a group failed: verl keeps no
    row of it); each session has two outputs, rows (batch, g, s, 0) and (batch, g, s, 1), scored by
    one request on the final one (a multi-output loop). ``stream``: an open ticket sized per uid, fed
    session by session, as a streaming worker feeds it; else the batch is submitted at once (one
    ticket per group size)."""
    requests, rows_of, group_of = [], {}, {}
    for g, (count, delay) in enumerate(zip(sessions, delays)):
        uid = f"b{batch_no}g{g}"
        for s in range(count):
            if (g, s) in failed:
                continue
            index = g * 16 + s
            requests.append({"index": index, "solution_str": f"{uid}-{s}", "ground_truth": g, "data_source": "t",
                             "extra_info": {"delay": delay}, "uid": uid})
            rows_of[index], group_of[index] = ((batch_no, g, s, 0), (batch_no, g, s, 1)), uid
    if stream:
        ticket = client_rewards.open_stream({f"b{batch_no}g{g}": count for g, count in enumerate(sessions)})
        for request in requests:
            client_rewards.client.add(ticket.ticket, [request])
        pending = client_rewards.close_stream(ticket, rows_of, group_of)
    else:
        pending = client_rewards.submit(requests, rows_of=[rows_of[r["index"]] for r in requests])
    return GeneratedBatch(None, pending, 0, {"drawn": batch_no}, weights_step,
                          positions={f"b{batch_no}g{g}": g for g in range(len(sessions))})


def rows_of_groups(step) -> dict:
    out: dict = {}
    for b, g, s, o in step.rows:
        out.setdefault((b, g), set()).add((s, o))
    return out


@pytest.mark.parametrize("stream", [True, False], ids=["open_ticket", "submitted"])
def test_groups_of_several_sizes_short_and_multi_output_are_pooled_whole_and_carried(stream):
    """Issue 43: groups of different sizes in one batch, a group a failed session left short, a
    prompt every session of which failed, two outputs per session: the pool takes each whole group
    (all its sessions' rows, both outputs with the final one's score) as one of the step's prompts,
    carries a slow one instead of waiting within the bound and waits for it once due; the prompt
    with no rows is one of a step's prompts, as verl's sampler counts it, so no batch more is
    generated. (Before: ValueError, "needs groups of one size".)"""
    rw = rewards(extra_keys=())
    driver = PoolDriver(rw, GROUPS, max_staleness=1, on_stale="wait")
    made = []

    def add(batch_no, sessions, delays, weights_step, born, failed=frozenset()):
        generated = irregular_batch(rw, batch_no, sessions, delays, weights_step, failed, stream)
        driver.add(generated, born=born, position_of=generated.positions)
        made.append(batch_no)

    # batch 1: sizes 2, 4 (session 1 failed: 3 left), 3; group 0 slow. Batch 2: group 1's one session failed
    add(1, [2, 4, 3], [2.0, 0.0, 0.0], weights_step=0, born=1, failed={(1, 1)})
    add(2, [4, 1, 2], [0.0, 0.0, 0.0], weights_step=0, born=2, failed={(1, 0)})
    time.sleep(0.5)
    start = time.monotonic()
    step1 = driver.next_step(1, generate_more=lambda: False)
    assert time.monotonic() - start < 1.0  # did not wait for the slow group (1.5 s more), loaded machine or not
    got = rows_of_groups(step1)
    assert sorted(got) == [(1, 1), (1, 2), (2, 0)]  # three groups, the ready ones, oldest first
    assert got[1, 1] == {(s, o) for s in (0, 2, 3) for o in (0, 1)}  # short: without the failed session
    assert got[1, 2] == {(s, o) for s in range(3) for o in (0, 1)} and got[2, 0] == {(s, o) for s in range(4) for o in (0, 1)}
    assert len(step1.rows) == len(set(step1.rows)) == len(step1.scored.rows) == 6 + 6 + 8
    assert all(score == row[1] for row, score in zip(step1.scored.rows, step1.scored.scores))  # both outputs: the session's score
    assert step1.sample_of_row[1, 1, 0, 0] == step1.sample_of_row[1, 1, 0, 1] != step1.sample_of_row[1, 1, 2, 0]
    assert step1.metrics["async_rm/groups_carried"] == 1 and step1.metrics["async_rm/pool_groups"] == 3
    assert step1.metrics["async_rm/pool_prompts_without_rows"] == 0
    assert driver.resume_state(None)[1] == [{"born": 1, "trained": [1, 2]}, {"born": 2, "trained": [0]}]

    # step 2: batch 1's slow group is due (waited for), with batch 2's prompt without rows and its last group
    step2 = driver.next_step(2, generate_more=lambda: add(3, [3, 2, 1], [0.0, 0.0, 0.0], weights_step=1, born=2) or True)
    got2 = rows_of_groups(step2)
    assert made == [1, 2] and sorted(got2) == [(1, 0), (2, 2)]  # no batch more: the failed prompt counts
    assert got2[1, 0] == {(s, o) for s in range(2) for o in (0, 1)}
    assert step2.metrics["async_rm/pool_prompts_without_rows"] == 1
    assert not set(step1.rows) & set(step2.rows)
    assert {step2.staleness_of_row[row] for row in step2.rows if row[0] == 1} == {1}
    assert step2.metrics["async_rm/groups_dropped_stale"] == 0 and step2.metrics["async_rm/pool_wait_due_s"] > 0.1
    assert driver.live == [] and driver.pool.groups == {}
    driver.abandon()


def test_a_step_whose_oldest_prompts_have_no_rows_takes_one_group_with_rows_more():
    """Two prompts per step; batch 1 lost every session of prompt 0 and its prompt 1 is slow, batch
    2 lost prompt 0 too: the two oldest ready prompts have no rows, so the step waits for the first
    group with rows and takes it as well (a step never trains on nothing)."""
    rw = rewards(extra_keys=())
    driver = PoolDriver(rw, 2, max_staleness=1, on_stale="wait")
    for batch_no, delays in ((1, [0.0, 2.0]), (2, [0.0, 0.2])):
        generated = irregular_batch(rw, batch_no, [2, 2], delays, weights_step=0, failed={(0, 0), (0, 1)})
        driver.add(generated, born=1, position_of=generated.positions)
    step = driver.next_step(1, generate_more=lambda: False)
    assert sorted(rows_of_groups(step)) == [(2, 1)]  # the first scored, batch 2's
    assert step.metrics["async_rm/pool_prompts_without_rows"] == 2 and len(step.rows) == 4
    assert sorted(driver.pool.groups) == [(0, "b1g1")]
    driver.abandon()


def test_a_due_group_a_failed_session_left_short_is_waited_for_and_trained_without_it():
    """The open ticket settles a short group when it closes; a due one is then waited for like any."""
    rw = rewards(extra_keys=())
    driver = PoolDriver(rw, 2, max_staleness=0, on_stale="wait")
    generated = irregular_batch(rw, 1, [4, 2], [0.4, 0.0], weights_step=0, failed={(0, 3)})
    driver.add(generated, born=1, position_of=generated.positions)
    step = driver.next_step(1, generate_more=lambda: False)
    got = rows_of_groups(step)
    assert got == {(1, 0): {(s, o) for s in range(3) for o in (0, 1)}, (1, 1): {(s, o) for s in range(2) for o in (0, 1)}}
    assert step.metrics["async_rm/pool_wait_due_s"] > 0.2 and driver.live == []
