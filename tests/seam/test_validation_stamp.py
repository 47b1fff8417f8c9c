"""verl's validation samples reach the agent marked as such on the per-sample path: verl tells only the
agent-loop manager that a batch is validation (v0: ``meta_info["validate"]``; v1: the batch's
``validate`` entry), so our managers stamp every row (``VALIDATION_KEY``) and ``run_single`` passes it
to ``score_in_group(..., validation=...)``, where ``admission_order: deadline`` ranks it first
(tests/agent/test_admission_order.py). verl's own ``generate_sequences`` is replaced by a recorder: its
real one starts workers."""

from __future__ import annotations

import asyncio
import types

import numpy as np
import pytest
from omegaconf import OmegaConf
from tensordict import TensorDict

from tests.seam.test_seam_decode import ByteTokenizer, batch_of
from verl import DataProto
from verl_async_rm.integration.group_sizes import GROUP_SIZE_KEY, VALIDATION_KEY

pytestmark = pytest.mark.local


@pytest.mark.parametrize("validate", [True, False, None])
def test_v1_manager_stamps_whether_the_batch_is_validation(monkeypatch, validate):
    from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopManagerTQ
    from verl.utils import tensordict_utils as tu

    from verl_async_rm.integration.group_size_v1 import AgentLoopManagerTQWithGroupSizes

    seen = []
    monkeypatch.setattr(AgentLoopManagerTQ, "generate_sequences", lambda self, batch: seen.append(batch))
    manager = object.__new__(AgentLoopManagerTQWithGroupSizes)  # verl's __init__ starts the workers
    manager._agent_settings, manager._client, manager.reward_loop_worker_handles = None, None, None
    manager.config = OmegaConf.create({"actor_rollout_ref": {"rollout": {"n": 4, "val_kwargs": {"n": 2}}}})
    batch = TensorDict({}, batch_size=[3])
    if validate is not None:
        tu.assign_non_tensor_data(batch, "validate", validate)
    manager.generate_sequences(batch)
    stamped = list(tu.get(seen[0], VALIDATION_KEY))
    assert stamped == [int(bool(validate))] * 3
    assert list(tu.get(seen[0], GROUP_SIZE_KEY)) == [2 if validate else 4] * 3


@pytest.mark.parametrize("validate", [True, False, None])
def test_v0_manager_stamps_whether_the_batch_is_validation(monkeypatch, validate):
    from verl.experimental.agent_loop import AgentLoopManager

    from verl_async_rm.integration.group_size_v0 import AgentLoopManagerWithGroupSizes

    seen = []
    monkeypatch.setattr(AgentLoopManager, "generate_sequences", lambda self, prompts: seen.append(prompts))
    manager = object.__new__(AgentLoopManagerWithGroupSizes)
    prompts = DataProto.from_dict(non_tensors={"uid": np.array(["a", "a", "b"], dtype=object)},
                                  meta_info={} if validate is None else {"validate": validate})
    manager.generate_sequences(prompts)
    assert list(seen[0].non_tensor_batch[VALIDATION_KEY]) == [int(bool(validate))] * 3
    assert list(seen[0].non_tensor_batch[GROUP_SIZE_KEY]) == [2, 2, 1]


@pytest.mark.parametrize("stamp, expected", [([1], True), ([0], False), (None, False)])
def test_run_single_tells_the_agent_a_validation_sample(stamp, expected):
    from verl_async_rm.integration.reward_manager import AsyncAgentRewardManager

    calls = []

    class Client:
        async def score_in_group(self, request, uid, size, wait, **kwargs):
            calls.append(kwargs)
            return 1.0, {}

    manager = object.__new__(AsyncAgentRewardManager)  # its __init__ connects to the agent
    manager.tokenizer, manager.client, manager._warned_unstamped = ByteTokenizer(), Client(), True
    manager.settings = types.SimpleNamespace(reward_fn_key="data_source", group_size=1, group_wait=None, group_timeout=None,
                                             extra_keys=())
    columns = {"uid": ["u"], "data_source": ["toy"], "reward_model": [{"ground_truth": "1"}]}
    if stamp is not None:
        columns[VALIDATION_KEY] = stamp
    result = asyncio.run(manager.run_single(batch_of(["1"], columns)))
    assert result["reward_score"] == 1.0
    assert calls == [{"validation": expected}]
