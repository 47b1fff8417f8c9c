"""Score while generating: the request an agent-loop worker builds for one finished sample is the
request the trainer's batch path builds for that sample's row (same dict => same score). Real
verl classes (its ``_postprocess``, its output types), no Ray. Pure apart from them, fast."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from verl.experimental.agent_loop.agent_loop import AgentLoopMetrics, AgentLoopOutput, _InternalAgentLoopOutput
from verl_async_rm.integration.decode import decode_requests, requests_from_token_lists, session_reward_columns
from verl_async_rm.strategies.streaming import ROW_KEY, SESSION_STRIDE, StreamingAgentLoopWorker, tool_field_columns, v1_index

pytestmark = pytest.mark.local
PROMPT_WIDTH, RESPONSE_WIDTH = 6, 8


class ByteTokenizer:
    pad_token_id = 0

    def batch_decode(self, rows, skip_special_tokens=True):
        return ["".join(chr(t) for t in row) for row in rows]


def internal(prompt: list[int], response: list[int], extra: dict, turns: int) -> _InternalAgentLoopOutput:
    """One sample as verl's ``_agent_loop_postprocess`` returns it (padded, batch dim 1)."""
    p = torch.zeros(1, PROMPT_WIDTH, dtype=torch.long)
    p[0, PROMPT_WIDTH - len(prompt):] = torch.tensor(prompt)
    r = torch.zeros(1, RESPONSE_WIDTH, dtype=torch.long)
    r[0, :len(response)] = torch.tensor(response)
    mask = torch.zeros(1, PROMPT_WIDTH + RESPONSE_WIDTH, dtype=torch.long)
    mask[0, PROMPT_WIDTH - len(prompt):PROMPT_WIDTH + len(response)] = 1
    rmask = mask[:, PROMPT_WIDTH:].clone()
    return _InternalAgentLoopOutput(prompt_ids=p, response_ids=r, input_ids=torch.cat([p, r], 1), position_ids=mask.cumsum(1),
                                    response_mask=rmask, attention_mask=mask, num_turns=turns,
                                    metrics=AgentLoopMetrics(), extra_fields=extra)


def worker() -> StreamingAgentLoopWorker:
    """The worker's request building, without its Ray/LLM set-up."""
    w = object.__new__(StreamingAgentLoopWorker)
    w.tokenizer = ByteTokenizer()
    w.reward_loop_worker_handles = None
    w.rollout_config = SimpleNamespace(agent=SimpleNamespace(default_agent_loop="single_turn_agent"))
    w._reward_fn_key = "data_source"
    return w


def test_a_v0_sample_streamed_from_its_worker_is_requested_as_the_batch_path_requests_its_row():
    texts = ["abc", "hello!", "x"]
    samples = [internal([1, 2, 3], [ord(c) for c in t], {"raw_prompt": f"p{i}", "max_global_steps": 7, "turn_scores": None,
                                                         **({"tool_reward": 0.5} if i == 1 else {})}, turns=2)
               for i, t in enumerate(texts)]
    # the generation batch as the trainer sends it (the manager adds "priority", the worker "agent_name")
    prompts = {
        "uid": ["u0", "u0", "u1"], "data_source": ["src"] * 3, "reward_model": [{"ground_truth": "lower"}] * 3,
        "extra_info": [{"index": i, "split": "train"} for i in range(3)], "raw_prompt": [f"p{i}" for i in range(3)],
        "priority": [0, 1, 2], ROW_KEY: [0, 1, 2],
    }
    input_keys = frozenset(prompts)
    worker_batch = {k: np.array(v + [], dtype=object) for k, v in prompts.items()}
    worker_batch["agent_name"] = np.array(["single_turn_agent"] * 3, dtype=object)
    w = worker()
    # the batch path: verl's _postprocess of the whole batch, then decode_requests per row
    batch = w._postprocess(samples, input_non_tensor_batch=worker_batch, validate=False)
    expected = decode_requests(batch, w.tokenizer, "data_source", tool_field_columns(batch.non_tensor_batch, input_keys))
    # streamed: each sample alone, with the kwargs verl's _run_agent_loop passes (no agent_name)
    streamed = [w.sample_request(sample, input_keys, {k: v[i] for k, v in prompts.items()}) for i, sample in enumerate(samples)]
    # rows whose loops set the same extra fields match exactly; a field only another row has is None
    # on the batch path (the batch's columns are the union) and absent when streamed
    assert streamed[1] == expected[1] and streamed[1]["extra_info"]["tool_reward"] == 0.5
    for i in (0, 2):
        assert expected[i]["extra_info"].pop("tool_reward") is None and "tool_reward" not in streamed[i]["extra_info"]
        assert streamed[i] == expected[i]
    assert [r["solution_str"] for r in streamed] == texts
    # what stock verl's reward sees of the loop is its extra fields: not the worker's agent_name column
    assert not [r for r in (*streamed, *expected) if "agent_name" in r["extra_info"]]
    assert streamed[1]["extra_info"]["max_global_steps"] == 7 and streamed[1]["extra_info"]["num_turns"] == 2


def test_a_v1_session_request_matches_the_trainers_from_transfer_queue_fields():
    """The trainer reads the session's final output back from TransferQueue; the worker has the
    same fields (``output.as_dict()`` updated with the prompt's) in hand."""
    output = AgentLoopOutput(prompt_ids=[5, 6], response_ids=[ord(c) for c in "Hi there"], response_mask=[1] * 8,
                             num_turns=2, metrics=AgentLoopMetrics(), extra_fields={"min_global_steps": 3})
    prompt = {"uid": "u7", "session_id": 1, "data_source": "src", "reward_model": {"ground_truth": "upper"},
              "extra_info": {"index": 4}, "raw_prompt": "p"}
    field = output.as_dict()
    field.update(prompt)
    columns = session_reward_columns(lambda name: [field[name]] if name in field else None, "data_source")
    [streamed] = requests_from_token_lists([field["prompts"].tolist()], [field["responses"].tolist()], columns,
                                           ByteTokenizer(), "data_source")
    # what the trainer's old batch path built: padded tensors, the same columns by hand
    from tensordict import TensorDict
    from verl import DataProto

    resp = torch.tensor([[ord(c) for c in "Hi there"] + [0, 0]])
    mask = torch.tensor([[1, 1] + [1] * 8 + [0, 0]])
    nt = {"uid": ["u7"], "reward_model": [prompt["reward_model"]], "extra_info": [prompt["extra_info"]],
          "data_source": ["src"], "tool_extra_fields": [{"min_global_steps": 3}], "__num_turns__": [2]}
    data = DataProto(batch=TensorDict({"prompts": torch.tensor([[5, 6]]), "responses": resp, "attention_mask": mask}, batch_size=1),
                     non_tensor_batch={k: np.array(v, dtype=object) for k, v in nt.items()})
    [expected] = decode_requests(data, ByteTokenizer(), "data_source")
    assert streamed == expected
    assert streamed["solution_str"] == "Hi there" and streamed["extra_info"]["min_global_steps"] == 3


def test_v1_indices_name_each_session_once():
    seen = {v1_index(p, s) for p in range(50) for s in range(9)}
    assert len(seen) == 50 * 9
    with pytest.raises(ValueError):
        v1_index(0, SESSION_STRIDE)
