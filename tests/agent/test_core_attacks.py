"""Issue 11, "What breaks today": one bounded regression test per item, against the public API.

Each test reproduces its item at the issue's sizes where feasible (smaller only where the bug still
reproduces, said in the test). Every test is bounded twice: a pytest-timeout marker, and internal
deadlines (``bounded(...)``, ``get(timeout=...)``, ``asyncio.wait(timeout=...)``) so that a hang is
reported as a failure of the promise it breaks rather than as a stuck suite. Every one of them failed
on the code of issue 11's time, for the reason its item gives (checked before the engine restructure).

Item 13 (the rate-limited judge) lives in tests/agent/test_rate_limited_judge.py (slow, real HTTP).
"""

from __future__ import annotations

import asyncio
import gc
import random
import threading
import time
import tracemalloc
from typing import Callable

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from tests.conftest import REWARDS
from tests.helpers.harness import agents, bounded, close_quietly, unformatted_logs  # noqa: F401 - fixtures
from verl_async_rm.user_rewards.llm_judge import JudgeReward
from verl_async_rm import RewardAgent, RewardError
from verl_async_rm_rig.judge_server import JudgeServer, JudgeServerConfig
from verl_async_rm.loader import RewardSpec, load_reward

FAST = {"backoff_initial": 0.01, "backoff_max": 0.05}


# ----------------------------------------------------------------------------- harness


def items(n: int, group_size: int = 1, **extra) -> list[dict]:
    return [{"solution_str": "x", "uid": i // group_size, "extra_info": {"i": i, **extra}} for i in range(n)]


def assert_exactly_once(delivered: list[int], n: int) -> None:
    seen = set(delivered)
    lost = n - len(seen)
    duplicated = len(delivered) - len(seen)
    assert lost == 0 and duplicated == 0 and seen == set(range(n)), f"{lost} lost, {duplicated} duplicated of {n}"


class ConcurrencyProbe:
    """Counts calls running at once, inside the reward (the truth, whatever metrics() says)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.now = 0
        self.peak = 0
        self.calls = 0

    def __enter__(self):
        with self.lock:
            self.now += 1
            self.calls += 1
            self.peak = max(self.peak, self.now)

    def __exit__(self, *exc):
        with self.lock:
            self.now -= 1


# ----------------------------------------------------------------------------- item 1


async def jittered(data_source, solution_str, ground_truth, extra_info=None):
    await asyncio.sleep(extra_info["delay"])
    return float(extra_info["i"])


def poll_with_timeouts(agent, ticket, n, threads, timeouts: Callable[[random.Random], float], seed, budget_s):
    """``threads`` callers each loop ``get(ticket, n, timeout=...)`` until the drained ticket answers
    empty; returns every index delivered (duplicates kept)."""
    delivered: list[int] = []
    lock = threading.Lock()
    stop_at = time.monotonic() + budget_s
    unfinished: list[int] = []

    def caller(k):
        rng = random.Random(seed * 100 + k)
        while time.monotonic() < stop_at:
            try:
                chunk = agent.get(ticket, n, timeout=timeouts(rng))
            except TimeoutError:
                continue
            if not len(chunk):
                return
            assert chunk.scores == [float(i) for i in chunk.indices]  # own scores, aligned
            with lock:
                delivered.extend(chunk.indices)
        unfinished.append(k)

    workers = [threading.Thread(target=caller, args=(k,), daemon=True) for k in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(budget_s + 5)
    assert not unfinished and not any(w.is_alive() for w in workers), "callers still polling at the budget"
    return delivered


@pytest.mark.local
@pytest.mark.timeout(120)
@pytest.mark.parametrize("threads", [1, 4])
def test_item01_get_with_tiny_timeouts_loses_nothing(agents, threads):
    n = 20_000  # the size
    agent = agents(jittered, {"max_concurrency": 256})
    # zero-latency scores: groups become ready all the time, so timeouts often fire mid hand-over
    batch = [{"solution_str": "x", "extra_info": {"i": i, "delay": 0.0}} for i in range(n)]
    ticket = agent.submit(batch, 1)
    delivered = poll_with_timeouts(agent, ticket, 4, threads, lambda r: r.uniform(0.001, 0.02), threads, budget_s=90)
    assert agent.remaining(ticket) == 0
    assert_exactly_once(delivered, n)


@pytest.mark.local
@pytest.mark.timeout(60)
def test_item01_cancelled_aget_consumes_nothing(agents):
    n = 20_000
    rng = random.Random(1)
    agent = agents(jittered, {"max_concurrency": 256})
    batch = [{"solution_str": "x", "extra_info": {"i": i, "delay": 0.0}} for i in range(n)]
    ticket = agent.submit(batch, 1)

    async def caller():
        delivered = []
        stop_at = time.monotonic() + 40
        while time.monotonic() < stop_at:
            try:
                chunk = await asyncio.wait_for(agent.aget(ticket, 4), rng.uniform(0.0005, 0.01))
            except asyncio.TimeoutError:  # wait_for cancelled the aget: it must have consumed nothing
                continue
            if not len(chunk):
                return delivered
            delivered += chunk.indices
        raise AssertionError("ticket not drained within 40 s")

    delivered = bounded(lambda: asyncio.run(caller()), 50, "aget caller")
    assert_exactly_once(delivered, n)


@st.composite
def polling_scenarios(draw):
    group_size = draw(st.sampled_from([1, 2, 4]))
    groups = draw(st.integers(1, 150))
    return {
        "group_size": group_size,
        "groups": groups,
        "chunk_groups": draw(st.integers(1, 4)),
        "max_delay": draw(st.sampled_from([0.0, 0.002, 0.01])),
        "callers": draw(st.lists(st.sampled_from(["get", "aget"]), min_size=1, max_size=4)),
        "timeouts": draw(st.lists(st.floats(0.0002, 0.02), min_size=1, max_size=6)),
        "seed": draw(st.integers(0, 2**16)),
    }


@pytest.mark.local
@pytest.mark.timeout(300)
@settings(max_examples=30, deadline=None, database=None, phases=[Phase.generate],
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])  # fmt: skip
@given(polling_scenarios())
def test_item01_property_random_timeouts_cancels_and_threads_deliver_every_sample_once(scenario):
    """Shrinking is off: the failure is a race, and a shrunk example would rarely reproduce it."""
    gs, n = scenario["group_size"], scenario["group_size"] * scenario["groups"]
    rng = random.Random(scenario["seed"])
    batch = [{"solution_str": "x", "uid": i // gs, "extra_info": {"i": i, "delay": rng.uniform(0, scenario["max_delay"])}}
             for i in range(n)]  # fmt: skip
    chunk = gs * scenario["chunk_groups"]
    timeouts = scenario["timeouts"]
    agent = RewardAgent(jittered, {"max_concurrency": 64})
    try:
        ticket = agent.submit(batch, gs)
        delivered: list[int] = []
        lock = threading.Lock()
        stop_at = time.monotonic() + 20

        def sync_caller(k):
            for attempt in range(10**9):
                if time.monotonic() > stop_at:
                    raise AssertionError("not drained")
                try:
                    got = agent.get(ticket, chunk, timeout=timeouts[(k + attempt) % len(timeouts)])
                except TimeoutError:
                    continue
                if not len(got):
                    return
                with lock:
                    delivered.extend(got.indices)

        async def async_caller(k):
            for attempt in range(10**9):
                if time.monotonic() > stop_at:
                    raise AssertionError("not drained")
                try:
                    got = await asyncio.wait_for(agent.aget(ticket, chunk), timeouts[(k + attempt) % len(timeouts)])
                except asyncio.TimeoutError:
                    continue
                if not len(got):
                    return
                with lock:
                    delivered.extend(got.indices)

        errors: list[BaseException] = []

        def run(kind, k):
            try:
                sync_caller(k) if kind == "get" else asyncio.run(async_caller(k))
            except BaseException as exc:  # noqa: BLE001
                errors.append(exc)

        workers = [threading.Thread(target=run, args=(kind, k), daemon=True) for k, kind in enumerate(scenario["callers"])]
        for w in workers:
            w.start()
        for w in workers:
            w.join(30)
        assert not any(w.is_alive() for w in workers) and not errors, errors
        assert_exactly_once(delivered, n)
    finally:
        close_quietly(agent)


# ----------------------------------------------------------------------------- item 2


@pytest.mark.local
@pytest.mark.slow
@pytest.mark.timeout(90)
def test_item02_streamed_groups_with_a_deadline_are_all_answered(agents, unformatted_logs):
    samples, group_size, cap, judge_s, deadline = 4_096, 8, 64, 0.2, 5.0  # the sizes

    async def judge(data_source, solution_str, ground_truth, extra_info=None):
        await asyncio.sleep(judge_s)
        return 1.0

    # a deadline far too short for the load: most samples expire; the subject is that every group is answered
    agent = agents(judge, {"max_concurrency": cap, "ticket_deadline": deadline, "request_timeout": deadline,
                           "max_failure_rate": 1.0})

    async def main():
        tasks = [asyncio.ensure_future(agent.ascore_in_group({"solution_str": str(i)}, f"g{i // group_size}", group_size))
                 for i in range(samples)]  # fmt: skip
        done, pending = await asyncio.wait(tasks, timeout=deadline + 10)
        for task in pending:
            task.cancel()
        return [t.result() for t in done if not t.exception()], [t.exception() for t in done if t.exception()], len(pending)

    answered, errors, unanswered = bounded(lambda: asyncio.run(main()), deadline + 30, "the streamed groups")
    gc.collect()  # a task that died of an exception nobody retrieved is logged when collected
    logged = [repr(r.exc_info[1]) for r in unformatted_logs.records if r.exc_info][:3]
    assert unanswered == 0, f"{unanswered} of {samples} samples unanswered {deadline + 10}s after submit; logged: {logged}"
    assert not errors, errors[:3]
    kinds = {extra.get("reward_failure") for _, extra in answered}
    assert len(answered) == samples and kinds <= {None, "deadline", "timeout"}


# ----------------------------------------------------------------------------- item 3


async def overflowing(data_source, solution_str, ground_truth, extra_info=None):
    return 10**400 if solution_str == "huge" else 1.0


@pytest.mark.quick
@pytest.mark.timeout(30)
@pytest.mark.parametrize("policy", ["neutral", "fill", "raise"])
def test_item03_unrepresentable_return_is_settled_by_every_policy(agents, policy):
    agent = agents(overflowing, {"failure_policy": policy, "fill_value": -1.0})
    ticket = agent.submit([{"solution_str": "huge", "uid": 0}, {"solution_str": "fine", "uid": 0}], 2)
    if policy == "raise":
        with pytest.raises(RewardError, match="sample 0"):
            bounded(lambda: agent.get_all(ticket, timeout=1), 5, "get_all")
        return
    chunk = bounded(lambda: agent.get_all(ticket, timeout=1), 5, "get_all")
    assert chunk.extra_info["reward_failed"] == [1, 0]
    assert chunk.scores == ([1.0, 1.0] if policy == "neutral" else [-1.0, 1.0])


@pytest.mark.quick
@pytest.mark.timeout(30)
@pytest.mark.parametrize("policy", ["neutral", "fill", "raise"])
def test_item03_unrepresentable_return_on_the_per_sample_path(agents, policy):
    agent = agents(overflowing, {"failure_policy": policy, "fill_value": -1.0})

    async def main():
        calls = [agent.ascore_in_group({"solution_str": s}, "g", 2) for s in ("huge", "fine")]
        try:
            return await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), 1)
        except asyncio.TimeoutError:
            raise AssertionError("the group was not answered within 1 s") from None

    answers = bounded(lambda: asyncio.run(main()), 5, "the streamed group")
    if policy == "raise":
        assert all(isinstance(a, RewardError) for a in answers), answers
    else:
        assert [a[1]["reward_failed"] for a in answers] == [1, 0]


# ----------------------------------------------------------------------------- item 4


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_item04_open_groups_do_not_exhaust_the_actor(ray_session):
    from verl_async_rm.ray_agent import RayRewardClient, get_or_create_agent_actor

    ray = ray_session
    pending_calls = 10_050  # just past the actor's default max_concurrency (10,000)
    spec = RewardSpec(str(REWARDS / "examples.py"), "async_plain")
    actor = get_or_create_agent_actor(spec, {}, name="attack-item04")  # today's defaults
    client = RayRewardClient(actor)  # what the reward manager uses: one call per sample

    async def scenario():
        item = {"solution_str": "1", "ground_truth": "1"}
        waiting = [asyncio.ensure_future(client.score_in_group(item, "open", pending_calls + 1)) for _ in range(pending_calls)]
        while (await actor.metrics.remote())["submitted"] < pending_calls:
            await asyncio.sleep(0.2)
        start = time.monotonic()
        metrics = await asyncio.wait_for(actor.metrics.remote(), 20)  # times out if the actor is stuck
        assert time.monotonic() - start < 20 and metrics["submitted"] == pending_calls
        last = client.score_in_group(item, "open", pending_calls + 1)
        return await asyncio.wait_for(asyncio.gather(*waiting, last), 120)

    try:
        answers = asyncio.run(scenario())
        assert len(answers) == pending_calls + 1 and all(score == 1.0 for score, _ in answers)
    finally:
        ray.kill(actor)


# ----------------------------------------------------------------------------- item 5


@pytest.mark.local
@pytest.mark.timeout(60)
def test_item05_huge_retry_after_is_bounded_by_backoff_max(agents):
    backoff_max = 1.0
    with JudgeServer(JudgeServerConfig()) as server:
        judge = JudgeReward(base_url=server.base_url, api_key="k", model="m")
        agent = agents(judge, {"backoff_initial": 0.1, "backoff_max": backoff_max})
        started = time.monotonic()
        server.start_storm(1.0, retry_after_s=86_400)  # the first request gets 429 + a day; later ones succeed
        ticket = agent.submit([{"solution_str": "#### 7", "ground_truth": "7"}], 1)
        chunk = bounded(lambda: agent.get_all(ticket, timeout=backoff_max + 8), backoff_max + 12, "get_all")
        took = time.monotonic() - started
        stats = server.stats()
    assert stats.outcomes["storm"] >= 1 and chunk.scores == [1.0] and chunk.extra_info["reward_failed"] == [0]
    assert took < backoff_max + 5  # retried after at most about backoff_max, not after a day


@pytest.mark.local
@pytest.mark.timeout(60)
def test_item05_huge_retry_after_is_bounded_by_the_ticket_deadline(agents):
    """Passes on the code of issue 11's time (the deadline timer settles the sample)."""
    deadline = 2.0
    with JudgeServer(JudgeServerConfig()) as server:
        server.start_storm(120, retry_after_s=86_400)  # every request: 429 + a day
        judge = JudgeReward(base_url=server.base_url, api_key="k", model="m")
        agent = agents(judge, {"ticket_deadline": deadline, "request_timeout": 1.0})
        started = time.monotonic()
        ticket = agent.submit(items(4, 2), 2)
        chunk = bounded(lambda: agent.get_all(ticket, timeout=deadline + 8), deadline + 12, "get_all")
        took = time.monotonic() - started

        async def streamed():
            return await agent.ascore_in_group({"solution_str": "s"}, "g", 1)

        score, extra = bounded(lambda: asyncio.run(streamed()), deadline + 8, "ascore_in_group")
    assert took < deadline + 3
    assert chunk.extra_info["reward_failed"] == [1] * 4 and set(chunk.extra_info["reward_failure"]) <= {"deadline", "http_429"}
    assert extra["reward_failed"] == 1


# ----------------------------------------------------------------------------- item 6


class HangsOnSome:
    """Sync reward that never returns (until released at teardown) on the samples marked ``hang``."""

    def __init__(self):
        self.release = threading.Event()
        self.calls = 0
        self.lock = threading.Lock()

    def compute_score(self, data_source, solution_str, ground_truth, extra_info=None):
        with self.lock:
            self.calls += 1
        if extra_info["hang"]:
            self.release.wait()
        return 1.0


def hang_batch(n, rate, seed):
    rng = random.Random(seed)
    hang = set(rng.sample(range(n), int(n * rate)))
    return [{"solution_str": "x", "extra_info": {"i": i, "hang": i in hang}} for i in range(n)], hang


@pytest.mark.local
@pytest.mark.timeout(120)
def test_item06_hung_sync_calls_do_not_starve_later_tickets(agents):
    reward = HangsOnSome()
    # cap 64 (threads = 64 by default): the 100 hung calls of the first ticket outnumber the threads
    agent = agents(reward, {"max_concurrency": 64, "request_timeout": 0.1, "max_attempts": 1, **FAST})
    try:
        first, _ = hang_batch(2_000, 0.05, seed=1)
        bounded(lambda: agent.get_all(agent.submit(first, 1), timeout=60), 65, "first ticket")
        later, hung = hang_batch(2_000, 0.05, seed=2)
        calls_before = reward.calls
        chunk = bounded(lambda: agent.get_all(agent.submit(later, 1), timeout=60), 65, "later ticket")
        failed = {i for i, f in zip(chunk.indices, chunk.extra_info["reward_failed"]) if f}
        others = 2_000 - len(hung)
        succeeded = others - len(failed - hung)
        assert succeeded >= 0.99 * others, (
            f"{others - succeeded} of the {others} samples that return failed; {reward.calls - calls_before} calls made"
        )
    finally:
        reward.release.set()


# ----------------------------------------------------------------------------- item 7


@pytest.mark.local
@pytest.mark.timeout(120)
def test_item07_a_crashed_worker_process_is_replaced(agents):
    reward = load_reward(str(REWARDS / "attacks.py"), "crashes_on_request", {})  # loadable in a fresh process
    agent = agents(reward, {"executor": "process", "max_workers": 2, "max_attempts": 2, **FAST})
    first = [{"solution_str": s} for s in ("a", "crash", "bb", "ccc")]
    chunk = bounded(lambda: agent.get_all(agent.submit(first, 1), timeout=30), 40, "ticket with the crash")
    assert chunk.extra_info["reward_failed"][1] == 1  # the crashing sample is settled as failed, not hung
    later = [{"solution_str": "x" * (i % 5 + 1)} for i in range(40)]
    chunk = bounded(lambda: agent.get_all(agent.submit(later, 1), timeout=30), 40, "later ticket")
    errors = [e for e in chunk.extra_info.get("reward_error", []) if e][:2]
    assert chunk.extra_info["reward_failed"] == [0] * 40, errors
    assert chunk.scores == [float(i % 5 + 1) for i in range(40)]


# ----------------------------------------------------------------------------- item 8


class SwallowsCancellation:
    """Async reward that ignores cancellation on samples marked ``stubborn`` (a buggy user retry
    loop), and otherwise sleeps a little, counting calls at once."""

    def __init__(self):
        self.probe = ConcurrencyProbe()
        self.stubborn_calls = 0
        self.swallowed = 0

    async def compute_score(self, data_source, solution_str, ground_truth, extra_info=None):
        if extra_info.get("stubborn"):
            self.stubborn_calls += 1
            while True:
                try:
                    await asyncio.sleep(3600)
                except asyncio.CancelledError:
                    self.swallowed += 1
                    continue
        with self.probe:
            await asyncio.sleep(0.05)
        return 1.0


@pytest.mark.local
@pytest.mark.timeout(60)
def test_item08_swallowed_cancellation_leaks_no_slot(agents):
    cap = 4
    reward = SwallowsCancellation()
    agent = agents(reward, {"max_concurrency": cap, "request_timeout": 0.2, "ticket_deadline": 1.0, "max_attempts": 1})
    stubborn = items(cap, stubborn=True)
    chunk = bounded(lambda: agent.get_all(agent.submit(stubborn, 1), timeout=10), 15, "the stubborn ticket")
    assert chunk.extra_info["reward_failed"] == [1] * cap and reward.stubborn_calls == cap
    later = bounded(lambda: agent.get_all(agent.submit(items(8 * cap), 1), timeout=10), 15, "a later ticket")
    kinds = [k for k in later.extra_info.get("reward_failure", []) if k]
    assert later.extra_info["reward_failed"] == [0] * (8 * cap), f"{len(kinds)} failed, as {set(kinds)}"
    assert reward.probe.peak == cap  # the full cap, not what the stubborn calls left of it
    stop_at = time.monotonic() + 5
    while agent.metrics()["in_flight"] and time.monotonic() < stop_at:
        time.sleep(0.05)
    assert agent.metrics()["in_flight"] == 0


@pytest.mark.local
@pytest.mark.timeout(60)
def test_item08_close_is_bounded_and_loud_with_a_stubborn_call():
    threads_before = set(threading.enumerate())
    reward = SwallowsCancellation()
    agent = RewardAgent(reward, {"max_concurrency": 4})
    agent.submit(items(2, stubborn=True), 1)
    time.sleep(0.2)  # the stubborn calls are running
    started = time.monotonic()
    try:
        bounded(agent.close, 15, "close()")
    except AssertionError:
        raise
    except Exception as exc:  # noqa: BLE001 - allowed, if it says what is wrong
        assert str(exc).strip(), f"close() raised an empty {type(exc).__name__}"
    took = time.monotonic() - started
    assert took < 10, f"close() took {took:.1f}s"
    stop_at = time.monotonic() + 3
    while time.monotonic() < stop_at:
        alive = [t for t in threading.enumerate() if t not in threads_before and t.is_alive()
                 and not t.name.startswith("bounded")]  # fmt: skip
        if not alive:
            break
        time.sleep(0.05)
    assert not alive, f"threads still running after close(): {[t.name for t in alive]}"


# ----------------------------------------------------------------------------- item 9


@pytest.mark.local
@pytest.mark.slow
@pytest.mark.timeout(180)
def test_item09_huge_error_bodies_are_bounded(agents):
    size, samples = 10 * 2**20, 32  # the sizes
    with JudgeServer(JudgeServerConfig(rate_500=1.0, error_body_bytes=size)) as server:
        judge = JudgeReward(base_url=server.base_url, api_key="k", model="m")
        agent = agents(judge, {"max_attempts": 1, "failure_policy": "fill", "max_failure_rate": 1.0})
        gc.collect()
        # Python allocations, not RSS: glibc keeps freed 10 MB blocks in its heap, so RSS would blame
        # the agent for memory it has already given back.
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            chunk = bounded(lambda: agent.get_all(agent.submit(items(samples), 1), timeout=120), 130, "get_all")
            gc.collect()
            grown_mb = (tracemalloc.get_traced_memory()[0] - before) / 2**20
        finally:
            tracemalloc.stop()
        assert server.stats().outcomes["500"] == samples
    lengths = [len(e) for e in chunk.extra_info["reward_error"]]
    assert chunk.extra_info["reward_failure"] == ["http_500"] * samples
    assert max(lengths) <= 16_384, f"error text of {max(lengths):,} chars per sample"
    assert grown_mb < 64, f"Python memory grew by {grown_mb:.0f} MB while the chunk is held (32 x 10 MB bodies)"


# ----------------------------------------------------------------------------- item 10


@pytest.mark.quick
@pytest.mark.timeout(60)
def test_item10_sync_calls_never_exceed_the_cap(agents):
    probe = ConcurrencyProbe()

    def slow(data_source, solution_str, ground_truth, extra_info=None):
        with probe:
            time.sleep(0.3)
        return 1.0

    # 8 calls of 0.3 s under a cap of 4: each attempt times out at 0.1 s while its call runs on
    agent = agents(slow, {"max_concurrency": 4, "max_workers": 16, "request_timeout": 0.1, "max_attempts": 1,
                          "max_failure_rate": 1.0})
    bounded(lambda: agent.get_all(agent.submit(items(8), 1), timeout=20), 25, "get_all")
    assert probe.peak <= 4, f"{probe.peak} calls at once under a cap of 4 (metrics said {agent.metrics()['peak_in_flight']})"


# ----------------------------------------------------------------------------- item 11


class SlowHook:
    def __init__(self, hook_s):
        self.hook_s = hook_s

    async def compute_score(self, data_source, solution_str, ground_truth, extra_info=None):
        return float(solution_str)

    def post_process_scores(self, scores):
        time.sleep(self.hook_s)
        return [s * 10 for s in scores]


@pytest.mark.quick
@pytest.mark.timeout(30)
def test_item11_slow_group_hook_output_is_kept(agents):
    agent = agents(SlowHook(0.4), {"request_timeout": 0.1})
    batch = [{"solution_str": str(v), "uid": 0} for v in (1, 2, 3)]
    chunk = bounded(lambda: agent.get_all(agent.submit(batch, 3), timeout=10), 15, "get_all")
    assert chunk.scores == [10.0, 20.0, 30.0] and chunk.extra_info["reward_failed"] == [0, 0, 0]


@pytest.mark.quick
@pytest.mark.timeout(30)
def test_item11_slow_group_hook_output_is_kept_on_the_per_sample_path(agents):
    agent = agents(SlowHook(0.4), {"request_timeout": 0.1})

    async def main():
        return await asyncio.wait_for(asyncio.gather(*(agent.ascore_in_group({"solution_str": str(v)}, "g", 2)
                                                       for v in (1, 2))), 10)  # fmt: skip

    answers = bounded(lambda: asyncio.run(main()), 15, "the streamed group")
    assert [s for s, _ in answers] == [10.0, 20.0] and [e["reward_failed"] for _, e in answers] == [0, 0]


# ----------------------------------------------------------------------------- item 12


async def forever(data_source, solution_str, ground_truth, extra_info=None):
    await asyncio.sleep(3600)


class LoopStallMonitor:
    """Calls ``metrics()`` back to back in a thread: the longest call (a finished one, or the one still
    waiting) is how long the agent's loop was blocked. Never joined: a call stuck behind a blocked
    loop must not keep the test waiting."""

    def __init__(self, agent: RewardAgent):
        self.agent = agent
        self.worst = 0.0
        self.calling_since: float | None = None
        self.running = True
        self.thread = threading.Thread(target=self._run, name="bounded: loop stall monitor", daemon=True)
        self.thread.start()

    def _run(self):
        while self.running:
            self.calling_since = started = time.monotonic()
            try:
                self.agent.metrics()
            except Exception:  # noqa: BLE001 - a closed agent ends the monitoring
                return
            self.calling_since = None
            self.worst = max(self.worst, time.monotonic() - started)
            time.sleep(0.005)

    def stop(self) -> float:
        self.running = False
        since = self.calling_since
        return max(self.worst, time.monotonic() - since if since is not None else 0.0)


@pytest.mark.local
@pytest.mark.slow
@pytest.mark.timeout(120)
def test_item12_cancelling_40k_queued_samples_does_not_block_the_loop(agents):
    n = 40_000  # the size
    agent = agents(forever, {"max_concurrency": 64})
    ticket = agent.submit(items(n), 1)
    stop_at = time.monotonic() + 30
    while agent.metrics()["in_flight"] < 64 and time.monotonic() < stop_at:
        time.sleep(0.05)
    time.sleep(1.0)  # let every sample reach the limiter's queue
    monitor = LoopStallMonitor(agent)
    time.sleep(0.1)
    try:
        cancelled = bounded(lambda: agent.cancel(ticket), 30, "cancel()")
        time.sleep(3.0)
        stall = monitor.stop()
    finally:
        close_quietly(agent, 60)  # a blocked loop must be done before the next test (see unformatted_logs)
    assert stall < 1.0, f"the loop was blocked for {stall:.1f}s by cancel()"
    assert cancelled == n


@pytest.mark.local
@pytest.mark.slow
@pytest.mark.timeout(120)
def test_item12_expiring_queued_samples_does_not_block_the_loop(agents):
    # 20,000 rather than 40,000: the stall (quadratic) is already several seconds at this size
    n, deadline = 20_000, 2.0
    agent = agents(forever, {"max_concurrency": 64, "ticket_deadline": deadline, "request_timeout": deadline,
                             "max_failure_rate": 1.0})
    started = time.monotonic()
    ticket = agent.submit(items(n), 1)
    time.sleep(max(0.0, started + deadline - 0.5 - time.monotonic()))
    monitor = LoopStallMonitor(agent)
    time.sleep(3.5)  # spans the deadline
    stall = monitor.stop()
    try:
        chunk = bounded(lambda: agent.get_all(ticket, timeout=30), 35, "get_all")
    finally:
        close_quietly(agent, 60)  # a blocked loop must be done before the next test (see unformatted_logs)
    assert stall < 1.0, f"the loop was blocked for {stall:.1f}s when the deadline expired {n:,} samples"
    assert chunk.extra_info["reward_failure"] == ["deadline"] * n


@pytest.mark.local
@pytest.mark.timeout(120)
def test_item12_cancelling_100_tickets_prints_no_tracebacks(agents, unformatted_logs, capfd):
    async def sleepy(data_source, solution_str, ground_truth, extra_info=None):
        await asyncio.sleep(random.uniform(0.001, 0.01))
        return 1.0

    agent = agents(sleepy, {"max_concurrency": 8})
    tickets = [agent.submit(items(136), 1) for _ in range(100)]  # 13,600 samples, as in the issue
    time.sleep(0.2)
    for ticket in tickets:
        bounded(lambda t=ticket: agent.cancel(t), 5, "cancel()")
    time.sleep(1.0)
    gc.collect()  # "exception was never retrieved" is logged when a failed task is collected
    bounded(agent.metrics, 5, "metrics()")
    close_quietly(agent)
    gc.collect()
    traced = [r for r in unformatted_logs.records if r.exc_info or "Traceback" in r.getMessage()]
    err = capfd.readouterr().err
    assert not traced, f"{len(traced)} log records with tracebacks, first: {traced[0].getMessage()[:300]!r}"
    assert "Traceback" not in err, f"{err.count('Traceback')} tracebacks on stderr, first: {err[:1500]}"


@pytest.mark.ray
@pytest.mark.timeout(120)
def test_item12_ticket_ids_never_repeat_across_a_recreated_actor(ray_session):
    from verl_async_rm.ray_agent import get_or_create_agent_actor

    ray = ray_session
    spec = RewardSpec(str(REWARDS / "examples.py"), "plain")
    name = "attack-item12-ids"
    old_actor = get_or_create_agent_actor(spec, {}, name=name)
    old_batch = [{"solution_str": "1", "ground_truth": "1"}, {"solution_str": "0", "ground_truth": "1"}]
    old_ticket = ray.get(old_actor.submit.remote(old_batch, 1), timeout=60)
    assert ray.get(old_actor.get.remote(old_ticket), timeout=60).scores == [1.0, 0.0]
    ray.kill(old_actor)
    stop_at = time.monotonic() + 30
    while time.monotonic() < stop_at:  # the name is freed once the kill is processed
        try:
            ray.get_actor(name)
            time.sleep(0.1)
        except ValueError:
            break
    new_actor = get_or_create_agent_actor(spec, {}, name=name)
    try:
        new_ticket = ray.get(new_actor.submit.remote([{"solution_str": "7", "ground_truth": "7"}] * 3, 1), timeout=60)
        assert new_ticket != old_ticket
        with pytest.raises(ray.exceptions.RayTaskError):
            stale = ray.get(new_actor.get.remote(old_ticket), timeout=30)
            raise AssertionError(f"old ticket {old_ticket!r} answered by the new actor with {len(stale)} samples")
    finally:
        ray.kill(new_actor)
