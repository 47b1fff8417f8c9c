"""v1: verl's TransferQueue agent-loop manager stamping each prompt with its session count (see
``group_sizes``)."""

from __future__ import annotations

from tensordict import TensorDict

from verl.trainer.ppo.v1 import AgentLoopManagerTQ
from verl.utils import tensordict_utils as tu
from verl_async_rm.integration.group_sizes import GROUP_SIZE_KEY, sessions_per_prompt


class AgentLoopManagerTQWithGroupSizes(AgentLoopManagerTQ):
    def generate_sequences(self, batch: TensorDict):
        rollout = self.config.actor_rollout_ref.rollout
        explicit = tu.get(batch, "__rollout_n__", default=None)
        sizes = sessions_per_prompt(len(batch), bool(tu.get(batch, "validate", default=False)),
                                    None if explicit is None else list(explicit), rollout.n, rollout.val_kwargs.n)
        tu.assign_non_tensor_stack(batch, GROUP_SIZE_KEY, sizes)
        return super().generate_sequences(batch)
