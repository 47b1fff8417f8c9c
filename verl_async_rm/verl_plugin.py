"""Entry point of the ``verl.plugins`` group: verl imports this inside every ``import verl``.

verl swallows a plugin's import error at DEBUG level, so a broken install would look like a missing
reward manager much later. Everything here reports its own failure loudly before re-raising.
Keep it cheap: it runs in every verl process, Ray workers included.
"""

from __future__ import annotations

import logging
import sys

_log = logging.getLogger("verl_async_rm")


def _load() -> None:
    try:
        from verl_async_rm.integration.register import install

        install()  # async_agent, registered when verl imports its reward-manager registries
        from verl_async_rm.cpu_backend import activate_if_requested  # CPU backend, only if VERL_ASYNC_RM_CPU=1

        activate_if_requested()
    except Exception as exc:  # noqa: BLE001 - re-raised after being made visible
        print(f"[verl_async_rm] plugin failed to load: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        _log.error("verl_async_rm plugin failed to load", exc_info=True)
        raise


_load()
