"""What this package does at the start of verl's STOCK entry point, through hydra's plugin extension
points: the legacy reward spellings, and the start-time check of the ``async_agent`` settings and reward.

verl 0.9.1's ``python -m verl.trainer.main_ppo`` composes the legacy keys (``reward_model.reward_manager``,
``custom_reward_function.*``; its ``legacy_reward_impl.yaml``) and then ignores them: the legacy
selector ``reward_model.reward_manager=async_agent`` silently ran verl's ``naive`` manager. verl
offers no hook between composing the config and using it, but hydra does:

1. ``VerlConfigSearchPath`` (a hydra ``SearchPathPlugin``, found through the ``hydra_plugins``
   namespace package) puts ``VerlLegacyConfigSource`` right before verl's own config directory,
   only for apps whose main config directory IS verl's (verl's entry points), not for other hydra apps,
   and only on a supported verl;
2. ``VerlLegacyConfigSource`` serves one config, ``legacy_reward_impl``: verl's own file, read from
   the installed verl at composition time (so it can never go stale), plus one hydra callback;
3. ``AsyncAgentStartCallback.on_run_start`` receives the composed config before hydra copies it for
   the task function: when the run selects ``async_agent`` (either selector), it moves the legacy
   block to ``reward.*`` (``legacy_config``) and says so on stderr, then checks the agent settings
   and builds the reward once (``loader.check_spec``), so a bad setting or reward stops the run
   here, not at the first reward inside a Ray actor; with verl's own trainer modes it selects the
   agent-loop manager that gives the per-sample path exact groups (``group_sizes``), as our entry
   point does, unless the run names its own. A run that does not select ``async_agent`` is left
   exactly as verl composed it. ``on_job_start`` re-checks: in a case the
   migration could not reach (hydra's multirun composes each job anew), the run stops at start with
   the exact ``reward.*`` spelling to use, instead of silently running another manager.

hydra turns a callback's ``Exception`` into a warning, so a refusal is a ``SystemExit``.
Everything here imports hydra and omegaconf only: hydra imports its plugins in every hydra app.
"""

from __future__ import annotations

import sys
from typing import Any, List, Optional

from hydra.core.config_search_path import ConfigSearchPath
from hydra.core.object_type import ObjectType
from hydra.experimental.callback import Callback
from hydra.plugins.config_source import ConfigLoadError, ConfigResult, ConfigSource
from hydra.plugins.search_path_plugin import SearchPathPlugin
from omegaconf import DictConfig, OmegaConf

VERL_CONFIG_PACKAGE = "verl.trainer.config"
LEGACY_CONFIG = "legacy_reward_impl"
SCHEME = "verl-async-rm-legacy"
PROVIDER = "verl-async-rm"
CALLBACK_KEY = "verl_async_rm"
CALLBACK_TARGET = f"{__name__}.AsyncAgentStartCallback"


def _is_verl_config_dir(path: str) -> bool:
    """Whether a search-path entry is verl's config directory. hydra names it as a package (its
    ``hydra.main`` writes ``pkg://verl.trainer/config``; normalized as hydra does) or as a folder."""
    if path.startswith("pkg://"):
        return path[len("pkg://") :].replace("/", ".").rstrip(".") == VERL_CONFIG_PACKAGE
    import importlib.util
    import os

    folder = path[len("file://") :] if path.startswith("file://") else path
    try:
        spec = importlib.util.find_spec("verl")  # locates verl without importing it
    except (ImportError, ValueError):
        return False
    locations = (spec.submodule_search_locations or []) if spec else []
    return any(os.path.abspath(folder) == os.path.join(os.path.abspath(loc), "trainer", "config") for loc in locations)


def _supported_verl() -> bool:
    """On a verl this package does not support it stays out of verl's way entirely (the verl plugin
    has already warned); read from the installed metadata, without importing verl."""
    from verl_async_rm.verl_compat import VerlVersionError, check_installed_version

    try:
        check_installed_version()
    except VerlVersionError:
        return False
    return True


class VerlConfigSearchPath(SearchPathPlugin):
    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
        if not _supported_verl():
            return
        for element in list(search_path.get_path()):
            if _is_verl_config_dir(element.path):
                # anchored: just before verl's directory, after anything the user put in front of it
                search_path.prepend(PROVIDER, f"{SCHEME}://verl", anchor=_query(element))
                return


def _query(element: Any):
    from hydra.core.config_search_path import SearchPathQuery

    return SearchPathQuery(provider=element.provider, path=element.path)


class VerlLegacyConfigSource(ConfigSource):
    """Serves ``legacy_reward_impl``: verl's own file plus the callback; nothing else."""

    @staticmethod
    def scheme() -> str:
        return SCHEME

    def _is_ours(self, config_path: str) -> bool:
        return self._normalize_file_name(config_path) == f"{LEGACY_CONFIG}.yaml"

    def load_config(self, config_path: str) -> ConfigResult:
        if not self._is_ours(config_path):
            raise ConfigLoadError(f"Config not found: {config_path}")
        from importlib.resources import files

        text = files(VERL_CONFIG_PACKAGE).joinpath(f"{LEGACY_CONFIG}.yaml").read_text(encoding="utf-8")
        callback = OmegaConf.create({"hydra": {"callbacks": {CALLBACK_KEY: {"_target_": CALLBACK_TARGET}}}})
        return ConfigResult(
            provider=self.provider,
            path=self.full_path(),
            config=OmegaConf.merge(OmegaConf.create(text), callback),
            header=self._get_header_dict(text),  # hydra's own parser of "# @package" headers
        )

    def is_group(self, config_path: str) -> bool:
        return config_path == ""

    def is_config(self, config_path: str) -> bool:
        return self._is_ours(config_path)

    def available(self) -> bool:
        return True

    def list(self, config_path: str, results_filter: Optional[ObjectType]) -> List[str]:
        if config_path == "" and results_filter in (None, ObjectType.CONFIG):
            return [LEGACY_CONFIG]
        return []


class AsyncAgentStartCallback(Callback):
    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        from verl_async_rm.integration.legacy_config import migrate_legacy_reward_config, selects_async_agent

        if not selects_async_agent(config):
            return  # not ours to touch: verl runs exactly as composed
        try:
            moved = migrate_legacy_reward_config(config)
        except Exception as exc:  # noqa: BLE001 - hydra would only warn; a half-migrated run must not start
            sys.exit(f"[verl_async_rm] could not move the legacy reward config to reward.*: {type(exc).__name__}: {exc}")
        if moved:
            print(f"[verl_async_rm] legacy reward config moved: {', '.join(moved)}", file=sys.stderr, flush=True)
        from verl_async_rm.integration.group_sizes import select_group_size_manager
        from verl_async_rm.integration.settings import prepare_drift_check, read_run_settings, write_verl_mode
        from verl_async_rm.loader import check_spec
        from verl_async_rm.strategies.plan import V1_MODE

        try:
            settings = read_run_settings(config)
            check_spec(settings.agent.reward, construct=True)
            prepare_drift_check(config, settings)
        except Exception as exc:  # noqa: BLE001 - as above: stop before any worker starts
            sys.exit(f"[verl_async_rm] async_agent cannot start: {type(exc).__name__}: {exc}")
        if settings.verl_mode is not None:
            write_verl_mode(config, settings.verl_mode)
        if not settings.strategy.enabled and OmegaConf.select(config, "trainer.v1.trainer_mode") != V1_MODE:
            # As our entry point does: exact groups (each sample stamped with its group's real size and
            # attempt, failed sessions withdrawn) instead of groups closed by a timer.
            chosen = select_group_size_manager(config)
            if chosen:
                print(f"[verl_async_rm] actor_rollout_ref.rollout.agent.agent_loop_manager_class={chosen}",
                      file=sys.stderr, flush=True)

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        from verl_async_rm.integration.legacy_config import (
            ASYNC_AGENT,
            exact_spelling,
            has_legacy_reward_config,
            legacy_selector,
            selects_async_agent,
        )

        if selects_async_agent(config) and has_legacy_reward_config(config):
            manager = legacy_selector(config) or ASYNC_AGENT
            sys.exit(
                f"[verl_async_rm] this run selects {manager} through verl's legacy reward keys, which this verl "
                f"entry point ignores, and they could not be moved here (hydra multirun?). Use: {exact_spelling(config)}"
            )
