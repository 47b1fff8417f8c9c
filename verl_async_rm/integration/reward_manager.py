"""``async_agent``: a verl reward manager that routes every sample through the shared agent.

Registered in both of verl 0.9's registries, like verl's own ``limited.py``:
- reward loop (``RewardManagerBase.run_single``, one sample per call from the RewardLoopWorkers):
  each sample is scored by the job's one agent actor and answered when its GRPO group (same ``uid``,
  same dispatch of the prompt) is resolved, so limits are global and ``post_process_scores`` sees
  whole groups;
- legacy (``__call__(data, return_dict)``): the whole batch goes to the agent as one ticket.
"""

from __future__ import annotations

import dataclasses
import logging
from collections import defaultdict
from typing import Any

import torch
from omegaconf import DictConfig

from verl import DataProto
from verl.experimental.reward_loop.reward_manager.base import RewardManagerBase
from verl_async_rm import verl_internals
from verl_async_rm.integration.agent_client import connect
from verl_async_rm.integration.decode import decode_requests, fixed_extra_info, group_size_of, valid_response_lengths
from verl_async_rm.integration.group_sizes import ATTEMPT_KEY, GROUP_SIZE_KEY, VALIDATION_KEY
from verl_async_rm.integration.registries import register_where_loaded
from verl_async_rm.integration.settings import read_run_settings
from verl_async_rm.loader import check_spec

NAME = "async_agent"
_log = logging.getLogger(__name__)


class AsyncAgentRewardManager(RewardManagerBase):
    def __init__(
        self,
        config: DictConfig | None = None,
        tokenizer: Any = None,
        compute_score: Any = None,  # verl's pre-wrapped function: unused, we load the reward ourselves
        reward_router_address: str | None = None,
        reward_model_tokenizer: Any = None,
        num_examine: int | None = None,  # legacy signature, unused
        reward_fn_key: str | None = None,
        **kwargs: Any,
    ):
        if tokenizer is None:
            raise TypeError("the async_agent reward manager needs a tokenizer")
        super().__init__(config if config is not None else DictConfig({"reward": {}}), tokenizer, compute_score)
        verl_internals.require_all("the async_agent reward manager")  # a verl that moved one: refused here
        # read and checked here, once, in this process (mask is refused off the strategies: masking.py)
        self.settings = read_run_settings(self.config).agent
        if reward_fn_key:
            self.settings = dataclasses.replace(self.settings, reward_fn_key=reward_fn_key)
        check_spec(self.settings.reward)  # a bad path/name fails here, at start, in this process
        self.client = connect(self.settings)
        self._warned_unstamped = False

    # -- reward loop: one sample per call ---------------------------------------------------------
    async def run_single(self, data: DataProto) -> dict:
        data = data[-1:]  # multi-sequence outputs: the reward is computed on the last sequence, as naive does
        request = decode_requests(data, self.tokenizer, self.settings.reward_fn_key)[0]
        uid = request.pop("uid")
        size, wait = self._group_of(data)
        stamp = data.non_tensor_batch.get(VALIDATION_KEY)  # our agent-loop managers say it (group_sizes.py)
        validation = stamp is not None and bool(stamp[-1])
        score, extra = await self.client.score_in_group(request, uid, size, wait, validation=validation, **self._member_of(data))
        return {"reward_score": score, "reward_extra_info": fixed_extra_info(score, extra, self.settings.extra_keys)}

    def _group_of(self, data: DataProto) -> tuple[int, float | None]:
        """(group size, stall timeout): the size stamped by our agent-loop manager (exact: the group
        is answered when its last member is scored; a session that fails is withdrawn by our v1
        worker, so the timeout only ends a group left short in a way nobody reported), else the
        configured size and ``group_wait``."""
        stamp = data.non_tensor_batch.get(GROUP_SIZE_KEY)
        if stamp is not None:
            return int(stamp[-1]), self.settings.group_timeout
        if not self._warned_unstamped:
            self._warned_unstamped = True
            _log.warning(
                "async_agent: samples carry no group size (the agent-loop manager is not %s's); groups of "
                "%d close after %ss without a new member. Run through verl_async_rm.main_ppo, or set "
                "actor_rollout_ref.rollout.agent.agent_loop_manager_class, for exact groups without a wait",
                __package__, self.settings.group_size, self.settings.group_wait,
            )
        return self.settings.group_size, self.settings.group_wait

    @staticmethod
    def _member_of(data: DataProto) -> dict:
        """Which session of which dispatch of its prompt the sample is, when our v1 agent-loop worker
        stamped the dispatch (``group_size_v1``): the worker withdraws a failed session by the same
        names, and a prompt dispatched again never shares a group with an earlier attempt."""
        attempt = data.non_tensor_batch.get(ATTEMPT_KEY)
        session = data.non_tensor_batch.get("session_id")
        if attempt is None or session is None:
            return {}
        return {"session": int(session[-1]), "attempt": str(attempt[-1])}

    # -- legacy: the whole batch at once ---------------------------------------------------------
    def __call__(self, data: DataProto, return_dict: bool = False):
        if "rm_scores" in data.batch.keys():  # already scored upstream
            if return_dict:
                keys = data.meta_info.get("reward_extra_keys", [])
                return {"reward_tensor": data.batch["rm_scores"], "reward_extra_info": {k: data.non_tensor_batch[k] for k in keys}}
            return data.batch["rm_scores"]
        requests = decode_requests(data, self.tokenizer, self.settings.reward_fn_key)
        chunk = self.client.get(self.client.submit(requests, group_size_of(requests)))
        lengths = valid_response_lengths(data)
        reward_tensor = torch.zeros_like(data.batch["responses"], dtype=torch.float32)
        rows = torch.as_tensor(chunk.indices)
        reward_tensor[rows, lengths[rows] - 1] = torch.as_tensor(chunk.scores, dtype=torch.float32)
        if not return_dict:
            return reward_tensor
        extra_info: dict[str, list] = defaultdict(list, {k: list(v) for k, v in chunk.extra_info.items()})
        return {"reward_tensor": reward_tensor, "reward_extra_info": extra_info}


register_where_loaded(AsyncAgentRewardManager, NAME)
