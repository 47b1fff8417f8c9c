"""One queue of trainer runs, a few alive at a time: what test_strategies.py, tests/seam (verl_modes.py) and the
rig's CPU-backend tests (rig_runs.py) start their trainers through.

Why a queue: a run spends most of its minute starting up (Ray, a dozen worker processes importing verl), which
leaves a core idle; two at once fill it (the strategy runs: 599 s one at a time, 388-417 s two at a time, 387 s
three at a time on 2 cores). A run may wait for another (``after``: a resume starts once the run it resumes has
ended, and not at all if that run failed) or train ``alone`` (nothing else alive: a run whose deadline a second
trainer beside it would make it miss). A failed run does not stop the others: the tests that read it fail. Every
run started is closed, whatever happens."""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable, Mapping
from typing import Any, NamedTuple


class QueuedRun(NamedTuple):
    make_config: Callable[[], Any]  # called when the run starts (a config may write files)
    after: Hashable | None = None
    alone: bool = False


def run_queue(jobs: Mapping[Hashable, QueuedRun], start: Callable[[Any], Any], at_once: int = 2,
              poll_s: float = 0.5) -> dict:
    """Run ``jobs`` in their order, ``at_once`` alive at a time; ``start(config)`` returns a running job with
    ``poll()``, ``close()`` and ``result()``. Returns key -> its result (None: not started, its ``after``
    failed: a result without ``ok``)."""
    waiting = dict(jobs)
    alive: dict[Hashable, Any] = {}
    results: dict[Hashable, Any] = {}
    try:
        while waiting or alive:
            for key in list(waiting):
                if len(alive) >= at_once or any(jobs[k].alone for k in alive):
                    break
                job = waiting[key]
                if job.after is not None and job.after not in results:
                    continue  # the run it resumes is still training
                if job.alone and alive:
                    break  # the others end first
                del waiting[key]
                if job.after is not None and not (results[job.after] and results[job.after].ok):
                    results[key] = None
                    continue
                alive[key] = start(job.make_config())
            for key in [k for k, running in alive.items() if running.poll()]:
                running = alive.pop(key)
                running.close()
                results[key] = running.result()
            time.sleep(poll_s)
    finally:
        for running in alive.values():
            running.close()
    return results
