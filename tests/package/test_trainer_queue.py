"""The test suite's one queue of trainer runs (tests/helpers/trainer_queue.py), with fake runs: never more
alive than asked, a resume only after its run and never after a failed one, an ``alone`` run with nothing else
alive, every started run closed even when a start fails."""

from __future__ import annotations

import pytest

from tests.helpers.trainer_queue import QueuedRun, run_queue

pytestmark = pytest.mark.quick


class FakeRun:
    def __init__(self, name, log, ok=True, polls=2):
        self.name, self.log, self.ok, self.polls, self.closed = name, log, ok, polls, False

    def poll(self):
        self.polls -= 1
        return self.polls <= 0

    def close(self):
        self.closed = True
        self.log.append(("end", self.name))

    def result(self):
        return self


def queue(jobs, failing=(), at_once=2):
    """Run fake jobs (name -> (after, alone)); a name starting with "long" trains for three polls."""
    log, started = [], {}

    def start(name):
        log.append(("start", name))
        started[name] = FakeRun(name, log, ok=name not in failing, polls=3 if name.startswith("long") else 1)
        return started[name]

    results = run_queue({name: QueuedRun(lambda name=name: name, *spec) for name, spec in jobs.items()}, start,
                        at_once=at_once, poll_s=0)
    return results, log, started


def alive_at_each_start(log):
    alive, seen = set(), []
    for kind, name in log:
        if kind == "start":
            alive.add(name)
            seen.append((name, set(alive)))
        else:
            alive.discard(name)
    return seen


def test_never_more_alive_than_asked_and_every_run_closed():
    results, log, started = queue({f"long{i}": () for i in range(5)}, at_once=2)
    assert set(results) == {f"long{i}" for i in range(5)}
    assert max(len(alive) for _, alive in alive_at_each_start(log)) == 2
    assert all(run.closed for run in started.values())


def test_a_resume_starts_after_its_run_and_not_at_all_after_a_failed_one():
    jobs = {"long_a": (), "resume_a": ("long_a",), "b": (), "resume_b": ("b",)}
    results, log, _ = queue(jobs, failing={"b"})
    assert log.index(("start", "resume_a")) > log.index(("end", "long_a"))
    assert results["resume_b"] is None and ("start", "resume_b") not in log


def test_an_alone_run_trains_with_nothing_else_alive():
    jobs = {"long_x": (), "solo": (None, True), "long_y": (), "z": ()}
    _, log, _ = queue(jobs, at_once=2)
    for name, alive in alive_at_each_start(log):
        if name == "solo":
            assert alive == {"solo"}
        else:
            assert "solo" not in alive


def test_runs_alive_when_a_start_fails_are_closed():
    started = []

    def start(name):
        if name == "bad":
            raise RuntimeError("no Ray")
        run = FakeRun(name, [], polls=10**6)
        started.append(run)
        return run

    with pytest.raises(RuntimeError):
        run_queue({"a": QueuedRun(lambda: "a"), "bad": QueuedRun(lambda: "bad")}, start, poll_s=0)
    assert [run.closed for run in started] == [True]
