"""verl's AgentLoopManager without in-loop rewards, chosen through verl's own config seam
``actor_rollout_ref.rollout.agent.agent_loop_manager_class``.

Training batches come back from generation unscored, so generation never waits for a reward; the
trainer submits them to the agent itself. Validation batches are scored through the agent here,
waiting for all of them, and carry ``rm_scores`` as verl's validation expects.
"""

from __future__ import annotations

from verl import DataProto
from verl.experimental.agent_loop import AgentLoopManager
from verl.experimental.reward_loop.reward_manager.base import RewardManagerBase
from verl_async_rm.strategies.rewards import BatchRewards, attach_extra_info
from verl_async_rm.verl_compat import require_verl

CLASS_PATH = "verl_async_rm.strategies.agent_loop.AgentLoopManagerWithoutRewards"


class AgentLoopManagerWithoutRewards(AgentLoopManager):
    def __init__(self, config, llm_client, teacher_client=None, reward_loop_worker_handles=None):
        require_verl("the async reward strategies (v0)", (("verl.experimental.agent_loop", "AgentLoopManager"),))
        super().__init__(config, llm_client, teacher_client, reward_loop_worker_handles=None)
        self._validation_rewards: BatchRewards | None = None

    def generate_sequences(self, prompts: DataProto) -> DataProto:
        output = super().generate_sequences(prompts)
        if prompts.meta_info.get("validate", False):
            self._score_validation(output)
        return output

    def _score_validation(self, output: DataProto) -> None:
        if self._validation_rewards is None:
            from verl.utils import hf_tokenizer

            model = self.config.actor_rollout_ref.model
            self._validation_rewards = BatchRewards(self.config, hf_tokenizer(model.tokenizer_path or model.path))
        rewards = self._validation_rewards
        chunk = rewards.take(rewards.submit(output))  # all of it: validation waits for every score
        output.batch["rm_scores"] = RewardManagerBase.assemble_rm_scores(output, chunk.scores)
        attach_extra_info(output, chunk.extra_info)
        output.meta_info["reward_extra_keys"] = list(chunk.extra_info)
