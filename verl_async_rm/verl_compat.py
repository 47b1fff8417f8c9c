"""The one place that knows which verl releases this package supports, and how to say so.

Every verl-facing module declares the (module, attribute) pairs it needs and calls ``require_verl``
before touching them, so a verl that moved them fails with one clear error naming the installed
version and the missing symbol, not with an AttributeError deep inside a Ray worker.
"""

from __future__ import annotations

import importlib

from verl_async_rm import AsyncRMError

SUPPORTED_VERL = ("0.9.1", "0.10")  # >= lower, < upper


class VerlVersionError(AsyncRMError, RuntimeError):
    """The installed verl is not a release this package supports, or lacks an internal it needs.
    (Here, not in ``errors.py``: verl's plugin checks the version in every verl process and, on an
    unsupported verl, must load nothing of ours beyond this module.)"""


def _parse(version: str) -> tuple[int, ...]:
    return tuple(int("".join(ch for ch in part if ch.isdigit()) or 0) for part in version.split("."))


def verl_version() -> str:
    import verl

    return getattr(verl, "__version__", "unknown")


def check_version(version: str | None = None, feature: str = "verl_async_rm") -> str:
    """Raise unless ``version`` (default: the imported verl's) is a supported release."""
    version = version or verl_version()
    low, high = SUPPORTED_VERL
    if not _parse(low) <= _parse(version) < _parse(high):
        raise VerlVersionError(
            f"{feature} supports verl>={low},<{high}; installed verl is {version}. It relies on verl "
            "internals (registries, trainer hooks) that move between releases."
        )
    return version


def check_installed_version(feature: str = "verl_async_rm") -> str:
    """The same check from package metadata, without importing verl (a launcher's preflight)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return check_version(version("verl"), feature)
    except PackageNotFoundError as exc:
        raise VerlVersionError("verl is not installed") from exc


def require_verl(feature: str, internals: tuple[tuple[str, str], ...] = ()) -> str:
    """Check the release and that every ``(module, attribute)`` exists; returns the version."""
    version = check_version(feature=feature)
    for module_name, attribute in internals:
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            raise VerlVersionError(f"verl {version}: module {module_name} is missing ({exc}); {feature} needs it") from exc
        if not hasattr(module, attribute):
            raise VerlVersionError(f"verl {version}: {module_name}.{attribute} is missing; {feature} needs it")
    return version
