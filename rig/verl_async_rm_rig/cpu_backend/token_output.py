"""A rollout answer as verl's ``TokenOutput``, built without importing verl (nor anything heavy): the
engine's process and the relay's (``engine_link``) both handle it, and neither needs verl."""

from __future__ import annotations

import dataclasses
from typing import Any, Optional


def verl_token_output(fields: dict[str, Any]):
    """Called by pickle in the process receiving a :class:`GeneratedTokens` (verl's agent loop)."""
    from verl.workers.rollout.replica import TokenOutput

    return TokenOutput(**fields)


@dataclasses.dataclass
class GeneratedTokens:
    """One request's answer: verl's ``TokenOutput`` fields, built without importing verl. Pickled (as
    Ray does with an actor's return value) it becomes a ``TokenOutput``: its ``__reduce__`` names
    :func:`verl_token_output`, which the receiving process runs."""

    token_ids: list[int]
    log_probs: Optional[list[float]]
    stop_reason: str
    num_preempted: int
    extra_fields: dict[str, Any]

    def __reduce__(self):
        return verl_token_output, (dataclasses.asdict(self),)
