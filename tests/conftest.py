"""Shared fixtures: one Ray start per test session, paths to the shared data."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
GSM8K_TEST = SHARED / "data" / "gsm8k" / "test.jsonl"
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
    if not GSM8K_TEST.exists():
        pytest.fail(f"GSM8K test split not found at {GSM8K_TEST}: ../shared must sit beside the repo")
    return GSM8K_TEST


# Hypothesis: no wall-clock deadline per example and no "too slow" health check. On a loaded machine both
# fail tests whose property holds (an example taking 250 ms instead of 50 is no bug); a broken property
# still fails on its counterexample. Tests set max_examples themselves.
settings.register_profile("verl_async_rm", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("verl_async_rm")


# Every test is in exactly one tier (pyproject.toml's markers): what it may start decides it.
TIERS = ("quick", "local", "ray", "trainer")


def pytest_collection_modifyitems(config, items):
    """Every test in exactly one tier. Tests that read ../shared are marked ``shared_data`` and may not be
    ``quick``: the inner loop must run anywhere, while the suite (CI) fails, never skips, without the data."""
    problems = []
    for item in items:
        tiers = sorted({mark.name for mark in item.iter_markers() if mark.name in TIERS})
        if len(tiers) != 1:
            problems.append(f"{item.nodeid}: tiers {tiers or 'none'} (give it exactly one of {TIERS})")
        if "gsm8k_path" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.shared_data)
            if item.get_closest_marker("quick"):
                raise pytest.UsageError(f"{item.nodeid} reads ../shared, so it cannot be marked quick")
    if problems:
        raise pytest.UsageError("tests outside the tiers:\n  " + "\n  ".join(problems))


def pytest_ignore_collect(collection_path, config):
    """``-m quick`` does not even import a test file with no quick test in it: most of those import verl or
    torch at their top (seconds per process), which the inner loop must not pay."""
    if config.option.markexpr.strip() == "quick" and collection_path.suffix == ".py" \
            and collection_path.name.startswith("test_") and "mark.quick" not in collection_path.read_text():
        return True
    return None


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
