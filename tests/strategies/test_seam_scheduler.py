"""The shared step scheduler against a real agent (in this process) and a recording fake of verl's
step functions: which rows each mini-batch holds, when advantages are computed, which updates run,
the KL controller, the merged worker metrics. The same scheduler runs on verl's real trainers in
tests/strategies/test_strategies.py."""

from __future__ import annotations

import dataclasses
import random
import time
import uuid

import pytest
from omegaconf import OmegaConf

from verl_async_rm.strategies.kl import DeferredKL
from verl_async_rm.strategies.plan import StrategyConfig, TrainerShape, plan_mini_batches, schedule_updates
from verl_async_rm.integration.settings import settings_from_verl_config
from verl_async_rm.strategies.rewards import BatchRewards, ScoredRows
from verl_async_rm.strategies.scheduler import Lookahead, MetricMerger, StepScheduler
from tests.conftest import HELPERS

pytestmark = pytest.mark.local
REWARD = str(HELPERS / "seam_reward.py")
N, PROMPTS, MINI = 4, 8, 2  # 8 groups of 4, mini-batches of 2 groups


def rewards(extra_keys=("verdict",), **agent) -> BatchRewards:
    config = OmegaConf.create({
        "reward": {"custom_reward_function": {"path": REWARD, "name": "delayed"},
                   "async_agent": {"actor_name": f"seam-{uuid.uuid4().hex}", "extra_keys": list(extra_keys), **agent}},
        "actor_rollout_ref": {"rollout": {"n": N}},
    })
    return BatchRewards(settings_from_verl_config(config), tokenizer=None)


def requests_for(order_of_rows, group_of_row, delays, fails=()):
    """One request per row (v0), the row's group as uid, its score = its row number."""
    return [
        {"index": row, "solution_str": f"r{row}", "ground_truth": row, "data_source": "t",
         "extra_info": {"delay": delays[group_of_row[row]], "fail": row in fails}, "uid": group_of_row[row]}
        for row in range(len(order_of_rows))
    ]


class FakeOps:
    def __init__(self, rows, pipelineable=True):
        self.order = rows
        self.can = pipelineable
        self.events = []
        self.scores = {}
        self.keys = set()

    def rows(self, batch):
        return list(self.order)

    def pipelineable(self, batch, pending):
        return self.can and pending.regular

    def attach(self, batch, scored):
        self.keys.add(tuple(scored.extra_info))
        for row, score in zip(scored.rows, scored.scores):
            self.scores[row] = score
        self.events.append(("attach", list(scored.rows)))

    def mask(self, batch, rows):
        self.events.append(("mask", list(rows)))

    def advantages(self, batch, rows, kl):
        if kl is not None:
            kl.update(current_kl=0.1 * (1 + len(rows or self.order)), n_steps=len(rows or self.order))
        self.events.append(("adv", None if rows is None else list(rows)))
        return {"adv/calls": 1.0}

    def update(self, batch, call, rows):
        self.events.append(("update", call.role, call.epochs, call.step_lr, None if rows is None else list(rows)))
        return {f"{call.role}/pg_loss": [1.0, 3.0], f"{call.role}/async_rm_loads": int(call.load),
                f"{call.role}/async_rm_offloads": int(call.offload)}


def layout(seed=0):
    """Rows in a training order that interleaves groups (as verl's length balancing does)."""
    group_of_row = [g for g in range(PROMPTS) for _ in range(N)]
    order = list(range(PROMPTS * N))
    random.Random(seed).shuffle(order)
    return order, group_of_row


def wait_until_scored(agent, count):
    deadline = time.monotonic() + 30
    while agent.client.metrics()["completed"] + agent.client.metrics()["failed"] < count:
        assert time.monotonic() < deadline
        time.sleep(0.01)


def run_step(order_mode="completion", use_critic=False, epochs=1, delays=None, fails=(), controller=None,
             shape_changes=None, pipelineable=True, agent_settings=None, all_scored_first=False, split_scored=False,
             merge=False, scored_first=None):
    """``merge``: mini-batches found scored already share an update call (the default in a trainer;
    off here unless asked, so the per-mini-batch tests do not depend on timing). ``scored_first``:
    wait until this many samples are scored before training."""
    order, group_of_row = layout()
    strategy = StrategyConfig(True, 0, order_mode, split_scored_batches=split_scored)
    shape = TrainerShape(train_batch_size=PROMPTS, ppo_mini_batch_size=MINI, rollout_n=N, ppo_epochs=epochs,
                         critic_epochs=epochs, use_critic=use_critic, adv_estimator="gae" if use_critic else "grpo",
                         **(shape_changes or {}))
    plan = dataclasses.replace(plan_mini_batches(strategy, shape), merge_ready=merge)
    agent = rewards(**(agent_settings or {}))
    delays = delays or {g: 0.02 * ((g * 5) % PROMPTS) for g in range(PROMPTS)}  # groups finish out of order
    pending = agent.submit(requests_for(order, group_of_row, delays, fails))
    if all_scored_first:  # every reward in before training starts (an instant judge, scored while generating)
        wait_until_scored(agent, len(order))
    if scored_first is not None:
        wait_until_scored(agent, scored_first)
    ops = FakeOps(order, pipelineable)
    scheduler = StepScheduler(strategy, plan, agent, use_critic=use_critic, reduce_lists=lambda d: {k: sum(v) / len(v) for k, v in d.items()})
    metrics = scheduler.train(ops, None, pending, update_actor=True, timing_raw={}, kl_controller=controller)
    return ops, metrics, group_of_row, order, plan


def test_completion_order_mini_batches_are_whole_groups_as_they_finish():
    ops, metrics, group_of_row, order, plan = run_step()
    updates = [e for e in ops.events if e[0] == "update"]
    assert len(updates) == PROMPTS // MINI and metrics["async_reward/pipelined"] == 1.0
    seen = []
    for event in updates:
        rows = event[4]
        groups = {group_of_row[r] for r in rows}
        assert len(rows) == MINI * N and len(groups) == MINI  # whole groups
        assert sorted(rows) == sorted(r for r in range(len(group_of_row)) if group_of_row[r] in groups)
        seen += rows
    assert sorted(seen) == list(range(PROMPTS * N))  # every sample once
    # the groups arrived in completion order (delays: group g finishes at 0.02 * (5g mod 8) s)
    finish = sorted(range(PROMPTS), key=lambda g: (g * 5) % PROMPTS)
    assert [group_of_row[u[4][0]] in set(finish[i * MINI:(i + 1) * MINI]) for i, u in enumerate(updates)] == [True] * 4
    assert all(ops.scores[r] == r for r in range(PROMPTS * N))  # each row its own reward


def test_index_order_trains_verls_own_mini_batches_and_each_group_is_advantaged_once_before_use():
    ops, metrics, group_of_row, order, plan = run_step("index")
    updates = [e for e in ops.events if e[0] == "update"]
    size = MINI * N
    assert [u[4] for u in updates] == [order[i * size:(i + 1) * size] for i in range(PROMPTS // MINI)]
    advantaged = []
    for event in ops.events:
        if event[0] == "adv":
            groups = {group_of_row[r] for r in event[1]}
            assert sorted(event[1]) == sorted(r for r in range(len(group_of_row)) if group_of_row[r] in groups)
            advantaged += sorted(groups)
        if event[0] == "update":  # every row's group has its advantages before the row is trained
            assert {group_of_row[r] for r in event[4]} <= set(advantaged)
    assert sorted(advantaged) == list(range(PROMPTS))  # each group exactly once


def test_failures_in_some_mini_batches_keep_one_key_set():
    failing = {r for r in range(PROMPTS * N) if r % 11 == 0}  # rows in some groups, not in others
    ops, metrics, *_ = run_step(fails=failing)
    assert len(ops.keys) == 1  # every chunk the same columns, failures or not
    assert ops.keys.pop() == ("acc", "reward_failed", "reward_failure", "verdict")


@pytest.mark.parametrize("order_mode,pipelineable", [("completion", True), ("index", True), ("completion", False)])
def test_mask_takes_failed_rows_and_thin_groups_out_before_their_advantages_and_updates(order_mode, pipelineable):
    """failure_policy=mask: each mini-batch's failed rows (and every row of a group left with fewer
    than min_group_success usable samples) are masked before advantages are computed, and never
    reach an advantage computation; the updates still see every row (with a zero loss mask)."""
    _, group_of_row = layout()
    failing = {r for r in range(PROMPTS * N) if r % 7 == 0} | {4, 5, 6}  # group 1: rows 4..7, one left
    ops, metrics, group_of_row, order, plan = run_step(
        order_mode, fails=failing, pipelineable=pipelineable,
        agent_settings={"failure_policy": "mask", "min_group_success": 2, "max_failure_rate": 1.0})
    thin = {g for g in range(PROMPTS) if sum(1 for r in range(PROMPTS * N) if group_of_row[r] == g and r not in failing) < 2}
    expected = failing | {r for r in range(PROMPTS * N) if group_of_row[r] in thin}
    assert thin == {1}
    masked_events = [e[1] for e in ops.events if e[0] == "mask"]
    assert sorted(r for rows in masked_events for r in rows) == sorted(expected)  # each masked row once
    seen_masked: set = set()
    advantaged: list = []
    for event in ops.events:
        if event[0] == "mask":
            seen_masked |= set(event[1])
        elif event[0] == "adv":
            assert event[1] is not None and not set(event[1]) & expected  # usable rows only
            advantaged += event[1]
        elif event[0] == "update" and event[4] is not None:
            assert set(event[4]) & expected <= seen_masked  # masked before any update trains on it
    assert sorted(advantaged) == sorted(set(range(PROMPTS * N)) - expected)
    assert metrics["async_rm/masked_samples"] == len(expected)
    assert metrics["async_rm/dropped_groups"] == 1


def test_mask_without_failures_changes_nothing():
    plain, _, *_ = run_step("index")
    masked, metrics, *_ = run_step("index", agent_settings={"failure_policy": "mask"})
    updates = lambda ops: [e for e in ops.events if e[0] == "update"]  # noqa: E731
    advantaged = lambda ops: sorted(r for e in ops.events if e[0] == "adv" for r in e[1])  # noqa: E731
    assert updates(masked) == updates(plain) and advantaged(masked) == advantaged(plain)
    assert not [e for e in masked.events if e[0] == "mask"]
    assert metrics["async_rm/masked_samples"] == 0 and metrics["async_rm/dropped_groups"] == 0


def test_later_epochs_run_as_verl_over_the_whole_batch_and_the_critic_waits_for_whole_mini_batches():
    ops, metrics, group_of_row, order, plan = run_step(use_critic=True, epochs=2, shape_changes={"critic_mini_batch_size": 4})
    updates = [e for e in ops.events if e[0] == "update"]
    critic = [u for u in updates if u[1] == "critic"]
    actor = [u for u in updates if u[1] == "actor"]
    assert [len(u[4]) if u[4] else None for u in critic] == [16, 16, None]  # 2 critic calls of 4 prompts, then epoch 2
    assert [len(u[4]) if u[4] else None for u in actor] == [8, 8, 8, 8, None]
    assert [u[2] for u in actor] == [1, 1, 1, 1, 1] and [u[3] for u in actor] == [False] * 4 + [True]
    assert metrics["async_reward/actor_loads"] == 1 and metrics["async_reward/actor_offloads"] == 1
    assert metrics["async_reward/critic_loads"] == 1 and metrics["async_reward/critic_offloads"] == 1


@pytest.mark.parametrize("order_mode", ["completion", "index"])
def test_a_batch_scored_before_training_starts_is_trained_whole_in_one_update_call(order_mode):
    """Nothing to overlap: verl's one update call (the split would cost a call per mini-batch), and
    the same scores attached as the pipeline attaches; split_scored_batches=true splits it anyway."""
    ops, metrics, group_of_row, order, plan = run_step(order_mode, delays={g: 0.0 for g in range(PROMPTS)}, all_scored_first=True)
    assert [e for e in ops.events if e[0] == "update"] == [("update", "actor", 1, True, None)]
    assert [e for e in ops.events if e[0] == "adv"] == [("adv", None)]
    assert metrics["async_reward/pipelined"] == 0.0
    assert ops.scores == {row: row for row in order}  # each row its own score (the row number)

    split, split_metrics, *_ = run_step(order_mode, delays={g: 0.0 for g in range(PROMPTS)}, all_scored_first=True,
                                        split_scored=True)
    assert len([e for e in split.events if e[0] == "update"]) == PROMPTS // MINI
    assert split_metrics["async_reward/pipelined"] == 1.0 and split.scores == ops.scores


def test_a_batch_still_being_scored_when_training_starts_is_pipelined():
    ops, metrics, *_ = run_step("completion", delays={g: 0.3 if g == 0 else 0.0 for g in range(PROMPTS)})
    assert metrics["async_reward/pipelined"] == 1.0
    assert len([e for e in ops.events if e[0] == "update"]) == PROMPTS // MINI


SLOW = 0.5  # s: a group still being scored when training starts


def test_mini_batches_scored_already_share_one_update_call_in_completion_order():
    """Six groups scored when training starts, two still out: the three mini-batches in hand go as one
    call (load on it), the last as another (LR step and offload on it), each after one scores write
    and one advantage call over exactly its groups; every row is trained once, in the order of the
    separate calls."""
    slow = {3, 6}
    ops, metrics, group_of_row, order, plan = run_step(
        "completion", delays={g: SLOW if g in slow else 0.0 for g in range(PROMPTS)}, merge=True,
        scored_first=(PROMPTS - len(slow)) * N)
    updates = [e for e in ops.events if e[0] == "update"]
    size = MINI * N
    assert [len(u[4]) for u in updates] == [3 * size, size]
    assert {group_of_row[r] for r in updates[1][4]} == slow
    assert [u[3] for u in updates] == [False, True]  # the LR steps once, on the last call
    assert metrics["async_reward/update_calls"] == 2 and metrics["async_reward/pipelined"] == 1.0
    assert metrics["async_reward/actor_loads"] == 1 and metrics["async_reward/actor_offloads"] == 1
    # one write and one advantage call per update call, over exactly the rows that call trains
    kinds = [e[0] for e in ops.events if e[0] in ("attach", "adv", "update")]
    assert kinds == ["attach", "adv", "update"] * 2
    for kind in ("attach", "adv"):
        assert [sorted(e[1]) for e in ops.events if e[0] == kind] == [sorted(u[4]) for u in updates]
    assert sorted(r for u in updates for r in u[4]) == list(range(PROMPTS * N))


@pytest.mark.parametrize("slow_group", range(PROMPTS))
def test_verls_mini_batches_scored_already_share_one_update_call_in_index_order(slow_group):
    """Index order, one group still out when training starts: the mini-batches before the first one
    it touches go as one call, the rest (all scored once it arrives) as another; the calls' rows,
    joined, are verl's mini-batches in verl's order, each group advantaged before its rows train."""
    ops, metrics, group_of_row, order, plan = run_step(
        "index", delays={g: SLOW if g == slow_group else 0.0 for g in range(PROMPTS)}, merge=True,
        scored_first=(PROMPTS - 1) * N)
    size = MINI * N
    first = min(i for i in range(PROMPTS // MINI) if slow_group in {group_of_row[r] for r in order[i * size:(i + 1) * size]})
    updates = [e for e in ops.events if e[0] == "update"]
    assert [len(u[4]) // size for u in updates] == ([first] if first else []) + [PROMPTS // MINI - first]
    assert [r for u in updates for r in u[4]] == order
    assert metrics["async_reward/update_calls"] == len(updates)
    advantaged: set = set()
    for event in ops.events:
        if event[0] == "adv":
            advantaged |= {group_of_row[r] for r in event[1]}
        elif event[0] == "update":
            assert {group_of_row[r] for r in event[4]} <= advantaged


def test_merged_calls_keep_the_critic_on_whole_critic_mini_batches_and_later_epochs_whole():
    ops, metrics, *_ = run_step(use_critic=True, epochs=2, shape_changes={"critic_mini_batch_size": 4}, merge=True,
                                delays={g: SLOW if g == 5 else 0.0 for g in range(PROMPTS)}, scored_first=(PROMPTS - 1) * N)
    updates = [e for e in ops.events if e[0] == "update"]
    critic = [len(u[4]) if u[4] else None for u in updates if u[1] == "critic"]
    actor = [len(u[4]) if u[4] else None for u in updates if u[1] == "actor"]
    assert critic[-1] is None and sum(critic[:-1]) == 32 and all(n % 16 == 0 for n in critic[:-1])
    assert actor[-1] is None and sum(actor[:-1]) == 32 and len(actor) < 5
    assert metrics["async_reward/actor_loads"] == 1 and metrics["async_reward/actor_offloads"] == 1
    assert metrics["async_reward/critic_loads"] == 1 and metrics["async_reward/critic_offloads"] == 1


def test_a_batch_that_cannot_be_cut_into_whole_group_mini_batches_is_trained_whole():
    ops, metrics, *_ = run_step(pipelineable=False, epochs=2)
    updates = [e for e in ops.events if e[0] == "update"]
    assert updates == [("update", "actor", 2, True, None)]  # verl's one call, both epochs
    assert [e for e in ops.events if e[0] == "adv"] == [("adv", None)]
    assert metrics["async_reward/pipelined"] == 0.0


def test_irregular_groups_go_as_one_ticket_per_size_and_are_never_pipelined():
    agent = rewards()
    requests = [{"index": i, "solution_str": str(i), "ground_truth": i, "data_source": "t", "extra_info": {},
                 "uid": uid} for i, uid in enumerate(["a", "a", "a", "b", "b", "c", "c", "c"])]
    pending = agent.submit(requests, rows_of=[(f"k{i}", f"k{i}x") for i in range(8)])  # two rows per request
    assert sorted(t.group_size for t in pending.tickets) == [2, 3] and not pending.regular
    scored = agent.take(pending)
    assert sorted(scored.rows) == sorted([f"k{i}" for i in range(8)] + [f"k{i}x" for i in range(8)])
    assert all(score == int(row[1]) for row, score in zip(scored.rows, scored.scores))  # copies share the score
    with pytest.raises(ValueError, match="one group size"):
        agent.take(agent.submit(requests), 2)


def test_a_pool_step_under_mask_counts_a_multi_output_session_as_one_sample():
    """The staleness pool hands a step every score in hand (``scored``) and each row's sample
    (``samples``): under failure_policy=mask a session with two outputs is one sample, so group "a"
    (two sessions, one failed) keeps one usable sample, fewer than min_group_success=2, and all its
    rows are masked; group "b" is untouched. (Each output counted as a sample of its own, "a" would
    keep two usable ones and only the failed session's rows would be masked.)"""
    agent = rewards(extra_keys=(), failure_policy="mask", min_group_success=2, max_failure_rate=1.0)
    rows = [(g, s, o) for g in "ab" for s in range(2) for o in range(2)]
    scored = ScoredRows.empty(agent.fixed_keys)
    for row in rows:
        failed = row[:2] == ("a", 1)
        scored.extend(ScoredRows([row], [0.0 if failed else 1.0], {"acc": [not failed], "reward_failed": [int(failed)],
                                                                  "reward_failure": ["judge" if failed else None]}, [row[0]]))
    strategy = StrategyConfig(True, 0, "completion")
    shape = TrainerShape(train_batch_size=2, ppo_mini_batch_size=2, rollout_n=2)
    scheduler = StepScheduler(strategy, plan_mini_batches(strategy, shape), agent, use_critic=False,
                              reduce_lists=lambda d: {k: sum(v) / len(v) for k, v in d.items()})
    ops = FakeOps(rows, pipelineable=False)
    metrics = scheduler.train(ops, None, None, update_actor=True, timing_raw={}, scored=scored,
                              samples={row: row[:2] for row in rows})
    assert [sorted(e[1]) for e in ops.events if e[0] == "mask"] == [[row for row in rows if row[0] == "a"]]
    assert metrics["async_rm/masked_samples"] == 2 and metrics["async_rm/dropped_groups"] == 1


class Controller:
    def __init__(self):
        self.value = 0.5
        self.updates = []

    def update(self, current_kl, n_steps):
        self.updates.append((current_kl, n_steps))
        self.value *= 2


def test_the_kl_controller_moves_once_per_step_with_the_batchs_kl():
    controller = Controller()
    ops, metrics, *_ = run_step(controller=controller)
    # four mini-batches of 8 rows, each reporting KL 0.1 * 9: one update with their size-weighted mean
    assert controller.updates == [(pytest.approx(0.9), 32)]
    assert metrics["actor/reward_kl_penalty_coeff"] == 0.5 and metrics["actor/reward_kl_penalty"] == pytest.approx(0.9)


def test_deferred_kl_is_the_batch_mean():
    controller = Controller()
    deferred = DeferredKL(controller)
    deferred.update(current_kl=1.0, n_steps=8)
    deferred.update(current_kl=4.0, n_steps=24)
    assert deferred.value == 0.5 and controller.updates == []
    assert deferred.flush()["actor/reward_kl_penalty"] == pytest.approx((8 + 96) / 32)
    assert controller.updates == [(pytest.approx(3.25), 32)]


def test_metric_merger_reduces_as_one_call_would():
    from verl.utils.metric import Metric, reduce_metrics

    def metric(*values):
        m = Metric("mean")
        m.extend(list(values))
        return m

    merger = MetricMerger()
    merger.add({"actor/pg_loss": [1.0, 2.0], "actor/m": metric(1.0), "actor/clip_max": 3.0,
                "actor/kl": 1.0, "actor/async_rm_loads": 1}, weight=8)
    merger.add({"actor/pg_loss": [3.0], "actor/m": metric(3.0, 5.0), "actor/clip_max": 2.0,
                "actor/kl": 4.0, "actor/async_rm_offloads": 1}, weight=24)
    out = merger.reduce(reduce_metrics)
    assert out["actor/pg_loss"] == 2.0 and out["actor/m"] == 3.0 and out["actor/clip_max"] == 3.0
    assert out["actor/kl"] == pytest.approx((8 + 96) / 32)
    assert out["async_reward/actor_loads"] == 1 and out["async_reward/actor_offloads"] == 1


def test_lookahead_keeps_k_batches_ahead_and_never_past_the_last_step():
    made = []

    def generate():
        made.append(len(made))
        return type("G", (), {"loader_state": {"at": made[-1]}, "rewards": None})()

    ahead = Lookahead(2)
    steps = []
    for step in range(1, 6):
        ahead.top_up(step, 5, generate)
        current = ahead.pop()
        steps.append((step, len(made), ahead.resume_state()))
    # step 1 generates batches 0..2; afterwards one per step, none after batch 4 (the last step's)
    assert steps == [(1, 3, {"at": 1}), (2, 4, {"at": 2}), (3, 5, {"at": 3}), (4, 5, {"at": 4}), (5, 5, None)]
    assert current.loader_state == {"at": 4}


def test_schedule_matches_the_plan_used():
    plan = plan_mini_batches(StrategyConfig(True), TrainerShape(train_batch_size=8, ppo_mini_batch_size=2, rollout_n=4))
    assert [c.pieces for c in schedule_updates(plan, use_critic=False, update_actor=True).calls] == [(0,), (1,), (2,), (3,)]
