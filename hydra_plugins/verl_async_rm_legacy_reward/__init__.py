"""verl-async-rm's hydra plugins (hydra imports every module under ``hydra_plugins``): the legacy
reward spellings on verl's stock entry point. See ``verl_async_rm.integration.hydra_legacy``."""

from verl_async_rm.integration.hydra_legacy import LegacyRewardConfigSource, LegacyRewardSearchPath

__all__ = ["LegacyRewardConfigSource", "LegacyRewardSearchPath"]
