"""verl's reward-loop workers in a strategy run: none are started.

verl's trainers start ``reward.num_workers`` reward-loop workers (8 by default) in ``init_workers``
whatever scores the samples. Under a strategy the agent scores every sample (training: the step's
tickets; validation: ours), and verl's workers are never called: v0's agent-loop manager drops
their handles (``agent_loop.AgentLoopManagerWithoutRewards``), v1 hides them
(``v1._WithoutStreamingRewards``), and a reward model, the one user of verl's ``compute_rm_score``
on these paths, is refused with the strategies (``plan.check_strategy``). Each worker is a Ray
actor that imports verl: about 5 CPU-s at start-up (``bench/startup_profile.py``) and its memory
for the whole run. So a strategy run asks verl for none.
"""

from __future__ import annotations

from omegaconf import DictConfig, open_dict


def without_reward_loop_workers(config: DictConfig) -> None:
    """Set ``reward.num_workers`` to 0 (call only when a strategy is enabled, before verl builds its
    workers)."""
    if int(config.reward.get("num_workers") or 0) == 0:
        return
    with open_dict(config):
        config.reward.num_workers = 0
