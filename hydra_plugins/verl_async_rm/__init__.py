"""verl-async-rm's hydra plugins (hydra imports every module under ``hydra_plugins``): at the start
of verl's stock entry point, the legacy reward spellings and the ``async_agent`` start-time check.
See ``verl_async_rm.integration.stock_entry``."""

from verl_async_rm.integration.stock_entry import VerlConfigSearchPath, VerlLegacyConfigSource

__all__ = ["VerlConfigSearchPath", "VerlLegacyConfigSource"]
