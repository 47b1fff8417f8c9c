"""Checkpoints taken with batches generated ahead (off-policy) record where the dataloader stood
before the first of them: on resume those batches are drawn and generated again, so none is lost
and none is trained twice. Shared by the v0 and v1 trainers."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Optional


@contextmanager
def loader_state_reported_as(loader, state: Optional[dict]):
    """While verl saves, ``loader.state_dict()`` returns ``state`` (None: the loader's own). The
    method is shadowed on this instance for the call only; verl's classes stay untouched."""
    if state is None:
        yield
        return
    loader.state_dict = lambda: state
    try:
        yield
    finally:
        del loader.state_dict
