"""A ``torch.cuda``-shaped device module for CPU.

verl reaches the accelerator through ``get_torch_device()`` (the platform's ``device_module``) and
calls CUDA-only functions on it: ``memory_reserved``/``mem_get_info`` (utils/memory_utils.py,
engine_workers.py perf metrics), ``empty_cache``/``ipc_collect`` after weight sync,
``get_rng_state``/``set_rng_state`` (FSDP checkpoint "extra" state), ``set_per_process_memory_fraction``.
``torch.cpu`` has none of these. This shim answers them with the CPU truth (process RSS, host
memory, the default CPU generator) and forwards everything else to ``torch.cpu``; an attribute that
neither defines still raises AttributeError, so a new verl call shows up instead of being swallowed.
"""

from __future__ import annotations

import types
from collections import namedtuple

import psutil
import torch

_DeviceProperties = namedtuple("_DeviceProperties", ["name", "total_memory", "major", "minor", "multi_processor_count"])


class CpuDeviceModule(types.ModuleType):
    def __init__(self) -> None:
        super().__init__("verl_async_rm_rig.cpu_backend.device_shim.cpu")
        self._peak_rss = 0

    # -- forwarded to torch.cpu unless defined here ----------------------------------------------
    def __getattr__(self, name: str):
        return getattr(torch.cpu, name)

    # -- device identity ---------------------------------------------------------------------------
    @staticmethod
    def is_available() -> bool:
        return True

    @staticmethod
    def current_device() -> str:
        # A str that every torch API accepting a device accepts (``.to``, ``device=``, ``torch.device``).
        return "cpu"

    @staticmethod
    def device_count() -> int:
        return 1

    @staticmethod
    def set_device(device) -> None:  # Ray hands each worker a fake GPU index; there is one CPU.
        return None

    @staticmethod
    def get_device_name(device=None) -> str:
        return "cpu"

    @staticmethod
    def get_device_properties(device=None):
        return _DeviceProperties("cpu", psutil.virtual_memory().total, 0, 0, psutil.cpu_count() or 1)

    @staticmethod
    def synchronize(device=None) -> None:
        return None

    # -- memory: report the process's RSS, there is no separate device pool -----------------------
    def _rss(self) -> int:
        rss = psutil.Process().memory_info().rss
        self._peak_rss = max(self._peak_rss, rss)
        return rss

    def memory_allocated(self, device=None) -> int:
        return self._rss()

    def memory_reserved(self, device=None) -> int:
        return self._rss()

    def max_memory_allocated(self, device=None) -> int:
        self._rss()
        return self._peak_rss

    def max_memory_reserved(self, device=None) -> int:
        return self.max_memory_allocated(device)

    def reset_peak_memory_stats(self, device=None) -> None:
        self._peak_rss = 0

    def reset_accumulated_memory_stats(self, device=None) -> None:
        return None

    @staticmethod
    def mem_get_info(device=None) -> tuple[int, int]:
        vm = psutil.virtual_memory()
        return vm.available, vm.total

    @staticmethod
    def empty_cache() -> None:
        return None

    @staticmethod
    def ipc_collect() -> None:
        return None

    @staticmethod
    def set_per_process_memory_fraction(fraction, device=None) -> None:
        return None

    # -- RNG: the CPU generator is torch's default generator ---------------------------------------
    @staticmethod
    def get_rng_state(device=None) -> torch.Tensor:
        return torch.get_rng_state()

    @staticmethod
    def set_rng_state(new_state, device=None) -> None:
        torch.set_rng_state(new_state)

    @staticmethod
    def manual_seed(seed: int) -> None:
        torch.manual_seed(seed)

    @staticmethod
    def manual_seed_all(seed: int) -> None:
        torch.manual_seed(seed)


cpu_device_module = CpuDeviceModule()
