"""``admission_order: deadline`` (engine/admission_order.py, issue 46 item 1): when the judge's
throughput binds, the queued request the trainer needs first starts first (validation, which verl's
trainers wait for, before training; the older ticket, the caller's rank, the group closest to
completion), a retry or a
429 keeps its rank, no request is passed over for longer than ``max_passover_s``, nothing is lost
or answered twice, and ``fifo`` (the default) is the plain deque, exactly first in, first out.

Three levels: the queue alone against a model (no loop); the request pipeline in virtual time with a
cap of one, retries, 429s and abandons mixed in, watched at each admission by a meter of its own;
the agent, whose tickets and streamed groups rank their samples."""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections import Counter, deque

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.helpers.harness import virtual
from verl_async_rm.agent import AsyncRewardAgent, RewardAgent
from verl_async_rm.engine.admission_order import COMPACT_SLACK, RankedQueue
from verl_async_rm.engine.executors import AsyncCalls
from verl_async_rm.engine.flow import FlowControl, FlowSettings
from verl_async_rm.engine.pipeline import DONE, QUEUED, RUNNING, RequestPipeline, Sample
from verl_async_rm.errors import RewardError, TicketCancelled
from verl_async_rm.items import RewardItem
from verl_async_rm.loader import wrap_reward
from verl_async_rm.metrics import AgentMetrics
from verl_async_rm.retry import RetryPolicy

pytestmark = pytest.mark.quick

# What an owner says of a sample: (training, not validation; ticket opened as, caller's rank, unsettled members of its group).
OWNER_RANKS = st.tuples(st.booleans(), st.integers(0, 3), st.integers(0, 2), st.integers(1, 4))


class Owner:
    """Ranks each sample as the test drew it."""

    def __init__(self):
        self.ranks: dict[int, tuple] = {}

    def describe(self, item):
        return f"sample {item.index}"

    def admission_rank(self, item):
        return self.ranks[item.index]


class Throttled(Exception):
    """What an HTTP client raises on a 429."""

    def __init__(self, retry_after):
        super().__init__("HTTP 429")
        self.status_code = 429
        self.headers = {"retry-after": str(retry_after)}


# -- the queue alone, against a model ---------------------------------------------------------------------
class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(
    st.tuples(st.just("queue"), OWNER_RANKS), st.tuples(st.just("pop"), st.none()),
    st.tuples(st.just("requeue"), st.integers(0, 50)), st.tuples(st.just("abandon"), st.integers(0, 50)),
    st.tuples(st.just("wait"), st.floats(0, 8)),
), max_size=80), st.sampled_from([0.5, 5.0, 1e9]))
def test_the_queue_serves_by_rank_promotes_by_age_and_keeps_a_requeued_samples_rank(operations, max_passover_s):
    """Any arrival order, with pops, waits, samples queued again after they left (a retry, a 429) and
    samples abandoned while queued: the head is the longest-waiting sample once it has waited
    ``max_passover_s``, else the first by rank; a sample queued again keeps its first rank; every
    queued sample leaves exactly once per queueing, no abandoned one ever does."""
    clock, owner = Clock(), Owner()
    queue = RankedQueue(clock, max_passover_s)
    model: list[tuple[float, Sample]] = []  # queued now: (queued at, sample), in queueing order
    first_rank: dict[int, tuple] = {}  # the rank each sample got the first time (owner's + arrival)
    out: list[Sample] = []  # popped, not queued again yet

    def queue_up(sample):
        sample.state = QUEUED
        queue.append(sample)
        model.append((clock.now, sample))

    def pop_the_head():
        overdue = clock.now - model[0][0] >= max_passover_s
        expected = model[0][1] if overdue else min((s for _, s in model), key=lambda s: first_rank[s.item.index])
        assert queue[0] is expected and queue.popleft() is expected
        model.remove(next(entry for entry in model if entry[1] is expected))
        expected.state = RUNNING
        out.append(expected)

    for operation, value in operations:
        if operation == "queue":
            index = len(first_rank)
            owner.ranks[index] = value
            first_rank[index] = (*value, index)
            queue_up(Sample(RewardItem(index, "x"), owner))
        elif operation == "wait":
            clock.now += value
        elif operation == "requeue" and out:
            queue_up(out.pop(value % len(out)))
        elif operation == "abandon" and model:
            _, sample = model.pop(value % len(model))
            sample.state = DONE  # as the pipeline's abandon_all does: the queue is not told
        elif operation == "pop":
            assert bool(queue) == bool(model)
            if model:
                pop_the_head()
        assert list(queue.waiting()) == model
        assert all(s.ranked_as == first_rank[s.item.index] for _, s in model)
    while model:  # whatever is still queued leaves, in order, and nothing else is left
        pop_the_head()
    assert not queue


def test_dead_entries_do_not_pile_up_behind_a_sample_waiting_its_turn():
    """A training sample waits while 20,000 validation samples pass it: the entries they leave
    behind in the queue's view by age (each holding its sample, and its ticket) are compacted away."""
    clock, owner = Clock(), Owner()
    queue = RankedQueue(clock, max_passover_s=1e9)
    owner.ranks[0] = (True, 0, 0, 1)
    queue.append(Sample(RewardItem(0, "x"), owner))
    longest = 0
    for index in range(1, 20_001):
        owner.ranks[index] = (False, 1, 0, 1)
        queue.append(Sample(RewardItem(index, "x"), owner))
        head = queue[0]
        assert head.item.index == index
        queue.popleft().state = RUNNING
        longest = max(longest, len(queue._by_time))
    assert longest <= COMPACT_SLACK + 4 * 2  # four times the live entries (two at most) and the slack, not 20,000
    assert [s.item.index for s in queue] == [0]


# -- the pipeline, watched at each admission --------------------------------------------------------------
class Watch:
    """A meter that lets everything through and records, at each admission, the time, the sample
    admitted and what was queued at that moment, the admitted sample included (``wait`` is asked with
    the head still queued, and ``take`` follows at once: it is the last meter). It checks that no
    abandoned sample is ever admitted."""

    reserves = False

    def __init__(self):
        self.queue = None
        self.seen: list = []
        self.admissions: list[tuple[float, Sample, list]] = []

    def wait(self, sample, now):
        if isinstance(self.queue, RankedQueue):
            self.seen = list(self.queue.waiting())
        else:
            self.seen = [(None, s) for s in self.queue if s.state == QUEUED]
        return 0.0

    def take(self, sample, now):
        assert not sample.settled  # never one abandoned (the engine's flag: settled from outside)
        self.admissions.append((now, sample, self.seen))


ARRIVALS = st.lists(st.tuples(
    st.floats(0, 20),  # arrives at
    OWNER_RANKS,
    st.sampled_from(["ok", "ok", "throttle", "retry", "slow"]),
    st.one_of(st.none(), st.floats(0, 40)),  # abandoned at (deadline, cancel), if not settled by then
), min_size=1, max_size=18)


def run_pipeline(arrivals, max_passover_s: float | None):
    """Every sample through a pipeline with a cap of one; ``max_passover_s`` None: FIFO. Returns the
    watch, outcomes per sample, what was abandoned (and when), the order the samples arrived in
    (timers due at the same time run in any order), and the pipeline's queue."""
    watch, owner, arrived = Watch(), Owner(), []
    outcomes: dict[int, list] = {i: [] for i in range(len(arrivals))}
    abandoned: dict[int, float] = {}
    attempts = Counter()
    box = {}

    async def reward(data_source, solution_str, ground_truth, extra_info=None):
        i = extra_info["i"]
        attempts[i] += 1
        behaviour = arrivals[i][2]
        if attempts[i] == 1 and behaviour == "throttle":
            raise Throttled(2)
        if attempts[i] == 1 and behaviour == "retry":
            raise ConnectionError("refused")
        await asyncio.sleep(3 if behaviour == "slow" else 1)
        return 1.0

    async def scenario():
        loop = asyncio.get_running_loop()
        start = loop.time()
        pipeline = RequestPipeline(
            loop=loop, calls=AsyncCalls(wrap_reward(reward, {})), max_concurrency=1, request_timeout=None,
            retry=RetryPolicy(3, 0.5, 2.0), flow=FlowControl(FlowSettings(1, 4.0, 0.5)), metrics=AgentMetrics(),
            on_outcome=lambda sample, outcome: outcomes[sample.item.index].append(outcome),
            on_systemic_failure=lambda message: None, max_hung_calls=10, max_throttled_s=None, meters=[watch],
            queue=None if max_passover_s is None else RankedQueue(loop.time, max_passover_s),
        )
        watch.queue = box["queue"] = pipeline.queue

        def abandon(sample):
            if not outcomes[sample.item.index] and not sample.settled:
                sample.settled = True  # the engine's flag: settled from outside
                abandoned[sample.item.index] = loop.time()
                pipeline.abandon(sample)

        def arrive(sample):
            arrived.append(sample.item.index)
            pipeline.enqueue([sample])

        for i, (at, rank, _, abandon_at) in enumerate(arrivals):
            owner.ranks[i] = rank
            sample = Sample(RewardItem(i, "x", None, "t", {"i": i}), owner)
            loop.call_at(start + at, arrive, sample)
            if abandon_at is not None:
                loop.call_at(start + at + abandon_at, abandon, sample)
        await asyncio.sleep(1000)
        await pipeline.aclose(1)

    virtual(scenario)
    return watch, outcomes, abandoned, arrived, box["queue"]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ARRIVALS, st.sampled_from([2.0, 6.0, 1e9]))
def test_when_the_cap_binds_the_first_by_rank_starts_and_none_waits_past_its_passover(arrivals, max_passover_s):
    """At every admission (one at a time: the cap is one) the sample that starts ranks before every
    other sample queued at that moment, unless the longest-waiting one has waited ``max_passover_s``:
    then it starts (no sample queued after it passes it: its wait is bounded). Retries, 429s and
    samples abandoned while queued or running are mixed in: every sample not abandoned is answered
    exactly once, an abandoned one never after it was abandoned, and none starts after it was
    abandoned."""
    watch, outcomes, abandoned, _, queue = run_pipeline(arrivals, max_passover_s)
    for at, admitted, seen in watch.admissions:
        assert seen and admitted in [s for _, s in seen]
        (oldest_at, oldest), others = seen[0], [s for _, s in seen if s is not admitted]
        if at - oldest_at >= max_passover_s:
            assert admitted is oldest  # promoted: the longest-waiting first, whatever its rank
        else:
            assert all(admitted.ranked_as < other.ranked_as for other in others)
    for i in range(len(arrivals)):
        answers = len(outcomes[i])
        assert answers == (0 if i in abandoned else 1), (i, outcomes[i], abandoned.get(i))
    assert not queue  # nothing left behind


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ARRIVALS.map(lambda arrivals: [(at, rank, "ok" if kind in ("throttle", "retry") else kind, gone)
                                      for at, rank, kind, gone in arrivals]))
def test_fifo_ignores_every_rank_and_admits_exactly_in_arrival_order(arrivals):
    """The default: a plain deque (the FIFO path is the code it always was), and samples start in the
    order they arrived, whatever their owners would rank them, less those abandoned before their turn."""
    watch, outcomes, abandoned, arrived, queue = run_pipeline(arrivals, None)
    assert type(queue) is deque
    started = [sample.item.index for _, sample, _ in watch.admissions]
    assert started == [i for i in arrived if i in started]
    assert set(arrived) - set(started) <= set(abandoned)
    assert all(len(outcomes[i]) == (0 if i in abandoned else 1) for i in range(len(arrivals)))


def test_a_sample_ranked_last_is_passed_over_no_longer_than_max_passover_s_plus_one_admission():
    """A training sample queued while a validation sample arrives every second, for 100 s, against a
    judge that takes one at a time for 1 s: without the bound it would wait for the whole stream;
    with ``max_passover_s`` 10 it starts within 10 s plus the admission in progress."""

    def training_start(max_passover_s):
        arrivals = [(0.5, (True, 0, 0, 1), "ok", None)] + [(float(t), (False, 1, 0, 1), "ok", None) for t in range(100)]
        watch = run_pipeline(arrivals, max_passover_s)[0]
        return next(at for at, sample, _ in watch.admissions if sample.item.index == 0)

    assert 0.5 + 10 <= training_start(10.0) <= 0.5 + 10 + 1
    assert training_start(1e9) >= 100  # no bound: passed over by every validation sample


# -- the agent: what tickets and streamed groups rank by --------------------------------------------------
def labelled(tag, n, group_size=1):
    return [{"solution_str": "x", "uid": f"{tag}{i // group_size}", "extra_info": {"tag": f"{tag}{i}"}} for i in range(n)]


def call_order(scenario_steps, admission_order):
    """The order an async reward (1 s a call, one at a time) is called in, for a scenario that
    submits while the first call holds the only slot."""
    called: list[str] = []

    async def reward(data_source, solution_str, ground_truth, extra_info=None):
        called.append(extra_info["tag"])
        await asyncio.sleep(1)
        return 1.0

    async def scenario():
        async with AsyncRewardAgent(reward, {"max_concurrency": 1, "admission_order": admission_order}) as agent:
            await scenario_steps(agent)

    virtual(scenario)
    return called


def test_tickets_rank_validation_first_then_older_first_then_the_callers_rank():
    async def steps(agent):
        tickets = [agent.submit(labelled("blocker", 1))]  # holds the slot: the rest queue up behind it
        tickets.append(agent.submit(labelled("V", 2), validation=True))
        older = agent.open_ticket(2)  # opened before the newer one, its samples come after it
        tickets.append(agent.submit(labelled("N", 4, 2), 2, ranks=[1, 1, 0, 0]))
        agent.add(older, labelled("O", 2, 2))
        agent.close_ticket(older)
        for ticket in [*tickets, older]:
            assert len(await agent.get_all(ticket)) > 0

    assert call_order(steps, "deadline") == ["blocker0", "V0", "V1", "O0", "O1", "N2", "N3", "N0", "N1"]
    assert call_order(steps, "fifo") == ["blocker0", "V0", "V1", "N0", "N1", "N2", "N3", "O0", "O1"]


def test_the_group_closest_to_completion_goes_first():
    """An open ticket: a member of group A arrives once its sibling is scored; group B's two members
    queued before it still have both members to go."""

    async def steps(agent):
        ticket = agent.open_ticket(2)
        agent.add(ticket, [{"index": 0, "solution_str": "x", "uid": "A", "extra_info": {"tag": "A0"}}])
        agent.add(ticket, [{"index": i, "solution_str": "x", "uid": "B", "extra_info": {"tag": f"B{i - 1}"}} for i in (1, 2)])
        await asyncio.sleep(1.5)  # A0 is scored; B0 runs
        agent.add(ticket, [{"index": 3, "solution_str": "x", "uid": "A", "extra_info": {"tag": "A1"}}])
        agent.close_ticket(ticket)
        assert len(await agent.get_all(ticket)) == 4

    assert call_order(steps, "deadline") == ["A0", "B0", "A1", "B1"]
    assert call_order(steps, "fifo") == ["A0", "B0", "B1", "A1"]


def test_the_per_sample_streams_groups_rank_by_when_they_opened():
    async def steps(agent):
        blocker = agent.submit(labelled("blocker", 1))
        first = asyncio.ensure_future(agent.score_in_group({"solution_str": "x", "extra_info": {"tag": "G0"}}, "G", 2))
        await asyncio.sleep(0)
        newer = agent.submit(labelled("N", 2))
        second = asyncio.ensure_future(agent.score_in_group({"solution_str": "x", "extra_info": {"tag": "G1"}}, "G", 2))
        await asyncio.gather(first, second, agent.get_all(blocker), agent.get_all(newer))

    assert call_order(steps, "deadline") == ["blocker0", "G0", "G1", "N0", "N1"]
    assert call_order(steps, "fifo") == ["blocker0", "G0", "N0", "N1", "G1"]


def test_a_streamed_validation_group_goes_before_older_training():
    """verl's validation pass, on the per-sample path (our agent-loop managers stamp it: the trainer
    waits for it), starts before training groups and tickets queued earlier; an older validation
    group before a newer one."""

    def member(tag, uid, validation):
        return asyncio.ensure_future(agent_ref[0].score_in_group(
            {"solution_str": "x", "extra_info": {"tag": tag}}, uid, 2, validation=validation))

    agent_ref = []

    async def steps(agent):
        agent_ref[:] = [agent]
        blocker = agent.submit(labelled("blocker", 1))
        training = [member("T0", "T", False), member("T1", "T", False)]
        await asyncio.sleep(0)
        ticket = agent.submit(labelled("N", 2))
        validation = [member(f"V{i}", f"V{i // 2}", True) for i in range(4)]
        await asyncio.gather(*training, *validation, agent.get_all(blocker), agent.get_all(ticket))

    assert call_order(steps, "deadline") == ["blocker0", "V0", "V1", "V2", "V3", "T0", "T1", "N0", "N1"]
    assert call_order(steps, "fifo") == ["blocker0", "T0", "T1", "N0", "N1", "V0", "V1", "V2", "V3"]


def test_a_streamed_validation_flag_that_is_not_a_bool_is_refused():
    async def scenario():
        async with AsyncRewardAgent(lambda data_source, solution_str, ground_truth, extra_info=None: 1.0) as agent:
            with pytest.raises(ValueError, match="validation must be true or false"):
                await agent.score_in_group({"solution_str": "x"}, "G", 1, validation="yes")
            assert agent.metrics()["submitted"] == 0

    virtual(scenario)


def test_a_group_judges_call_ranks_as_its_group():
    class Judge:
        async def compute_group_score(self, group):
            called.append(group[0].extra_info["tag"])
            await asyncio.sleep(1)
            return [1.0] * len(group)

    called: list[str] = []

    async def scenario():
        async with AsyncRewardAgent(Judge(), {"max_concurrency": 1, "admission_order": "deadline"}) as agent:
            tickets = [agent.submit(labelled("blocker", 1))]
            tickets.append(agent.submit(labelled("V", 2, 2), 2, validation=True))
            tickets.append(agent.submit(labelled("T", 4, 2), 2, ranks=[1, 1, 0, 0]))
            for ticket in tickets:
                await agent.get_all(ticket)

    virtual(scenario)
    assert called == ["blocker0", "V0", "T2", "T0"]


@pytest.mark.parametrize("ranks, match", [
    ([0], "ranks has 1 entries for 2 items"),
    ([0, True], "the rank of sample 1 is True"),
    ([0, 1.5], "the rank of sample 1 is 1.5"),
    ([0, "first"], "ranks are integers"),
])
def test_bad_ranks_and_validation_flags_are_refused_at_submit(ranks, match):
    async def scenario():
        async with AsyncRewardAgent(lambda data_source, solution_str, ground_truth, extra_info=None: 1.0) as agent:
            with pytest.raises(ValueError, match=match):
                agent.submit(labelled("x", 2), ranks=ranks)
            with pytest.raises(ValueError, match="validation must be true or false"):
                agent.open_ticket(validation="yes")
            assert agent.metrics()["submitted"] == 0

    virtual(scenario)


# -- every sample once, through the agent -----------------------------------------------------------------
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.integers(1, 3), st.integers(1, 2), st.booleans(), st.booleans(), st.booleans()),
                min_size=1, max_size=4),
       st.lists(st.sampled_from(["ok", "ok", "throttle", "retry", "hang"]), min_size=1, max_size=12),
       st.one_of(st.none(), st.integers(0, 3)), st.sampled_from([3.0, 1e9]))
def test_every_sample_of_every_ticket_is_handed_out_once_with_retries_429s_deadlines_and_cancels(
        shapes, behaviours, cancelled, max_passover_s):
    """Tickets of every shape (groups, validation or not, caller's ranks or not, submitted or opened
    and added to) under a cap of one, with 429s, retries, calls that hang until the deadline, and a
    cancelled ticket: each ticket hands out each of its samples exactly once, or raises."""
    attempts = Counter()

    async def reward(data_source, solution_str, ground_truth, extra_info=None):
        key = extra_info["key"]
        attempts[key] += 1
        kind = behaviours[extra_info["n"] % len(behaviours)]
        if kind == "hang":
            await asyncio.sleep(10**6)
        if attempts[key] == 1 and kind == "throttle":
            raise Throttled(1)
        if attempts[key] == 1 and kind == "retry":
            raise ConnectionError("refused")
        await asyncio.sleep(0.5)
        return 1.0

    config = {"max_concurrency": 1, "admission_order": "deadline", "max_passover_s": max_passover_s,
              "request_timeout": 5, "ticket_deadline": 40, "max_failure_rate": 1.0, "backoff_initial": 0.5,
              "backoff_max": 2, "max_throttled_s": None}

    async def scenario():
        async with AsyncRewardAgent(reward, config) as agent:
            tickets, numbers = [], itertools.count()
            for t, (groups, size, validation, ranked, opened) in enumerate(shapes):
                batch = [{"index": i, "solution_str": "x", "uid": f"{t}-{i // size}",
                          "extra_info": {"key": f"{t}/{i}", "n": next(numbers)}} for i in range(groups * size)]
                if opened:
                    ticket = agent.open_ticket(size, validation=validation)
                    agent.add(ticket, batch[::2])
                    agent.add(ticket, batch[1::2])
                    agent.close_ticket(ticket)
                else:
                    ranks = [i % 3 for i in range(len(batch))] if ranked else None
                    ticket = agent.submit(batch, size, validation=validation, ranks=ranks)
                tickets.append((ticket, len(batch)))
            if cancelled is not None and cancelled < len(tickets):
                agent.cancel(tickets[cancelled][0])
            for position, (ticket, n) in enumerate(tickets):
                try:
                    chunk = await agent.get_all(ticket)
                except (RewardError, TicketCancelled):
                    assert position == cancelled
                    continue
                assert sorted(chunk.indices) == list(range(n))
            return agent.metrics()

    metrics = virtual(scenario)
    assert metrics["queued"] == 0


# -- the agent in its own thread (verl's trainer process) ---------------------------------------------------
def test_reward_agent_serves_validation_then_the_older_ticket():
    """Through ``RewardAgent``: a validation batch and two training batches queue behind a call that
    holds the only slot; validation goes first (the trainer waits for it), then the older training
    ticket (opened first, its samples added last)."""
    gate, called = threading.Event(), []

    async def reward(data_source, solution_str, ground_truth, extra_info=None):
        called.append(extra_info["tag"])
        while not gate.is_set():
            await asyncio.sleep(0.005)
        return 1.0

    with RewardAgent(reward, {"max_concurrency": 1, "admission_order": "deadline"}) as agent:
        tickets = [agent.submit(labelled("blocker", 1))]
        tickets.append(agent.submit(labelled("V", 2), validation=True))
        older = agent.open_ticket(1)
        tickets.append(agent.submit(labelled("N", 2)))
        agent.add(older, labelled("O", 2))
        agent.close_ticket(older)
        gate.set()
        for ticket in [*tickets, older]:
            assert len(agent.get_all(ticket, timeout=30)) > 0
    assert called == ["blocker0", "V0", "V1", "O0", "O1", "N0", "N1"]
