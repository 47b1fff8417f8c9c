"""Simulated judges (rig/verl_async_rm_rig/cpu_backend/latency.py) and the toy reward that sleeps, hangs and
fails by them: quantiles and fractions match the parameters, draws are reproducible per (text, seed),
the uniform model is today's draw bit for bit, bad parameters are refused by name."""

from __future__ import annotations

import asyncio
import hashlib
import math
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from verl_async_rm_rig.cpu_backend.latency import (
    JudgeModel,
    SimulatedJudgeError,
    unit_draw,
    unit_from_hash,
)
from verl_async_rm_rig.cpu_backend.toy_task import (
    compute_score,
    compute_score_with_latency,
    simulated_latency,
)

pytestmark = pytest.mark.quick

N = 20_000
TEXTS = [f"response {i}" for i in range(N)]


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def todays_uniform(text: str, lo: float, hi: float) -> float:
    """The toy task's draw before judge models existed (copied from git history, not imported)."""
    if hi <= 0:
        return 0.0
    digest = hashlib.sha1(text.encode()).digest()
    return lo + (hi - lo) * int.from_bytes(digest[:8], "big") / 2**64


@given(text=st.text(max_size=200), lo=st.floats(0, 10), span=st.floats(0, 50))
def test_uniform_is_todays_draw_bit_for_bit(text, lo, span):
    hi = lo + span
    assert simulated_latency(text, lo, hi) == todays_uniform(text, lo, hi)
    assert JudgeModel(latency_lo=lo, latency_hi=hi).draw(text).latency_s == todays_uniform(text, lo, hi)


@pytest.mark.parametrize("p50, p99", [(0.1, 1.0), (2.0, 5.0), (1.0, 1.0)])
@pytest.mark.parametrize("seed", [0, 7])
def test_lognormal_empirical_quantiles_match_the_parameters(p50, p99, seed):
    model = JudgeModel(latency_model="lognormal", latency_p50=p50, latency_p99=p99, latency_seed=seed)
    draws = [model.latency(t) for t in TEXTS]
    # Order-statistic noise at N=20k: p50 within ~1.5%, p99 within ~6% for sigma ~1 (p99 = 10x p50).
    assert quantile(draws, 0.50) == pytest.approx(p50, rel=0.04)
    assert quantile(draws, 0.99) == pytest.approx(p99, rel=0.10)
    assert min(draws) > 0


def test_lognormal_has_the_heavy_tail_a_uniform_lacks():
    heavy = JudgeModel(latency_model="lognormal", latency_p50=0.1, latency_p99=1.0)
    draws = [heavy.latency(t) for t in TEXTS]
    # Beyond p99 it keeps going: the top 0.1% is well past p99 (a uniform stops at hi).
    assert quantile(draws, 0.999) > 1.5
    assert heavy.sigma == pytest.approx(math.log(10) / 2.3263478740408408)


@pytest.mark.parametrize("hang_prob, fail_prob", [(0.02, 0.0), (0.0, 0.2), (0.05, 0.2), (0.0, 1.0)])
def test_hang_and_fail_fractions_match_the_probabilities(hang_prob, fail_prob):
    model = JudgeModel(latency_hi=1.0, hang_prob=hang_prob, fail_prob=fail_prob, hang_s=99.0)
    draws = [model.draw(t) for t in TEXTS]
    hangs = [d for d in draws if d.outcome == "hang"]
    fails = [d for d in draws if d.outcome == "fail"]
    tolerance = 4 * math.sqrt(0.25 / N)  # four binomial standard deviations at worst
    assert len(hangs) / N == pytest.approx(hang_prob, abs=tolerance)
    assert len(fails) / N == pytest.approx(fail_prob, abs=tolerance)
    assert all(d.latency_s == 99.0 for d in hangs)
    assert all(0 <= d.latency_s <= 1.0 for d in fails)


def test_outcomes_do_not_pick_the_slow_responses():
    """Outcome and latency are independent streams: failing ones are not the fast or the slow ones."""
    model = JudgeModel(latency_hi=1.0, fail_prob=0.3)
    fail_latencies = [model.latency(t) for t in TEXTS if model.draw(t).outcome == "fail"]
    assert sum(fail_latencies) / len(fail_latencies) == pytest.approx(0.5, abs=0.03)


@settings(max_examples=50)
@given(text=st.text(max_size=100), seed=st.integers(0, 2**31), model=st.sampled_from(["uniform", "lognormal"]))
def test_draws_are_deterministic_per_text_and_seed(text, seed, model):
    params = {"latency_model": model, "latency_hi": 2.0, "latency_p50": 0.5, "latency_p99": 5.0,
                  "hang_prob": 0.1, "fail_prob": 0.1, "latency_seed": seed}
    assert JudgeModel(**params).draw(text) == JudgeModel(**params).draw(text)
    assert 0 < unit_draw(text, seed, "latency") < 1


def test_the_seed_changes_the_draws():
    by_seed = [[JudgeModel(latency_model="lognormal", latency_p50=1, latency_p99=10, latency_seed=s).latency(t)
                for t in TEXTS[:200]] for s in (1, 2)]
    assert sum(a != b for a, b in zip(*by_seed)) > 190


def test_extreme_hashes_stay_finite():
    model = JudgeModel(latency_model="lognormal", latency_p50=1.0, latency_p99=10.0)
    assert all(math.isfinite(model.latency(t)) for t in TEXTS[:2000])
    # the open interval holds at the very ends of the hash range
    assert 0 < unit_from_hash(0) and unit_from_hash(2**64 - 1) < 1


@pytest.mark.parametrize(
    "params, names",
    [
        ({"latency_model": "lognormal", "latency_p50": 2, "latency_p99": 1}, "latency_p50 <= latency_p99"),
        ({"latency_model": "lognormal", "latency_p50": 0, "latency_p99": 1}, "latency_p50 > 0"),
        ({"latency_model": "gamma"}, "latency_model"),
        ({"hang_prob": 1.5}, "hang_prob"),
        ({"fail_prob": -0.1}, "fail_prob"),
        ({"hang_prob": 0.6, "fail_prob": 0.6}, "hang_prob + fail_prob"),
        ({"latency_lo": -1, "latency_hi": 1}, "latency_lo"),
        ({"latency_lo": 3, "latency_hi": 1}, "latency_lo <= latency_hi"),
        ({"hang_s": -5}, "hang_s"),
        ({"latency_p99": float("nan")}, "latency_p99"),
        ({"latency_hi": "slow"}, "latency_hi"),
        ({"latency_seed": 1.5}, "latency_seed"),
    ],
)
def test_bad_parameters_are_refused_by_name(params, names):
    with pytest.raises(ValueError, match=names.replace("+", r"\+")):
        JudgeModel(**params)
    with pytest.raises(ValueError, match=names.replace("+", r"\+")):
        asyncio.run(compute_score_with_latency("d", "text", "lower", **params))


def test_from_kwargs_reads_only_its_own_keys():
    model = JudgeModel.from_kwargs({"latency_model": "lognormal", "latency_p50": 1, "latency_p99": 4,
                                    "min_chars": 3, "latency_lo": None})
    assert (model.latency_model, model.latency_p50, model.latency_p99, model.latency_lo) == ("lognormal", 1.0, 4.0, 0.0)


def test_the_toy_reward_sleeps_fails_and_hangs_as_drawn():
    text = "abcdefgh"
    assert asyncio.run(compute_score_with_latency("d", text, "lower")) == compute_score("d", text, "lower")
    start = time.perf_counter()
    asyncio.run(compute_score_with_latency("d", text, "lower", latency_model="lognormal",
                                           latency_p50=0.05, latency_p99=0.05))
    assert time.perf_counter() - start >= 0.05
    with pytest.raises(SimulatedJudgeError):
        asyncio.run(compute_score_with_latency("d", text, "lower", fail_prob=1.0))

    async def hangs() -> None:
        await asyncio.wait_for(compute_score_with_latency("d", text, "lower", hang_prob=1.0), timeout=0.2)

    start = time.perf_counter()
    with pytest.raises(TimeoutError):  # only a deadline settles a hung judge
        asyncio.run(hangs())
    assert time.perf_counter() - start < 5
