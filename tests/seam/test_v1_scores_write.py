"""strategies/v1.py, ``AsyncRewardTrainer._put_scores``: the scores reach TransferQueue as verl's agent
loop writes ``rm_scores`` (zeros, the score on the last response token), in ONE write per call with
the rows' staleness beside them; the response lengths come from the rows' tags, and from
TransferQueue only where a tag lacks them (a round trip costs milliseconds a step). TransferQueue is
a recording fake here; the real one is exercised by the v1 trainer runs (tests/strategies/test_strategies.py)."""

from __future__ import annotations

import pytest
import torch
from transfer_queue import KVBatchMeta

import verl_async_rm.strategies.v1 as v1
from verl_async_rm.strategies.rewards import ScoredRows

pytestmark = pytest.mark.local


class RecordingTQ:
    def __init__(self, lengths: dict[str, int]):
        self.lengths = lengths
        self.gets: list[tuple[list, list]] = []
        self.puts: list[tuple[list, dict]] = []

    def kv_batch_get(self, keys, partition_id, select_fields):
        self.gets.append((list(keys), list(select_fields)))
        assert select_fields == ["responses"]
        return {"responses": torch.nested.as_nested_tensor([torch.ones(self.lengths[k], dtype=torch.long) for k in keys],
                                                           layout=torch.jagged)}

    def kv_batch_put(self, keys, partition_id, fields):
        self.puts.append((list(keys), {name: fields[name] for name in fields.keys()}))


def trainer(staleness: dict) -> v1.AsyncRewardTrainer:
    t = object.__new__(v1.AsyncRewardTrainer)  # _put_scores reads nothing of verl's state
    t._staleness_of_row = staleness
    return t


def scored(rows, scores):
    return ScoredRows(list(rows), list(scores), {}, ["g"] * len(rows))


LENGTHS = {"a": 3, "b": 1, "c": 0, "d": 5}


def batch(tagged: set) -> KVBatchMeta:
    keys = list(LENGTHS)
    return KVBatchMeta(partition_id="train", keys=keys,
                       tags=[{"response_len": LENGTHS[k]} if k in tagged else {"is_padding": False} for k in keys])


def written(put) -> dict[str, list[float]]:
    keys, fields = put
    return {key: row.tolist() for key, row in zip(keys, fields["rm_scores"].unbind())}


def test_lengths_from_the_tags_one_write_with_the_staleness(monkeypatch):
    fake = RecordingTQ(LENGTHS)
    monkeypatch.setattr(v1, "tq", fake)
    trainer({"a": 0, "b": 1, "c": 2, "d": 0})._put_scores(batch(set(LENGTHS)), scored(["d", "a", "c"], [0.5, 1.0, 0.25]))
    assert fake.gets == []  # no read: the tags had every length
    (put,) = fake.puts
    assert written(put) == {"d": [0, 0, 0, 0, 0.5], "a": [0, 0, 1.0], "c": []}
    assert put[1][v1.STALENESS_FIELD].tolist() == [0, 0, 2]  # in the written rows' order


def test_a_row_without_its_length_tag_reads_the_lengths_once(monkeypatch):
    fake = RecordingTQ(LENGTHS)
    monkeypatch.setattr(v1, "tq", fake)
    trainer({})._put_scores(batch({"a"}), scored(["a", "b"], [1.0, -1.0]))
    assert fake.gets == [(["a", "b"], ["responses"])]
    (put,) = fake.puts
    assert written(put) == {"a": [0, 0, 1.0], "b": [-1.0]}
    assert v1.STALENESS_FIELD not in put[1]  # outside a training step (validation): no staleness


def test_nothing_scored_writes_nothing(monkeypatch):
    fake = RecordingTQ(LENGTHS)
    monkeypatch.setattr(v1, "tq", fake)
    trainer({"a": 0})._put_scores(batch(set(LENGTHS)), ScoredRows.empty([]))
    assert fake.gets == fake.puts == []
