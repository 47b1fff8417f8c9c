"""The proof for the legacy spelling on verl's STOCK entry point: ``python -m verl.trainer.main_ppo``
on the CPU backend for 2 steps, given the legacy selector and the legacy top-level reward block
(while ``reward.custom_reward_function`` names another reward), trains through this package's
agent, which scores every sample.

The run is the ``sync`` run of tests/helpers/verl_modes.py (the session fixture ``verl_modes_runs``,
shared with tests/seam/test_verl_async_modes.py, which checks the same run's groups, scores, verdict
log and limits): one trainer for both modules instead of one each."""

from __future__ import annotations

from collections import Counter

import pytest

from tests.helpers import session_probe
from tests.helpers.verl_modes import LEGACY, PROMPTS, RUNS, read_jsonl, trained, training_calls
from verl_async_rm.ray_agent import DEFAULT_ACTOR_NAME

pytestmark = [pytest.mark.trainer, pytest.mark.slow, pytest.mark.timeout(2400)]


def test_stock_main_ppo_with_the_legacy_override_trains_through_the_agent(verl_modes_runs):
    out, result, _ = verl_modes_runs[LEGACY]
    log = open(result.log_path).read()
    assert result.ok, log[-4000:]
    # only the legacy keys select the agent and name the probe (reward.* names the toy reward)
    assert "reward_model.reward_manager=async_agent" in result.overrides
    assert not [o for o in result.overrides if o.startswith(("reward.reward_manager.name=", "reward.custom_reward_function.path=")) and
                ("async_agent" in o or "session_probe" in o)]
    assert "legacy reward config moved: reward_model.reward_manager -> reward.reward_manager.name" in log
    assert "custom_reward_function.path -> reward.custom_reward_function.path" in log
    # every training sample scored once, by the agent actor (verl's naive manager would score in its
    # reward-loop workers, and with the legacy block ignored would call the toy reward, not this one)
    calls = read_jsonl(out / "calls.jsonl")
    assert calls and {call["actor"] for call in calls} == {DEFAULT_ACTOR_NAME}
    probes = Counter(call["probe"] for call in training_calls(out))
    assert probes and set(probes.values()) == {1}
    steps = trained(out)
    assert sorted(steps) == list(range(1, RUNS[LEGACY] + 1))
    for rows in steps.values():  # every trained sample was scored by it (its probe: {uid}_{session}_{output})
        assert {row["uid"].rsplit("_", 1)[0] for row in rows} <= set(probes)
        assert len({row["uid"].rsplit("_", 2)[0] for row in rows}) == PROMPTS
    assert any(call["probe"].startswith(session_probe.VALIDATION) for call in calls)  # validation too
    assert len(result.series("critic/score/mean")) == RUNS[LEGACY]
