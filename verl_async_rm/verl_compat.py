"""The one place that knows which verl releases and internals this package relies on.

Every verl-facing module declares the (module, attribute) pairs it needs and calls ``require_verl``
before touching them, so a verl that moved them fails with one clear error naming the installed
version and the missing symbol, not with an AttributeError deep inside a Ray worker.
"""

from __future__ import annotations

import importlib

SUPPORTED_VERL = ("0.9.1", "0.10")  # >= lower, < upper


class VerlVersionError(RuntimeError):
    """The installed verl is not a release this package supports, or lacks an internal it needs."""


def _parse(version: str) -> tuple[int, ...]:
    return tuple(int("".join(ch for ch in part if ch.isdigit()) or 0) for part in version.split("."))


def verl_version() -> str:
    import verl

    return getattr(verl, "__version__", "unknown")


def require_verl(feature: str, internals: tuple[tuple[str, str], ...] = ()) -> str:
    """Check the verl release and that every ``(module, attribute)`` exists; returns the version."""
    version = verl_version()
    low, high = SUPPORTED_VERL
    if not _parse(low) <= _parse(version) < _parse(high):
        raise VerlVersionError(
            f"verl_async_rm's {feature} supports verl>={low},<{high}; the installed verl is {version}"
        )
    for module_name, attribute in internals:
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            raise VerlVersionError(f"{feature} needs {module_name}, missing in verl {version}: {exc}") from None
        if not hasattr(module, attribute):
            raise VerlVersionError(f"{feature} needs {module_name}.{attribute}, missing in verl {version}")
    return version
