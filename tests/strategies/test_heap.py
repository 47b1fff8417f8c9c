"""strategies/heap.py: the trainer and its workers freeze the start-up heap once, before step 1, so
CPython's full collections on the step's critical path scan only what training allocated. The
trainer runs in tests/strategies/test_strategies.py check that every strategy run froze both sides."""

from __future__ import annotations

import gc
import weakref

import pytest

from verl_async_rm.strategies.heap import FREEZE_ENV, freeze_startup_heap, freeze_trainer_and_workers, freeze_worker_heaps

pytestmark = pytest.mark.quick


@pytest.fixture
def unfrozen():
    gc.unfreeze()
    yield
    gc.unfreeze()  # the test process keeps CPython's default


def test_every_object_alive_before_the_freeze_leaves_the_collected_generations(unfrozen, monkeypatch):
    monkeypatch.delenv(FREEZE_ENV, raising=False)
    alive = [[] for _ in range(3)]  # containers: tracked by the collector
    assert all(gc.is_tracked(obj) for obj in alive)
    frozen = freeze_startup_heap()
    # The count it returns is the permanent generation's right after the freeze; a frozen object freed
    # since (by another test's leftover thread, in a one-process run) lowers the count, never raises it.
    now = gc.get_freeze_count()
    assert now > 1000 and 0 <= frozen - now < 100
    collected = {id(obj) for obj in gc.get_objects()}  # every generation but the permanent one
    assert not any(id(obj) in collected for obj in alive)
    later = [[]]
    assert id(later) in {id(obj) for obj in gc.get_objects()}  # what training allocates stays collectable


def test_garbage_cycles_are_collected_before_freezing(unfrozen, monkeypatch):
    monkeypatch.delenv(FREEZE_ENV, raising=False)

    class Node:
        pass

    cycle = Node()
    cycle.self = cycle
    probe = weakref.ref(cycle)
    del cycle
    assert probe() is not None  # a cycle: only the collector frees it
    freeze_startup_heap()
    assert probe() is None  # collected first, not frozen alive for the rest of the run


@pytest.mark.parametrize("value", ["0", "false", "OFF", " no "])
def test_the_environment_turns_it_off(unfrozen, monkeypatch, value):
    monkeypatch.setenv(FREEZE_ENV, value)
    assert freeze_startup_heap() == 0
    assert gc.get_freeze_count() == 0


class Group:
    def __init__(self, counts):
        self.counts = counts
        self.calls = 0

    def freeze_startup_heap(self):
        self.calls += 1
        return self.counts


def test_each_group_that_offers_it_freezes_once_and_the_fewest_frozen_is_reported():
    actor, critic = Group([600_000, 590_000]), Group([580_000])
    assert freeze_worker_heaps(actor, None, object(), critic) == 580_000
    assert actor.calls == critic.calls == 1
    assert freeze_worker_heaps(Group([0, 600_000])) == 0  # one worker turned off: reported as such
    assert freeze_worker_heaps(None, object()) == 0  # stock verl's worker classes: nothing to freeze


def test_the_trainer_and_its_workers_freeze_once_and_the_metrics_name_both_sides(unfrozen, monkeypatch):
    monkeypatch.delenv(FREEZE_ENV, raising=False)
    actor, critic = Group([600_000, 590_000]), Group([580_000])
    metrics = freeze_trainer_and_workers(actor, critic)
    assert actor.calls == critic.calls == 1
    assert set(metrics) == {"async_rm/frozen_heap_objects/trainer", "async_rm/frozen_heap_objects/workers"}
    assert metrics["async_rm/frozen_heap_objects/workers"] == 580_000
    # this process froze too (the count can drop by a few as frozen objects are freed by refcount)
    assert metrics["async_rm/frozen_heap_objects/trainer"] > 1000 and gc.get_freeze_count() > 1000
    assert freeze_trainer_and_workers(Group([1]), None)["async_rm/frozen_heap_objects/workers"] == 1  # no critic


def test_turned_off_the_trainer_reports_nothing_frozen(unfrozen, monkeypatch):
    monkeypatch.setenv(FREEZE_ENV, "0")
    assert freeze_trainer_and_workers(Group([0]))["async_rm/frozen_heap_objects/trainer"] == 0
    assert gc.get_freeze_count() == 0
