"""How a reward manager reaches the agent: the job's shared named Ray actor, or, when no Ray is
running (a script, a test), an agent in this process."""

from __future__ import annotations

from typing import Any

from verl_async_rm.agent import RewardAgent
from verl_async_rm.integration.settings import AsyncAgentSettings
from verl_async_rm.loader import load_reward
from verl_async_rm.outcome import ScoredChunk
from verl_async_rm.ray_agent import get_or_create_agent_actor


class AgentClient:
    def __init__(self, settings: AsyncAgentSettings):
        import ray

        self.settings = settings
        self._actor = None
        self._local: RewardAgent | None = None
        if ray.is_initialized():
            # One actor per job, created by whichever worker asks first: the cap, rate limits and
            # cache hold for all of verl's reward workers together.
            self._actor = get_or_create_agent_actor(
                settings.reward, settings.agent.model_dump(), name=settings.actor_name
            )
        else:
            reward = load_reward(settings.reward.path, settings.reward.name, settings.reward.kwargs)
            self._local = RewardAgent(reward, settings.agent)

    async def score_in_group(self, request: dict, uid: Any, group_size: int, group_wait: float | None):
        if self._actor is not None:
            return await self._actor.score_in_group.remote(request, uid, group_size, group_wait)
        return await self._local.ascore_in_group(request, uid, group_size, group_wait)

    def submit(self, requests: list[dict], group_size: int) -> int:
        if self._actor is not None:
            import ray

            return ray.get(self._actor.submit.remote(requests, group_size))
        return self._local.submit(requests, group_size)

    def take(self, ticket: int, n: int | None = None) -> ScoredChunk:
        """Whole groups totalling ``n`` samples (all that remain when None), blocking until ready."""
        if self._actor is not None:
            import ray

            return ray.get(self._actor.get.remote(ticket, n))
        return self._local.get(ticket, n)

    def cancel(self, ticket: int) -> int:
        if self._actor is not None:
            import ray

            return ray.get(self._actor.cancel.remote(ticket))
        return self._local.cancel(ticket)

    def score_batch(self, requests: list[dict], group_size: int) -> ScoredChunk:
        return self.take(self.submit(requests, group_size))

    def metrics(self) -> dict:
        if self._actor is not None:
            import ray

            return ray.get(self._actor.metrics.remote())
        return self._local.metrics()
