"""Run a callback right after a given module is imported, without importing it ourselves.

verl's reward-manager registries live in packages whose ``__init__`` imports every manager (about
2 s); the plugin runs inside every ``import verl``, so registering eagerly would slow every verl
process down. Python has no public post-import hook, so this small meta-path finder wraps the
target module's loader: once the module has executed, the callback registers into it.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from types import ModuleType
from typing import Callable


class _AfterImport(importlib.abc.MetaPathFinder):
    def __init__(self, name: str, callback: Callable[[ModuleType], None]):
        self.name = name
        self.callback = callback

    def find_spec(self, fullname, path, target=None):
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)  # one shot; also keeps the search below from finding us again
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return spec
        execute = spec.loader.exec_module
        callback = self.callback

        def exec_module(module: ModuleType) -> None:
            execute(module)
            callback(module)

        spec.loader.exec_module = exec_module
        return spec


def after_import(name: str, callback: Callable[[ModuleType], None]) -> None:
    """Call ``callback(module)`` once ``name`` is imported (at once if it already is)."""
    module = sys.modules.get(name)
    if module is not None:
        callback(module)
    else:
        sys.meta_path.insert(0, _AfterImport(name, callback))
