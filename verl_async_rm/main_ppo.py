"""``python -m verl_async_rm.main_ppo``: verl's main_ppo with this package's config.

Same overrides as verl's own entry point, plus: verl's whole legacy reward block (the selector
``reward_model.reward_manager[.name]``, ``custom_reward_function.*``, ...; moved to ``reward.*`` by
``integration.legacy_config``), the ``reward.async_agent`` settings (with or without ``+``), validated
here before any Ray worker starts, and the strategy flags.
"""

from __future__ import annotations

import functools
import sys

import hydra
from omegaconf import DictConfig, open_dict

from verl_async_rm.integration.group_sizes import select_group_size_manager
from verl_async_rm.integration.legacy_config import migrate_legacy_reward_config
from verl_async_rm.integration.settings import RunSettings, prepare_drift_check, read_run_settings, write_verl_mode
from verl_async_rm.loader import check_spec
from verl_async_rm.strategies.plan import V1_MODE
from verl_async_rm.strategies.reward_workers import without_reward_loop_workers

AGENT_LOOP_CLASS = "verl_async_rm.strategies.agent_loop.AgentLoopManagerWithoutRewards"
V1_STREAMING_CLASS = "verl_async_rm.strategies.streaming_v1.StreamingAgentLoopManagerTQ"  # = streaming.V1_MANAGER_CLASS (light import here)
CONFIG_NAME = "async_ppo_trainer"  # verl_async_rm/hydra_conf/: verl's ppo_trainer plus our settings
SETTINGS_CONFIG = "async_reward_settings"  # our keys alone, shared by async_ppo_trainer and async_ppo_megatron_trainer


def prepare(config: DictConfig) -> RunSettings:
    """Check the run and complete its config (in place) before any Ray worker starts; its settings."""
    migrate_legacy_reward_config(config)  # the whole legacy block, whichever manager it names
    settings = read_run_settings(config)  # bad settings, or what cannot run as verl would: fail now
    if settings.verl_mode is not None:
        write_verl_mode(config, settings.verl_mode)
    strategy = settings.strategy
    if settings.uses_agent:
        check_spec(settings.agent.reward, construct=True)  # a reward that cannot load: fail now
    prepare_drift_check(config, settings)  # its calibration set and judge: fail now
    agent = config.actor_rollout_ref.rollout.agent
    chosen = agent.get("agent_loop_manager_class")
    if strategy.enabled:
        without_reward_loop_workers(config)  # the agent scores every sample: verl's would idle
    if strategy.enabled and config.trainer.get("use_v1", True):
        with open_dict(config):
            config.trainer.v1.trainer_mode = V1_MODE
        if strategy.stream_rewards:
            if chosen and chosen != V1_STREAMING_CLASS:
                raise ValueError(f"stream_rewards needs agent_loop_manager_class={V1_STREAMING_CLASS}, not {chosen} "
                                 "(or set stream_rewards=false)")
            with open_dict(config):
                agent.agent_loop_manager_class = V1_STREAMING_CLASS  # workers add each sample to the step's ticket
    elif strategy.enabled:
        if chosen and chosen != AGENT_LOOP_CLASS:
            raise ValueError(f"the strategies need agent_loop_manager_class={AGENT_LOOP_CLASS}, not {chosen}")
        with open_dict(config):
            agent.agent_loop_manager_class = AGENT_LOOP_CLASS  # training generation without in-loop rewards
    else:
        # Stamps each sample with its group's real size, so the per-sample path never waits on a timer.
        select_group_size_manager(config)
    return settings


V0_STRATEGY_RUNNER = "verl_async_rm.strategies.v0_runner:AsyncRewardTaskRunnerActor"


def task_runner(settings: RunSettings) -> str:
    """``module:Name`` of the TaskRunner this run's driver starts: verl's, or ours for v0 strategies."""
    if settings.shape.use_v1:
        return "verl.trainer.main_ppo:TaskRunnerV1"
    if settings.strategy.enabled:
        return V0_STRATEGY_RUNNER
    return "verl.trainer.main_ppo_v0:TaskRunner"


def check_as_verls_driver(config: DictConfig) -> None:
    """What verl's driver does to the config before starting the TaskRunner (device, validation)."""
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config
    from verl.utils.device import auto_set_device

    auto_set_device(config)
    validate_config(config=config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))


def run(config: DictConfig, settings: RunSettings) -> None:
    """Train on a config ``prepare`` has made: verl's driver with the TaskRunner ``task_runner`` names."""
    if task_runner(settings) != V0_STRATEGY_RUNNER:
        from verl.trainer.main_ppo import main as verl_main

        verl_main.__wrapped__(config)  # verl's own body, undecorated
    else:
        from verl.trainer.main_ppo import run_ppo

        from verl_async_rm.strategies.v0_runner import AsyncRewardTaskRunnerActor

        check_as_verls_driver(config)
        run_ppo(config, task_runner_class=AsyncRewardTaskRunnerActor)


@hydra.main(config_path="pkg://verl_async_rm.hydra_conf", config_name=CONFIG_NAME, version_base=None)
def main(config: DictConfig) -> None:
    run(config, prepare(config))


@functools.cache
def declared_keys() -> frozenset[str]:
    """Dotted leaf keys our configs declare on top of verl's (settings and strategy flags)."""
    from importlib.resources import files

    from omegaconf import OmegaConf

    ours = OmegaConf.create(files("verl_async_rm.hydra_conf").joinpath(f"{SETTINGS_CONFIG}.yaml").read_text())
    keys: set[str] = set()

    def walk(node, prefix: str) -> None:
        for key, value in node.items():
            dotted = f"{prefix}{key}"
            if isinstance(value, DictConfig):
                walk(value, f"{dotted}.")
            else:
                keys.add(dotted)

    walk(ours, "")
    return frozenset(keys)


def accept_recipe_spellings(argv: list[str]) -> list[str]:
    """The recipe writes ``+mini_batch_pipeline=True``, verl's entry point needs
    ``+reward.async_agent.max_concurrency=64`` (``+`` adds a key hydra does not know); our config
    declares these keys with defaults, and hydra refuses to add an existing key. So the ``+`` is
    dropped for every key our config declares, and both spellings work on both entry points."""
    declared = declared_keys()
    return [arg[1:] if arg.startswith("+") and arg[1:].split("=", 1)[0] in declared else arg for arg in argv]


def refuse_unsupported_verl() -> None:
    """On a verl outside the supported range the plugin disabled itself (it only warns, so verl keeps
    working for everyone); this entry point exists for our features, so here it is an error."""
    from verl_async_rm.verl_compat import check_installed_version

    check_installed_version("python -m verl_async_rm.main_ppo")


def cli() -> None:
    refuse_unsupported_verl()
    sys.argv[1:] = accept_recipe_spellings(sys.argv[1:])
    main()


if __name__ == "__main__":
    cli()
