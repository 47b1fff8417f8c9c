"""v1: verl's TransferQueue agent-loop manager stamping each prompt with its session count, and its
worker telling the agent about the sessions that will send no sample (see ``group_sizes``).

Why the worker: verl's ``AgentLoopWorkerTQ._run_prompt`` runs a prompt's ``n`` sessions side by side
and marks the prompt failed only once every session has ended; a session whose rollout raised never
reaches the reward, so its group would wait for a member that cannot come, and the surviving
sessions, awaiting their group's answer, would hold the prompt (and a sync step) for
``group_timeout``. The worker sees the session fail, so it withdraws that session from the group
(``RewardClient.withdraw``): the group is answered as soon as its other members are scored, and
verl then handles the failed prompt its own way (sync: trained without the failed session;
colocate_async/separate_async: evicted and replaced by a fresh prompt).

Each start of a prompt's sessions is an *attempt* with its own id (``ATTEMPT_KEY``), part of the
group's identity in the agent: a prompt verl dispatches again under the same uid (re-issued on
resume) never joins, or is withdrawn from, an earlier attempt's group.
"""

from __future__ import annotations

import asyncio
import logging
import uuid

import ray
from tensordict import TensorDict

from verl.trainer.ppo.v1 import AgentLoopManagerTQ, AgentLoopWorkerTQ
from verl.utils import tensordict_utils as tu
from verl_async_rm.errors import RewardAgentStopped
from verl_async_rm.integration.group_sizes import ATTEMPT_KEY, GROUP_SIZE_KEY, VALIDATION_KEY, sessions_per_prompt
from verl_async_rm.integration.settings import read_run_settings

_log = logging.getLogger(__name__)


class AgentLoopWorkerTQWithGroupSizes(AgentLoopWorkerTQ.__ray_actor_class__):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        settings = read_run_settings(self.config)  # once, in this worker's process
        # The agent scores in the reward loop only with our manager and verl's reward-loop workers on.
        self._agent_settings = settings.agent if settings.reward_manager == "async_agent" else None
        self._client = None

    async def _run_prompt(self, prompt: dict, sampling_params: dict, trajectory: dict, trace: bool = False) -> None:
        prompt[ATTEMPT_KEY] = uuid.uuid4().hex  # this dispatch of the prompt: every session carries it
        return await super()._run_prompt(prompt, sampling_params, trajectory, trace)

    async def _run_agent_loop(self, sampling_params, trajectory, *, agent_name, trace=True, **kwargs):
        try:
            return await super()._run_agent_loop(sampling_params, trajectory, agent_name=agent_name, trace=trace, **kwargs)
        except Exception:
            await self._withdraw_session(kwargs)
            raise

    async def _withdraw_session(self, kwargs: dict) -> None:
        """A session ended in an error: whether or not it handed a sample to the reward first (the
        agent ignores the withdrawal of a session that did), its group must not wait for it."""
        if self._agent_settings is None or self.reward_loop_worker_handles is None or ATTEMPT_KEY not in kwargs:
            return
        try:
            if self._client is None:
                from verl_async_rm.integration.agent_client import connect

                # connect() waits for the actor (ray.get): off this loop, which runs every other session
                self._client = await asyncio.to_thread(connect, self._agent_settings)
            await self._client.withdraw(str(kwargs["uid"]), int(kwargs["session_id"]), str(kwargs[ATTEMPT_KEY]))
        except Exception:  # noqa: BLE001 - the session's own error is the one verl must see
            _log.exception("async_agent: could not withdraw failed session %s of %s; its group waits for "
                           "reward.async_agent.group_timeout", kwargs.get("session_id"), kwargs.get("uid"))


class AgentLoopManagerTQWithGroupSizes(AgentLoopManagerTQ):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.agent_loop_workers_class = ray.remote(AgentLoopWorkerTQWithGroupSizes)  # verl's __init__ names its own
        settings = read_run_settings(self.config)  # once, in the trainer's process
        self._agent_settings = settings.agent if settings.reward_manager == "async_agent" else None
        self._client = None

    def _refuse_if_the_agent_stopped(self) -> None:
        """Why here: on verl's per-sample path a reward error only fails its rollout session, and
        colocate_async/separate_async answer a failed session by evicting its group and dispatching a
        fresh prompt, which fails the same way: once the agent has stopped for good (budget spent,
        failures systematic, closed) the run would regenerate without end. Every dispatch (a step's
        batch, a refill) passes here, in the trainer, so the run ends loudly with the agent's reason."""
        if self._agent_settings is None or self.reward_loop_worker_handles is None:
            return
        if self._client is None:
            from verl_async_rm.integration.agent_client import connect

            self._client = connect(self._agent_settings)
        stopped = self._client.metrics().get("stopped")
        if stopped:
            raise RewardAgentStopped(
                f"async_agent stopped scoring ({stopped}); the run stops here, at its next dispatch of prompts "
                "(verl would otherwise fail, and regenerate, every rollout session whose reward it asks for)"
            )

    def generate_sequences(self, batch: TensorDict):
        self._refuse_if_the_agent_stopped()
        rollout = self.config.actor_rollout_ref.rollout
        explicit = tu.get(batch, "__rollout_n__", default=None)
        validate = bool(tu.get(batch, "validate", default=False))
        sizes = sessions_per_prompt(len(batch), validate, None if explicit is None else list(explicit), rollout.n,
                                    rollout.val_kwargs.n)
        tu.assign_non_tensor_stack(batch, GROUP_SIZE_KEY, sizes)
        tu.assign_non_tensor_stack(batch, VALIDATION_KEY, [int(validate)] * len(sizes))
        return super().generate_sequences(batch)
