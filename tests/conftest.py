"""Shared fixtures: one Ray start per test session, the paths of the tests' own data; the tiers."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

ROOT = Path(__file__).resolve().parents[1]
GSM8K_TEST = Path(__file__).resolve().parent / "data" / "gsm8k" / "test.jsonl"  # in the repository, MIT (its LICENSE)
HELPERS = Path(__file__).resolve().parent / "helpers"  # what the tests run: rewards, agent loops, fake jobs
REWARDS = HELPERS / "rewards"


@pytest.fixture(scope="session")
def ray_session():
    """One local Ray instance for the whole session, shut down at the end."""
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    import ray

    if not ray.is_initialized():
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, namespace="verl_async_rm_tests")
    yield ray
    ray.shutdown()


@pytest.fixture
def gsm8k_path() -> Path:
    return GSM8K_TEST


# Hypothesis: no wall-clock deadline per example and no "too slow" health check. On a loaded machine both
# fail tests whose property holds (an example taking 250 ms instead of 50 is no bug); a broken property
# still fails on its counterexample. Tests set max_examples themselves.
settings.register_profile("verl_async_rm", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("verl_async_rm")


# Every test is in exactly one tier (pyproject.toml's markers): what it may start decides it.
TIERS = ("quick", "local", "ray", "trainer")


def pytest_collection_modifyitems(config, items):
    """Every test in exactly one tier."""
    problems = []
    for item in items:
        tiers = sorted({mark.name for mark in item.iter_markers() if mark.name in TIERS})
        if len(tiers) != 1:
            problems.append(f"{item.nodeid}: tiers {tiers or 'none'} (give it exactly one of {TIERS})")
    if problems:
        raise pytest.UsageError("tests outside the tiers:\n  " + "\n  ".join(problems))


def pytest_ignore_collect(collection_path, config):
    """``-m quick`` does not even import a test file with no quick test in it: most of those import verl or
    torch at their top (seconds per process), which the inner loop must not pay."""
    if config.option.markexpr.strip() == "quick" and collection_path.suffix == ".py" \
            and collection_path.name.startswith("test_") and "mark.quick" not in collection_path.read_text():
        return True
    return None


# What a quick test may not import: each costs seconds per process (verl ~7 s with torch), which the inner
# loop must not pay. Checked as each test file is collected and as each quick test runs, so the test (or file)
# that brings one in is named.
HEAVY = ("verl", "torch", "ray")


def _heavy_loaded() -> set[str]:
    return {name for name in HEAVY if name in sys.modules}


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    if item.get_closest_marker("quick") is None:
        return (yield)
    before = _heavy_loaded()
    result = yield
    if brought := sorted(_heavy_loaded() - before):
        raise AssertionError(f"a quick test imported {brought}: mark it local, or keep the import out of its path")
    return result


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector):
    quick_run = collector.config.option.markexpr.strip() == "quick"
    before = _heavy_loaded() if quick_run and isinstance(collector, pytest.Module) else None
    report = yield
    if before is not None and (brought := sorted(_heavy_loaded() - before)):
        report.outcome, report.longrepr = "failed", (
            f"{collector.nodeid} imports {brought} when collected: the quick tier must not (import it inside "
            "the tests that need it, and mark those local)")
    return report


# The inner loop (`pytest -m quick`) runs on QUICK_WORKERS processes (pytest-xdist) unless the
# caller chose (-n/--numprocesses; -p no:xdist): its ~480 tests spend a third of their wall time
# waiting (real timers, sockets, subprocesses), and each worker's collection (the verl and torch
# imports, ~7 s) runs beside the other's. On 2 cores: 40 s in one process, 28 s on two (three or
# four: no faster). The full suite stays in one process: one Ray start per session.
QUICK_WORKERS = min(4, os.cpu_count() or 1)


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config):
    if hasattr(config, "workerinput") or not config.pluginmanager.hasplugin("xdist"):
        return  # an xdist worker, or xdist not there: run as asked
    if config.option.markexpr.strip() == "quick" and config.option.numprocesses is None:
        config.option.numprocesses = QUICK_WORKERS
