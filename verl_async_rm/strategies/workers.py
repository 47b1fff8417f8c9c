"""Worker subclasses that let the trainer update on one mini-batch without stepping the LR scheduler.

verl steps the scheduler on the last mini-batch of every ``update_actor`` / ``train_mini_batch``
call, so the pipeline's K calls per step would step it K times. The trainer marks every call but
the step's last with ``meta_info["async_rm_step_lr"] = False``; for that call these workers make
their engine's ``lr_scheduler_step`` a no-op (an attribute on this engine instance only: verl's files
and classes stay untouched, and every engine kind, FSDP or Megatron, is covered).
"""

from __future__ import annotations

from contextlib import contextmanager

from verl.single_controller.base.decorator import make_nd_compute_dataproto_dispatch_fn, register
from verl.utils import tensordict_utils as tu
from verl.workers.engine_workers import ActorRolloutRefWorker, TrainingWorker

STEP_LR_KEY = "async_rm_step_lr"


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


class AsyncRewardActorRolloutRefWorker(ActorRolloutRefWorker):
    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn(mesh_name="actor"))
    def update_actor(self, data):
        step_lr = tu.pop(data, key=STEP_LR_KEY, default=True)
        with lr_step_suppressed(self.actor.engine, suppress=not step_lr):
            return super().update_actor(data)


class AsyncRewardTrainingWorker(TrainingWorker):
    """The critic's worker."""

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn(mesh_name="train"), blocking=False)
    def train_mini_batch(self, data):
        step_lr = tu.pop(data, key=STEP_LR_KEY, default=True)
        with lr_step_suppressed(self.engine, suppress=not step_lr):
            return super().train_mini_batch(data)
