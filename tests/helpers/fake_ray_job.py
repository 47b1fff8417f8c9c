"""A stand-in for verl's entry point on a shared Ray cluster (tests/rig/test_shared_cluster.py): it reads
the address and the runtime env's variables from the launcher's hydra overrides as verl's driver
would, connects, starts the rollout server's named actor (``hf_cpu_server_0_0``, the name every run
uses) and one named as TransferQueue names its controller (in the fixed namespace ``transfer_queue``,
through the CPU backend's patch: tq_namespace.py), waits at its start gate as verl's trainer does, then
asks both actors what their process sees and writes that as its one metrics line."""

from __future__ import annotations

import json
import os
import sys

import ray

from verl_async_rm_rig.cpu_backend.names import server_actor_name
from verl_async_rm_rig.cpu_backend.tq_namespace import TQ_NAMESPACE, JobNamespacedActorClass, JobNamespacedRay
from verl_async_rm_rig.cpu_backend.start_gate import GATE_ENV, wait_at_gate

ADDRESS = "+ray_kwargs.ray_init.address="
ENV_VAR = "+ray_kwargs.ray_init.runtime_env.env_vars."


@ray.remote(num_cpus=0)
class Probe:
    def seen(self) -> dict:
        return {"pid": os.getpid(), "metrics_path": os.environ.get("VERL_FILE_LOGGER_PATH"),
                "namespace": ray.get_runtime_context().namespace}


def from_overrides(argv: list[str]) -> tuple[str, dict[str, str]]:
    address, env_vars = None, {}
    for arg in argv:
        if arg.startswith(ADDRESS):
            address = json.loads(arg[len(ADDRESS):])
        elif arg.startswith(ENV_VAR):
            key, value = arg[len(ENV_VAR):].split("=", 1)
            env_vars[key] = json.loads(value)
    return address, env_vars


if __name__ == "__main__":
    address, env_vars = from_overrides(sys.argv[1:])
    ray.init(address=address, runtime_env={"env_vars": env_vars})
    probe = Probe.options(name=server_actor_name(0, 0)).remote()
    first = ray.get(probe.seen.remote())
    # as transfer_queue.interface creates its controller and its clients find it, patched
    owned = JobNamespacedActorClass(Probe).options(name="TransferQueueController", namespace=TQ_NAMESPACE).remote()
    # both actors up before the gate, as verl's trainer has its workers up there: a worker the raylet
    # spawned after the run was frozen at its gate would not be frozen with it
    ray.get(owned.seen.remote())
    wait_at_gate(os.environ[GATE_ENV])
    seen = ray.get(probe.seen.remote())
    assert seen["pid"] == first["pid"]
    controller = ray.get(JobNamespacedRay(ray).get_actor("TransferQueueController", namespace=TQ_NAMESPACE).seen.remote())
    seen["tq_metrics_path"] = controller["metrics_path"]
    with open(os.environ["VERL_FILE_LOGGER_PATH"], "w") as f:
        f.write(json.dumps({"step": 1, "data": {"training/global_step": 1, **{f"probe/{k}": v for k, v in seen.items()}}}) + "\n")
