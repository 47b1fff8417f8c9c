"""Score while generating: each training sample goes to the agent the moment its rollout finishes.

Stock verl scores each sample inside its agent loop (``AgentLoopWorker._compute_score``, called per
sample from ``_agent_loop_postprocess``). The strategies take rewards out of the loop, so without
this module a batch would be submitted only after its last rollout ended. Here the agent-loop
workers (separate Ray actor processes) add each finished sample to the step's *open ticket*
(``open_ticket`` / ``add`` / ``close_ticket`` on the shared agent actor); the trainer opens the ticket
before generation, closes it after, and takes scored groups in whatever order they finish.

What travels with the prompts (training only; validation is scored by the trainer as before):
- v0 (``DataProto``): ``meta_info[TICKET_KEY]`` and a column ``ROW_KEY`` (the row's position in the
  generation batch), which is the sample's index in the ticket; the trainer maps it back to the row
  after verl's batch balancing (the column travels with the rows).
- v1 (TransferQueue ``TensorDict``, ``streaming_v1.py``): fields ``TICKET_KEY`` and ``PROMPT_KEY`` (the prompt's position
  in the step's batch); a session's index is ``prompt * SESSION_STRIDE + session_id``.

Requests are built on the worker exactly as the trainer builds them on the batch path (same
functions on the same columns: ``decode_requests`` on verl's own ``_postprocess`` of the one sample
for v0, ``session_reward_columns`` on the TransferQueue fields for v1), so a sample scores the same.
"""

from __future__ import annotations

import contextvars
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

from verl.experimental.agent_loop import AgentLoopWorker
from verl_async_rm.integration.decode import decode_requests
from verl_async_rm.integration.settings import AsyncAgentSettings, read_run_settings

TICKET_KEY = "async_rm_ticket"
ROW_KEY = "async_rm_row"  # v0: the row's position in the generation batch = its index in the ticket
PROMPT_KEY = "async_rm_prompt"  # v1: the prompt's position in the step's batch
V1_MANAGER_CLASS = "verl_async_rm.strategies.streaming_v1.StreamingAgentLoopManagerTQ"
SESSION_STRIDE = 1 << 16  # v1 index = prompt * stride + session id (sessions per prompt < stride)
# agent_name: verl's worker adds it to its own batch (the loop to run), so the output has the column and
# the trainer's prompts do not; it is never one of a loop's extra fields, and a stock reward never sees it.
NOT_TOOL_FIELDS = frozenset({"__num_turns__", "multi_modal_inputs", "agent_name"})


def v1_index(prompt: int, session: int) -> int:
    if not 0 <= session < SESSION_STRIDE:
        raise ValueError(f"session id {session} out of range [0, {SESSION_STRIDE})")
    return int(prompt) * SESSION_STRIDE + int(session)


def tool_field_columns(output_keys, input_keys) -> list[str]:
    """Columns verl's ``_postprocess`` added from the loops' ``extra_fields``: everything but the
    prompt's own columns and verl's fixed ones (``raw_prompt`` is both: the loop copies it into its
    extra fields, and naive's reward sees it there)."""
    inputs = set(input_keys) - {"raw_prompt"}
    return sorted(set(output_keys) - inputs - NOT_TOOL_FIELDS)


@dataclass(frozen=True)
class _Stream:
    ticket: str
    input_keys: frozenset  # the prompt columns as the manager sent them (before the worker adds any)


# Per generate call: asyncio tasks copy the context at creation, so each sample's task sees the
# ticket of the batch it belongs to.
_STREAM: contextvars.ContextVar[Optional[_Stream]] = contextvars.ContextVar("async_rm_stream", default=None)


class _AgentHandle:
    """The job's agent actor, looked up by name on first use (created by the trainer at start)."""

    def __init__(self, settings: AsyncAgentSettings):
        self._settings = settings
        self._actor = None

    def get(self):
        if self._actor is None:
            from verl_async_rm.ray_agent import get_or_create_agent_actor

            settings = self._settings
            self._actor = get_or_create_agent_actor(settings.reward, settings.agent.model_dump(), name=settings.actor_name)
        return self._actor

    async def add(self, ticket: str, requests: list[dict]) -> None:
        await self.get().add.remote(ticket, requests)


class StreamingAgentLoopWorker(AgentLoopWorker):
    """v0: verl's agent-loop worker, adding each finished training sample to the step's ticket."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        settings = read_run_settings(self.config).agent  # once, in this worker's process
        self._agent = _AgentHandle(settings)
        self._reward_fn_key = settings.reward_fn_key

    async def generate_sequences(self, batch):
        ticket = batch.meta_info.get(TICKET_KEY)
        stream = None if ticket is None else _Stream(str(ticket), frozenset(batch.non_tensor_batch))
        token = _STREAM.set(stream)
        try:
            return await super().generate_sequences(batch)
        finally:
            _STREAM.reset(token)

    async def _agent_loop_postprocess(self, output, validate, **kwargs):
        internal = await super()._agent_loop_postprocess(output, validate, **kwargs)
        stream = _STREAM.get()
        if stream is not None and not validate:
            await self._agent.add(stream.ticket, [self.sample_request(internal, stream.input_keys, kwargs)])
        return internal

    def sample_request(self, internal, input_keys, kwargs: dict) -> dict:
        """The request the trainer's batch path builds for this sample's row: verl's own
        ``_postprocess`` of the one sample (the prompt's columns included, as verl includes them
        without in-loop rewards), then ``decode_requests`` with the loop's extra-field columns."""
        columns = {k: _one(v) for k, v in kwargs.items()}
        if "agent_name" not in columns:  # popped by _run_agent_loop; verl's batch carries it
            columns["agent_name"] = _one(self.rollout_config.agent.default_agent_loop)
        row = self._postprocess([internal], input_non_tensor_batch=columns, validate=False)
        tool_fields = tool_field_columns(row.non_tensor_batch, input_keys)
        (request,) = decode_requests(row, self.tokenizer, self._reward_fn_key, tool_fields)
        request["index"] = int(kwargs[ROW_KEY])
        return request


def _one(value: Any) -> np.ndarray:
    array = np.empty(1, dtype=object)
    array[0] = value
    return array
