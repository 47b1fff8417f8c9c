"""Loading user rewards from files, and the normalization of what they return."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.conftest import REWARDS
from verl_async_rm.errors import RewardFunctionError
from verl_async_rm.loader import load_reward, wrap_reward
from verl_async_rm.reward_returns import normalize_group_scores, normalize_score

pytestmark = pytest.mark.quick
EXAMPLES = str(REWARDS / "examples.py")


def call(reward, solution="a", truth="a"):
    return reward.score_fn(data_source="d", solution_str=solution, ground_truth=truth, extra_info=None, **reward.call_kwargs)


def test_function_with_kwargs():
    reward = load_reward(EXAMPLES, "plain", {"bonus": 0.5})
    assert not reward.score_is_async and reward.group_hook is None
    assert call(reward) == 1.5 and reward.label == "examples.py:plain"


def test_async_function_detected():
    import asyncio

    reward = load_reward(EXAMPLES, "async_plain")
    assert reward.score_is_async
    assert asyncio.run(call(reward)) == {"score": 1.0, "judge": "async"}


def test_class_instantiated_once_with_kwargs_and_hook():
    reward = load_reward(EXAMPLES, "Stateful", {"offset": 2.0})
    assert call(reward) == 3.0 and reward.call_kwargs == {}
    assert reward.group_hook([1.0, 2.0]) == [10.0, 20.0]
    assert reward.score_fn.__self__.calls == 1  # bound to one instance


def test_async_class_hook_detected():
    reward = load_reward(EXAMPLES, "AsyncStateful")
    assert reward.score_is_async and reward.hook_is_async


@pytest.mark.parametrize(
    "path, name, kwargs, error, match",
    [
        ("/nonexistent/reward.py", "f", None, FileNotFoundError, "reward file not found"),
        (EXAMPLES, "missing", None, AttributeError, r"has no attribute 'missing'.*plain"),
        (EXAMPLES, "NoComputeScore", None, RewardFunctionError, "has no compute_score"),
        (EXAMPLES, "wrong_signature", None, RewardFunctionError, "cannot be called as compute_score"),
        (EXAMPLES, "plain", {"nope": 1}, RewardFunctionError, r"cannot be called.*nope"),
        (EXAMPLES, "Stateful", {"nope": 1}, RewardFunctionError, "cannot instantiate"),
        (EXAMPLES, "NOT_CALLABLE", None, RewardFunctionError, "not a function or a class"),
    ],
)
def test_load_errors_are_clear(path, name, kwargs, error, match):
    with pytest.raises(error, match=match):
        load_reward(path, name, kwargs)


def test_wrap_instance_and_lambda():
    class Judge:
        def compute_score(self, data_source, solution_str, ground_truth, extra_info=None):
            return 0.25

    assert wrap_reward(Judge()).score_fn(None, "x", None) == 0.25
    with pytest.raises(RewardFunctionError, match="instance"):
        wrap_reward(Judge(), {"a": 1})
    assert wrap_reward(lambda data_source, solution_str, ground_truth, extra_info=None: 1).score_fn(1, 2, 3) == 1


@pytest.mark.parametrize(
    "value, score, extra",
    [
        (1, 1.0, {}),
        (True, 1.0, {}),
        (np.float32(0.5), 0.5, {}),
        (np.int64(-2), -2.0, {}),
        (np.array(0.75), 0.75, {}),
        ({"score": 0.3, "acc": 1}, 0.3, {"acc": 1}),
        ((0.5, "prompt", "why"), 0.5, {"prompt": "prompt", "explanation": "why"}),
    ],
)
def test_accepted_returns(value, score, extra):
    assert normalize_score(value, "f on sample 3") == (score, extra)


@pytest.mark.parametrize(
    "value, match",
    [
        (None, "NoneType"),
        (float("nan"), "non-finite"),
        (float("inf"), "non-finite"),
        ("1.0", "str"),
        ((1.0, "x"), "tuple of 2"),
        ({"acc": 1}, "without a 'score'"),
        ({"score": None}, "NoneType"),
        ([1.0], "list"),
    ],
)
def test_rejected_returns_name_function_and_sample(value, match):
    with pytest.raises(RewardFunctionError, match=match) as info:
        normalize_score(value, "judge.py:score on sample 7 (uid 'u3')")
    assert "judge.py:score on sample 7 (uid 'u3')" in str(info.value)


@given(st.floats(allow_nan=True, allow_infinity=True))
def test_floats_accepted_iff_finite(x):
    if math.isfinite(x):
        assert normalize_score(x, "f")[0] == x
    else:
        with pytest.raises(RewardFunctionError):
            normalize_score(x, "f")


def test_group_hook_return_checked():
    assert normalize_group_scores(np.array([1, 2]), 2, "hook") == [1.0, 2.0]
    with pytest.raises(RewardFunctionError, match="returned 1 scores for a group of 2"):
        normalize_group_scores([1.0], 2, "hook")
    with pytest.raises(RewardFunctionError, match="position 1"):
        normalize_group_scores([1.0, None], 2, "hook")
    with pytest.raises(RewardFunctionError, match="not a list"):
        normalize_group_scores(None, 2, "hook")


SLOW_TO_IMPORT = """
import time
time.sleep(0.02)  # a module doing real work at import (torch, a tokenizer): the race's window


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return 1.0 if solution_str == ground_truth else 0.0
"""


def test_two_agents_built_at_once_from_one_reward_file_both_load_it(tmp_path):
    """Issue 45 item 7: the second loader took the module from sys.modules while the first was
    still running it ("has no attribute 'compute_score'", 29 of 30 trials). 25 races, each on a
    fresh file (a loaded file is cached for the process), both builders released together."""
    import threading

    from verl_async_rm import RewardAgent

    failures = []
    for trial in range(25):
        path = tmp_path / f"reward_{trial}.py"
        path.write_text(SLOW_TO_IMPORT)
        start = threading.Barrier(2)
        built: list[RewardAgent] = []

        def build():
            start.wait()
            try:
                built.append(RewardAgent.from_file(str(path), "compute_score"))
            except Exception as exc:  # noqa: BLE001 - collected, asserted below
                failures.append(f"trial {trial}: {type(exc).__name__}: {exc}")

        threads = [threading.Thread(target=build) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        for agent in built:
            try:
                assert agent.get_all(agent.submit([{"solution_str": "a", "ground_truth": "a"}]), timeout=10).scores == [1.0]
            finally:
                agent.close()
    assert not failures, f"{len(failures)} of 25 races failed; first: {failures[0]}"
