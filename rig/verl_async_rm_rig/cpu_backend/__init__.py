"""Run verl's real PPO/GRPO trainer on CPU: platform, HF rollout, tiny model, toy task, launcher.

Importing this package is cheap (no verl, Ray or torch import). The verl-facing parts are
registered by :func:`activate`, which the package's ``verl.plugins`` entry point calls in every
verl process (driver and Ray workers) when ``VERL_ASYNC_RM_CPU=1``; the launcher sets it.

Typical use::

    python -m verl_async_rm_rig.cpu_backend --trainer v1 --steps 4 --out /tmp/run
"""

from __future__ import annotations

import os

ENV_FLAG = "VERL_ASYNC_RM_CPU"
TMP_DIR_ENV = "VERL_ASYNC_RM_CPU_TMPDIR"  # per-run scratch dir the launcher creates and removes

__all__ = ["ENV_FLAG", "activate", "activate_if_requested", "is_requested"]

_activated = False


def is_requested() -> bool:
    return os.environ.get(ENV_FLAG, "0").strip().lower() in ("1", "true", "yes")


def activate_if_requested() -> bool:
    """Called from the rig's ``verl.plugins`` entry point on every ``import verl``; a no-op unless requested."""
    if not is_requested():
        return False
    activate()
    return True


def activate() -> None:
    """Register the CPU platform and the ``hf_cpu`` rollout with verl (idempotent, per process)."""
    global _activated
    if _activated:
        return
    from verl_async_rm.verl_compat import check_version

    from . import verl_internals

    check_version(feature="the CPU backend")
    # Before the internals check: it imports checkpoint_engine.base, which binds the function by name.
    _patch_process_group_backend()
    verl_internals.check(verl_internals.AT_ACTIVATION)
    _register_platform()
    _register_rollout()
    _patch_value_head_loader()
    _patch_offload_policy_pinning()
    _patch_master_addr_port()
    from . import tq_namespace

    tq_namespace.install()  # v1's TransferQueue per run on a shared Ray cluster (tq_namespace.py)
    from .start_gate import install_if_requested

    install_if_requested()  # the demo's gate between start-up and training (start_gate.py)
    # verl picks the training engine by (device, vendor); the FSDP engines are registered for
    # "cuda" only, and are plain torch, so they run on CPU once selected (verl's own override).
    os.environ.setdefault("VERL_ENGINE_DEVICE", "cuda")
    _activated = True


def _register_platform() -> None:
    from verl.plugin.platform import platform_manager

    from .cpu_platform import PLATFORM_NAME, PlatformCPU

    platform_manager.PlatformRegistry.register(platform=PLATFORM_NAME)(PlatformCPU)
    os.environ["VERL_PLATFORM"] = PLATFORM_NAME  # verl's own override of auto-detection
    current = platform_manager._current_platform
    if current is not None and not isinstance(current, PlatformCPU):
        # Something resolved the platform before the plugin ran (it fell back to "nvidia").
        platform_manager.set_platform(PlatformCPU())


def _patch_process_group_backend() -> None:
    """PATCH verl.utils.distributed.initialize_global_process_group_ray (runtime, not on disk).

    Why: it builds ``f"cpu:gloo,{device}:{backend}"``, which on CPU is ``cpu:gloo,cpu:gloo`` and
    torch rejects duplicated device types. We default ``backend`` to ``"cpu:gloo"``; callers that
    pass one (checkpoint_engine/base.py already passes "cpu:gloo") are untouched. Consumers import
    the function by name (engine_workers.py, checkpoint_engine/base.py) after ``import verl`` has
    run this plugin, so they bind the wrapper.
    """
    import functools

    import verl.utils.distributed as dist_utils

    from verl_async_rm.verl_compat import VerlVersionError, verl_version

    original = getattr(dist_utils, "initialize_global_process_group_ray", None)
    if original is None:
        raise VerlVersionError(
            f"verl {verl_version()}: verl.utils.distributed.initialize_global_process_group_ray is missing"
        )
    if getattr(original, "_verl_async_rm_cpu", False):
        return

    @functools.wraps(original)
    def initialize_global_process_group_ray(timeout_second=None, backend=None):
        # Second reason for the wrapper: verl picks MASTER_PORT by binding port 0 and releasing it;
        # on a busy box another process grabbed it before the TCPStore bound it (EADDRINUSE, seen
        # in ~1 of 3 runs here). A single-rank group needs no port: rendezvous through a fresh file
        # (verl reads DIST_INIT_METHOD for exactly this). Multi-rank groups keep verl's env://.
        if os.environ.get("WORLD_SIZE", "1") == "1" and not os.environ.get("DIST_INIT_METHOD"):
            import tempfile

            # Under the launcher's per-run temp dir (removed after the run) when there is one.
            parent = os.environ.get(TMP_DIR_ENV) or None
            store = os.path.join(tempfile.mkdtemp(prefix="verl_pg_", dir=parent), "store")
            os.environ["DIST_INIT_METHOD"] = f"file://{store}"
            try:
                return original(timeout_second=timeout_second, backend=backend or "cpu:gloo")
            finally:
                os.environ.pop("DIST_INIT_METHOD", None)
        return original(timeout_second=timeout_second, backend=backend or "cpu:gloo")

    initialize_global_process_group_ray._verl_async_rm_cpu = True
    dist_utils.initialize_global_process_group_ray = initialize_global_process_group_ray


def _patch_value_head_loader() -> None:
    """PATCH verl.utils.model.load_valuehead_model (runtime, not on disk), once that module is imported.

    Why: it loads the critic's value model with ``attn_implementation="flash_attention_2"``
    hard-coded, which cannot load on CPU, and then falls back to trl (not a verl dependency). On CPU
    the same class, ``AutoModelForTokenClassification`` with one label, loads with eager attention.
    The FSDP engine imports the function by name inside ``_build_module``, at call time, so it binds
    the wrapper.
    """
    from verl_async_rm.integration.import_hooks import after_import

    from . import verl_internals

    def patch(module) -> None:
        verl_internals.check(verl_internals.VALUE_HEAD_LOADER)
        original = module.load_valuehead_model
        if getattr(original, "_verl_async_rm_cpu", False):
            return

        def load_valuehead_model(local_path, torch_dtype, model_config, trust_remote_code):
            from transformers import AutoModelForTokenClassification

            return AutoModelForTokenClassification.from_pretrained(
                pretrained_model_name_or_path=local_path, torch_dtype=torch_dtype, config=model_config,
                attn_implementation="eager", trust_remote_code=trust_remote_code,
            )

        load_valuehead_model._verl_async_rm_cpu = True
        module.load_valuehead_model = load_valuehead_model

    after_import("verl.utils.model", patch)


def _patch_offload_policy_pinning() -> None:
    """PATCH verl.workers.engine.fsdp.transformer_impl.CPUOffloadPolicy (runtime, not on disk), once
    that module is imported.

    Why: verl builds every forward-only FSDP2 engine (the reference policy) with
    ``CPUOffloadPolicy(pin_memory=True)``; pinning host memory needs an accelerator, so a reference
    model (KL in the reward or the loss) cannot load on CPU. On CPU the parameters already live in
    host memory: the same policy without pinning. The engine module imported the name at its top,
    so the module global is what it calls.
    """
    from verl_async_rm.integration.import_hooks import after_import

    from . import verl_internals

    def patch(module) -> None:
        verl_internals.check(verl_internals.OFFLOAD_POLICY)
        original = module.CPUOffloadPolicy
        if getattr(original, "_verl_async_rm_cpu", False):
            return

        def CPUOffloadPolicy(pin_memory: bool = True, **kwargs):  # noqa: N802 - stands in for the class
            return original(pin_memory=False, **kwargs)

        CPUOffloadPolicy._verl_async_rm_cpu = True
        module.CPUOffloadPolicy = CPUOffloadPolicy

    after_import("verl.workers.engine.fsdp.transformer_impl", patch)


def _patch_master_addr_port() -> None:
    """PATCH verl.single_controller.ray.base.RayWorkerGroup._get_master_addr_port (runtime, not on
    disk), once that module is imported.

    Why: verl finds a worker group's master address and a free port with a Ray task placed on the
    group's first bundle. The task starts a Ray worker process of its own (~1.3 CPU-s, ~100 MB, then
    idle for the whole run: the ``ray::IDLE`` of bench/startup_profile.py), one per worker group and
    run. When that bundle is on the caller's node, which it always is on the CPU backend's one-node
    clusters, the task's own function gives the same answer in the caller's process (the node's IP
    and a port free on it). Elsewhere verl's task runs as before.
    """
    import functools

    from verl_async_rm.integration.import_hooks import after_import

    from . import verl_internals

    def patch(module) -> None:
        verl_internals.check(verl_internals.MASTER_ADDRESS, verl_internals.INSTANCE_ATTRIBUTES)
        original = module.RayWorkerGroup._get_master_addr_port
        if getattr(original, "_verl_async_rm_cpu", False):
            return

        @functools.wraps(original)
        def _get_master_addr_port(self, pg, bundle_index=0, master_port_range=None):
            if self._master_addr is None and self._master_port is None and bundle_on_this_node(pg, bundle_index):
                # the remote function's body (Ray keeps it as _function), called here
                self._master_addr, self._master_port = module.get_master_addr_port._function(
                    master_port_range=master_port_range)
                return
            return original(self, pg, bundle_index=bundle_index, master_port_range=master_port_range)

        _get_master_addr_port._verl_async_rm_cpu = True
        module.RayWorkerGroup._get_master_addr_port = _get_master_addr_port

    after_import("verl.single_controller.ray.base", patch)


def bundle_on_this_node(pg, bundle_index: int) -> bool:
    """Whether bundle ``bundle_index`` of the (ready) placement group ``pg`` is on this process's node."""
    import ray
    from ray.util import placement_group_table

    return placement_group_table(pg)["bundles_to_node_id"].get(bundle_index) == ray.get_runtime_context().get_node_id()


def _register_rollout() -> None:
    from verl.workers.rollout import base as rollout_base
    from verl.workers.rollout.replica import RolloutReplicaRegistry

    from .names import ADAPTER_FQN, ROLLOUT_NAME

    # Both lazy: this runs inside ``import verl``, and rollout.py itself imports verl.
    RolloutReplicaRegistry.register(ROLLOUT_NAME, _load_replica_class)
    # Worker-side adapter table is private in verl 0.9.1 (no register function); checked by verl_internals.py.
    rollout_base._ROLLOUT_REGISTRY[(ROLLOUT_NAME, "async")] = ADAPTER_FQN


def _load_replica_class():
    from .rollout import HFCPUReplica

    return HFCPUReplica
