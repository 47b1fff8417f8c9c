"""The agent as a named async Ray actor, so it runs beside the trainer and every process shares it.

``get`` is a coroutine: while one caller waits for its groups, the actor keeps serving others
(submit, metrics, other tickets). Ray is imported lazily to keep ``import verl_async_rm`` light.
"""

from __future__ import annotations

from typing import Any, Mapping

from verl_async_rm.agent import RewardAgent
from verl_async_rm.loader import RewardSpec, load_reward
from verl_async_rm.outcome import ScoredChunk

DEFAULT_ACTOR_NAME = "verl_async_rm_agent"


class RewardAgentActor:
    """Actor body. ``reward`` is a ``RewardSpec`` (path/name/kwargs, loaded inside the actor) or any
    picklable reward accepted by ``RewardAgent``."""

    def __init__(self, reward: RewardSpec | Any, config: Mapping | None = None):
        if isinstance(reward, RewardSpec):
            reward = load_reward(reward.path, reward.name, reward.kwargs)
        self._agent = RewardAgent(reward, config)

    def submit(self, items: list, group_size: int = 1) -> int:
        return self._agent.submit(items, group_size)

    async def get(self, ticket: int, n: int | None = None) -> ScoredChunk:
        return await self._agent.aget(ticket, n)

    async def score_in_group(self, item: dict, uid=None, group_size: int = 1, group_wait: float | None = None):
        return await self._agent.ascore_in_group(item, uid, group_size, group_wait)

    def cancel(self, ticket: int) -> int:
        return self._agent.cancel(ticket)

    def remaining(self, ticket: int) -> int:
        return self._agent.remaining(ticket)

    def metrics(self) -> dict:
        return self._agent.metrics()

    def config(self) -> dict:
        return self._agent.config.model_dump()

    def close(self) -> None:
        self._agent.close()


def get_or_create_agent_actor(
    reward: RewardSpec | Any,
    config: Mapping | None = None,
    *,
    name: str = DEFAULT_ACTOR_NAME,
    namespace: str | None = None,
    max_concurrency: int = 10_000,
):
    """The named agent actor, created on first use. Every caller with the same name (and namespace)
    gets the same actor, so its limits and cache are global. Needs ``ray.init`` done."""
    import ray

    actor_cls = ray.remote(RewardAgentActor)
    return actor_cls.options(
        name=name,
        namespace=namespace,
        get_if_exists=True,
        num_cpus=0,  # mostly waiting on I/O: must not take a CPU slot from the trainer
        max_concurrency=max_concurrency,  # concurrent get() waiters on the actor's loop
    ).remote(reward, dict(config or {}))
