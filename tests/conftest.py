"""Shared fixtures: one Ray start per test session, paths to the shared data."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
GSM8K_TEST = SHARED / "data" / "gsm8k" / "test.jsonl"
REWARDS = Path(__file__).resolve().parent / "rewards"


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


def pytest_collection_modifyitems(config, items):
    """Tests that read ../shared are marked ``shared_data`` and may not be ``quick``: the inner loop
    must run anywhere, while the suite (CI) fails, never skips, without the data."""
    for item in items:
        if "gsm8k_path" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.shared_data)
            if item.get_closest_marker("quick"):
                raise pytest.UsageError(f"{item.nodeid} reads ../shared, so it cannot be marked quick")
