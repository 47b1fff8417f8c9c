"""The agent as a named async Ray actor (one Ray start per session)."""

from __future__ import annotations

import asyncio
import time

import pytest

from tests.conftest import REWARDS
from verl_async_rm.loader import RewardSpec
from verl_async_rm.ray_agent import RayRewardClient, get_or_create_agent_actor

pytestmark = pytest.mark.ray


def test_named_actor_is_shared_and_get_awaits(ray_session):
    ray = ray_session
    spec = RewardSpec(str(REWARDS / "examples.py"), "Stateful", {"offset": 0.0})
    actor = get_or_create_agent_actor(spec, {"max_concurrency": 4}, name="agent-under-test")
    same = get_or_create_agent_actor(spec, {"max_concurrency": 4}, name="agent-under-test")  # found by name
    assert same._actor_id == actor._actor_id
    batch = [{"solution_str": str(i % 2), "ground_truth": "1", "uid": i // 2} for i in range(8)]
    ticket = ray.get(same.submit.remote(batch, 2))
    first, second = ray.get([actor.get.remote(ticket, 4), actor.get.remote(ticket, 4)])  # concurrent waiters
    assert sorted(first.indices + second.indices) == list(range(8))
    assert first.scores == [0.0, 10.0, 0.0, 10.0]  # the class's group hook ran inside the actor
    assert ray.get(actor.metrics.remote())["completed"] == 8
    ray.get(actor.close.remote())
    ray.kill(actor)


def test_a_named_actor_with_another_reward_or_settings_is_refused(ray_session):
    ray = ray_session
    spec = RewardSpec(str(REWARDS / "examples.py"), "plain", {})
    actor = get_or_create_agent_actor(spec, {"max_concurrency": 4}, name="agent-fingerprint")
    with pytest.raises(ValueError, match=r"another configuration .*\['max_concurrency'\]"):
        get_or_create_agent_actor(spec, {"max_concurrency": 8}, name="agent-fingerprint")
    with pytest.raises(ValueError, match="another reward"):
        get_or_create_agent_actor(RewardSpec(str(REWARDS / "examples.py"), "async_plain", {}), {"max_concurrency": 4},
                                  name="agent-fingerprint")
    # defaults written out or left implicit are the same settings
    assert get_or_create_agent_actor(spec, {"max_concurrency": 4, "max_attempts": 3}, name="agent-fingerprint")._actor_id \
        == actor._actor_id
    ray.kill(actor)


def test_waiting_get_does_not_block_the_actor(ray_session):
    ray = ray_session
    spec = RewardSpec(str(REWARDS / "slow.py"), "compute_score", {"delay": 3.0})
    actor = get_or_create_agent_actor(spec, name="agent-nonblocking")
    slow = ray.get(actor.submit.remote([{"solution_str": "x"}], 1))
    pending = actor.get.remote(slow)
    start = time.perf_counter()
    assert ray.get(actor.metrics.remote())["submitted"] == 1  # answered while get() waits
    # A blocked actor answers only once the 3 s call ends; 2 s leaves a loaded machine's Ray room
    assert time.perf_counter() - start < 2.0
    assert ray.get(pending).scores == [1.0]
    # cancel through the actor: a waiting get fails with TicketCancelled, not a hang
    doomed = ray.get(actor.submit.remote([{"solution_str": "x"}] * 3, 1))
    waiting = actor.get.remote(doomed)
    assert ray.get(actor.cancel.remote(doomed)) == 3
    with pytest.raises(ray.exceptions.RayTaskError, match="TicketCancelled"):
        ray.get(waiting, timeout=10)
    # a get with a timeout answers by it, consuming nothing
    ticket = ray.get(actor.submit.remote([{"solution_str": "x"}], 1))
    with pytest.raises(ray.exceptions.RayTaskError, match="TimeoutError"):
        ray.get(actor.get.remote(ticket, None, 0.1), timeout=10)
    assert ray.get(actor.get.remote(ticket), timeout=10).scores == [1.0]
    ray.kill(actor)


@pytest.mark.slow
def test_per_sample_calls_never_exhaust_the_actor(ray_session):
    """Issue 11 item 4: 12,000 samples whose groups stay open (each waits for a second member) are
    more than the actor's concurrency; metrics still answer, then every group resolves."""
    ray = ray_session
    spec = RewardSpec(str(REWARDS / "examples.py"), "async_plain", {})
    actor = get_or_create_agent_actor(spec, {"max_concurrency": 512}, name="agent-many-open-groups")
    client = RayRewardClient(actor)
    groups = 12_000

    async def scenario():
        firsts = [asyncio.ensure_future(client.score_in_group({"solution_str": "a", "ground_truth": "a"}, f"g{g}", 2))
                  for g in range(groups)]
        await asyncio.sleep(0)
        while ray.get(actor.metrics.remote(), timeout=30)["submitted"] < groups:
            await asyncio.sleep(0.2)
        started = time.perf_counter()
        metrics = await actor.metrics.remote()
        answered_in = time.perf_counter() - started
        seconds = [client.score_in_group({"solution_str": "b", "ground_truth": "a"}, f"g{g}", 2) for g in range(groups)]
        results = await asyncio.wait_for(asyncio.gather(*firsts, *seconds), 120)
        return metrics, answered_in, results

    metrics, answered_in, results = asyncio.run(scenario())
    # an exhausted actor never answers (the groups close only after it): 15 s is room for a loaded machine
    assert metrics["submitted"] == groups and metrics["open_groups"] == groups and answered_in < 15
    assert [score for score, _ in results] == [1.0] * groups + [0.0] * groups
    ray.kill(actor)


def test_ticket_ids_are_not_reused_by_a_recreated_actor(ray_session):
    """Issue 11 item 12: an old ticket id on a re-created actor is an error, never another batch."""
    ray = ray_session
    spec = RewardSpec(str(REWARDS / "examples.py"), "plain", {})
    old = get_or_create_agent_actor(spec, name="agent-recreated")
    old_ticket = ray.get(old.submit.remote([{"solution_str": "x", "ground_truth": "x"}], 1))
    ray.kill(old)
    deadline = time.time() + 30
    while True:  # the name is free once the kill has gone through
        try:
            new = get_or_create_agent_actor(spec, name="agent-recreated")
            new_ticket = ray.get(new.submit.remote([{"solution_str": "y", "ground_truth": "x"}], 1))
            break
        except ray.exceptions.RayActorError:
            assert time.time() < deadline
            time.sleep(0.2)
    assert new_ticket != old_ticket
    with pytest.raises(ray.exceptions.RayTaskError, match="unknown ticket"):
        ray.get(new.get.remote(old_ticket), timeout=10)
    assert ray.get(new.get.remote(new_ticket), timeout=10).scores == [0.0]
    ray.kill(new)


def test_open_tickets_through_the_actor(ray_session):
    """open_ticket / add / close_ticket / get over the client protocol, mixed group sizes."""
    spec = RewardSpec(str(REWARDS / "examples.py"), "plain", {})
    client = RayRewardClient(get_or_create_agent_actor(spec, name="agent-open-tickets"))
    ticket = client.open_ticket({"a": 2, "b": 1})
    client.add(ticket, [{"solution_str": "x", "ground_truth": "x", "uid": "a", "index": 0}])
    client.add(ticket, [{"solution_str": "y", "ground_truth": "x", "uid": "b", "index": 1}])
    first = client.get(ticket, 1, timeout=10)
    assert first.indices == [1] and first.scores == [0.0]  # 'b' is whole; 'a' still waits for its second
    client.add(ticket, [{"solution_str": "x", "ground_truth": "x", "uid": "a", "index": 2}])
    client.close_ticket(ticket)
    rest = client.get(ticket, timeout=10)
    assert rest.indices == [0, 2] and rest.scores == [1.0, 1.0]
    ray_session.kill(client.actor)


def test_a_withdrawn_session_closes_its_group_through_the_actor(ray_session):
    """verl's agent-loop worker withdraws a failed session through the job's actor (another process
    than the reward-loop workers that joined its siblings): the group is answered at once, not after
    group_wait (an hour here); a withdrawal for another attempt of the uid changes nothing."""
    ray = ray_session
    spec = RewardSpec(str(REWARDS / "examples.py"), "async_plain", {})
    actor = get_or_create_agent_actor(spec, name="agent-withdrawal")
    joining, withdrawing = RayRewardClient(actor), RayRewardClient(actor)

    async def scenario():
        members = [asyncio.ensure_future(joining.score_in_group({"solution_str": "a", "ground_truth": "a"}, "u", 4, 3600.0,
                                                                session=s, attempt="a2")) for s in range(3)]
        await withdrawing.withdraw("u", 3, "a1")  # an earlier attempt's session: not this group's
        await asyncio.sleep(1.0)
        assert not any(m.done() for m in members)
        await withdrawing.withdraw("u", 3, "a2")
        return await asyncio.wait_for(asyncio.gather(*members), 30)

    assert [score for score, _ in asyncio.run(scenario())] == [1.0] * 3
    assert ray.get(actor.metrics.remote())["withdrawn_sessions"] == 2  # a1's stays pending: a group that never opens
    ray.kill(actor)
