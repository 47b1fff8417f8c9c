"""The CPU backend's own trainer runs, shared by tests/rig/test_cpu_backend.py and
tests/rig/test_cpu_async_trainer.py (one session fixture, ``rig_runs``, in tests/rig/conftest.py):
four runs of verl's stock entry point (``python -m verl.trainer.main_ppo``), two at a time, each
started once the run it resumes has ended (one queue: a run on its own leaves a core idle for most
of its start-up; these were three fixtures and a test, each starting its trainers alone or in a pair).

- ``v0`` (test_cpu_backend): 6 steps, validation every 3, a checkpoint at 6;
- ``v0_resumed`` (test_cpu_backend): that run resumed to step 7 with the weight sync off;
- ``partial``, ``stale`` (test_cpu_async_trainer): verl's colocate_async trainer, see there."""

from __future__ import annotations

import copy
from pathlib import Path

from tests.helpers.trainer_queue import QueuedRun, run_queue

V0_TIMEOUT_S = 420.0
# colocate_async (test_cpu_async_trainer.py)
BATCH, N, RESPONSE = 8, 4, 16
# Per token: a batch of 8-16 tokens then takes 0.4-0.8 s, so a batch is still generating when a step
# samples the one before (the sample follows it by a poll and a few TransferQueue reads, ~0.1 s); the
# tiny model's own ~1 ms would finish first.
DECODE_S = 0.05
# Each weight update takes this long, as a GPU's does: verl's client re-sends an aborted request 1 s
# after its abort, and with the CPU step's ~0.3 s and no sync time the next step's fresh batch was
# queued first and overtook the resumed requests at every sample (no trajectory spanning two
# versions trained in 4 steps; names.WEIGHT_SYNC_S_ENV).
WEIGHT_SYNC_S = 1.5
ASYNC_STEPS = {"partial": 5, "stale": 3}
ASYNC_FLAGS = {"partial": [], "stale": ["trainer.v1.sampler.max_off_policy_threshold=1",
                                        "trainer.v1.sampler.max_off_policy_strategy=drop"]}


def configs(tmp_path_factory) -> dict:
    """name -> (its config, the name of the run it resumes or None); started in this order."""
    from verl_async_rm_rig.cpu_backend.launch import CPURunConfig, prepare_assets

    v0 = CPURunConfig(out_dir=str(tmp_path_factory.mktemp("cpu_v0")), trainer="v0", steps=6, seed=0, test_freq=3,
                      save_freq=6, timeout_s=V0_TIMEOUT_S)
    resumed = copy.deepcopy(v0)  # the same folder: verl resumes from its latest checkpoint (step 6)
    resumed.steps, resumed.weight_sync, resumed.val_before_train = 7, False, False
    assets = prepare_assets(CPURunConfig(out_dir=str(tmp_path_factory.mktemp("assets"))))
    out = {"v0": (v0, None)}
    for name in ASYNC_STEPS:
        if name == "stale":
            out["v0_resumed"] = (resumed, "v0")  # before stale: it may start as soon as v0 has ended
        folder = tmp_path_factory.mktemp(name)
        out[name] = (CPURunConfig(
            out_dir=str(folder), trainer="v1", steps=ASYNC_STEPS[name], model_dir=assets.model_dir,
            train_file=assets.train_file, val_file=assets.val_file, train_batch_size=BATCH, rollout_n=N,
            response_length=RESPONSE, val_before_train=False, v1_poll_interval_s=0.05, decode_s=DECODE_S,
            weight_sync_s=WEIGHT_SYNC_S if name == "partial" else 0.0,
            timeout_s=600, extra_overrides=["trainer.v1.trainer_mode=colocate_async",
                                            f"trainer.rollout_data_dir={Path(folder) / 'rollouts'}", *ASYNC_FLAGS[name]],
        ), None)
    return out


def run_all(tmp_path_factory) -> dict:
    """name -> (its config, its RunResult, or None if the run it resumes failed)."""
    from verl_async_rm_rig.cpu_backend.launch import start

    jobs = configs(tmp_path_factory)
    results = run_queue({name: QueuedRun(lambda cfg=cfg: cfg, after) for name, (cfg, after) in jobs.items()},
                        lambda cfg: start(cfg, progress=False))
    return {name: (cfg, results[name]) for name, (cfg, _) in jobs.items()}
