"""A start gate between a trainer's start-up and its training loop, so several runs can start up at
once and then train one at a time.

Why: on the CPU backend a verl run spends most of its wall time starting (Ray, then six or so
worker processes that each import verl, one stage after another, leaving the cores idle between
stages). The demo starts all its runs together and lets each train alone: start-up overlaps, the
measured training loops never do.

How: with ``VERL_ASYNC_RM_CPU_START_GATE=<path>`` in the trainer's environment, the first
``_validate`` of verl's trainer (v0 ``RayPPOTrainer``, v1 ``PPOTrainer``; the validation before
step 1, which also absorbs the one-time warm-up) writes ``<path>.waiting`` when it returns and then
blocks until ``<path>`` exists. The loop, and every step timer in it, starts after the gate, so the
wait is not in any step time. Installed by :func:`verl_async_rm_rig.cpu_backend.activate` only when the
variable is set, and only once the trainer module is imported (no import cost elsewhere).

The step clock: a gated v1 trainer also appends the wall-clock start of each step (its
``on_step_begin``, the first call inside verl's step timer) to ``<path>.steps``. With the passed
marker it places every step on the wall clock: what a trainer does between the gate and step 1
(the strategies' set-up, verl's warm-up batches) is outside every step timer but not outside the
loop, and the judge calls are drawn where they happened (bench/e2e.py).
"""

from __future__ import annotations

import functools
import os
import time
from pathlib import Path
from types import ModuleType

GATE_ENV = "VERL_ASYNC_RM_CPU_START_GATE"
# The trainer classes whose ``_validate`` carries the gate (both listed in verl_internals.py).
GATED = (("verl.trainer.ppo.ray_trainer", "RayPPOTrainer"), ("verl.trainer.ppo.v1.trainer_base", "PPOTrainer"))
POLL_S = 0.05


def waiting_marker(gate: str | os.PathLike) -> Path:
    """The file a trainer writes when it has started up and waits at ``gate``."""
    return Path(f"{os.fspath(gate)}.waiting")


def passed_marker(gate: str | os.PathLike) -> Path:
    """The file a trainer writes when it passes the gate: the wall-clock time (Unix seconds) its
    training loop starts, which places the run's judge log on its step timeline."""
    return Path(f"{os.fspath(gate)}.passed")


def step_clock(gate: str | os.PathLike) -> Path:
    """The file a gated v1 trainer appends each step's start to: Unix seconds, one a line."""
    return Path(f"{os.fspath(gate)}.steps")


def read_step_clock(gate: str | os.PathLike) -> list[float]:
    """The steps' start times written so far: whole lines only (a line cut by a killed writer, which
    may still read as a number, is left out)."""
    path = step_clock(gate)
    if not path.exists():
        return []
    return [float(line) for line in path.read_text().split("\n")[:-1]]


def open_gate(gate: str | os.PathLike) -> None:
    Path(gate).touch()


def wait_at_gate(gate: str | os.PathLike, timeout_s: float | None = None) -> float:
    """Announce arrival, then block until the gate file exists; returns the seconds waited.

    No timeout by default: the launcher owns the run's timeout and kills the whole process tree."""
    start = time.monotonic()
    waiting_marker(gate).write_text(f"{os.getpid()}\n")
    while not Path(gate).exists():
        if timeout_s is not None and time.monotonic() - start > timeout_s:
            raise TimeoutError(f"start gate {gate} stayed closed for {timeout_s} s")
        time.sleep(POLL_S)
    passed_marker(gate).write_text(f"{time.time()!r}\n")
    return time.monotonic() - start


def _gate_first_validation(module: ModuleType, class_name: str) -> None:
    from . import verl_internals

    verl_internals.check([entry for entry in verl_internals.START_GATE if entry[0] == module.__name__])
    cls = getattr(module, class_name)
    original = cls._validate
    if getattr(original, "_verl_async_rm_gate", False):
        return

    @functools.wraps(original)
    def _validate(self, *args, **kwargs):
        metrics = original(self, *args, **kwargs)
        gate = os.environ.get(GATE_ENV)
        if gate and not getattr(self, "_verl_async_rm_gate_passed", False):
            self._verl_async_rm_gate_passed = True
            waited = wait_at_gate(gate)
            print(f"[cpu-backend] start gate {gate} opened after {waited:.1f} s", flush=True)
        return metrics

    _validate._verl_async_rm_gate = True
    cls._validate = _validate
    if hasattr(cls, "on_step_begin"):  # v1's hook; v0's monolithic fit has none (no step clock there)
        _stamp_step_starts(cls)


def _stamp_step_starts(cls) -> None:
    original = cls.on_step_begin
    if getattr(original, "_verl_async_rm_gate", False):
        return

    @functools.wraps(original)
    def on_step_begin(self, *args, **kwargs):
        gate = os.environ.get(GATE_ENV)
        if gate:
            with open(step_clock(gate), "a") as f:
                f.write(f"{time.time()!r}\n")
        return original(self, *args, **kwargs)

    on_step_begin._verl_async_rm_gate = True
    cls.on_step_begin = on_step_begin


def install_if_requested() -> bool:
    """PATCH RayPPOTrainer._validate and PPOTrainer._validate (runtime, not on disk), when they are
    imported and only if ``VERL_ASYNC_RM_CPU_START_GATE`` is set. A run without validation before
    step 1 has no gate: the launcher refuses that combination (``CPURunConfig``)."""
    if not os.environ.get(GATE_ENV):
        return False
    from verl_async_rm.integration.import_hooks import after_import

    for module_name, class_name in GATED:
        after_import(module_name, functools.partial(_gate_first_validation, class_name=class_name))
    return True
