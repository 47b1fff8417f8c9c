"""Rows -> reward requests as verl's naive manager builds them; padding rows; v1 sessions; the
fixed extra-info keys; the group-size stamps. Pure, fast."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from tensordict import TensorDict

from verl import DataProto
from verl_async_rm.integration.decode import (
    FIXED_EXTRA_KEYS,
    decode_requests,
    fixed_extra_columns,
    fixed_extra_info,
    padding_sources,
    real_length_of_padded,
    reward_extra_info,
    sessions_of,
)
from verl_async_rm.integration.group_sizes import rows_per_uid, sessions_per_prompt
from verl_async_rm.strategies.agent_loop import tool_field_columns

pytestmark = pytest.mark.local


class ByteTokenizer:
    def batch_decode(self, rows, skip_special_tokens=True):
        return ["".join(chr(t) for t in row) for row in rows]


def batch_of(texts, non_tensor):
    width = max(map(len, texts)) + 1
    responses = torch.zeros((len(texts), width), dtype=torch.long)
    mask = torch.zeros((len(texts), 2 + width), dtype=torch.long)
    for i, text in enumerate(texts):
        responses[i, : len(text)] = torch.tensor([ord(c) for c in text])
        mask[i, : 2 + len(text)] = 1
    tensors = TensorDict({"responses": responses, "attention_mask": mask, "prompts": torch.ones(len(texts), 2, dtype=torch.long)},
                         batch_size=len(texts))
    return DataProto(batch=tensors, non_tensor_batch={k: np.array(v, dtype=object) for k, v in non_tensor.items()})


def test_naives_extra_info_on_every_path():
    """naive (verl 0.9.1): dataset extra_info, updated with the agent loop's fields, plus num_turns
    and rollout_reward_scores. The per-sample path packs the fields as tool_extra_fields; the
    strategies' batched path has them as columns (default columns left at None are not fields)."""
    expected = {"split": "train", "index": 3, "max_global_steps": 7, "raw_prompt": "p", "num_turns": 2,
                "rollout_reward_scores": {}}
    per_sample = batch_of(["ab"], {
        "extra_info": [{"split": "train", "index": 3}], "tool_extra_fields": [{"max_global_steps": 7, "raw_prompt": "p"}],
        "__num_turns__": [np.int32(2)], "uid": ["u"], "data_source": ["d"], "reward_model": [{"ground_truth": "g"}],
    })
    [request] = decode_requests(per_sample, ByteTokenizer())
    assert request["extra_info"] == expected
    assert (request["solution_str"], request["ground_truth"], request["uid"]) == ("ab", "g", "u")
    batched = batch_of(["ab"], {
        "extra_info": [{"split": "train", "index": 3}], "max_global_steps": [7], "raw_prompt": ["p"], "turn_scores": [None],
        "__num_turns__": [2], "uid": ["u"], "data_source": ["d"], "reward_model": [{"ground_truth": "g"}],
    })
    fields = tool_field_columns(batched.non_tensor_batch, ["extra_info", "raw_prompt", "uid", "data_source", "reward_model"])
    assert fields == ["max_global_steps", "raw_prompt", "turn_scores"]
    [request] = decode_requests(batched, ByteTokenizer(), tool_field_keys=fields)
    assert request["extra_info"] == expected
    assert reward_extra_info(None, None, None, None) == {"num_turns": None, "rollout_reward_scores": {}}


def test_the_reward_never_mutates_the_datasets_extra_info():
    shared = {"split": "train"}
    reward_extra_info(shared, {"x": 1}, 2, None)
    assert shared == {"split": "train"}


def test_every_sample_carries_the_same_keys_success_or_failure():
    ok = fixed_extra_info(0.5, {"reward_failed": 0, "verdict": "yes"}, ("verdict", "extra"))
    failed = fixed_extra_info(0.2, {"reward_failed": 1, "reward_failure": "timeout", "reward_error": "..."}, ("verdict", "extra"))
    assert list(ok) == list(failed) == [*FIXED_EXTRA_KEYS, "verdict", "extra"]
    assert ok["acc"] == 0.5 and failed["acc"] is None and failed["reward_failure"] == "timeout"
    # two chunks of one ticket, one with a failure and one without, give the same columns (F1)
    clean = fixed_extra_columns([1.0], {"reward_failed": [0]})
    dirty = fixed_extra_columns([0.0], {"reward_failed": [1], "reward_failure": ["error"], "reward_error": ["boom"]})
    assert list(clean) == list(dirty) == list(FIXED_EXTRA_KEYS)


@given(
    groups=st.integers(1, 12),
    group_size=st.integers(1, 4),
    divisor=st.integers(1, 6),
)
def test_verls_validation_padding_is_recovered(groups, group_size, divisor):
    """verl's pad_dataproto_to_divisor appends copies of the first rows; the real length comes back
    exactly, whatever the batch, group size and divisor (uids unique per prompt, as verl makes them)."""
    uids = [f"u{g}" for g in range(groups) for _ in range(group_size)]
    prompts = [f"p{g}" for g in range(groups) for _ in range(group_size)]
    real = len(uids)
    pad = (-real) % divisor
    padded_uids = uids + [uids[j % real] for j in range(pad)]
    padded_prompts = prompts + [prompts[j % real] for j in range(pad)]
    assert real_length_of_padded(padded_uids, padded_prompts, divisor, group_size) == real
    sources = padding_sources(len(padded_uids), real)
    assert [padded_uids[s] for s in sources] == padded_uids and sources[:real] == list(range(real))


def test_rows_of_one_group_are_not_mistaken_for_padding():
    assert real_length_of_padded(["a", "a"], ["p", "p"], 2, group_size=2) == 2  # one group of two
    assert real_length_of_padded(["a", "a"], ["p", "p"], 2, group_size=1) == 1  # one row, padded
    assert real_length_of_padded(["a", "b", "c", "a"], list("pqrp"), 2) == 3
    assert real_length_of_padded(["a", "b", "b", "a"], list("pqqp"), 4) == 4  # nothing verl would produce


def test_v1_sessions_score_the_final_output():
    keys = ["u1_0_0", "u1_0_1", "u1_1_0", "u-2_0_0", "u-2_0_2", "u-2_0_1"]
    sessions = sessions_of(keys)
    assert [(s.uid, s.session, s.final_key, s.keys) for s in sessions] == [
        ("u1", "0", "u1_0_1", ("u1_0_0", "u1_0_1")),
        ("u1", "1", "u1_1_0", ("u1_1_0",)),
        ("u-2", "0", "u-2_0_2", ("u-2_0_0", "u-2_0_2", "u-2_0_1")),
    ]
    with pytest.raises(ValueError, match="unexpected TransferQueue key"):
        sessions_of(["nounderscore"])


def test_group_size_stamps():
    assert rows_per_uid(["a", "a", "b", "a"]) == [3, 3, 1, 3]  # a padding copy joins its source's group
    assert sessions_per_prompt(3, False, None, n=4, val_n=1) == [4, 4, 4]
    assert sessions_per_prompt(3, True, None, n=4, val_n=1) == [1, 1, 1]
    assert sessions_per_prompt(2, False, [torch.tensor(2), 5], n=4, val_n=1) == [2, 5]
