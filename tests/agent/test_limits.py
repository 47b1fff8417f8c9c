"""Configured rate limits (pure leaky buckets): the bound holds in every window, the rate is the
configured one, and the pump's wait time is exact."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from verl_async_rm.items import RewardItem
from verl_async_rm.limits import LeakyBucket, approx_tokens, rate_bound, strict_bucket

pytestmark = pytest.mark.quick


def admit_greedily(bucket: LeakyBucket, amounts: list[float], start: float = 0.0) -> list[float]:
    """Admission times when every request is sent as soon as the bucket allows (as the pump does)."""
    now, times = start, []
    for amount in amounts:
        now += bucket.wait_time(now, amount)
        assert bucket.wait_time(now, amount) == pytest.approx(0.0, abs=1e-9)
        bucket.take(now, amount)
        times.append(now)
    return times


def most_in_window(times: list[float], amounts: list[float], window: float) -> float:
    best, j, inside = 0.0, 0, 0.0
    for i, t in enumerate(times):
        inside += amounts[i]
        while times[j] <= t - window + 1e-9:
            inside -= amounts[j]
            j += 1
        best = max(best, inside)
    return best


@settings(max_examples=60, deadline=None)
@given(st.sampled_from([60.0, 600.0, 3_000.0, 12_000.0]), st.sampled_from([0.1, 1.0, 7.0, 60.0]))
def test_strict_bucket_bound_holds_in_every_window(per_minute, window):
    bucket = strict_bucket(per_minute)
    amounts = [1.0] * int(per_minute * 2.5 / 60 + 50)  # 2.5 minutes' worth of saturated demand
    times = admit_greedily(bucket, amounts)
    assert most_in_window(times, amounts, window) <= rate_bound(per_minute, window) + 1e-6
    assert most_in_window(times, amounts, 60.0) <= per_minute + 1e-6
    steady = times[len(times) // 2:]
    assert (len(steady) - 1) / (steady[-1] - steady[0]) == pytest.approx((per_minute - per_minute / 60) / 60, rel=1e-6)


@given(st.lists(st.floats(1, 5_000), min_size=1, max_size=200))
def test_token_bucket_with_uneven_amounts_never_exceeds_its_minute(amounts):
    per_minute = 20_000.0
    times = admit_greedily(strict_bucket(per_minute), amounts)
    clamped = [min(a, strict_bucket(per_minute).capacity) for a in amounts]
    assert most_in_window(times, clamped, 60.0) <= per_minute + 1e-6


def test_bad_limits_are_refused():
    with pytest.raises(ValueError, match="too low"):
        strict_bucket(1)
    with pytest.raises(ValueError, match="capacity > 0"):
        LeakyBucket(0, 1)


def test_built_in_token_estimate_counts_what_a_judge_reads():
    item = RewardItem(0, "x" * 400, ground_truth="y" * 40, extra_info={"q": "z" * 36})
    assert 110 <= approx_tokens(item) <= 130  # ~4 characters a token
    assert approx_tokens(RewardItem(0, "")) == 1
