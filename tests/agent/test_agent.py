"""Agent behaviour: cap, timeout, errors named, non-blocking submit, event-driven get, shutdown."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from tests.conftest import REWARDS
from verl_async_rm.agent import RewardAgent
from verl_async_rm.errors import RewardError, TicketCancelled

pytestmark = pytest.mark.quick
EXAMPLES = str(REWARDS / "examples.py")


def items(n, group_size=1, **extra):
    return [{"solution_str": "a", "ground_truth": "a", "uid": i // group_size, **extra} for i in range(n)]


class PeakCounter:
    """Counts simultaneous calls inside the reward itself."""

    def __init__(self, delay=0.01, sync=False):
        self.delay, self.now, self.peak = delay, 0, 0
        self.lock = threading.Lock()
        if sync:
            self.compute_score = self._sync

    def _enter(self):
        with self.lock:
            self.now += 1
            self.peak = max(self.peak, self.now)

    def _exit(self):
        with self.lock:
            self.now -= 1

    async def compute_score(self, data_source, solution_str, ground_truth, extra_info=None):
        self._enter()
        await asyncio.sleep(self.delay)
        self._exit()
        return 1.0

    def _sync(self, data_source, solution_str, ground_truth, extra_info=None):
        self._enter()
        time.sleep(self.delay)
        self._exit()
        return 1.0


@pytest.mark.parametrize("sync", [False, True])
def test_concurrency_cap_is_never_exceeded_and_reached(sync):
    counter = PeakCounter(sync=sync)
    with RewardAgent(counter, {"max_concurrency": 5}) as agent:
        chunk = agent.get_all(agent.submit(items(60), 1), timeout=30)
        metrics = agent.metrics()
    assert len(chunk) == 60
    assert counter.peak == 5 and metrics["peak_in_flight"] == 5


def test_submit_does_not_block_and_get_wakes_on_completion():
    release = threading.Event()

    def slow(data_source, solution_str, ground_truth, extra_info=None):
        release.wait(10)
        return 1.0

    with RewardAgent(slow, {"max_concurrency": 4}) as agent:
        start = time.perf_counter()
        ticket = agent.submit(items(8, 4), 4)
        assert time.perf_counter() - start < 0.5
        with pytest.raises(TimeoutError):
            agent.get(ticket, 4, timeout=0.2)  # nothing ready: times out, consumes nothing
        assert agent.remaining(ticket) == 8
        threading.Timer(0.1, release.set).start()
        chunk = agent.get(ticket, 8, timeout=10)
    assert chunk.indices == list(range(8)) and chunk.groups == 2


def test_timeout_fails_the_sample_with_its_name_under_raise_policy():
    async def hangs_on_3(data_source, solution_str, ground_truth, extra_info=None):
        if extra_info["i"] == 3:
            await asyncio.sleep(60)
        return 1.0

    config = {"request_timeout": 0.2, "failure_policy": "raise", "max_attempts": 1}
    with RewardAgent(hangs_on_3, config) as agent:
        batch = [{"solution_str": "x", "extra_info": {"i": i}, "uid": f"u{i}"} for i in range(6)]
        ticket = agent.submit(batch, 1)
        start = time.perf_counter()
        with pytest.raises(RewardError, match=r"sample 3 \(ticket [0-9a-f]+-0, uid 'u3'\).*TimeoutError"):
            agent.get_all(ticket, timeout=10)
        assert time.perf_counter() - start < 5
        handed = 0
        with pytest.raises(RewardError):  # the ticket stays failed: what was ready, then the error
            while agent.get(ticket, 1, timeout=5):
                handed += 1
        assert handed <= 5
        assert agent.metrics()["failures_by_kind"] == {"timeout": 1}


def test_invalid_return_is_named_and_flagged_under_neutral_policy():
    def none_for_odd(data_source, solution_str, ground_truth, extra_info=None):
        return None if extra_info["i"] % 2 else 2.0

    with RewardAgent(none_for_odd) as agent:  # default policy: neutral
        batch = [{"solution_str": "x", "extra_info": {"i": i}, "uid": "g"} for i in range(4)]
        chunk = agent.get_all(agent.submit(batch, 4), timeout=10)
    assert chunk.scores == [2.0, 2.0, 2.0, 2.0]  # failures take the group mean: zero advantage
    assert chunk.extra_info["reward_failed"] == [0, 1, 0, 1]
    assert chunk.extra_info["reward_failure"] == [None, "invalid", None, "invalid"]
    assert "on sample 1" in chunk.extra_info["reward_error"][1] and "NoneType" in chunk.extra_info["reward_error"][1]


def test_user_exception_is_not_retried_and_is_reported():
    calls = []

    def broken(data_source, solution_str, ground_truth, extra_info=None):
        calls.append(1)
        raise KeyError("missing field")

    with RewardAgent(broken, {"failure_policy": "raise", "max_attempts": 5}) as agent:
        with pytest.raises(RewardError, match=r"broken on sample 0.*KeyError.*missing field"):
            agent.get_all(agent.submit(items(1), 1), timeout=10)
    assert len(calls) == 1


def test_dict_extras_and_recipe_tuple_reach_the_chunk():
    with RewardAgent.from_file(EXAMPLES, "recipe_tuple") as agent:
        chunk = agent.get_all(agent.submit(items(2), 1))
    assert chunk.scores == [0.5, 0.5] and chunk.extra_info["explanation"] == ["explained"] * 2
    with RewardAgent.from_file(EXAMPLES, "async_plain") as agent:
        chunk = agent.get_all(agent.submit(items(2), 1))
    assert chunk.extra_info["judge"] == ["async", "async"]


def test_class_hook_runs_per_group_in_sample_order():
    with RewardAgent.from_file(EXAMPLES, "Stateful", reward_kwargs={"offset": 1.0}) as agent:
        batch = [{"solution_str": str(i % 2), "ground_truth": "1", "uid": i // 3, "index": 10 + i} for i in range(6)]
        chunk = agent.get_all(agent.submit(batch, 3))
        instance = agent.reward.score_fn.__self__
    assert chunk.scores == [10.0, 20.0, 10.0, 20.0, 10.0, 20.0]
    assert sorted(instance.groups) == [[1.0, 2.0, 1.0], [2.0, 1.0, 2.0]]


def test_process_pool_executor_scores_from_file():
    with RewardAgent.from_file(EXAMPLES, "plain", {"executor": "process", "max_workers": 2}, reward_kwargs={"bonus": 1}) as agent:
        chunk = agent.get_all(agent.submit(items(6), 1), timeout=60)
    assert chunk.scores == [2.0] * 6


def test_bad_input_and_config_fail_at_once():
    with pytest.raises(ValueError, match="max_concurrency"):
        RewardAgent(lambda **kw: 1, {"max_concurrency": -1})
    with pytest.raises(ValueError, match="unknown_key"):
        RewardAgent(lambda **kw: 1, {"unknown_key": 1})
    with pytest.raises(ValueError, match="ticket_deadline"):
        RewardAgent(lambda **kw: 1, {"ticket_deadline": 1, "request_timeout": 5})
    with pytest.raises(ValueError, match="failure_policy"):
        RewardAgent(lambda **kw: 1, {"failure_policy": "zero"})
    with RewardAgent.from_file(EXAMPLES, "plain") as agent:
        with pytest.raises(ValueError, match="needs a string 'solution_str'"):
            agent.submit([{"solution_str": None}], 1)
        with pytest.raises(ValueError, match="unknown keys"):
            agent.submit([{"solution_str": "x", "respons": "y"}], 1)
        with pytest.raises(ValueError, match="has 1 samples"):
            agent.submit(items(3, 2), 2)
        ticket = agent.submit(items(4, 2), 2)
        with pytest.raises(ValueError, match="not a multiple of the group size 2"):
            agent.get(ticket, 3)
        with pytest.raises(KeyError, match="unknown ticket"):
            agent.get("not-a-ticket", 2)
        assert len(agent.get_all(ticket)) == 4
        assert len(agent.get(ticket, 2)) == 0  # drained: empty, not an error
        assert len(agent.get_all(agent.submit([], 1))) == 0


def test_close_cancels_in_flight_fails_waiters_and_leaks_no_thread():
    before = {t.name for t in threading.enumerate()}

    async def forever(data_source, solution_str, ground_truth, extra_info=None):
        await asyncio.sleep(3600)

    agent = RewardAgent(forever)
    ticket = agent.submit(items(4), 1)
    errors = []
    waiter = threading.Thread(target=lambda: errors.append(pytest.raises(RuntimeError, agent.get_all, ticket)))
    waiter.start()
    time.sleep(0.1)
    start = time.perf_counter()
    agent.close()
    waiter.join(5)
    assert time.perf_counter() - start < 5 and not waiter.is_alive() and errors
    assert "closed" in str(errors[0].value)
    assert {t.name for t in threading.enumerate()} - before == set()
    with pytest.raises(RuntimeError, match="closed"):
        agent.submit(items(1), 1)
    agent.close()  # idempotent


def test_concurrent_submitters_from_many_threads():
    with RewardAgent.from_file(EXAMPLES, "async_plain", {"max_concurrency": 32}) as agent:
        results = {}

        def worker(k):
            ticket = agent.submit(items(40, 4), 4)
            results[k] = agent.get_all(ticket, timeout=30)

        threads = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
        [t.start() for t in threads]
        [t.join(30) for t in threads]
    assert sorted(results) == list(range(8))
    assert all(c.indices == list(range(40)) for c in results.values())


def test_cancel_stops_a_tickets_calls_and_fails_its_gets():
    release = asyncio.Event()
    state = {"started": 0, "cancelled": 0}

    async def waits(data_source, solution_str, ground_truth, extra_info=None):
        if extra_info and extra_info.get("fast"):
            return 1.0
        state["started"] += 1
        try:
            await release.wait()  # never set: only cancel ends these calls
        except asyncio.CancelledError:
            state["cancelled"] += 1
            raise
        return 1.0

    with RewardAgent(waits, {"max_concurrency": 8}) as agent:
        batch = [{**item, "extra_info": {"fast": i < 4}} for i, item in enumerate(items(12, group_size=4))]
        ticket = agent.submit(batch, group_size=4)
        assert len(agent.get(ticket, 4)) == 4  # the fast group
        errors = []
        waiter = threading.Thread(target=lambda: errors.append(pytest.raises(TicketCancelled, agent.get, ticket)))
        waiter.start()
        time.sleep(0.1)  # the waiter is blocked in get, 8 calls are in flight
        assert agent.cancel(ticket) == 8
        waiter.join(5)
        assert not waiter.is_alive() and len(errors) == 1
        with pytest.raises(TicketCancelled, match=f"ticket {ticket} was cancelled"):
            agent.get(ticket)
        assert agent.cancel(ticket) == 0  # idempotent
        with pytest.raises(KeyError):
            agent.cancel(ticket + "-not-issued")
        metrics = agent.metrics()
        assert (metrics["cancelled"], metrics["pending"], metrics["in_flight"], metrics["open_tickets"]) == (8, 0, 0, 0)
        assert state == {"started": 8, "cancelled": 8}
        # the agent goes on serving other tickets
        assert sorted(agent.get_all(agent.submit(batch[:4], group_size=4)).indices) == [0, 1, 2, 3]


def test_a_get_interrupted_at_the_moment_of_hand_over_loses_nothing(monkeypatch):
    """The worst moment, forced every other time: the caller of aget is cancelled right as its groups
    arrive. They must go back, in order, and the ticket must not retire meanwhile (issue 11 item 1)."""
    from verl_async_rm import agent as agent_module

    real_deliver = agent_module._HandOver.deliver
    state = {"calls": 0, "caller": None, "loop": None}

    def deliver_then_interrupt(self, result, error):
        delivered = real_deliver(self, result, error)
        state["calls"] += 1
        if delivered and result and state["calls"] % 2:
            state["loop"].call_soon_threadsafe(state["caller"].cancel)  # before the caller can run
        return delivered

    monkeypatch.setattr(agent_module._HandOver, "deliver", deliver_then_interrupt)
    with RewardAgent.from_file(EXAMPLES, "async_plain", {"max_concurrency": 8}) as agent:
        ticket = agent.submit(items(64, 4), 4)

        async def drain():
            state["loop"] = asyncio.get_running_loop()
            seen, interrupted = [], 0
            while True:
                state["caller"] = asyncio.ensure_future(agent.aget(ticket, 8))
                try:
                    chunk = await state["caller"]
                except asyncio.CancelledError:
                    interrupted += 1
                    continue
                if not len(chunk):
                    return seen, interrupted
                seen += chunk.indices

        seen, interrupted = asyncio.run(asyncio.wait_for(drain(), 30))
    assert interrupted >= 4 and sorted(seen) == list(range(64))


@pytest.mark.parametrize("sync", [False, True])
def test_a_drained_ticket_is_freed_at_once_not_when_its_request_timeouts_are_due(sync):
    """Issue 45 item 4: with the default request_timeout (120 s) a live agent held every finished
    request until its timeout was due (the FIFO of attempt deadlines kept each attempt, its sample,
    and through it the whole ticket; an idle worker thread kept its last call too): RSS grew by
    530 MB over three 100k tickets. Each ticket here, once drained, must be garbage at once. (The
    figure, RSS flat over 10 x 100k tickets: bench/hot_path.py.)"""
    import gc
    import weakref

    def zero_sync(data_source, solution_str, ground_truth, extra_info=None):
        return 1.0

    async def zero_async(data_source, solution_str, ground_truth, extra_info=None):
        return 1.0

    with RewardAgent(zero_sync if sync else zero_async) as agent:  # the default settings
        for _ in range(3):
            ticket = agent.submit(items(2_000, 8), 8)
            run = weakref.ref(agent._engine.tickets[ticket])
            got = 0
            while chunk := agent.get(ticket, 512):
                got += len(chunk)
            assert got == 2_000 and ticket not in agent._engine.tickets  # drained and retired
            agent.metrics()  # one more round trip: the loop has handled every end
            # Freed at once; the generous bound only lets a worker thread that a loaded machine
            # has not scheduled yet finish its last line (before the fix: held for 120 s).
            give_up = time.monotonic() + 10
            while gc.collect() is not None and run() is not None and time.monotonic() < give_up:
                time.sleep(0.01)
            assert run() is None, "a drained ticket is still referenced: " + ", ".join(
                sorted({type(r).__name__ for r in gc.get_referrers(run())}))


METRICS_KEYS = [  # what metrics() has always returned, in this order (a thread executor: "threads"; shared_limits: "shared_*")
    "submitted", "completed", "failed", "cancelled", "pending", "in_flight", "peak_in_flight", "queued", "hung_now",
    "threads", "effective_cap", "open_tickets", "open_groups", "withdrawn_sessions", "stopped", "paused_s", "window",
    "pace_per_s", "service_rate_per_s", "throttle_events", "input_tokens", "output_tokens", "cost",
    "estimated_input_tokens", "estimated_output_tokens", "estimated_cost", "usage_reported_requests",
    "usage_estimated_requests", "reserved_tokens", "budget_overruns", "resumed", "verdicts_logged", "retries",
    "throttled", "hung_calls", "hook_failures", "cache_hits", "cache_misses", "split_groups", "failures_by_kind",
    "attempt_errors_by_kind", "latency_p50", "latency_p95", "latency_max",
]


@pytest.mark.parametrize("sync", [True, False])
def test_metrics_are_the_typed_statistics_of_each_part_flat(sync):
    """Each source of metrics() gives a frozen dataclass; the engine's statistics() composes them, and
    metrics() is that, flat, with every key it always had (an executor without threads has no "threads")."""
    import dataclasses

    reward = PeakCounter(sync=sync)
    with RewardAgent(reward.compute_score, {"max_concurrency": 4}) as agent:
        agent.get_all(agent.submit(items(8, group_size=2), 2))
        statistics = agent._call(agent._engine.statistics)
        metrics = agent.metrics()
    assert list(metrics) == [key for key in METRICS_KEYS if sync or key != "threads"]
    assert statistics.as_dict() == metrics  # (nothing moved between the two)
    assert (statistics.samples.completed, statistics.tickets.open_tickets, statistics.shared) == (8, 0, None)
    parts = [statistics, statistics.samples, statistics.pipeline, statistics.tickets, statistics.stream,
             statistics.flow, statistics.cost, statistics.verdict_log]
    for part in parts:
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(part, dataclasses.fields(part)[0].name, None)
