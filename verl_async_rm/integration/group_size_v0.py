"""v0: verl's AgentLoopManager stamping each row with its group's size (see ``group_sizes``)."""

from __future__ import annotations

import numpy as np

from verl import DataProto
from verl.experimental.agent_loop import AgentLoopManager
from verl_async_rm.integration.group_sizes import GROUP_SIZE_KEY, VALIDATION_KEY, rows_per_uid


class AgentLoopManagerWithGroupSizes(AgentLoopManager):
    def generate_sequences(self, prompts: DataProto) -> DataProto:
        if "uid" in prompts.non_tensor_batch:
            sizes = rows_per_uid(list(prompts.non_tensor_batch["uid"]))
            prompts.non_tensor_batch[GROUP_SIZE_KEY] = np.array(sizes, dtype=np.int64)
            validate = bool(prompts.meta_info.get("validate", False))
            prompts.non_tensor_batch[VALIDATION_KEY] = np.full(len(sizes), int(validate), dtype=np.int64)
        return super().generate_sequences(prompts)
