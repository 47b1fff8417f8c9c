"""Process-pool side of the ``executor='process'`` option, for CPU-heavy sync scorers.

A function loaded from a file path cannot be pickled by reference in a fresh process, so each worker
loads the reward itself from its ``RewardSpec`` once, in the pool initializer. A class is instantiated
once per worker process; its ``post_process_scores`` runs in the agent's process, on the agent's own
instance.
"""

from __future__ import annotations

from verl_async_rm.loader import RewardSpec, UserReward, load_reward

_reward: UserReward | None = None


def load(spec: RewardSpec) -> None:
    global _reward
    _reward = load_reward(spec.path, spec.name, spec.kwargs)


def score(kwargs: dict):
    if _reward is None:
        raise RuntimeError("process worker used before its reward was loaded")
    return _reward.score_fn(**kwargs, **_reward.call_kwargs)


def call(fn, call_kwargs: dict, fields: dict):
    """An in-memory (picklable, module-level) reward function, called in a worker process."""
    return fn(**fields, **call_kwargs)
