"""verl platform "cpu": device ``cpu``, collectives over gloo, Ray placement on fake GPUs.

verl 0.9.1 resolves its device through ``verl.plugin.platform`` and, on a box without GPUs,
falls back to "nvidia" (CUDA). This platform is registered under ``PLATFORM_NAME`` and selected
with ``VERL_PLATFORM=cpu`` (verl's own override), so every ``verl.utils.device`` helper answers for
the CPU.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Optional

import torch

from verl.plugin.platform.platform_base import PlatformBase

from .device_shim import cpu_device_module

PLATFORM_NAME = "cpu"


class PlatformCPU(PlatformBase):
    @property
    def device_name(self) -> str:
        return "cpu"

    @property
    def vendor_name(self) -> str:
        return "cpu"

    @property
    def device_module(self):
        return cpu_device_module

    def is_available(self) -> bool:
        return True

    def is_platform_available(self, use_smi_check=False) -> bool:
        # Never auto-detected: only chosen explicitly through VERL_PLATFORM=cpu.
        return False

    def current_device(self):
        return cpu_device_module.current_device()

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index: int) -> None:
        return None

    def synchronize(self, device_index: Optional[int] = None) -> None:
        return None

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        return None  # "expandable_segments" is a CUDA caching-allocator knob

    def empty_cache(self) -> None:
        return None

    def get_device_capability(self, device_index: int = 0):
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        # Ray sets it for the fake GPUs we place workers on; CPU torch ignores it.
        return "CUDA_VISIBLE_DEVICES"

    @contextmanager
    def nvtx_range(self, msg: str):
        yield

    def profiler_start(self) -> None:
        return None

    def profiler_stop(self) -> None:
        return None

    def ray_resource_name(self) -> str:
        # verl sizes its resource pools in GPUs; the launcher declares fake GPUs (ray_init.num_gpus).
        return "GPU"

    def ray_resource_options(self, num_gpus: float) -> dict[str, Any]:
        return {"num_gpus": num_gpus}

    def ray_noset_envvars(self) -> list[str]:
        return []

    def is_ipc_supported(self) -> bool:
        return False

    def cudart(self) -> Any:
        return None
