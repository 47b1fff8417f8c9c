"""How the verl integration reaches the agent: the job's shared named Ray actor, or, when no Ray is
running (a script, a test), an agent in this process. Both speak ``client.RewardClient``."""

from __future__ import annotations

from verl_async_rm.client import RewardClient
from verl_async_rm.integration.settings import AsyncAgentSettings


def connect(settings: AsyncAgentSettings) -> RewardClient:
    import ray

    if ray.is_initialized():
        from verl_async_rm.ray_agent import RayRewardClient, get_or_create_agent_actor

        # One actor per job, created by whichever process asks first: the cap, rate limits and cache
        # hold for all of verl's reward workers together.
        actor = get_or_create_agent_actor(settings.reward, settings.agent.model_dump(), name=settings.actor_name)
        return RayRewardClient(actor)
    from verl_async_rm.agent import RewardAgent
    from verl_async_rm.loader import load_reward

    return RewardAgent(load_reward(settings.reward.path, settings.reward.name, settings.reward.kwargs), settings.agent)

