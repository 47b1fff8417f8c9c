"""The scores' TransferQueue traffic on verl's v1 trainer: written with the advantages, in one write.

verl's v1 ``_compute_advantage`` reads ``rm_scores`` (and the policy fields) for its rows from
TransferQueue, computes, and writes ``advantages``/``returns`` back. Stock verl's agent loop wrote
``rm_scores`` during generation; the strategies score outside generation, so a plain scores write
before each advantage call would be one more TransferQueue round trip per call, and a pipelined
step makes several calls (measured: ~7 ms a write on the CPU backend, most of what a split step's
scores cost). ``advantage_call_with_scores`` instead runs verl's own method with its read answered
with the scores in hand (the other fields still read from TransferQueue, as verl asked for them)
and the scores (and each row's staleness) added to its write. verl's arithmetic is untouched: the
same method on the same values.

How: for the call's duration verl's module global ``tq`` (``verl.trainer.ppo.v1.trainer_base.tq``,
listed in verl_internals.py) is a proxy that forwards everything to TransferQueue but these two
calls made on the calling thread (another thread's go through untouched). If verl's method no
longer reads ``rm_scores`` or no longer writes its rows once, the proxy raises rather than leave a
row without its score (tests/seam/test_v1_scores_io.py runs verl's method against the plain path).
"""

from __future__ import annotations

import contextlib
import sys
import threading
from typing import Any, Callable, Iterator, Optional, Sequence

import torch
from tensordict import TensorDict

SCORES_FIELD = "rm_scores"
V1_TRAINER_MODULE = "verl.trainer.ppo.v1.trainer_base"


def score_rows(lengths: Sequence[int], scores: Sequence[float]) -> torch.Tensor:
    """``rm_scores`` as verl's agent loop writes them: per row, zeros over the response with the
    score on its last token (a jagged nested tensor, one row per response)."""
    rows = []
    for length, score in zip(lengths, scores, strict=True):
        row = torch.zeros(int(length), dtype=torch.float32)
        if length:
            row[-1] = score
        rows.append(row)
    return torch.nested.as_nested_tensor(rows, layout=torch.jagged)


class _ServedScores:
    """verl's ``tq`` during one advantage call: its read of ``rm_scores`` answered from ``scores``,
    its write of the same rows carrying ``scores`` and ``extra`` along; anything else forwarded."""

    def __init__(self, real: Any, scores: dict, extra: dict[str, Callable[[list], torch.Tensor]]):
        self._real = real
        self._thread = threading.get_ident()  # another thread's call through verl's module is not ours
        self._scores = scores
        self._extra = extra
        self.read: Optional[TensorDict] = None  # what verl read (the scores included): the caller may reuse it
        self.written = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def kv_batch_get(self, keys, partition_id, select_fields=None):
        if threading.get_ident() != self._thread:
            return self._real.kv_batch_get(keys=keys, partition_id=partition_id, select_fields=select_fields)
        fields = list(select_fields or [])
        if self.read is not None or SCORES_FIELD not in fields or "response_mask" not in fields:
            raise RuntimeError(
                "verl's v1 _compute_advantage no longer reads rm_scores and response_mask in one TransferQueue read "
                f"(asked for {fields}): verl_async_rm/strategies/v1_scores_io.py must follow verl")
        data = self._real.kv_batch_get(keys=keys, partition_id=partition_id,
                                       select_fields=[f for f in fields if f != SCORES_FIELD])
        lengths = data["response_mask"].offsets().diff().tolist()
        data[SCORES_FIELD] = score_rows(lengths, [self._scores[key] for key in keys])
        self.read = data
        self._keys = list(keys)
        return data

    def kv_batch_put(self, keys, partition_id, fields=None, **kwargs):
        if threading.get_ident() != self._thread:
            return self._real.kv_batch_put(keys=keys, partition_id=partition_id, fields=fields, **kwargs)
        if self.read is None or self.written or list(keys) != self._keys or fields is None:
            raise RuntimeError(
                "verl's v1 _compute_advantage no longer writes its rows once after reading them: "
                "verl_async_rm/strategies/v1_scores_io.py must follow verl")
        merged = {name: fields[name] for name in fields.keys()}
        merged[SCORES_FIELD] = self.read[SCORES_FIELD]
        for name, build in self._extra.items():
            merged[name] = build(list(keys))
        self.written = True
        return self._real.kv_batch_put(keys=keys, partition_id=partition_id,
                                       fields=TensorDict(merged, batch_size=len(keys)), **kwargs)


@contextlib.contextmanager
def _verl_tq_replaced(proxy: Any) -> Iterator[None]:
    module = sys.modules[V1_TRAINER_MODULE]
    real = module.tq
    module.tq = proxy
    try:
        yield
    finally:
        module.tq = real


def advantage_call_with_scores(compute_advantage: Callable[[], Any], scores: dict,
                               extra: Optional[dict[str, Callable[[list], torch.Tensor]]] = None) -> TensorDict:
    """Run ``compute_advantage`` (verl's ``_compute_advantage`` on a piece whose every row is in
    ``scores``: key -> score) with the scores served to its read and written with its output, plus
    ``extra`` fields (name -> rows -> tensor). Returns what verl read (its fields for the piece)."""
    module = sys.modules[V1_TRAINER_MODULE]
    proxy = _ServedScores(module.tq, scores, extra or {})
    with _verl_tq_replaced(proxy):
        compute_advantage()
    if not proxy.written:
        raise RuntimeError("verl's v1 _compute_advantage returned without writing its rows: "
                           "verl_async_rm/strategies/v1_scores_io.py must follow verl")
    return proxy.read


def fields_of(keys: Sequence, fields: Sequence[str], reads: Sequence[tuple[list, TensorDict]]) -> Optional[TensorDict]:
    """``fields`` of ``keys`` (in that order) from earlier reads ((their keys, what was read)), as
    one TransferQueue read of them would return them (jagged rows); None if the reads do not cover
    every key and field (the caller reads TransferQueue instead)."""
    found: dict = {}
    for read_keys, data in reads:
        if not all(name in data.keys() for name in fields):
            continue
        columns = {name: data[name].unbind() for name in fields}
        for i, key in enumerate(read_keys):
            found[key] = {name: columns[name][i] for name in fields}
    if not keys or any(key not in found for key in keys):
        return None
    return TensorDict({name: torch.nested.as_nested_tensor([found[key][name] for key in keys], layout=torch.jagged)
                       for name in fields}, batch_size=len(keys))
