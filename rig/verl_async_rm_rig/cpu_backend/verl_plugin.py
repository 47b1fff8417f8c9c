"""The CPU backend's entry point in verl's ``verl.plugins`` group: verl imports it inside every ``import verl``.

It does nothing unless ``VERL_ASYNC_RM_CPU=1`` (the launcher sets it for its runs' driver and, through
Ray's runtime env, for their workers); then it registers the CPU platform and the ``hf_cpu`` rollout.
As the product's plugin, it never raises inside verl's import: a failure is printed instead.
"""

from __future__ import annotations

import logging
import sys


def _load() -> None:
    try:
        from verl_async_rm_rig.cpu_backend import activate_if_requested

        activate_if_requested()
    except Exception as exc:  # noqa: BLE001 - never break ``import verl``; made visible instead
        print(f"[verl_async_rm_rig] CPU backend failed to activate: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        logging.getLogger("verl_async_rm_rig").error("CPU backend failed to activate", exc_info=True)


_load()
