"""Admission's meters (engine/meters.py) in the request pipeline, in virtual time: a limit the
pipeline has never seen is honoured by giving it the meter, with no edit of the request loop; a
meter that reserves is asked only for a request that may start now; a meter that raises refuses
the request, never sent."""

from __future__ import annotations

import asyncio

import pytest

from tests.helpers.harness import virtual
from verl_async_rm.engine.executors import AsyncCalls
from verl_async_rm.engine.flow import FlowControl, FlowSettings
from verl_async_rm.engine.meters import ConcurrencyCap, Meter, RequestRate, TokenRate, rate_meters
from verl_async_rm.engine.pipeline import RequestPipeline, Sample
from verl_async_rm.items import RewardItem
from verl_async_rm.loader import wrap_reward
from verl_async_rm.metrics import AgentMetrics
from verl_async_rm.retry import RetryPolicy

pytestmark = pytest.mark.quick


class Owner:
    def describe(self, item):
        return f"sample {item.index}"


class Spacing:
    """A limit the pipeline has never heard of: starts at least ``gap`` seconds apart."""

    reserves = False

    def __init__(self, gap: float):
        self.gap, self.next_at = gap, float("-inf")

    def wait(self, sample, now):
        return max(0.0, self.next_at - now)

    def take(self, sample, now):
        self.next_at = now + self.gap


class Recorder:
    """A meter that reserves: records when it is asked and what it took."""

    reserves = True

    def __init__(self):
        self.asked, self.taken = [], []

    def wait(self, sample, now):
        self.asked.append(round(now, 6))
        return 0.0

    def take(self, sample, now):
        self.taken.append(sample.item.index)


class Refusing:
    reserves = False

    def wait(self, sample, now):
        if sample.item.index == 1:
            raise ValueError("no estimate for this one")
        return 0.0

    def take(self, sample, now):
        pass


def run(meters: list, n: int = 3, max_concurrency: int = 8):
    """Start times (virtual seconds) of ``n`` instant requests under ``meters``, and their outcomes."""
    started, outcomes = {}, {}

    async def reward(data_source, solution_str, ground_truth, extra_info=None):
        started[int(solution_str)] = round(asyncio.get_running_loop().time() - t0, 6)
        return 1.0

    async def scenario():
        nonlocal t0
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        done = loop.create_future()

        def on_outcome(sample, outcome):
            outcomes[sample.item.index] = outcome
            if len(outcomes) == n and not done.done():
                done.set_result(None)

        pipeline = RequestPipeline(
            loop=loop, calls=AsyncCalls(wrap_reward(reward, {})), max_concurrency=max_concurrency,
            request_timeout=None, retry=RetryPolicy(1, 0.1, 1.0), flow=FlowControl(FlowSettings(max_concurrency, 1.0, 0.1)),
            metrics=AgentMetrics(), on_outcome=on_outcome, on_systemic_failure=lambda message: None,
            max_hung_calls=10, max_throttled_s=None, meters=meters,
        )
        pipeline.enqueue([Sample(RewardItem(i, str(i)), Owner()) for i in range(n)])
        await asyncio.wait_for(done, 100)
        await pipeline.aclose(1)

    t0 = 0.0
    virtual(scenario)
    return started, outcomes


def test_a_new_limit_is_a_new_meter():
    started, _ = run([Spacing(2.0)])
    assert started == {0: 0.0, 1: 2.0, 2: 4.0}


def test_a_meter_that_reserves_is_asked_only_for_a_request_that_may_start_now():
    recorder = Recorder()
    started, _ = run([Spacing(2.0), recorder])
    assert recorder.asked == [t + recorder.asked[0] for t in (0.0, 2.0, 4.0)]  # never while Spacing says wait
    assert recorder.taken == [0, 1, 2] and started == {0: 0.0, 1: 2.0, 2: 4.0}


def test_a_meter_that_raises_refuses_the_request_never_sent():
    started, outcomes = run([Refusing()])
    assert sorted(started) == [0, 2]
    assert outcomes[1].kind == "invalid" and "no estimate for this one" in outcomes[1].message


def test_the_cap_holds_its_slots_and_the_rate_meters_read_their_buckets():
    started, _ = run(rate_meters(120, None, lambda item: 1.0), n=4)  # a bucket of 2 a second, 1 at once
    assert started[0] == 0.0 and started[3] > started[2] > started[1] >= 0.0
    cap = ConcurrencyCap(2)
    assert cap.wait(None, 0.0) == 0.0
    cap.take(None, 0.0), cap.take(None, 0.0)
    assert cap.wait(None, 0.0) is None and (cap.in_flight, cap.peak) == (2, 2)
    meters: list[Meter] = rate_meters(60_000, 6_000, lambda item: 10.0)
    assert [type(m) for m in meters] == [RequestRate, TokenRate] and rate_meters(None, None, len) == []
