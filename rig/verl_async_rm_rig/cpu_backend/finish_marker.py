"""A trainer's "training finished" marker, so the launcher need not sit through a graceful teardown.

Why: after its last step a CPU run spends ~3.5 s of wall time exiting (measured on a demo lane: the
driver's Ray shutdown and interpreter exit, 1.7 CPU-s, while the workers wind down), and nothing
reads what happens then. The demo trains its five lanes one after another, so that is ~17 s of its
four minutes; the e2e benchmark pays it on every run. With ``VERL_ASYNC_RM_CPU_FINISHED=<path>`` in
its environment, our entry point as the launcher runs it (entry.py) writes ``<path>`` once verl's run has returned
(the loop, its final validation and checkpoints done, every metrics line written: verl's file logger
is unbuffered). The launcher then ends the run's processes itself, as it does after any run
(``RunningTrainer.close``), and counts the run as finished. Without the variable, or on verl's own
entry point, nothing changes: the launcher waits for the process to exit.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

FINISHED_ENV = "VERL_ASYNC_RM_CPU_FINISHED"


def mark_finished() -> bool:
    """Write the marker if the launcher asked for one; True if written."""
    path = os.environ.get(FINISHED_ENV)
    if not path:
        return False
    sys.stdout.flush()  # the launcher may end this process as soon as it sees the marker
    sys.stderr.flush()
    Path(path).write_text(f"{time.time()!r}\n")
    return True
