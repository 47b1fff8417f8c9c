"""DataProto rows -> reward requests, as verl's naive manager reads them."""

from __future__ import annotations

from typing import Any

import numpy as np


def valid_response_lengths(data) -> Any:
    """Tokens of each response that are not padding (from the attention mask)."""
    response_length = data.batch["responses"].shape[-1]
    return data.batch["attention_mask"][:, -response_length:].sum(dim=-1)


def _extra_info(non_tensor: dict, i: int) -> dict | None:
    extra = non_tensor.get("extra_info")
    extra = dict(extra[i]) if extra is not None and extra[i] is not None else None
    tool_fields = non_tensor.get("tool_extra_fields")
    if tool_fields is not None and tool_fields[i] is not None:
        extra = {**(extra or {}), **dict(tool_fields[i])}
    return extra


def _scalar(value: Any) -> Any:
    return value.item() if isinstance(value, np.generic) else value


def decode_requests(data, tokenizer, reward_fn_key: str = "data_source") -> list[dict]:
    """One request per row: response decoded without special tokens, valid length from the mask,
    data source from ``reward_fn_key``, ground truth from ``reward_model.ground_truth``."""
    lengths = valid_response_lengths(data).tolist()
    responses = data.batch["responses"]
    texts = tokenizer.batch_decode(
        [responses[i, : lengths[i]].tolist() for i in range(len(data))], skip_special_tokens=True
    )
    non_tensor = data.non_tensor_batch
    sources = non_tensor.get(reward_fn_key)
    reward_model = non_tensor.get("reward_model")
    uids = non_tensor.get("uid")
    requests = []
    for i, text in enumerate(texts):
        truth = reward_model[i].get("ground_truth") if reward_model is not None and reward_model[i] else None
        requests.append(
            {
                "index": i,
                "solution_str": text,
                "ground_truth": _scalar(truth),
                "data_source": str(sources[i]) if sources is not None else "",
                "extra_info": _extra_info(non_tensor, i),
                "uid": str(uids[i]) if uids is not None else None,
            }
        )
    return requests


def group_size_of(requests: list[dict]) -> int:
    """A whole batch states its group size: every uid appears the same number of times."""
    counts: dict[Any, int] = {}
    for request in requests:
        if request["uid"] is None:
            return 1
        counts[request["uid"]] = counts.get(request["uid"], 0) + 1
    sizes = set(counts.values())
    if len(sizes) > 1:
        raise ValueError(f"uids appear unequally often in the batch ({sorted(sizes)}): cannot form GRPO groups")
    return sizes.pop() if sizes else 1
