"""TransferQueue's named actors in their run's own namespace, for runs that share one Ray cluster.

Why: verl's v1 trainer stores its batches in TransferQueue, whose controller (and, with its Ray
storage backend, its object storage) is a named actor in a fixed namespace, ``transfer_queue``
(``transfer_queue/interface.py``, ``transfer_queue/storage/clients/ray_storage_client.py``). Runs that
are jobs of one cluster (shared_cluster.py: the demo's lanes) would find the first run's controller
and use it: the demo's second v1 lane hung at its first TransferQueue call after validation, on a
controller frozen with the first lane at its start gate, and two lanes training at once would mix
their batches. Here that namespace becomes the job's own, ``transfer_queue_<job id>``: every process
of a run (its TaskRunner and its workers) is a worker of the run's job, so a run's controller and
clients meet, and no other run's. A run on a cluster of its own has one job: nothing changes there.

:func:`install` patches ``transfer_queue``'s modules in this process (the CPU backend's ``activate``
calls it in every verl process of a CPU run); it imports nothing verl does not import anyway.
"""

from __future__ import annotations

import importlib
from typing import Any

TQ_NAMESPACE = "transfer_queue"
# transfer_queue's modules that name their actors in TQ_NAMESPACE, and those actors' classes there
NAMED_ACTORS = {"transfer_queue.interface": ("TransferQueueController",),
                "transfer_queue.storage.clients.ray_storage_client": ("RayObjectRefStorage",)}
_MARK = "_verl_async_rm_cpu_job_namespace"


def job_namespace(namespace: Any) -> Any:
    """``transfer_queue`` as this process's job's own namespace; any other namespace unchanged."""
    if namespace != TQ_NAMESPACE:
        return namespace
    import ray

    return f"{TQ_NAMESPACE}_{ray.get_runtime_context().get_job_id()}"


class JobNamespacedRay:
    """The ``ray`` module as a patched module sees it: ``get_actor`` in the job's namespace."""

    def __init__(self, ray_module):
        self._ray = ray_module

    def __getattr__(self, name: str):
        return getattr(self._ray, name)

    def get_actor(self, name: str, namespace: Any = None, **kwargs):
        return self._ray.get_actor(name, namespace=job_namespace(namespace), **kwargs)


class JobNamespacedActorClass:
    """A Ray actor class whose ``options(namespace=...)`` names the job's namespace."""

    def __init__(self, actor_class):
        self._actor_class = actor_class

    def __getattr__(self, name: str):
        return getattr(self._actor_class, name)

    def options(self, **kwargs):
        if "namespace" in kwargs:
            kwargs["namespace"] = job_namespace(kwargs["namespace"])
        return self._actor_class.options(**kwargs)


def install() -> bool:
    """Patch transfer_queue's modules that name actors in ``transfer_queue`` (idempotent). False when
    transfer_queue is not installed (a tree without verl's v1 trainer); a module of it that no longer
    has what is patched is an error, not a silent no-op (its runs would hang on a shared cluster)."""
    try:
        importlib.import_module("transfer_queue")
    except ImportError:
        return False
    for module_name, classes in NAMED_ACTORS.items():
        module = importlib.import_module(module_name)
        if getattr(module, _MARK, False):
            continue
        missing = [name for name in ("ray", *classes) if not hasattr(module, name)]
        if missing:
            raise RuntimeError(f"{module_name} has no {missing}: the CPU backend cannot give its named actors "
                               f"each run's own namespace (cpu_backend/tq_namespace.py)")
        module.ray = JobNamespacedRay(module.ray)
        for name in classes:
            setattr(module, name, JobNamespacedActorClass(getattr(module, name)))
        setattr(module, _MARK, True)
    return True
