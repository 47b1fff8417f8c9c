"""verl 0.9's two reward-manager registries: where they live, and registering into those already imported.

Apart from ``register.py`` (which waits for verl to import them) so that our manager's module can
register itself at its import without importing the module that imports it lazily (no import circle).
"""

from __future__ import annotations

import sys

REWARD_LOOP_PACKAGE = "verl.experimental.reward_loop.reward_manager"
LEGACY_PACKAGE = "verl.workers.reward_manager"
REWARD_LOOP_REGISTRY = f"{REWARD_LOOP_PACKAGE}.registry"
LEGACY_REGISTRY = f"{LEGACY_PACKAGE}.registry"
REGISTRY_OF_PACKAGE = {REWARD_LOOP_PACKAGE: REWARD_LOOP_REGISTRY, LEGACY_PACKAGE: LEGACY_REGISTRY}


def register_where_loaded(manager_cls: type, name: str) -> None:
    """Register into whichever registries are already imported (the rest wait for their import)."""
    for registry_name in (REWARD_LOOP_REGISTRY, LEGACY_REGISTRY):
        registry = sys.modules.get(registry_name)
        if registry is not None and hasattr(registry, "register"):
            registry.register(name)(manager_cls)
