"""Generated rows -> reward requests, with the inputs verl's naive manager gives a reward; and the
fixed set of extra-info keys every scored sample carries back. Pure apart from the tokenizer.

What naive's ``run_single`` (verl 0.9.1, ``experimental/reward_loop/reward_manager/naive.py``)
passes as ``extra_info``: the dataset's ``extra_info``, updated with the agent loop's extra fields
(``tool_extra_fields``), plus ``num_turns`` (``__num_turns__``) and ``rollout_reward_scores``
(``reward_scores``, default ``{}``). Every path here builds the same dict.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any, Optional, Sequence

# Keys every sample's extra info carries, success or failure: verl stacks per-sample extra info by
# the first sample's keys (per-sample path) and concatenates chunks by key (strategies).
FIXED_EXTRA_KEYS = ("acc", "reward_failed", "reward_failure")
# Columns verl's agent loop adds to every output (``_postprocess``), None where a loop set nothing;
# on the per-sample path a reward never sees them unless the loop set them.
DEFAULT_AGENT_FIELDS = frozenset({"turn_scores", "tool_rewards", "min_global_steps", "max_global_steps", "extras"})


def valid_response_lengths(data) -> Any:
    """Tokens of each response that are not padding (from the attention mask)."""
    response_length = data.batch["responses"].shape[-1]
    return data.batch["attention_mask"][:, -response_length:].sum(dim=-1)


def _scalar(value: Any) -> Any:
    """numpy and torch scalars (0-d) as Python numbers; anything else as is."""
    return value.item() if hasattr(value, "item") and getattr(value, "shape", None) == () else value


def reward_extra_info(
    extra_info: Optional[dict], tool_fields: Optional[dict], num_turns: Any, reward_scores: Any
) -> dict:
    """The ``extra_info`` a reward receives, as naive builds it."""
    merged = dict(extra_info) if extra_info else {}
    if tool_fields:
        merged.update(tool_fields)
    merged["num_turns"] = _scalar(num_turns)
    merged["rollout_reward_scores"] = reward_scores if reward_scores is not None else {}
    return merged


def tool_fields_of_row(non_tensor: dict, i: int, tool_field_keys: Sequence[str] = ()) -> Optional[dict]:
    """The agent loop's extra fields of row ``i``: the ``tool_extra_fields`` dict on the per-sample
    path; on the strategies' batched path, the columns ``tool_field_keys`` (default columns that
    the loop left at None are dropped, as the per-sample path never has them)."""
    packed = non_tensor.get("tool_extra_fields")
    if packed is not None and packed[i] is not None:
        return dict(packed[i])
    if not tool_field_keys:
        return None
    fields = {}
    for key in tool_field_keys:
        value = non_tensor[key][i]
        if value is None and key in DEFAULT_AGENT_FIELDS:
            continue
        fields[key] = _scalar(value)
    return fields


def decode_requests(data, tokenizer, reward_fn_key: str = "data_source", tool_field_keys: Sequence[str] = ()) -> list[dict]:
    """One request per row: response decoded without special tokens, valid length from the mask,
    data source from ``reward_fn_key``, ground truth from ``reward_model.ground_truth``, and naive's
    ``extra_info``."""
    lengths = valid_response_lengths(data).tolist()
    responses = data.batch["responses"]
    texts = tokenizer.batch_decode(
        [responses[i, : lengths[i]].tolist() for i in range(len(data))], skip_special_tokens=True
    )
    non_tensor = data.non_tensor_batch
    sources = non_tensor.get(reward_fn_key)
    reward_model = non_tensor.get("reward_model")
    uids = non_tensor.get("uid")
    extra = non_tensor.get("extra_info")
    turns = non_tensor.get("__num_turns__")
    reward_scores = non_tensor.get("reward_scores")
    requests = []
    for i, text in enumerate(texts):
        truth = reward_model[i].get("ground_truth") if reward_model is not None and reward_model[i] else None
        requests.append(
            {
                "index": i,
                "solution_str": text,
                "ground_truth": _scalar(truth),
                "data_source": str(sources[i]) if sources is not None else "",
                "extra_info": reward_extra_info(
                    extra[i] if extra is not None else None,
                    tool_fields_of_row(non_tensor, i, tool_field_keys),
                    turns[i] if turns is not None else None,
                    reward_scores[i] if reward_scores is not None else None,
                ),
                "uid": str(uids[i]) if uids is not None else None,
            }
        )
    return requests


def group_size_of(requests: list[dict]) -> int:
    """A whole batch states its group size: every uid appears the same number of times."""
    sizes = set(group_counts(requests).values())
    if len(sizes) > 1:
        raise ValueError(f"uids appear unequally often in the batch ({sorted(sizes)}): cannot form GRPO groups")
    return sizes.pop() if sizes else 1


def group_counts(requests: list[dict]) -> dict[Any, int]:
    """Samples per uid (a request without a uid is a group of one)."""
    counts: Counter = Counter()
    for request in requests:
        counts[request["uid"] if request["uid"] is not None else ("sample", request["index"])] += 1
    return dict(counts)


def fixed_extra_info(score: float, extra: dict, extra_keys: Sequence[str] = ()) -> dict:
    """One sample's extra info with exactly ``FIXED_EXTRA_KEYS + extra_keys``: ``acc`` (as naive;
    None for a failed sample, which verl's validation metrics skip), the failure flags, and the
    declared user keys (None where a sample has none)."""
    failed = extra.get("reward_failed", 0)
    fixed = {
        "acc": None if failed else extra.get("acc", score),
        "reward_failed": failed,
        "reward_failure": extra.get("reward_failure") or "",
    }
    for key in extra_keys:
        fixed[key] = extra.get(key)
    return fixed


def fixed_extra_columns(scores: Sequence[float], extra_info: dict[str, list], extra_keys: Sequence[str] = ()) -> dict[str, list]:
    """``fixed_extra_info`` over a chunk's columns (whatever keys this chunk happened to carry)."""
    columns: dict[str, list] = {key: [] for key in (*FIXED_EXTRA_KEYS, *extra_keys)}
    for i, score in enumerate(scores):
        row = fixed_extra_info(score, {key: values[i] for key, values in extra_info.items()}, extra_keys)
        for key, value in row.items():
            columns[key].append(value)
    return columns


# -- rows verl added to a batch for its own reasons ---------------------------------------------------


def real_length_of_padded(uids: Sequence[Any], prompts: Sequence[Any], divisor: int, group_size: int = 1) -> int:
    """verl's ``pad_dataproto_to_divisor`` appends copies of the batch's first rows until its length
    is a multiple of ``divisor`` (v0 validation pads to the agent-loop worker count). Given the
    padded batch's uids and prompts (anything comparable per row) and its group size (each prompt
    repeated ``val_kwargs.n`` times, contiguously, under a uid of its own), return how many rows are
    real: the length L that verl would pad to this length, made of whole groups of distinct uids,
    whose tail repeats its head cyclically. At most one L qualifies (a shorter one would make
    later real groups copies of the first). None qualifying: the length itself."""
    total, size, divisor = len(uids), max(1, group_size), max(1, divisor)

    def whole_groups(length: int) -> bool:
        firsts = [uids[start] for start in range(0, length, size)]
        return len(set(firsts)) == len(firsts) and all(uids[i] == uids[i - i % size] for i in range(length))

    for real in range(total - total % size, max(0, total - divisor), -size):
        pad = total - real
        if pad != (-real) % divisor or not whole_groups(real):
            continue
        if all(uids[real + j] == uids[j % real] and prompts[real + j] == prompts[j % real] for j in range(pad)):
            return real
    return total


def padding_sources(total: int, real: int) -> list[int]:
    """The row each row of a padded batch copies (a real row: itself)."""
    return [i if i < real else (i - real) % real for i in range(total)]


# -- v1: TransferQueue keys "{uid}_{session}_{index}" ------------------------------------------------


@dataclass(frozen=True)
class Session:
    uid: str
    session: str
    final_key: str  # the highest output index: the one verl scores
    keys: tuple[str, ...]  # every output of the session, in the batch's order


def sessions_of(keys: Sequence[str]) -> list[Session]:
    """Group v1 trajectory keys by session; verl scores each session's final output and copies the
    score to its earlier outputs (``agent_loop_tq._agent_loop_postprocess``)."""
    outputs: dict[tuple[str, str], list[tuple[int, str]]] = {}
    for key in keys:
        parts = key.rsplit("_", 2)
        if len(parts) != 3 or not parts[2].isdigit():
            raise ValueError(f"unexpected TransferQueue key {key!r}: expected '{{uid}}_{{session}}_{{index}}'")
        outputs.setdefault((parts[0], parts[1]), []).append((int(parts[2]), key))
    return [
        Session(uid, session, max(found)[1], tuple(key for _, key in found))
        for (uid, session), found in outputs.items()
    ]


# -- v1: a session's request from its TransferQueue fields --------------------------------------------


def session_reward_columns(get, reward_fn_key: str) -> dict[str, list]:
    """The non-tensor columns ``decode_requests`` reads, from v1 TransferQueue fields (``get(name)``:
    the field's values per row, None when absent): the agent loop's ``extra_fields`` are naive's
    ``tool_extra_fields``, ``num_turns`` its ``__num_turns__``. The trainer (from TransferQueue) and
    the agent-loop worker (from the fields it is about to put there) both build requests with this."""
    columns = {}
    for name in ("uid", "reward_model", "extra_info", reward_fn_key, "reward_scores"):
        values = get(name)
        if values is not None:
            columns[name] = list(values)
    for field, column in (("extra_fields", "tool_extra_fields"), ("num_turns", "__num_turns__")):
        values = get(field)
        if values is not None:
            columns[column] = list(values)
    return columns


def requests_from_token_lists(prompts: Sequence[Sequence[int]], responses: Sequence[Sequence[int]],
                              columns: dict[str, list], tokenizer, reward_fn_key: str, pad_id: int = 0) -> list[dict]:
    """``decode_requests`` on rows given as token lists (prompts left-padded, responses right-padded,
    the attention mask from their lengths), with ``columns`` as the non-tensor batch."""
    import numpy as np
    import torch
    from tensordict import TensorDict
    from verl import DataProto

    n = len(prompts)
    prompt_width = max([len(p) for p in prompts] + [1])
    response_width = max([len(r) for r in responses] + [1])
    prompt_ids = torch.full((n, prompt_width), pad_id, dtype=torch.long)
    response_ids = torch.full((n, response_width), pad_id, dtype=torch.long)
    mask = torch.zeros((n, prompt_width + response_width), dtype=torch.long)
    for i, (p, r) in enumerate(zip(prompts, responses, strict=True)):
        if len(p):
            prompt_ids[i, prompt_width - len(p):] = torch.as_tensor(list(p), dtype=torch.long)
            mask[i, prompt_width - len(p):prompt_width] = 1
        if len(r):
            response_ids[i, :len(r)] = torch.as_tensor(list(r), dtype=torch.long)
            mask[i, prompt_width:prompt_width + len(r)] = 1
    non_tensor = {}
    for name, values in columns.items():
        array = np.empty(n, dtype=object)
        array[:] = list(values)
        non_tensor[name] = array
    tensors = TensorDict({"prompts": prompt_ids, "responses": response_ids, "attention_mask": mask}, batch_size=n)
    return decode_requests(DataProto(batch=tensors, non_tensor_batch=non_tensor), tokenizer, reward_fn_key)
