"""Start-time checks of the user's reward (``loader.check_spec``) and the ``pkg://`` reward paths."""

from __future__ import annotations

import pytest

from tests.conftest import REWARDS
from verl_async_rm.errors import RewardFunctionError
from verl_async_rm.loader import RewardSpec, check_spec, load_module, load_reward
from verl_async_rm.user_rewards import llm_judge

pytestmark = pytest.mark.quick
EXAMPLES = str(REWARDS / "examples.py")


@pytest.fixture
def checked():
    module = load_module(EXAMPLES)
    module.Checked.built = module.Checked.closed = 0
    return module.Checked


def test_class_kwargs_are_checked_against_the_constructor_without_building_it(checked):
    with pytest.raises(RewardFunctionError, match=r"cannot instantiate examples.py:Checked .*'modle'"):
        check_spec(RewardSpec(EXAMPLES, "Checked", {"modle": "m"}))
    check_spec(RewardSpec(EXAMPLES, "Checked", {"model": "m"}))
    check_spec(RewardSpec(EXAMPLES, "Checked", {}))  # the signature allows it; only building tells
    assert checked.built == 0


def test_construct_builds_once_closes_and_reports_what_the_constructor_refuses(checked):
    with pytest.raises(RewardFunctionError, match=r"cannot instantiate examples.py:Checked .*ValueError: Checked needs a model"):
        check_spec(RewardSpec(EXAMPLES, "Checked", {}), construct=True)
    check_spec(RewardSpec(EXAMPLES, "Checked", {"model": "m"}), construct=True)
    assert (checked.built, checked.closed) == (1, 1)


def test_function_kwargs_checked_as_before():
    with pytest.raises(RewardFunctionError, match="cannot be called.*nope"):
        check_spec(RewardSpec(EXAMPLES, "plain", {"nope": 1}), construct=True)
    check_spec(RewardSpec(EXAMPLES, "plain", {"bonus": 1}), construct=True)


def test_pkg_and_file_paths_as_verl_accepts_them():
    for path in ("pkg://verl_async_rm.user_rewards.gsm8k", "pkg://verl_async_rm/user_rewards/gsm8k"):
        reward = load_reward(path, "compute_score")
        assert reward.label == "verl_async_rm.user_rewards.gsm8k:compute_score"
        assert reward.score_fn("gsm8k", "#### 3", "3") == 1.0
    assert load_reward(f"file://{EXAMPLES}", "plain").score_fn("d", "a", "a") == 1.0
    with pytest.raises(ModuleNotFoundError):
        check_spec(RewardSpec("pkg://verl_async_rm.user_rewards.nope", "compute_score"))


def test_judge_needs_a_model_and_takes_the_self_hosted_placeholder_key(monkeypatch):
    for var in ("JUDGE_BASE_URL", "OPENAI_BASE_URL", "JUDGE_API_KEY", "OPENAI_API_KEY", "JUDGE_MODEL"):
        monkeypatch.delenv(var, raising=False)
    judge = RewardSpec("pkg://verl_async_rm.user_rewards.llm_judge", "JudgeReward")
    with pytest.raises(RewardFunctionError, match="needs a model"):
        check_spec(judge, construct=True)
    assert llm_judge.client_settings(base_url="http://127.0.0.1:1/v1", model="m") == ("http://127.0.0.1:1/v1", "EMPTY", "m")
    with pytest.raises(ValueError, match="needs api_key"):
        llm_judge.client_settings(model="m")  # no server named, no key: the public endpoint would refuse
    check_spec(RewardSpec(judge.path, judge.name, {"base_url": "http://127.0.0.1:1/v1", "model": "m"}), construct=True)
    monkeypatch.setenv("JUDGE_MODEL", "from-env")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    assert llm_judge.client_settings() == (None, "sk-test", "from-env")
