"""The seam tests' shared trainer runs (one start per session, whichever module asks first)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def verl_modes_runs(tmp_path_factory):
    """``async_agent`` on verl's v1 trainer modes through verl's stock entry point: tests/helpers/verl_modes.py."""
    from tests.helpers import verl_modes

    return verl_modes.run_all(tmp_path_factory)
