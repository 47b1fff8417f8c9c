"""A stand-in for verl's entry point in the launcher's start-gate test: it 'starts up', waits at the
gate exactly as verl's trainer does with the CPU backend's patch, then writes one metrics line.
With ``FAKE_TRAINER_BUSY_CHILD=1`` it first starts a child that keeps a core busy until the trainer
exits (as a parked run's Ray cluster keeps taking CPU). With ``FAKE_TRAINER_TEARDOWN_S=<s>`` it then
marks its training finished, as ``verl_async_rm.main_ppo`` does, and takes that long to exit (as
Ray's teardown does); ``FAKE_TRAINER_EXIT`` is its exit code."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from verl_async_rm_rig.cpu_backend.finish_marker import mark_finished
from verl_async_rm_rig.cpu_backend.start_gate import GATE_ENV, wait_at_gate

BUSY_CHILD = """
import os, sys
parent = int(sys.argv[1])
while True:
    for _ in range(100_000):
        pass
    try:
        os.kill(parent, 0)
    except ProcessLookupError:
        break
"""

if __name__ == "__main__":
    if os.environ.get("FAKE_TRAINER_BUSY_CHILD"):
        subprocess.Popen([sys.executable, "-c", BUSY_CHILD, str(os.getpid())])
    wait_at_gate(os.environ[GATE_ENV])
    with open(os.environ["VERL_FILE_LOGGER_PATH"], "w") as f:
        f.write(json.dumps({"step": 1, "data": {"training/global_step": 1, "timing_s/step": 0.5}}) + "\n")
    if os.environ.get("FAKE_TRAINER_TEARDOWN_S"):
        mark_finished()
        time.sleep(float(os.environ["FAKE_TRAINER_TEARDOWN_S"]))
    sys.exit(int(os.environ.get("FAKE_TRAINER_EXIT", "0")))
