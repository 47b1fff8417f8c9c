"""Freeze the start-up heap before the training loop, in the trainer and in its workers.

Why: a verl process carries roughly 0.6 M long-lived objects from its imports and start-up, and
CPython runs a full (generation 2) collection once the objects promoted since the last one exceed a
quarter of that: each costs ~0.2 s on the CPU backend, all of it on the step's critical path. Our
strategies keep a generated batch alive across a step and split each update into one call per
mini-batch, so more objects live long enough to be promoted, and a full collection lands inside
a ten-step run where stock verl's does not (measured: one in the trainer and one in the actor
worker at steps 9-10). ``gc.collect(); gc.freeze()`` once, after validation and before step 1,
moves the start-up heap to the permanent generation: later full collections scan only what
training allocated (milliseconds). Ray Serve does the same for its replicas
(``RAY_SERVE_FREEZE_GC_ON_STARTUP``). The cost: garbage cycles among the frozen objects are never
collected, which is bounded by the start-up heap; set ``VERL_ASYNC_RM_FREEZE_HEAP=0`` to keep
CPython's default.
"""

from __future__ import annotations

import gc
import os

FREEZE_ENV = "VERL_ASYNC_RM_FREEZE_HEAP"


def freeze_startup_heap() -> int:
    """Collect, then freeze every object alive now; returns how many were frozen (0: turned off)."""
    if os.environ.get(FREEZE_ENV, "1").strip().lower() in ("0", "false", "no", "off"):
        return 0
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


def freeze_worker_heaps(*worker_groups) -> int:
    """The same in every worker of each group that offers it (our worker classes; others and None:
    skipped); returns the fewest objects frozen in any worker (0: none froze, or turned off)."""
    counts = []
    for group in worker_groups:
        freeze = getattr(group, "freeze_startup_heap", None) if group is not None else None
        if freeze is not None:
            counts.extend(freeze())  # one count per worker (Dispatch.ONE_TO_ALL)
    return min(counts, default=0)


def freeze_trainer_and_workers(*worker_groups) -> dict:
    """Freeze the workers of each group (see ``freeze_worker_heaps``), then this process; returns the
    per-step metrics, so a run's log shows the freeze happened on both sides (0: it did not)."""
    workers_frozen = freeze_worker_heaps(*worker_groups)
    return {"async_rm/frozen_heap_objects/trainer": freeze_startup_heap(),
            "async_rm/frozen_heap_objects/workers": workers_frozen}
