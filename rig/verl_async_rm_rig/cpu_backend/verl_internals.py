"""Every verl 0.9.1 internal the CPU backend touches that is not a documented, stable API: module
globals it registers into or patches, helpers whose signature it relies on, trainer methods its start
gate wraps. The product keeps its own list (``verl_async_rm.verl_internals``) in the same form, checked
by the same function. Each group here is checked where it is first used, in the process that uses it
(:func:`check`): at activation, when verl imports a module a patch changes, in the light driver's host;
so a verl that moved one fails there, by name, not later as a silent skip or an AttributeError.

Each entry: (module, dotted attribute, parameters the code relies on (present, in this order) or
None, who relies on it). Light to import (no verl import).
"""

from __future__ import annotations

from typing import Optional

from verl_async_rm.verl_compat import VerlVersionError, check_version
from verl_async_rm.verl_internals import missing, missing_instance_attributes

Entry = tuple[str, str, Optional[tuple[str, ...]], str]

# Checked when the backend activates, inside ``import verl`` (modules light enough to import there).
AT_ACTIVATION: tuple[Entry, ...] = (
    ("verl.plugin.platform.platform_manager", "_current_platform", None, "__init__.py: platform resolved early"),
    ("verl.plugin.platform.platform_manager", "PlatformRegistry", None, "__init__.py"),
    ("verl.plugin.platform.platform_manager", "set_platform", None, "__init__.py"),
    ("verl.plugin.platform.platform_base", "PlatformBase", None, "cpu_platform.py"),
    ("verl.utils.distributed", "initialize_global_process_group_ray", ("timeout_second", "backend"), "__init__.py patches it"),
    ("verl.workers.rollout.base", "_ROLLOUT_REGISTRY", None, "__init__.py registers the hf_cpu adapter"),
    ("verl.workers.rollout.base", "BaseRollout", None, "rollout.py"),
    ("verl.workers.rollout.replica", "RolloutReplicaRegistry", None, "__init__.py"),
    ("verl.workers.rollout.replica", "RolloutReplica.launch_servers", ("self",), "rollout.py"),
    ("verl.workers.rollout.replica", "TokenOutput", None, "server.py: what its answers unpickle as"),
    ("verl.checkpoint_engine.base", "ColocatedCheckpointEngine", None, "rollout.py"),
)
# Checked by each patch when verl imports the module it patches (__init__.py, start_gate.py).
VALUE_HEAD_LOADER: tuple[Entry, ...] = (
    ("verl.utils.model", "load_valuehead_model", ("local_path", "torch_dtype", "model_config", "trust_remote_code"),
     "__init__.py patches it"),
)
OFFLOAD_POLICY: tuple[Entry, ...] = (
    ("verl.workers.engine.fsdp.transformer_impl", "CPUOffloadPolicy", None, "__init__.py patches it (no pinning on CPU)"),
)
MASTER_ADDRESS: tuple[Entry, ...] = (
    ("verl.single_controller.ray.base", "RayWorkerGroup._get_master_addr_port",
     ("self", "pg", "bundle_index", "master_port_range"), "__init__.py patches it (no Ray task on one node)"),
    ("verl.single_controller.ray.base", "get_master_addr_port", None, "__init__.py calls its body in process"),
)
START_GATE: tuple[Entry, ...] = (
    ("verl.trainer.ppo.ray_trainer", "RayPPOTrainer._validate", ("self", "merged"), "start_gate.py wraps it"),
    ("verl.trainer.ppo.v1.trainer_base", "PPOTrainer._validate", ("self",), "start_gate.py wraps it"),
    ("verl.trainer.ppo.v1.trainer_base", "PPOTrainer.on_step_begin", ("self",),
     "start_gate.py stamps each step's start (the step clock)"),
)
# Checked by the light driver's TaskRunnerHost, in its process (the driver itself never imports verl).
LIGHT_DRIVER: tuple[Entry, ...] = (
    ("verl.trainer.main_ppo", "run_ppo", ("config", "task_runner_class"), "light_driver.py reproduces its ray.init"),
    ("verl.trainer.constants_ppo", "get_ppo_ray_runtime_env", ("config",), "light_driver.py reproduces it (no GPU)"),
    ("verl.trainer.constants_ppo", "PPO_RAY_RUNTIME_ENV", None, "light_driver.py: its env vars"),
    ("verl.trainer.main_ppo", "TaskRunnerV1.__ray_actor_class__.run", ("self", "config"), "light_driver.py runs it in its host"),
    ("verl.trainer.main_ppo_v0", "TaskRunner.__ray_actor_class__.run", ("self", "config"), "light_driver.py runs it in its host"),
)
INTERNALS: tuple[Entry, ...] = (*AT_ACTIVATION, *VALUE_HEAD_LOADER, *OFFLOAD_POLICY, *MASTER_ADDRESS, *START_GATE, *LIGHT_DRIVER)

# Instance attributes (set in a verl method, so not on the class): (module, class, attribute, the
# method that sets it, who relies on it). Checked with MASTER_ADDRESS.
INSTANCE_ATTRIBUTES: tuple[tuple[str, str, str, str, str], ...] = (
    ("verl.single_controller.ray.base", "RayWorkerGroup", "_master_addr", "__init__", "the master address patch"),
    ("verl.single_controller.ray.base", "RayWorkerGroup", "_master_port", "__init__", "the master address patch"),
    # Ray's, as verl's task is a Ray remote function: the function it wraps
    ("ray.remote_function", "RemoteFunction", "_function", "__init__", "the master address patch"),
)


def check(internals=INTERNALS, instance_attributes=()) -> str:
    """Raise VerlVersionError naming every internal the installed verl lacks; returns its version."""
    version = check_version(feature="the CPU backend")
    problems = [*missing(internals), *missing_instance_attributes(instance_attributes)]
    if problems:
        raise VerlVersionError(f"verl {version} lacks what the CPU backend relies on:\n  " + "\n  ".join(problems))
    return version
