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
``main_ppo`` and verl's own entry point (``stock_entry``) select them (verl's
``agent_loop_manager_class``, ``select_group_size_manager``) when the ``async_agent`` manager scores
inside the agent loop. They stamp whether the batch is validation too (``VALIDATION_KEY``), which
verl's trainers say to the agent-loop manager only. v1's worker also tells the agent when a session
ends without a sample (its rollout failed), so the group closes without it at once
(``group_size_v1``). This module is light:
the entry point imports it before verl.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Optional, Sequence

from omegaconf import DictConfig, open_dict

GROUP_SIZE_KEY = "__async_rm_group_size__"
# v1: which dispatch of a prompt a sample comes from (a fresh value each time verl's agent-loop worker
# starts a prompt's sessions): verl generates a prompt again under the same uid (a checkpointed prompt
# re-issued on resume), and the agent keeps each attempt a group of its own.
ATTEMPT_KEY = "__async_rm_attempt__"
# Whether the sample belongs to a validation pass: verl's trainers (v0 and v1) wait for a validation pass
# before they go on, so ``admission_order: deadline`` serves its samples first.
VALIDATION_KEY = "__async_rm_validation__"
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


def select_group_size_manager(config: DictConfig) -> Optional[str]:
    """A run scoring through ``async_agent`` on verl's per-sample path (no trainer strategy) that names
    no agent-loop manager of its own gets the stamping one (in place); returns the class chosen."""
    agent = config.actor_rollout_ref.rollout.agent
    if config.reward.reward_manager.get("name") != "async_agent" or agent.get("agent_loop_manager_class"):
        return None
    chosen = V1_CLASS if config.trainer.get("use_v1", True) else V0_CLASS
    with open_dict(config):
        agent.agent_loop_manager_class = chosen
    return chosen
