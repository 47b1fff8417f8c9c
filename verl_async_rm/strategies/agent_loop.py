"""verl's AgentLoopManager without in-loop rewards, chosen through verl's own config seam
``actor_rollout_ref.rollout.agent.agent_loop_manager_class`` (v0 strategies).

Training batches come back from generation unscored, so generation never waits for a reward: the
agent-loop workers add each finished sample to the step's open ticket (``streaming.py``), or, with
``stream_rewards=false``, the trainer submits the batch after generation. Each output records which of its columns are the agent
loop's extra fields (``TOOL_FIELDS_KEY``), which naive hands a reward as ``tool_extra_fields``.
Validation batches are scored through the agent here, waiting for all of them, and carry
``rm_scores`` and the reward's extra info as verl's validation expects. verl pads a validation
batch to a multiple of the agent-loop worker count by repeating its first rows (uids included):
only the real rows are scored, and each padding row gets its source row's score (verl drops them).
"""

from __future__ import annotations

import ray

from verl import DataProto
from verl.experimental.agent_loop import AgentLoopManager
from verl.experimental.reward_loop.reward_manager.base import RewardManagerBase
from verl_async_rm.integration.decode import decode_requests, padding_sources, real_length_of_padded
from verl_async_rm.strategies.rewards import BatchRewards, object_array, reorder
from verl_async_rm.strategies.streaming import StreamingAgentLoopWorker, tool_field_columns

CLASS_PATH = "verl_async_rm.strategies.agent_loop.AgentLoopManagerWithoutRewards"
TOOL_FIELDS_KEY = "async_rm_tool_fields"  # meta_info: the output columns that are agent-loop extra fields
__all__ = ["AgentLoopManagerWithoutRewards", "CLASS_PATH", "TOOL_FIELDS_KEY", "tool_field_columns"]


class AgentLoopManagerWithoutRewards(AgentLoopManager):
    def __init__(self, config, llm_client, teacher_client=None, reward_loop_worker_handles=None):
        self.agent_loop_workers_class = ray.remote(StreamingAgentLoopWorker)  # verl's seam for the worker class
        super().__init__(config, llm_client, teacher_client, reward_loop_worker_handles=None)
        self._validation_rewards: BatchRewards | None = None

    def generate_sequences(self, prompts: DataProto) -> DataProto:
        output = super().generate_sequences(prompts)
        # after the call: verl adds "priority" to the prompts in place
        output.meta_info[TOOL_FIELDS_KEY] = tool_field_columns(output.non_tensor_batch, prompts.non_tensor_batch)
        if prompts.meta_info.get("validate", False):
            self._score_validation(output)
        return output

    def _score_validation(self, output: DataProto) -> None:
        if self._validation_rewards is None:
            from verl.utils import hf_tokenizer

            from verl_async_rm.integration.settings import read_run_settings

            model = self.config.actor_rollout_ref.model
            settings = read_run_settings(self.config).agent  # once: this manager's validation client
            self._validation_rewards = BatchRewards(settings, hf_tokenizer(model.tokenizer_path or model.path))
        rewards = self._validation_rewards
        tool_fields = output.meta_info.pop(TOOL_FIELDS_KEY)
        non_tensor = output.non_tensor_batch
        uids = list(non_tensor["uid"]) if "uid" in non_tensor else list(range(len(output)))
        prompts = [tuple(row.tolist()) for row in output.batch["prompts"]]
        rollout = self.config.actor_rollout_ref.rollout
        real = real_length_of_padded(uids, prompts, int(rollout.agent.num_workers), int(rollout.val_kwargs.n))
        requests = decode_requests(output[:real], rewards.tokenizer, rewards.settings.reward_fn_key, tool_fields)
        scored = rewards.take(rewards.submit(requests, validation=True))  # all of it: validation waits for every score
        scores, extra = reorder(scored, padding_sources(len(output), real))
        output.batch["rm_scores"] = RewardManagerBase.assemble_rm_scores(output, scores)
        for key, values in extra.items():
            non_tensor[key] = object_array(values)
        output.meta_info["reward_extra_keys"] = list(extra)

