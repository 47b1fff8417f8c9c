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
    driver.add(streamed_batch(rw, 1, [0.0, 0.8, 0.0], weights_step=0), born=1, position_of={"b1g0": 0, "b1g1": 1, "b1g2": 2})
    driver.add(streamed_batch(rw, 2, [0.0, 0.0, 0.0], weights_step=0), born=2, position_of={"b2g0": 0, "b2g1": 1, "b2g2": 2})
    time.sleep(0.2)
    start = time.monotonic()
    step1 = driver.next_step(1, generate_more=lambda: False)
    assert time.monotonic() - start < 0.5  # did not wait for the slow group
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
