"""The rig tests' shared trainer runs (one start per session, whichever module asks first)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def rig_runs(tmp_path_factory):
    """The CPU backend's own runs of verl's stock trainers: tests/helpers/rig_runs.py."""
    from tests.helpers import rig_runs

    return rig_runs.run_all(tmp_path_factory)
