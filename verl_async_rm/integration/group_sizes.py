"""The real size of every GRPO group, stamped on each sample before generation, so the per-sample
reward path (``AsyncAgentRewardManager.run_single``) answers a group the moment its last member is
scored, instead of guessing with a timer.

verl 0.9.1 hands ``run_single`` one sample with the prompt's columns (``_compute_score`` in
``experimental/agent_loop/agent_loop.py``) but nothing that says whether the batch is validation or
training, nor how many samples share the uid: v0 repeats each prompt ``rollout.n`` times for
training and ``val_kwargs.n`` times for validation, then pads validation batches by repeating rows;
v1 runs ``__rollout_n__`` sessions per prompt (default ``n`` or ``val_kwargs.n``). The agent-loop
manager sees the whole batch, so our subclasses (``group_size_v0``, ``group_size_v1``) count and
stamp ``GROUP_SIZE_KEY``: every prompt column reaches the reward as a column of its one-row batch.
``main_ppo`` selects them (verl's ``agent_loop_manager_class``) when the ``async_agent`` manager
scores inside the agent loop. This module is light: the entry point imports it before verl.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Optional, Sequence

GROUP_SIZE_KEY = "__async_rm_group_size__"
V0_CLASS = "verl_async_rm.integration.group_size_v0.AgentLoopManagerWithGroupSizes"
V1_CLASS = "verl_async_rm.integration.group_size_v1.AgentLoopManagerTQWithGroupSizes"


def rows_per_uid(uids: Sequence[Any]) -> list[int]:
    """v0: for each row, how many rows of the batch share its uid (padding copies included: they
    are scored too, and join their source's group)."""
    counts = Counter(uids)
    return [counts[uid] for uid in uids]


def sessions_per_prompt(rows: int, validate: bool, explicit: Optional[Sequence[Any]], n: int, val_n: int) -> list[int]:
    """v1: the sessions each prompt runs, as ``AgentLoopWorkerTQ._run_prompt`` decides it."""
    if explicit is not None:
        return [int(x) for x in explicit]
    return [int(val_n if validate else n)] * rows
