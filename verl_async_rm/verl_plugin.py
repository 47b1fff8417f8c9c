"""Entry point of the ``verl.plugins`` group: verl imports this inside every ``import verl``.

Rules, because this runs inside verl's own import, in every verl process (Ray workers included),
for every user of the environment, whether or not they ever select ``async_agent``:
- it never raises: a raise here would break ``import verl`` (verl swallows plugin errors only at
  load time, not inside the registry imports our hooks run in);
- on a verl release this package does not support, it warns once (naming the installed and the
  supported versions) and installs nothing, so verl behaves exactly as without this package;
- it is cheap: registration waits for verl's own import of its registries (``integration.register``).
"""

from __future__ import annotations

import logging
import sys
import warnings

_log = logging.getLogger("verl_async_rm")


class UnsupportedVerlWarning(RuntimeWarning):
    """The installed verl is outside the supported range: verl_async_rm disabled itself."""


def _installed_verl_version() -> str:
    # Inside ``import verl``: ``verl.__version__`` is set before verl loads its plugins.
    verl = sys.modules.get("verl")
    version = getattr(verl, "__version__", None)
    if version is None:
        from importlib.metadata import version as dist_version

        version = dist_version("verl")
    return version


def supported_verl() -> bool:
    """True if the installed verl is in range; otherwise warn (once per process) and return False."""
    from verl_async_rm.verl_compat import SUPPORTED_VERL, VerlVersionError, check_version

    version = _installed_verl_version()
    try:
        check_version(version)
    except VerlVersionError:
        low, high = SUPPORTED_VERL
        warnings.warn(
            f"verl_async_rm supports verl>={low},<{high}, but verl {version} is installed: its async_agent reward "
            f"manager and trainer strategies are disabled, and verl runs as without it. "
            f"Install a supported verl (pip install 'verl>={low},<{high}') or uninstall verl-async-rm.",
            UnsupportedVerlWarning,
            stacklevel=2,
        )
        return False
    return True


def _load() -> None:
    try:
        if not supported_verl():
            return
        from verl_async_rm.integration.register import install

        install()  # async_agent, registered when verl imports its reward-manager registries
    except Exception as exc:  # noqa: BLE001 - never break ``import verl``; made visible instead
        print(f"[verl_async_rm] plugin failed to load: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        _log.error("verl_async_rm plugin failed to load", exc_info=True)


_load()
