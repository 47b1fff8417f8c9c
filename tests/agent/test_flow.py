"""Back-pressure (engine.flow), pure and in virtual time: against a token-bucket service (as real APIs
limit), a 429 storm, and absurd Retry-After values. The same numbers are checked end to end against
the loopback judge server in tests/agent/test_core_attacks.py; here every regime runs in milliseconds."""

from __future__ import annotations

import heapq
import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from verl_async_rm.engine.flow import FlowControl, FlowSettings



def simulate(n=200, cap=256, capacity=30, refill=3.0, latency=(0.02, 0.08), seed=0, round_up=False, storm=None,
             max_pause=30.0, random_429=0.0, random_retry_after=0.05, instant_refusals=False, stall=None):
    """A client with FlowControl against a token-bucket server (capacity, refill/s; Retry-After = time
    to the next token, optionally rounded up to whole seconds) or a storm (start, duration, R) in which
    every request is refused. Discrete events; returns what the issue's targets are about."""
    rng = random.Random(seed)
    flow = FlowControl(FlowSettings(cap=cap, max_pause=max_pause, default_pause=0.5))
    tokens, refilled_at, now = float(capacity), 0.0, 0.0
    queue, done, in_flight, events = n, 0, 0, []
    first_429 = None
    sent_after = rejected_after = 0
    storm_sends: list[float] = []
    full_cap_after = None

    def server(t):
        nonlocal tokens, refilled_at
        if storm and storm[0] <= t < storm[0] + storm[1]:
            return False, storm[2]
        if random_429 and rng.random() < random_429:
            return False, random_retry_after
        if refill is None:
            return True, None
        tokens = min(capacity, tokens + (t - refilled_at) * refill)
        refilled_at = t
        if tokens >= 1:
            tokens -= 1
            return True, None
        wait = (1 - tokens) / refill
        return False, math.ceil(wait) if round_up else wait

    while done < n:
        while queue and in_flight < cap:
            delay = flow.send_delay(now)
            if delay is None:
                break
            if delay > 0:
                heapq.heappush(events, (now + delay, 0, None))
                break
            queue -= 1
            in_flight += 1
            epoch = flow.on_send(now)
            ok, retry_after = server(now)
            if first_429 is not None:
                sent_after += 1
                rejected_after += not ok
            if storm and first_429 is not None and now < storm[0] + storm[1]:
                storm_sends.append(now)
            delay = 0.001 if instant_refusals and not ok else rng.uniform(*latency)  # a front door answers at once
            at = now + delay
            if stall and stall[0] <= at < stall[0] + stall[1]:
                at = stall[0] + stall[1]  # the client's loop was busy: the answers arrive together after it
            heapq.heappush(events, (at, 1, (epoch, ok, retry_after, now)))
        if storm and full_cap_after is None and now >= storm[0] + storm[1] and in_flight >= cap:
            full_cap_after = now - (storm[0] + storm[1])
        now, kind, answer = heapq.heappop(events)
        if kind:
            epoch, ok, retry_after, sent_at = answer
            in_flight -= 1
            if ok:
                done += 1
            else:
                first_429 = now if first_429 is None else first_429
                queue += 1
            flow.on_answer(now, epoch, sent_at=sent_at, throttled=not ok, retry_after=retry_after)
    limit = capacity + refill * now if refill else None
    return {
        "elapsed": now,
        "goodput": n / limit if limit else None,
        "rejected_after_first_429": rejected_after / max(1, sent_after),
        "storm_sends": storm_sends,
        "full_cap_after": full_cap_after,
    }


@pytest.mark.quick
@pytest.mark.parametrize("round_up", [False, True], ids=["exact Retry-After", "whole seconds"])
@pytest.mark.parametrize("seed", range(4))
def test_a_token_bucket_is_learned_few_rejections_and_near_full_goodput(seed, round_up):
    """The issue's target (30 requests / 10 s, 200 samples, no configured RPM): goodput >= 90% of the
    server's limit and < 10% of the requests after the first 429 rejected."""
    result = simulate(seed=seed, round_up=round_up)
    assert result["goodput"] >= 0.9
    assert result["rejected_after_first_429"] < 0.10


def check_regime(refill, capacity, latency):
    """Slower, faster and high-latency services over 3 minutes: never the collapse of a naive client
    (~50% rejected at a token bucket). While the rate is learned, high rate x latency costs goodput."""
    result = simulate(n=int(refill * 180) + capacity, capacity=capacity, refill=refill, latency=latency)
    assert result["rejected_after_first_429"] < 0.10
    assert result["goodput"] >= 0.6


@pytest.mark.quick
def test_a_slow_service_stays_useful():
    check_regime(0.5, 5, (0.1, 0.3))


@pytest.mark.local
@pytest.mark.slow
@pytest.mark.parametrize("refill, capacity, latency", [(20.0, 20, (1.0, 5.0)), (100.0, 100, (0.5, 1.5))],
                         ids=["20/s, 1-5 s latency", "100/s, 1 s latency"])
def test_faster_and_high_latency_services_stay_useful(refill, capacity, latency):
    """Thousands of simulated requests (1-6 s of CPU each, hence not quick)."""
    check_regime(refill, capacity, latency)


@pytest.mark.quick
@pytest.mark.parametrize("retry_after, cap, latency", [(1.0, 64, (0.05, 0.2)), (5.0, 256, (0.05, 0.2))])
def test_a_429_storm_gets_one_probe_per_retry_after_and_full_cap_soon_after(retry_after, cap, latency):
    result = simulate(n=100_000, cap=cap, refill=None, storm=(2.0, 20.0, retry_after), latency=latency)
    sends = result["storm_sends"]
    windows = {int((t - sends[0]) // retry_after) for t in sends} if sends else set()
    assert len(sends) <= 20.0 / retry_after + 1 and len(sends) == len(windows)  # at most one per window
    assert result["full_cap_after"] is not None and result["full_cap_after"] < 5.0


@pytest.mark.quick
@given(st.floats(0, 1e6), st.floats(0.01, 60))
def test_a_pause_is_bounded_by_max_pause_whatever_retry_after_says(retry_after, max_pause):
    flow = FlowControl(FlowSettings(cap=8, max_pause=max_pause, default_pause=0.5))
    epoch = flow.on_send(100.0)
    flow.on_answer(100.0, epoch, throttled=True, retry_after=retry_after)
    assert flow.send_delay(100.0) == pytest.approx(min(retry_after, max_pause)) or (retry_after == 0 and flow.send_delay(100.0) == 0)
    assert flow.send_delay(100.0 + max_pause) == 0.0  # the probe


@pytest.mark.quick
@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["send", "ok", "429", "429-old", "wait"]), st.floats(0, 3)), max_size=200))
def test_bookkeeping_invariants_under_any_event_order(events):
    flow = FlowControl(FlowSettings(cap=16, max_pause=5.0, default_pause=0.5))
    now, outstanding = 0.0, []
    for event, dt in events:
        now += dt / 10
        if event == "send" and flow.send_delay(now) == 0.0:
            outstanding.append((flow.on_send(now), now))
        elif event == "wait":
            now += dt
        elif outstanding:
            epoch, sent_at = outstanding.pop(0 if event == "429-old" else -1)
            flow.on_answer(now, epoch, sent_at=sent_at, throttled=event != "ok", retry_after=dt)
        assert flow.sending == len(outstanding)
        assert flow.window is None or 1 <= flow.window <= 16
        delay = flow.send_delay(now)
        rate = flow.current_rate(now)
        assert rate is None or rate > 0
        assert delay is None or 0.0 <= delay <= max(5.0, 1.0 / rate if rate else 0.0) + 1e-9


@pytest.mark.quick
def test_disabled_flow_control_never_pauses():
    flow = FlowControl(FlowSettings(cap=8, max_pause=30.0, default_pause=0.5, enabled=False))
    epoch = flow.on_send(0.0)
    flow.on_answer(0.0, epoch, throttled=True, retry_after=10.0)
    assert flow.send_delay(0.0) == 0.0 and flow.throttles == 1


@pytest.mark.quick
@pytest.mark.parametrize("share, at_least", [(0.01, 0.08), (0.10, 0.015)])
def test_throttles_that_are_not_a_limit_do_not_spiral_the_pace_down(share, at_least):
    """429s now and then (1% or 10%, Retry-After 50 ms) from a service with no rate limit. A client
    cannot tell them from a limit it slightly exceeds, and each one pauses the whole agent as the
    service asked; what must not happen is a pace that ratchets down event after event (what is
    accepted is only our own pace minus the pauses) until nothing moves. A guard, not a target:
    5,000 requests at cap 64, 20-80 ms latency, against the same service without throttles."""
    result = simulate(n=5_000, cap=64, refill=None, random_429=share)
    unthrottled = simulate(n=5_000, cap=64, refill=None)
    assert unthrottled["elapsed"] / result["elapsed"] >= at_least


def simulate_stalled(stalls, seed, n=200, capacity=30, refill=3.0, latency=(0.02, 0.1), round_up=False):
    """``simulate``'s token bucket (30 requests / 10 s) against a client whose loop is stalled now
    and then (a loaded machine): during a stall it neither sends nor handles answers; answers that
    arrive meanwhile are handled together at its end. Returns the flow control, the end, and the
    service rates it had learned from 15 s on, when the opening burst is long past."""
    rng = random.Random(seed)
    flow = FlowControl(FlowSettings(cap=256, max_pause=30.0, default_pause=0.5))
    tokens, refilled_at, now = float(capacity), 0.0, 0.0
    queue, done, in_flight, events, reported = n, 0, 0, [], []

    def busy_until(t):
        return next((start + length for start, length in stalls if start <= t < start + length), t)

    while done < n:
        while queue and in_flight < cap_of(flow):
            delay = flow.send_delay(now)
            if delay is None:
                break
            if delay > 0:
                heapq.heappush(events, (now + delay, 0, None))
                break
            queue -= 1
            in_flight += 1
            epoch = flow.on_send(now)
            tokens = min(capacity, tokens + (now - refilled_at) * refill)
            refilled_at = now
            ok = tokens >= 1
            tokens -= ok
            wait = (1 - tokens) / refill
            retry_after = None if ok else (math.ceil(wait) if round_up else wait)
            heapq.heappush(events, (now + rng.uniform(*latency), 1, (epoch, ok, retry_after, now)))
        at, kind, answer = heapq.heappop(events)
        now = max(now, busy_until(at))
        if kind:
            epoch, ok, retry_after, sent_at = answer
            in_flight -= 1
            done += ok
            queue += not ok
            flow.on_answer(now, epoch, sent_at=sent_at, throttled=not ok, retry_after=retry_after)
            if now >= 15.0:
                reported.append(flow.measured_rate)
    return flow, now, reported


def cap_of(flow):
    return flow.settings.cap


@pytest.mark.quick
def test_the_learned_rate_tracks_the_service_when_the_loop_stalls():
    """Issue 45 item 9: at the end of a token-bucket run (3/s) the flow control reported a pace of
    19.1/s (wall 1.22 x ideal). Answers held up by a stalled loop, handled in a bunch, were counted
    as a burst the service never accepted, and the max filter kept that for a minute. Timed by when
    requests were sent, the measured rate stays the service's whatever the stalls: 60 runs, each
    with 1-8 stalls of 0.3-5 s in its first 55 s (before, 9 of them ended at 0.65-16/s)."""
    rng = random.Random(7)
    wrong = []
    for seed in range(60):
        stalls = sorted((rng.uniform(0, 55), rng.choice([0.3, 0.7, 1.5, 3.0, 5.0])) for _ in range(rng.randint(1, 8)))
        flow, end, reported = simulate_stalled(stalls, seed, round_up=rng.random() < 0.5)
        learned = flow.measured_rate
        most = max((rate for rate in reported if rate is not None), default=0.0)
        if learned is None or not (2.7 <= learned <= 3.3 and most <= 3.3):
            wrong.append(f"seed {seed}: learned {learned}/s, at most {most:.2f}/s after 15 s; stalls {stalls}")
    assert not wrong, f"{len(wrong)} of 60 runs: " + "; ".join(wrong[:3])
    assert flow.snapshot(end)["service_rate_per_s"] == flow.measured_rate  # the metrics say what was learned


@pytest.mark.quick
def test_reading_the_pace_changes_nothing():
    """The metrics' pace is a query: reading it past the point where the pace would be released
    must not release it (it did: a metrics() call changed what the agent would send next)."""
    flow = FlowControl(FlowSettings(cap=16, max_pause=5.0, default_pause=0.5))
    sent = [(flow.on_send(0.0), 0.0) for _ in range(4)]
    for epoch, at in sent[:3]:
        flow.on_answer(0.1, epoch, sent_at=at)
    flow.on_answer(0.1, sent[3][0], sent_at=0.0, throttled=True, retry_after=0.2)  # the first event
    later = [(flow.on_send(0.3 + i / 10), 0.3 + i / 10) for i in range(20)]
    for epoch, at in later[:-1]:
        flow.on_answer(at + 0.05, epoch, sent_at=at)
    flow.on_answer(2.5, later[-1][0], sent_at=later[-1][1], throttled=True, retry_after=0.2)  # measures
    assert flow.measured_rate is not None
    before = flow.measured_rate
    far = 10_000.0  # the curve is far past release_factor by then
    assert flow.snapshot(far)["pace_per_s"] is None and flow.current_rate(far) is None
    assert flow.measured_rate == before and flow.snapshot(far)["service_rate_per_s"] == before
