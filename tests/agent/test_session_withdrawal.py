"""verl's per-sample path when a rollout session fails (issue 45 item 16, issue 43 item 2): the
agent-loop worker withdraws the failed session from its group, so the group is answered as soon as
its other members are scored instead of after ``group_timeout``; and each dispatch of a prompt (an
*attempt*) is a group of its own, so a prompt verl generates again under the same uid never mixes
with an earlier attempt's members or withdrawals. Pure ledger (Hypothesis), the engine on virtual
time, and verl's own worker class with its parent's session replaced."""

from __future__ import annotations

import asyncio
from collections import defaultdict

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.helpers.harness import virtual
from verl_async_rm.agent import AsyncRewardAgent
from verl_async_rm.engine.ledger import StreamGroups, stream_key



@st.composite
def attempts(draw):
    """Prompts, each dispatched once or twice under the same uid (verl re-issuing it), each attempt
    with ``size`` sessions of which some fail (withdrawn) and the rest hand over a sample; every
    join and withdrawal in a random interleaving (they come from different processes)."""
    events = []
    plan = {}
    for uid in range(draw(st.integers(1, 4))):
        size = draw(st.integers(1, 4))
        for attempt in range(draw(st.integers(1, 2))):
            failed = draw(st.sets(st.integers(0, size - 1), max_size=size))
            plan[uid, attempt] = (size, failed)
            events += [("withdraw" if s in failed else "join", uid, attempt, s) for s in range(size)]
    return plan, draw(st.permutations(events))


@pytest.mark.quick
@settings(max_examples=400, deadline=None)
@given(attempts())
def test_a_group_closes_when_its_last_live_session_joins_with_exactly_that_attempts_members(case):
    plan, events = case
    stream = StreamGroups()
    members: dict = defaultdict(list)  # (uid, attempt) -> sessions in the group that joined
    group_of: dict = {}
    closed_at: dict = {}
    for step, (kind, uid, attempt, session) in enumerate(events):
        key = stream_key(uid, attempt)
        if kind == "join":
            group, _ = stream.add(key, plan[uid, attempt][0], session)
            assert group_of.setdefault((uid, attempt), group) is group  # one group per attempt, never shared
            members[uid, attempt].append(session)
            if group.closed:
                closed_at[uid, attempt] = step
        else:
            group = stream.withdraw(key, session)
            if group is not None:
                assert stream.close(group) is False  # complete in membership; its members still to settle
                closed_at[uid, attempt] = step
    assert len({id(g) for g in group_of.values()}) == len(group_of)
    for (uid, attempt), (size, failed) in plan.items():
        if len(failed) == size:  # every session failed: no group, nobody waits
            assert (uid, attempt) not in group_of
            continue
        group = group_of[uid, attempt]
        assert sorted(members[uid, attempt]) == sorted(set(range(size)) - failed)
        assert group.closed and len(group.members) == size - len(failed)
        # closed by the last event of its attempt, not before: no live session is left out
        last = max(i for i, e in enumerate(events) if e[1:3] == (uid, attempt))
        assert closed_at[uid, attempt] == last
    assert stream.open_groups == 0 and stream.split_groups == 0
    assert stream.withdrawn_sessions == sum(len(failed) for _, failed in plan.values())


@pytest.mark.quick
def test_a_withdrawal_for_a_session_that_joined_changes_nothing():
    stream = StreamGroups()
    group, _ = stream.add(stream_key("u", "a"), 3, 0)
    assert stream.withdraw(stream_key("u", "a"), 0) is None  # it failed after handing its sample over
    stream.add(stream_key("u", "a"), 3, 1)
    assert not group.closed and group.expected == 3
    stream.add(stream_key("u", "a"), 3, 2)
    assert group.closed and stream.withdrawn_sessions == 0


@pytest.mark.quick
def test_a_late_member_of_a_withdrawn_session_counts_again():
    """Its session was cancelled after sending the sample: the join outranks the withdrawal."""
    stream = StreamGroups()
    stream.withdraw(stream_key("u", "a"), 1)
    group, _ = stream.add(stream_key("u", "a"), 3, 0)
    assert group.expected == 2
    stream.add(stream_key("u", "a"), 3, 1)
    assert group.expected == 3 and not group.closed and stream.withdrawn_sessions == 0
    stream.add(stream_key("u", "a"), 3, 2)
    assert group.closed


@pytest.mark.quick
def test_pending_withdrawals_are_bounded(monkeypatch):
    monkeypatch.setattr(StreamGroups, "MAX_PENDING_WITHDRAWALS", 10)
    stream = StreamGroups()
    for uid in range(25):
        stream.withdraw(stream_key(uid, "a"), 0)
    assert stream.withdrawn_sessions == 10
    group, _ = stream.add(stream_key(24, "a"), 2, 1)  # the newest is remembered
    assert group.closed


# -- the engine ---------------------------------------------------------------------------------------


def _reward(latency):
    async def reward(data_source, solution_str, ground_truth, extra_info=None):
        await asyncio.sleep(latency)
        return float(extra_info["session"])

    return reward


@pytest.mark.quick
@pytest.mark.parametrize("withdraw_at", [0.0, 0.5, 3.0])  # before any member, while scoring, after scored
def test_a_withdrawn_session_does_not_hold_its_group_for_the_timeout(withdraw_at):
    """Three of four sessions hand over a sample (1 s to score); the fourth fails at ``withdraw_at``:
    every member is answered by max(1 s, withdraw_at), not after group_wait (600 s)."""

    async def scenario():
        async with AsyncRewardAgent(_reward(1.0)) as agent:
            loop = asyncio.get_running_loop()
            start = loop.time()

            async def member(session):
                score = await agent.score_in_group({"solution_str": "x", "extra_info": {"session": session}}, "u", 4, 600.0,
                                                   session=session, attempt="a1")
                return score[0], loop.time() - start

            async def failed_session():
                await asyncio.sleep(withdraw_at)
                await agent.withdraw("u", 3, "a1")

            answers = await asyncio.gather(*(member(s) for s in range(3)), failed_session())
            return answers[:3], agent.metrics()

    answers, metrics = virtual(scenario)
    assert [score for score, _ in answers] == [0.0, 1.0, 2.0]
    assert {round(t, 6) for _, t in answers} == {max(1.0, withdraw_at)}
    assert metrics["withdrawn_sessions"] == 1 and metrics["split_groups"] == 0


@pytest.mark.quick
def test_without_the_withdrawal_the_group_waits_for_its_timer():
    """The control: the same group with no withdrawal waits group_wait after its last member."""

    async def scenario():
        async with AsyncRewardAgent(_reward(1.0)) as agent:
            loop = asyncio.get_running_loop()
            start = loop.time()
            await asyncio.gather(*(agent.score_in_group({"solution_str": "x", "extra_info": {"session": s}}, "u", 4, 600.0,
                                                        session=s, attempt="a1") for s in range(3)))
            return loop.time() - start

    assert virtual(scenario) == pytest.approx(600.0)


@pytest.mark.quick
def test_a_prompt_dispatched_again_under_its_uid_is_a_group_of_its_own():
    """Attempt 1 loses a session and is withdrawn from; attempt 2 of the same uid (verl re-issuing
    the prompt) runs whole: neither the withdrawal nor attempt 1's members reach attempt 2's group,
    whose group hook sees exactly its own four scores."""
    hook_calls: list[list[float]] = []

    class Reward:
        async def compute_score(self, data_source, solution_str, ground_truth, extra_info=None):
            await asyncio.sleep(extra_info.get("latency", 1.0))
            return float(extra_info["score"])

        def post_process_scores(self, scores):
            hook_calls.append(list(scores))
            return scores

    async def scenario():
        async with AsyncRewardAgent(Reward()) as agent:
            def member(attempt, session, score, latency=1.0):
                return agent.score_in_group({"solution_str": str(score), "extra_info": {"score": score, "latency": latency}},
                                            "u", 4, 600.0, session=session, attempt=attempt)

            async def failed_session():
                await asyncio.sleep(2.0)
                await agent.withdraw("u", 3, "a1")

            # both attempts' members arrive together (attempt 1 still being scored when attempt 2 starts)
            answers = await asyncio.gather(*(member("a1", s, 10 + s, latency=5.0) for s in range(3)),
                                           *(member("a2", s, 20 + s) for s in range(4)), failed_session())
            return answers[:3], answers[3:7], asyncio.get_running_loop().time()

    first, second, ended = virtual(scenario)
    assert ended == pytest.approx(5.0)  # nobody waited for a timer
    assert [s for s, _ in first] == [10.0, 11.0, 12.0] and [s for s, _ in second] == [20.0, 21.0, 22.0, 23.0]
    assert sorted(map(sorted, hook_calls)) == [[10.0, 11.0, 12.0], [20.0, 21.0, 22.0, 23.0]]


@pytest.mark.quick
@pytest.mark.parametrize("group_judge", [False, True])
def test_a_failed_reward_in_an_attempts_group_is_settled_by_the_policy(group_judge):
    """A group keyed by its attempt too: a failed sample is named in its error (the uid) and settled by
    the failure policy, per sample or as a group judge's call, never left holding its slot."""

    class PerSample:
        async def compute_score(self, data_source, solution_str, ground_truth, extra_info=None):
            await asyncio.sleep(1)
            if extra_info["fail"]:
                raise ValueError("judge said no")
            return 1.0

    class GroupJudge:
        async def compute_group_score(self, group):
            await asyncio.sleep(1)
            raise ValueError("judge said no")

    async def scenario():
        async with AsyncRewardAgent(GroupJudge() if group_judge else PerSample(), {"max_concurrency": 1}) as agent:
            members = [agent.score_in_group({"solution_str": str(s), "extra_info": {"fail": s == 0}}, "u", 2, 600.0,
                                            session=s, attempt="a1") for s in range(2)]
            return await asyncio.wait_for(asyncio.gather(*members), 60)

    answers = virtual(scenario)
    failed = [extra for _, extra in answers if extra["reward_failed"]]
    assert failed and all("group 'u'" in extra["reward_error"] and "judge said no" in extra["reward_error"] for extra in failed)


# -- verl's worker ------------------------------------------------------------------------------------


@pytest.mark.local
def test_verls_worker_withdraws_a_failed_session_of_the_dispatch_it_belongs_to(monkeypatch):
    """verl's TransferQueue worker (our subclass), with verl's ``_run_prompt`` reduced to starting the
    sessions and its ``_run_agent_loop`` replaced: a session that raises is withdrawn by its uid,
    session and attempt, and the error still reaches verl; each dispatch of the same uid (verl
    re-issuing a prompt) carries an attempt of its own; a session that succeeds withdraws nothing."""
    from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopWorkerTQ

    from verl_async_rm.integration.group_size_v1 import AgentLoopWorkerTQWithGroupSizes
    from verl_async_rm.integration.group_sizes import ATTEMPT_KEY

    verls = AgentLoopWorkerTQ.__ray_actor_class__
    withdrawn, errors, attempts = [], [], []

    class Client:
        async def withdraw(self, uid, session, attempt=None):
            withdrawn.append((uid, session, attempt))

    async def run_agent_loop(self, sampling_params, trajectory, *, agent_name, trace=True, **kwargs):
        await asyncio.sleep(0.01 * kwargs["session_id"])
        if kwargs["session_id"] == 2:
            raise RuntimeError("rollout died")
        return kwargs["session_id"]

    async def run_prompt(self, prompt, sampling_params, trajectory, trace=False):  # verl's: n sessions, then status
        attempts.append(prompt[ATTEMPT_KEY])
        results = await asyncio.gather(*(self._run_agent_loop(sampling_params, trajectory, agent_name="x", trace=trace,
                                                              session_id=i, **prompt) for i in range(4)),
                                       return_exceptions=True)
        errors.extend(r for r in results if isinstance(r, BaseException))

    monkeypatch.setattr(verls, "_run_agent_loop", run_agent_loop)
    monkeypatch.setattr(verls, "_run_prompt", run_prompt)
    worker = object.__new__(AgentLoopWorkerTQWithGroupSizes)  # verl's __init__ starts TransferQueue and servers
    worker._agent_settings, worker._client, worker.reward_loop_worker_handles = object(), Client(), ["reward worker"]

    async def scenario():
        for _ in range(2):  # the same prompt, dispatched twice
            await worker._run_prompt({"uid": "u1"}, {}, {"validate": False})

    asyncio.run(scenario())
    assert len(set(attempts)) == 2
    assert withdrawn == [("u1", 2, attempts[0]), ("u1", 2, attempts[1])]
    assert [str(e) for e in errors] == ["rollout died"] * 2
    worker.reward_loop_worker_handles = None  # verl scores nothing in the agent loop: nobody to tell
    withdrawn.clear()
    asyncio.run(scenario())
    assert withdrawn == []


@pytest.mark.local
def test_the_reward_manager_names_the_session_and_attempt_the_worker_stamped():
    import numpy as np

    from verl import DataProto
    from verl_async_rm.integration.group_sizes import ATTEMPT_KEY
    from verl_async_rm.integration.reward_manager import AsyncAgentRewardManager

    stamped = DataProto(non_tensor_batch={"session_id": np.array([3]), ATTEMPT_KEY: np.array(["a7"], dtype=object)})
    assert AsyncAgentRewardManager._member_of(stamped) == {"session": 3, "attempt": "a7"}
    assert AsyncAgentRewardManager._member_of(DataProto(non_tensor_batch={"session_id": np.array([3])})) == {}


# -- an agent that stopped for good stops verl's run --------------------------------------------------


@pytest.mark.quick
def test_the_agent_reports_why_it_stopped_for_good():
    """Budget spent on the per-sample path: every later sample is refused at once (``BudgetExceeded``),
    which on verl's modes only fails a rollout session; the agent says it stopped (metrics' "stopped")
    so the trainer can end the run. A failed sample alone does not stop it."""

    async def reward(data_source, solution_str, ground_truth, extra_info=None):
        await asyncio.sleep(1)
        if extra_info.get("fail"):
            raise ValueError("bad answer")
        return {"score": 1.0, "usage": {"prompt_tokens": 60, "completion_tokens": 10}}

    async def scenario():
        config = {"token_budget": 300, "reserve_output_tokens": 10, "failure_policy": "fill", "max_failure_rate": 1.0}
        async with AsyncRewardAgent(reward, config, token_estimator=lambda item: 60) as agent:
            await agent.score_in_group({"solution_str": "x", "extra_info": {"fail": True}}, "u0", 1)
            healthy = agent.metrics()["stopped"]
            answers = await asyncio.gather(*(agent.score_in_group({"solution_str": str(i), "extra_info": {}}, f"u{i}", 1)
                                             for i in range(1, 10)), return_exceptions=True)
            return healthy, answers, agent.metrics()["stopped"]

    healthy, answers, stopped = virtual(scenario)
    assert healthy is None
    assert any(isinstance(a, BaseException) for a in answers)
    assert stopped.startswith("BudgetExceeded: ") and "token_budget 300" in stopped


@pytest.mark.local
def test_verls_dispatch_ends_the_run_once_the_agent_stopped(monkeypatch):
    """The trainer's agent-loop manager asks before every dispatch (a step's batch or verl's refill of
    an evicted group): with the agent stopped it raises the agent's reason instead of generating."""
    from omegaconf import OmegaConf
    from tensordict import TensorDict

    from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopManagerTQ

    from verl_async_rm.integration.group_size_v1 import AgentLoopManagerTQWithGroupSizes, RewardAgentStopped

    dispatched = []

    class Client:
        stopped = None

        def metrics(self):
            return {"stopped": self.stopped}

    monkeypatch.setattr(AgentLoopManagerTQ, "generate_sequences", lambda self, batch: dispatched.append(len(batch)))
    manager = object.__new__(AgentLoopManagerTQWithGroupSizes)  # verl's __init__ starts the workers
    manager._agent_settings, manager._client, manager.reward_loop_worker_handles = object(), Client(), ["reward worker"]
    manager.config = OmegaConf.create({"actor_rollout_ref": {"rollout": {"n": 4, "val_kwargs": {"n": 1}}}})
    manager.generate_sequences(TensorDict({}, batch_size=[2]))
    manager._client.stopped = "BudgetExceeded: token_budget 300 reached"
    with pytest.raises(RewardAgentStopped, match="token_budget 300 reached"):
        manager.generate_sequences(TensorDict({}, batch_size=[2]))
    assert dispatched == [2]
