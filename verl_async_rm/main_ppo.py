"""``python -m verl_async_rm.main_ppo``: verl's main_ppo with this package's config.

Same overrides as verl's own entry point, plus: the older spelling
``reward_model.reward_manager.name=async_agent`` (moved to ``reward.reward_manager.name``), and the
``reward.async_agent`` settings, validated here before any Ray worker starts.
"""

from __future__ import annotations

import sys

import hydra
from omegaconf import DictConfig, open_dict

from verl_async_rm.integration.settings import settings_from_verl_config
from verl_async_rm.loader import check_spec
from verl_async_rm.integration.group_sizes import V0_CLASS as GROUP_SIZE_V0_CLASS, V1_CLASS as GROUP_SIZE_V1_CLASS
from verl_async_rm.strategies.plan import V1_MODE, check_strategy, shape_from_config, strategy_from_mapping

AGENT_LOOP_CLASS = "verl_async_rm.strategies.agent_loop.AgentLoopManagerWithoutRewards"


def migrate_legacy_selector(config: DictConfig) -> DictConfig:
    """``reward_model.reward_manager.name`` -> ``reward.reward_manager.name``; then the legacy node is
    put back to verl's shape (null), which the rest of verl expects."""
    legacy = config.get("reward_model", {}).get("reward_manager")
    name = legacy.get("name") if isinstance(legacy, DictConfig) else legacy
    with open_dict(config):
        if name:
            config.reward.reward_manager.name = name
        if "reward_model" in config and isinstance(legacy, DictConfig):
            config.reward_model.reward_manager = None
    return config


def prepare(config: DictConfig) -> DictConfig:
    config = migrate_legacy_selector(config)
    strategy = strategy_from_mapping(config)
    if config.reward.reward_manager.name == "async_agent" or strategy.enabled:
        check_spec(settings_from_verl_config(config).reward)  # bad settings or reward: fail now, not in a worker
    check_strategy(strategy, shape_from_config(config))  # everything the strategies cannot run as verl would
    agent = config.actor_rollout_ref.rollout.agent
    chosen = agent.get("agent_loop_manager_class")
    if strategy.enabled and config.trainer.get("use_v1", True):
        with open_dict(config):
            config.trainer.v1.trainer_mode = V1_MODE
    elif strategy.enabled:
        if chosen and chosen != AGENT_LOOP_CLASS:
            raise ValueError(f"the strategies need agent_loop_manager_class={AGENT_LOOP_CLASS}, not {chosen}")
        with open_dict(config):
            agent.agent_loop_manager_class = AGENT_LOOP_CLASS  # training generation without in-loop rewards
    elif config.reward.reward_manager.name == "async_agent" and not chosen:
        # Stamps each sample with its group's real size, so the per-sample path never waits on a timer.
        with open_dict(config):
            agent.agent_loop_manager_class = GROUP_SIZE_V1_CLASS if config.trainer.get("use_v1", True) else GROUP_SIZE_V0_CLASS
    return config


@hydra.main(config_path="pkg://hydra_conf", config_name="async_ppo_trainer", version_base=None)
def main(config: DictConfig) -> None:
    config = prepare(config)
    if not strategy_from_mapping(config).enabled or config.trainer.get("use_v1", True):
        from verl.trainer.main_ppo import main as verl_main

        verl_main.__wrapped__(config)  # verl's own body, undecorated
        return
    from verl.trainer.main_ppo import run_ppo
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config
    from verl.utils.device import auto_set_device

    from verl_async_rm.strategies.v0_runner import AsyncRewardTaskRunnerActor

    auto_set_device(config)
    validate_config(config=config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))
    run_ppo(config, task_runner_class=AsyncRewardTaskRunnerActor)


STRATEGY_KEYS = ("mini_batch_pipeline", "update_pipeline", "off_policy_steps")


def accept_recipe_spellings(argv: list[str]) -> list[str]:
    """The recipe writes ``+mini_batch_pipeline=True`` (``+`` adds a key hydra does not know); our
    config declares these keys with defaults, and hydra refuses to add an existing key. So the
    ``+`` is dropped for them, and both spellings work."""
    return [arg[1:] if arg.startswith("+") and arg[1:].split("=", 1)[0] in STRATEGY_KEYS else arg for arg in argv]


def cli() -> None:
    sys.argv[1:] = accept_recipe_spellings(sys.argv[1:])
    main()


if __name__ == "__main__":
    cli()
