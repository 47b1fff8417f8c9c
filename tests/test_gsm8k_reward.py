"""The GSM8K example reward on the real test split."""

from __future__ import annotations

import asyncio
import json
import random
import time

import pytest

from verl_async_rm.user_rewards.gsm8k import compute_score, compute_score_async, extract_answer

pytestmark = pytest.mark.quick


def load(path):
    with open(path) as f:
        rows = [json.loads(line) for line in f]
    return [(row["answer"], row["answer"].split("####")[-1].strip()) for row in rows]


def test_reference_solutions_score_one_and_perturbed_score_zero(gsm8k_path):
    rows = load(gsm8k_path)
    assert len(rows) == 1319
    assert all(compute_score("gsm8k", sol, gt) == 1.0 for sol, gt in rows)
    rng = random.Random(0)
    for sol, gt in rows:
        wrong = str(int(float(gt.replace(",", ""))) + rng.choice([-3, -1, 1, 7]))
        perturbed = sol.rsplit("####", 1)[0] + "#### " + wrong
        assert compute_score("gsm8k", perturbed, gt) == 0.0


@pytest.mark.parametrize(
    "text, value",
    [
        ("so the total is\n#### 1,234", 1234),
        ("The answer is $18.", 18),
        ("Therefore \\boxed{42} apples", 42),
        ("Q: ...\nA: 7", 7),
        ("She pays 3 + 4 = 7 dollars. She has 12 dollars left.", 12),
        ("The answer is -2.5 degrees", -2.5),
        ("I do not know", None),
    ],
)
def test_formats_models_write(text, value):
    assert extract_answer(text) == value


def test_ground_truth_forms_and_comparison():
    assert compute_score("gsm8k", "The answer is 1,000", "1000") == 1.0
    assert compute_score("gsm8k", "#### 18", "Janet ... #### 18") == 1.0  # full solution as ground truth
    assert compute_score("gsm8k", "#### 18.0", 18) == 1.0
    assert compute_score("gsm8k", "#### 19", "18") == 0.0
    assert compute_score("gsm8k", "no number", "18") == 0.0
    with pytest.raises(ValueError, match="not a number"):
        compute_score("gsm8k", "#### 1", "eighteen")


def test_simulated_latency_is_off_by_default_and_bounded_when_on():
    start = time.perf_counter()
    compute_score("gsm8k", "#### 1", "1")
    assert time.perf_counter() - start < 0.05
    start = time.perf_counter()
    assert asyncio.run(compute_score_async("gsm8k", "#### 1", "1", latency_lo=0.05, latency_hi=0.1)) == 1.0
    assert 0.05 <= time.perf_counter() - start < 0.5
    with pytest.raises(ValueError):
        compute_score("gsm8k", "#### 1", "1", latency_lo=2, latency_hi=1)
