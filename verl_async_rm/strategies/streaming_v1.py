"""v1 half of ``streaming.py``: verl's TransferQueue agent-loop worker and manager, adding each
finished training session to the step's ticket. Its own module: importing verl's v1 package runs
our trainer-mode registration (``v1.py``), which imports ``streaming``'s names."""

from __future__ import annotations

import ray

from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopManagerTQ, AgentLoopWorkerTQ
from verl_async_rm.integration.decode import requests_from_token_lists, session_reward_columns
from verl_async_rm.integration.settings import read_run_settings
from verl_async_rm.strategies.streaming import PROMPT_KEY, TICKET_KEY, _AgentHandle, v1_index


class StreamingAgentLoopWorkerTQ(AgentLoopWorkerTQ.__ray_actor_class__):
    """v1: verl's TransferQueue agent-loop worker, adding each finished training session (its final
    output, as verl scores it) to the step's ticket before the session reports done."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        settings = read_run_settings(self.config).agent  # once, in this worker's process
        self._agent = _AgentHandle(settings)
        self._reward_fn_key = settings.reward_fn_key

    async def _agent_loop_postprocess(self, output, validate, **kwargs) -> None:
        await super()._agent_loop_postprocess(output, validate, **kwargs)
        ticket = kwargs.get(TICKET_KEY)
        outputs = output if isinstance(output, list) else [output]
        if ticket is None or validate or not outputs:
            return
        await self._agent.add(str(ticket), [self.session_request(outputs[-1], kwargs)])

    def session_request(self, final, kwargs: dict) -> dict:
        """The request the trainer builds from TransferQueue for this session's final output: the
        same fields verl puts there (``output.as_dict()`` updated with the prompt's)."""
        field = final.as_dict()
        field.update(kwargs)
        columns = session_reward_columns(lambda name: [field[name]] if name in field else None, self._reward_fn_key)
        (request,) = requests_from_token_lists([field["prompts"].tolist()], [field["responses"].tolist()], columns,
                                               self.tokenizer, self._reward_fn_key)
        request["uid"] = str(kwargs["uid"])  # the group, as the trainer's sessions_of names it
        request["index"] = v1_index(kwargs[PROMPT_KEY], kwargs["session_id"])
        return request


class StreamingAgentLoopManagerTQ(AgentLoopManagerTQ):
    """v1: verl's TransferQueue agent-loop manager with the streaming workers (verl's own
    ``__init__`` names its worker class, so ours is set after it)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.agent_loop_workers_class = ray.remote(StreamingAgentLoopWorkerTQ)
