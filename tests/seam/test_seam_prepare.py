"""Start-time refusals and choices, through both entry points: ``verl_async_rm.main_ppo``'s
``prepare`` (before any Ray worker) and the v1 mode's constructor (``python -m
verl.trainer.main_ppo ... trainer.v1.trainer_mode=async_reward``, before any worker is built)."""

from __future__ import annotations

import copy
import functools

import pytest
import yaml
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf, open_dict

from tests.conftest import ROOT
from verl_async_rm.integration.group_sizes import V0_CLASS, V1_CLASS

REWARD = str(ROOT / "verl_async_rm" / "user_rewards" / "gsm8k.py")


@functools.cache
def _composed(module: str, name: str):
    """One hydra composition per config (~0.5 s each); tests change copies with ``with_values``."""
    with initialize_config_module(module, version_base=None):
        return compose(name, overrides=["actor_rollout_ref.model.path=/nonexistent", f"reward.custom_reward_function.path={REWARD}"])


def with_values(config, *overrides):
    """``key=value`` overrides on a copy, as hydra would apply them to declared or new keys."""
    config = copy.deepcopy(config)
    with open_dict(config):
        for override in overrides:
            key, value = override.lstrip("+").split("=", 1)
            OmegaConf.update(config, key, yaml.safe_load(value), force_add=True)  # 1 -> int, true -> bool
    return config


def ours(*overrides):
    return with_values(_composed("verl_async_rm.hydra_conf", "async_ppo_trainer"), *overrides)


def verls(*overrides):
    return with_values(_composed("verl.trainer.config", "ppo_trainer"), *overrides)


@pytest.mark.local
@pytest.mark.parametrize(
    "overrides, match",
    [
        (["off_policy_steps=1", "reward.reward_manager.name=dapo"], "overlong penalty"),
        (["off_policy_steps=1", "reward.reward_model.enable=true"], "reward_model.enable"),
        (["off_policy_steps=1", "algorithm.adv_estimator=remax", "trainer.use_v1=false"], "greedy generation"),
        (["off_policy_steps=2"], "prefetches one batch at most"),
        (["mini_batch_pipeline=true", "algorithm.filter_groups.enable=true"], "filter_groups"),
        (["mini_batch_pipeline=true", "algorithm.rollout_correction.rollout_is_batch_normalize=true"], "batch_normalize"),
        (["mini_batch_pipeline=true", "actor_rollout_ref.actor.ppo_mini_batch_size=3"], "must divide"),
    ],
)
def test_prepare_refuses_what_would_not_run_as_verl(overrides, match):
    from tests.helpers.harness import prepared

    with pytest.raises(ValueError, match=match):
        prepared(ours(*overrides))


@pytest.mark.local
@pytest.mark.parametrize("use_v1, expected", [(True, V1_CLASS), (False, V0_CLASS)])
def test_the_per_sample_path_gets_its_group_sizes_from_the_agent_loop(use_v1, expected):
    """Strategies off, async_agent scoring inside the agent loop: the group-size stamping manager."""
    from tests.helpers.harness import prepared
    from verl_async_rm.strategies.plan import strategy_from_mapping

    config = prepared(ours("reward.reward_manager.name=async_agent", f"trainer.use_v1={str(use_v1).lower()}"))
    assert config.actor_rollout_ref.rollout.agent.agent_loop_manager_class == expected
    assert not strategy_from_mapping(config).enabled
    chosen = prepared(ours("reward.reward_manager.name=async_agent", "+actor_rollout_ref.rollout.agent.agent_loop_manager_class=my.Manager"))
    assert chosen.actor_rollout_ref.rollout.agent.agent_loop_manager_class == "my.Manager"  # the user's choice stays
    naive = prepared(ours())
    assert not naive.actor_rollout_ref.rollout.agent.get("agent_loop_manager_class")  # verl's own config, untouched


@pytest.mark.local
@pytest.mark.parametrize("use_v1", [True, False])
def test_a_strategy_run_starts_none_of_verls_reward_loop_workers(use_v1):
    """The agent scores every sample of a strategy run, so verl's reward-loop workers (8 by default,
    each a Ray actor importing verl) would only idle: reward.num_workers becomes 0, the legacy
    spelling included; without a strategy verl's value stays, as it does for off_policy_steps alone
    on v1, which is verl's colocate_async (its reward-loop workers hand each sample to the agent)."""
    from tests.helpers.harness import prepared

    v1 = f"trainer.use_v1={str(use_v1).lower()}"
    strategy = "off_policy_steps=1" if not use_v1 else "mini_batch_pipeline=true"
    assert ours(v1).reward.num_workers == 8  # verl's default
    assert prepared(ours(v1, strategy)).reward.num_workers == 0
    assert prepared(ours(v1, strategy, "reward_model.num_workers=4")).reward.num_workers == 0
    alone = prepared(ours(v1, "off_policy_steps=1"))
    assert alone.reward.num_workers == (8 if use_v1 else 0)
    assert alone.trainer.v1.trainer_mode == ("colocate_async" if use_v1 else "sync")
    assert prepared(ours(v1, "reward.reward_manager.name=async_agent")).reward.num_workers == 8
    assert prepared(ours(v1, "reward.num_workers=3")).reward.num_workers == 3


@pytest.mark.local
@pytest.mark.parametrize("module", ["verl_async_rm.integration.group_size_v0", "verl_async_rm.integration.group_size_v1"])
def test_the_stamping_managers_import(module):
    import importlib

    from verl_async_rm.integration.group_sizes import V0_CLASS as v0, V1_CLASS as v1

    path = v0 if module.endswith("v0") else v1
    assert getattr(importlib.import_module(module), path.rsplit(".", 1)[1])


@pytest.mark.local
def test_the_v1_mode_refuses_in_its_constructor_through_verls_own_entry_point():
    """S7: verl's entry point never runs our prepare; the mode checks before a worker exists."""
    from verl.trainer.ppo.v1 import get_trainer_cls

    import verl_async_rm.strategies.v1  # noqa: F401 - registers the mode, as the plugin does in verl's processes

    config = verls("trainer.v1.trainer_mode=async_reward")
    with open_dict(config):
        config.off_policy_steps = 2
    with pytest.raises(ValueError, match="prefetches one batch at most"):
        get_trainer_cls("async_reward")(config)
    with open_dict(config):
        config.off_policy_steps = 1
        config.reward.reward_manager.name = "prime"
    with pytest.raises(ValueError, match="prime"):
        get_trainer_cls("async_reward")(config)


@pytest.mark.local
@pytest.mark.parametrize("mode", ["sync", "colocate_async", "separate_async"])
def test_verls_own_entry_point_gives_async_agent_exact_groups_in_each_of_verls_modes(mode):
    """``python -m verl.trainer.main_ppo ... reward.reward_manager.name=async_agent``: the start callback
    selects the stamping agent-loop manager as our entry point does (each sample's real group size and
    dispatch, failed sessions withdrawn), so verl's own modes never wait on a timer; a run naming its
    own manager, the strategies' mode and a run without async_agent are left alone."""
    from verl_async_rm.integration.stock_entry import AsyncAgentStartCallback

    def started(*overrides):
        config = verls(*overrides)
        AsyncAgentStartCallback().on_run_start(config)
        return config.actor_rollout_ref.rollout.agent.get("agent_loop_manager_class")

    agent = "reward.reward_manager.name=async_agent"
    assert started(agent, f"trainer.v1.trainer_mode={mode}") == V1_CLASS
    assert started(agent, "trainer.use_v1=false") == V0_CLASS
    assert started(agent, f"trainer.v1.trainer_mode={mode}", "+actor_rollout_ref.rollout.agent.agent_loop_manager_class=my.M") == "my.M"
    assert started(agent, "trainer.v1.trainer_mode=async_reward", "+off_policy_steps=1") is None  # the strategies' own
    assert started(agent, "+off_policy_steps=1") == V1_CLASS  # alone on v1: verl's colocate_async (below)
    assert started(f"trainer.v1.trainer_mode={mode}") is None  # verl's naive manager: untouched


@pytest.mark.local
@pytest.mark.parametrize("mode", ["sync", "colocate_async", "separate_async"])
def test_mask_is_refused_at_start_on_verls_own_modes_with_the_reason(mode):
    """verl's modes score one sample per call and drop a sample only when its session fails: mask
    (a failed reward out of the loss and the group statistics) is refused before any worker starts,
    naming the run's mode, on both entry points."""
    from verl_async_rm.integration.settings import read_run_settings
    from verl_async_rm.integration.stock_entry import AsyncAgentStartCallback

    overrides = ["reward.reward_manager.name=async_agent", f"trainer.v1.trainer_mode={mode}", "+reward.async_agent.failure_policy=mask"]
    reason = rf"failure_policy=mask needs the trainer strategies .*trainer_mode={mode}.*never for a failed reward"
    with pytest.raises(ValueError, match=reason):
        read_run_settings(verls(*overrides))
    with pytest.raises(SystemExit, match=reason):
        AsyncAgentStartCallback().on_run_start(verls(*overrides))
    from tests.helpers.harness import prepared

    with pytest.raises(ValueError, match=reason):
        prepared(ours(*[o.lstrip("+") for o in overrides]))


@pytest.mark.local
@pytest.mark.parametrize("entry", ["ours", "verls"])
def test_off_policy_steps_alone_on_v1_runs_verls_colocate_async_with_the_agent(entry, capsys):
    """On either entry point: verl's colocate_async, a step waiting rather than training a sample more
    than one step old (threshold 2: verl counts the step it was submitted at), the agent as the reward
    manager behind verl's reward-loop workers, exact groups, the flag off in the config every later
    process reads; said on stderr. With failure_policy=mask the run stays this package's."""
    from tests.helpers.harness import prepared
    from verl_async_rm.integration.stock_entry import AsyncAgentStartCallback

    if entry == "ours":
        config = prepared(ours("off_policy_steps=1"))
    else:
        config = verls("reward.reward_manager.name=async_agent", "+off_policy_steps=1")
        AsyncAgentStartCallback().on_run_start(config)
    assert (config.trainer.v1.trainer_mode, config.trainer.v1.sampler.max_off_policy_threshold,
            config.trainer.v1.sampler.max_off_policy_strategy) == ("colocate_async", 2, "wait")
    assert config.reward.reward_manager.name == "async_agent" and config.off_policy_steps == 0
    assert config.actor_rollout_ref.rollout.agent.agent_loop_manager_class == V1_CLASS
    assert "runs as verl's own colocate_async mode with the agent" in capsys.readouterr().err
    masked = prepared(ours("off_policy_steps=1", "reward.async_agent.failure_policy=mask", "actor_rollout_ref.rollout.n=4"))
    assert masked.trainer.v1.trainer_mode == "async_reward" and masked.reward.num_workers == 0
