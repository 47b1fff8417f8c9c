"""The GSM8K example reward on the real test split (tests/data/gsm8k, in the repository with its licence)."""

from __future__ import annotations

import json
import random

import pytest

from tests.agent.test_gsm8k_reward import FINAL_LINES
from verl_async_rm.user_rewards.gsm8k import compute_score

pytestmark = pytest.mark.local


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


def test_rewritten_final_lines_after_an_earlier_different_answer(gsm8k_path):
    """Every reference solution, its final line rewritten in each form a model writes, after an
    earlier answer statement of every other form: the final line decides, and it scores 1."""
    rows = load(gsm8k_path)
    for number, (solution, truth) in enumerate(rows):
        body = solution.rsplit("####", 1)[0].rstrip()
        early_kind, final_kind = FINAL_LINES[number % 5], FINAL_LINES[(number // 5) % 5]
        if early_kind == final_kind:
            final_kind = FINAL_LINES[(number + 1) % 5]
        wrong = str(int(float(truth.replace(",", ""))) + 7)
        text = f"{early_kind.format(wrong)}\n{body}\n{final_kind.format(truth)}"
        assert compute_score("gsm8k", text, truth) == 1.0, text
