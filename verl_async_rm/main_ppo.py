"""``python -m verl_async_rm.main_ppo``: verl's main_ppo with this package's config.

Same overrides as verl's own entry point, plus: the older spelling
``reward_model.reward_manager.name=async_agent`` (moved to ``reward.reward_manager.name``), and the
``reward.async_agent`` settings, validated here before any Ray worker starts.
"""

from __future__ import annotations

import hydra
from omegaconf import DictConfig, open_dict

from verl_async_rm.integration.settings import settings_from_verl_config
from verl_async_rm.loader import check_spec


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
    if config.reward.reward_manager.name == "async_agent":
        check_spec(settings_from_verl_config(config).reward)  # bad settings or reward: fail now, not in a worker
    return config


@hydra.main(config_path="pkg://hydra_conf", config_name="async_ppo_trainer", version_base=None)
def main(config: DictConfig) -> None:
    from verl.trainer.main_ppo import main as verl_main

    verl_main.__wrapped__(prepare(config))  # verl's own body, undecorated


if __name__ == "__main__":
    main()
