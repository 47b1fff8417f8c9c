"""The GSM8K example reward: answer formats, the last statement winning, ground truths, latency
(the real test split: test_gsm8k_split.py)."""

from __future__ import annotations

import asyncio
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from verl_async_rm.user_rewards.gsm8k import compute_score, compute_score_async, extract_answer

pytestmark = pytest.mark.quick


@pytest.mark.parametrize(
    "text, value",
    [
        ("so the total is\n#### 1,234", 1234),
        ("The answer is $18.", 18),
        ("Therefore \\boxed{42} apples", 42),
        ("Q: ...\nA: 7", 7),
        ("She pays 3 + 4 = 7 dollars. She has 12 dollars left.", 12),
        ("The answer is -2.5 degrees", -2.5),
        ("The answer is: $-10", -10),
        ("I do not know", None),
        # the last statement wins, whatever its kind
        ("I think the answer is 7.\nWait, 3 * 6 = 18.\nA: 18", 18),
        ("#### 5\nOn reflection the answer is 6", 6),
        ("\\boxed{4} ... recomputing ... #### 9", 9),
        ("A: 2\nso the final result is \\boxed{3}", 3),
        ("The answer is 12. Check: 12 + 0 = 12, 5 apples.", 12),  # trailing numbers are not statements
    ],
)
def test_formats_models_write(text, value):
    assert extract_answer(text) == value


FINAL_LINES = ["#### {}", "The answer is {}.", "The answer is: ${}", "A: {}", "Therefore \\boxed{{{}}}."]


@given(
    answers=st.lists(st.tuples(st.sampled_from(FINAL_LINES), st.integers(-10**6, 10**6)), min_size=1, max_size=5),
    filler=st.sampled_from(["", "Let me check.", "So we have 3 cats and 4 dogs."]),
)
def test_the_last_statement_wins_property(answers, filler):
    text = f"\n{filler}\n".join(kind.format(value) for kind, value in answers)
    assert extract_answer(text) == answers[-1][1]


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
