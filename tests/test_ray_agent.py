"""The agent as a named async Ray actor (one Ray start per session)."""

from __future__ import annotations

import time

import pytest

from tests.conftest import REWARDS
from verl_async_rm.loader import RewardSpec
from verl_async_rm.ray_agent import get_or_create_agent_actor

pytestmark = pytest.mark.ray


def test_named_actor_is_shared_and_get_awaits(ray_session):
    ray = ray_session
    spec = RewardSpec(str(REWARDS / "examples.py"), "Stateful", {"offset": 0.0})
    actor = get_or_create_agent_actor(spec, {"max_concurrency": 4}, name="agent-under-test")
    same = get_or_create_agent_actor(None, name="agent-under-test")  # looked up by name, not created
    batch = [{"solution_str": str(i % 2), "ground_truth": "1", "uid": i // 2} for i in range(8)]
    ticket = ray.get(same.submit.remote(batch, 2))
    first, second = ray.get([actor.get.remote(ticket, 4), actor.get.remote(ticket, 4)])  # concurrent waiters
    assert sorted(first.indices + second.indices) == list(range(8))
    assert first.scores == [0.0, 10.0, 0.0, 10.0]  # the class's group hook ran inside the actor
    assert ray.get(actor.metrics.remote())["completed"] == 8
    ray.get(actor.close.remote())
    ray.kill(actor)


def test_waiting_get_does_not_block_the_actor(ray_session):
    ray = ray_session
    spec = RewardSpec(str(REWARDS / "slow.py"), "compute_score", {"delay": 1.0})
    actor = get_or_create_agent_actor(spec, name="agent-nonblocking")
    slow = ray.get(actor.submit.remote([{"solution_str": "x"}], 1))
    pending = actor.get.remote(slow)
    start = time.perf_counter()
    assert ray.get(actor.metrics.remote())["submitted"] == 1  # answered while get() waits
    assert time.perf_counter() - start < 0.8
    assert ray.get(pending).scores == [1.0]
    # cancel through the actor: a waiting get fails with TicketCancelled, not a hang
    doomed = ray.get(actor.submit.remote([{"solution_str": "x"}] * 3, 1))
    waiting = actor.get.remote(doomed)
    assert ray.get(actor.cancel.remote(doomed)) == 3
    with pytest.raises(ray.exceptions.RayTaskError, match="TicketCancelled"):
        ray.get(waiting, timeout=10)
    ray.kill(actor)
