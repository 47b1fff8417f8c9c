"""Worker subclasses that let the trainer update one mini-batch at a time and still do, per step,
what verl does in one update call: step the LR scheduler once, load (with parameter/optimizer
offload) once and offload once, and run epochs 2..E over the whole batch.

verl's ``train_mini_batch`` steps the scheduler on its last mini-batch, runs ``epochs`` over the data
it is given, and loads on entry / offloads on exit (``BaseEngineCtx``). The trainer sends, with each
call, the flags of ``plan.UpdateCall`` (``UPDATE_KEYS``); the worker then shadows its engine's
``lr_scheduler_step`` for that call, overrides ``epochs``, and moves the model itself once per step
(verl's automatic moves are disabled for the calls in between). Shadowing is an attribute on this
engine instance only: verl's files and classes stay untouched, and every engine kind is covered.

Every move of the engine (``engine.to``) inside an update call is counted and returned with the
call's metrics (``LOADS_METRIC``, ``OFFLOADS_METRIC``), so the per-step count is observable.
"""

from __future__ import annotations

from contextlib import contextmanager

from verl.single_controller.base.decorator import Dispatch, make_nd_compute_dataproto_dispatch_fn, register
from verl.utils import tensordict_utils as tu
from verl.utils.device import get_device_name
from verl.workers.engine_workers import ActorRolloutRefWorker, TrainingWorker
from verl_async_rm.strategies.heap import freeze_startup_heap

STEP_LR_KEY = "async_rm_step_lr"
EPOCHS_KEY = "async_rm_epochs"
LOAD_KEY = "async_rm_load"
OFFLOAD_KEY = "async_rm_offload"
UPDATE_KEYS = (STEP_LR_KEY, EPOCHS_KEY, LOAD_KEY, OFFLOAD_KEY)
# Returned with each update's metrics; verl prefixes them with "actor/" or "critic/".
LOADS_METRIC = "async_rm_loads"
OFFLOADS_METRIC = "async_rm_offloads"


def update_flags(call) -> dict:
    """The per-call keys the trainer attaches to an update's data (``call``: ``plan.UpdateCall``)."""
    return {STEP_LR_KEY: call.step_lr, EPOCHS_KEY: call.epochs, LOAD_KEY: call.load, OFFLOAD_KEY: call.offload}


@contextmanager
def lr_step_suppressed(engine, suppress: bool):
    if not suppress:
        yield
        return
    engine.lr_scheduler_step = lambda: None  # shadows the method for this call only
    try:
        yield
    finally:
        del engine.lr_scheduler_step


class _MoveCounter:
    """Counts, during one update call, the engine's loads (moves on entering verl's train-mode
    context, or ours) and offloads (on leaving it, or ours). On the CPU backend the device *is*
    "cpu", so a move is classified by where it happens, not by its target."""

    def __init__(self, engine):
        self.engine = engine
        self.loads = 0
        self.offloads = 0
        self._moves = 0

    def __enter__(self):
        engine, counter = self.engine, self
        to, train_mode = type(engine).to, engine.train_mode

        def counted_to(device, model=True, optimizer=True, grad=True):
            if model or optimizer:
                counter._moves += 1
            return to(engine, device, model=model, optimizer=optimizer, grad=grad)

        class Counted:
            def __init__(self, ctx):
                self.ctx = ctx

            def __enter__(self):
                before = counter._moves
                result = self.ctx.__enter__()
                counter.loads += counter._moves > before
                return result

            def __exit__(self, *exc):
                before = counter._moves
                result = self.ctx.__exit__(*exc)
                counter.offloads += counter._moves > before
                return result

        engine.to = counted_to
        engine.train_mode = lambda **kwargs: Counted(train_mode(**kwargs))
        return self

    def __exit__(self, *exc):
        del self.engine.to
        del self.engine.train_mode

    def move(self, device: str, load: bool) -> None:
        """What verl's train-mode context does on entry (load) and exit (offload) with offload on."""
        engine = self.engine
        if not engine.is_param_offload_enabled and not engine.is_optimizer_offload_enabled:
            return
        engine.to(
            device=device,
            model=engine.is_param_offload_enabled,
            optimizer=engine.is_optimizer_offload_enabled,
            grad=engine.is_param_offload_enabled,
        )
        if load:
            self.loads += 1
        else:
            self.offloads += 1


def run_update(engine, data, role: str, update):
    """Run verl's update ``update(data)`` under the trainer's per-call flags (absent: verl's own call)."""
    flags = {key: tu.pop(data, key=key, default=None) for key in UPDATE_KEYS}
    if flags[STEP_LR_KEY] is None:  # a call from verl's own code path
        return update(data)
    with _MoveCounter(engine) as moves:
        if flags[EPOCHS_KEY] is not None:
            tu.assign_non_tensor(data, epochs=int(flags[EPOCHS_KEY]))
        # One load per step on the first call, one offload on the last; none in between.
        tu.assign_non_tensor(data, disable_auto_offload=True)
        if flags[LOAD_KEY]:
            moves.move(get_device_name(), load=True)
        with lr_step_suppressed(engine, suppress=not flags[STEP_LR_KEY]):
            output = update(data)
        if flags[OFFLOAD_KEY]:
            moves.move("cpu", load=False)
    if output is not None:  # None on ranks that report no metrics
        metrics = dict(tu.get(output, "metrics"))
        metrics[LOADS_METRIC], metrics[OFFLOADS_METRIC] = moves.loads, moves.offloads
        tu.assign_non_tensor(output, metrics=metrics)
    return output


class AsyncRewardActorRolloutRefWorker(ActorRolloutRefWorker):
    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn(mesh_name="actor"))
    def update_actor(self, data):
        return run_update(self.actor.engine, data, "actor", super().update_actor)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def freeze_startup_heap(self) -> int:
        """strategies/heap.py: called by the trainer once, before step 1."""
        return freeze_startup_heap()


class AsyncRewardTrainingWorker(TrainingWorker):
    """The critic's worker."""

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn(mesh_name="train"), blocking=False)
    def train_mini_batch(self, data):
        return run_update(self.engine, data, "critic", super().train_mini_batch)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def freeze_startup_heap(self) -> int:
        """strategies/heap.py: called by the trainer once, before step 1."""
        return freeze_startup_heap()
