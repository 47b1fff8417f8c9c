"""The CPU runs' model and data (a tiny random Qwen2 and the toy task's parquet files): where they
live in an assets directory, and building them there once among the processes that share it.

Why runs may build them themselves (``CPURunConfig.assets_dir`` with the light driver): building
takes ~0.1 s, but importing what it needs (torch, transformers with Qwen2, pandas) took ~7 s here,
13-15 s on a slow hour and ~45 s on a cold disk cache, which the demo paid in its own process, on one
core, before any run could start. Every run's TaskRunner process imports torch and transformers
anyway, so the first run to get there builds them after its verl imports while the others wait on the
directory's lock, then find them built (light_driver.TaskRunnerHost).

Why a file lock (``fcntl.flock``) rather than a marker polled with a timeout: the builders are
separate processes (Ray workers of separate jobs); the kernel releases the lock when its holder ends,
killed or not, so a builder killed mid-build leaves no stale lock and the next caller builds again
(its record, ``built-seed<N>.json``, written last and atomically, is the only sign of a finished build).
The data are drawn per seed and kept apart by seed, so runs of different seeds may share a directory.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from dataclasses import dataclass
from typing import Callable, Mapping

# A run builds its assets in its TaskRunner process when this is set: JSON {"dir": ..., "seed": ...}
ASSETS_ENV = "VERL_ASYNC_RM_ASSETS"
LOCK = ".lock"


@dataclass(frozen=True)
class AssetPaths:
    model_dir: str
    train_file: str
    val_file: str


def asset_paths(assets_dir: str, seed: int) -> AssetPaths:
    """Where the model and the data of ``seed`` live in ``assets_dir`` (built or not)."""
    data = os.path.join(assets_dir, f"data-seed{seed}")
    return AssetPaths(os.path.join(assets_dir, "model"), os.path.join(data, "train.parquet"),
                      os.path.join(data, "val.parquet"))


def build_assets(assets_dir: str, seed: int) -> None:
    """Write the tiny model (its own fixed seed: every run and benchmark trains the same model) and
    the toy dataset drawn with ``seed``. torch's global generator is left as it was: the builder may
    be a run's TaskRunner, whose later draws must not depend on whether it built."""
    import torch

    from .tiny_model import build_tiny_model
    from .toy_task import write_dataset

    paths = asset_paths(assets_dir, seed)
    with torch.random.fork_rng(devices=[]):
        build_tiny_model(paths.model_dir)
    train, val = write_dataset(os.path.dirname(paths.train_file), seed=seed)
    assert (train, val) == (paths.train_file, paths.val_file), (train, val)


def _record_path(assets_dir: str, seed: int) -> str:
    return os.path.join(assets_dir, f"built-seed{seed}.json")


def read_built(assets_dir: str, seed: int) -> dict | None:
    """The record of the finished build of ``seed`` in ``assets_dir`` (seconds, builder's pid), or None."""
    try:
        with open(_record_path(assets_dir, seed)) as f:
            return json.load(f)
    except FileNotFoundError:
        return None


def build_assets_once(assets_dir: str, seed: int,
                      build: Callable[[str, int], None] = build_assets) -> dict:
    """Build the assets of ``seed`` in ``assets_dir`` unless they are built; safe to call from several
    processes at once (one builds, the others wait for it). Returns the build's record."""
    os.makedirs(assets_dir, exist_ok=True)
    with open(os.path.join(assets_dir, LOCK), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes or its process ends
        built = read_built(assets_dir, seed)
        if built is not None:
            return built
        started = time.monotonic()
        build(assets_dir, seed)
        record = {"seed": seed, "build_s": round(time.monotonic() - started, 3), "pid": os.getpid()}
        partial = _record_path(assets_dir, seed) + ".partial"
        with open(partial, "w") as f:
            json.dump(record, f)
        os.replace(partial, _record_path(assets_dir, seed))
        return record


def build_if_asked(environ: Mapping[str, str] = os.environ) -> dict | None:
    """In a run's TaskRunner: build the assets named by :data:`ASSETS_ENV`, once among the runs."""
    asked = environ.get(ASSETS_ENV)
    if not asked:
        return None
    spec = json.loads(asked)
    return build_assets_once(spec["dir"], int(spec["seed"]))
