"""strategies/v1_scores_io.py: verl's own v1 ``_compute_advantage`` run with the scores served to its
read and written with its output leaves TransferQueue exactly as writing the scores first and then
calling verl's method does (every field, every row), in one read and one write instead of a write, a
read and a write; a verl whose method stops reading or writing as we rely on is refused loudly; the
rows' fields the calls read serve the correction statistics as a read would. Against a recording
in-memory store (quick) and against real TransferQueue (on the session's Ray)."""

from __future__ import annotations


import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from tensordict import TensorDict

import verl.trainer.ppo.v1.trainer_base as trainer_base
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync
from verl_async_rm.strategies.v1_scores_io import advantage_call_with_scores, fields_of, score_rows

GROUPS, N = 3, 4  # 3 prompts x 4 responses
KEYS = [f"uid{g}_{s}_0" for g in range(GROUPS) for s in range(N)]
LENGTHS = [3, 1, 5, 2, 4, 4, 1, 6, 2, 3, 5, 1]
STALE = "async_rm_staleness"


class MemoryStore:
    """The TransferQueue calls verl's advantage method makes, on a dict; counts the round trips."""

    def __init__(self):
        self.rows: dict = {}
        self.gets = self.puts = 0

    def kv_batch_put(self, keys, partition_id, fields=None, tags=None):
        self.puts += 1
        for name in fields.keys():
            column = fields[name]
            values = column.unbind() if column.is_nested else list(column.unbind(0))
            for key, value in zip(keys, values):
                self.rows.setdefault(key, {})[name] = value.clone()

    def kv_batch_get(self, keys, partition_id, select_fields=None):
        self.gets += 1
        names = [n for n in select_fields if all(n in self.rows[k] for k in keys)]  # absent fields are left out
        out = {}
        for name in names:
            values = [self.rows[k][name] for k in keys]
            out[name] = (torch.nested.as_nested_tensor(values, layout=torch.jagged) if values[0].dim() else torch.stack(values))
        return TensorDict(out, batch_size=len(keys))


def _seed(store, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    nested = lambda make: torch.nested.as_nested_tensor([make(n) for n in LENGTHS], layout=torch.jagged)  # noqa: E731
    store.kv_batch_put(KEYS, "train", TensorDict({
        "response_mask": nested(lambda n: torch.ones(n, dtype=torch.int64)),
        "old_log_probs": nested(lambda n: -torch.rand(n, generator=g)),
        "rollout_log_probs": nested(lambda n: -torch.rand(n, generator=g)),
        "uid": torch.tensor([int(k[3]) for k in KEYS]),
    }, batch_size=len(KEYS)))


def _trainer(estimator: str = "grpo"):
    t = object.__new__(PPOTrainerSync)  # _compute_advantage reads config and the KL controller alone
    t.config = OmegaConf.create({
        "algorithm": {"use_kl_in_reward": False, "adv_estimator": estimator, "gamma": 1.0, "lam": 1.0,
                      "norm_adv_by_std_in_grpo": True, "rollout_correction": None},
        "actor_rollout_ref": {"rollout": {"n": N}},
    })
    t.kl_ctrl_in_reward = None
    return t


class Meta(list):
    """The part of KVBatchMeta verl's advantage method uses."""

    def __init__(self, keys):
        super().__init__(keys)
        self.keys, self.partition_id = list(keys), "train"


SCORES = {key: float(i % 5) / 4 for i, key in enumerate(KEYS)}
STALENESS = {key: i % 2 for i, key in enumerate(KEYS)}


def _plain(store, pieces):
    """Scores written first, then verl's method reads them: what the code did before."""
    for keys in pieces:
        store.kv_batch_put(keys, "train", TensorDict({
            "rm_scores": score_rows([LENGTHS[KEYS.index(k)] for k in keys], [SCORES[k] for k in keys]),
            STALE: torch.tensor([STALENESS[k] for k in keys])}, batch_size=len(keys)))
        _trainer()._compute_advantage(Meta(keys), metrics={})


def _fused(store, pieces):
    reads = []
    for keys in pieces:
        extra = {STALE: lambda rows: torch.tensor([STALENESS[k] for k in rows])}
        reads.append((keys, advantage_call_with_scores(lambda: _trainer()._compute_advantage(Meta(keys), metrics={}),
                                                       {k: SCORES[k] for k in keys}, extra)))
    return reads


PIECES = {"whole batch": [KEYS], "by groups": [KEYS[8:], KEYS[:4], KEYS[4:8]]}


def _same_rows(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert a[key].keys() == b[key].keys(), key
        for name in a[key]:
            assert torch.equal(a[key][name], b[key][name]), (key, name)


@pytest.fixture
def memory_tq(monkeypatch):
    store = MemoryStore()
    monkeypatch.setattr(trainer_base, "tq", store)
    return store


@pytest.mark.local
@pytest.mark.parametrize("pieces", list(PIECES), ids=str)
def test_the_fused_call_leaves_what_scores_first_then_verls_call_leaves_in_one_read_and_one_write(memory_tq, monkeypatch, pieces):
    baseline = MemoryStore()
    monkeypatch.setattr(trainer_base, "tq", baseline)  # the plain path on its own store
    _seed(baseline, 0)
    _plain(baseline, PIECES[pieces])
    monkeypatch.setattr(trainer_base, "tq", memory_tq)
    _seed(memory_tq, 0)
    memory_tq.gets = memory_tq.puts = 0
    _fused(memory_tq, PIECES[pieces])
    assert trainer_base.tq is memory_tq  # verl's global is restored
    _same_rows(memory_tq.rows, baseline.rows)
    calls = len(PIECES[pieces])
    assert (memory_tq.gets, memory_tq.puts) == (calls, calls)
    assert (baseline.gets, baseline.puts) == (calls, 2 * calls + 1)  # the seeding write counts once
    advantages = {k: memory_tq.rows[k]["advantages"] for k in KEYS}
    assert any(float(a.abs().max()) > 0 for a in advantages.values())  # a real computation, not zeros


@pytest.mark.local
def test_rows_read_by_the_calls_serve_the_correction_statistics_as_a_read_would(memory_tq):
    _seed(memory_tq, 1)
    reads = _fused(memory_tq, PIECES["by groups"])
    fields = ["old_log_probs", "rollout_log_probs", "response_mask"]
    usable = [k for k in KEYS if k != KEYS[5]]
    served = fields_of(usable, fields, reads).to_padded_tensor()
    direct = memory_tq.kv_batch_get(usable, "train", fields).to_padded_tensor()
    for name in fields:
        assert torch.equal(served[name], direct[name]), name
    assert fields_of(usable, fields, reads[:2]) is None  # a row no call read: the caller reads TransferQueue


@pytest.mark.local
def test_a_verl_that_stops_reading_the_scores_or_writing_its_rows_is_refused(memory_tq):
    _seed(memory_tq, 2)
    scores = {k: 1.0 for k in KEYS[:4]}
    reads_without_scores = lambda: trainer_base.tq.kv_batch_get(KEYS[:4], "train", ["response_mask"])  # noqa: E731
    with pytest.raises(RuntimeError, match="no longer reads rm_scores"):
        advantage_call_with_scores(reads_without_scores, scores)
    assert trainer_base.tq is memory_tq
    reads_only = lambda: trainer_base.tq.kv_batch_get(KEYS[:4], "train", ["response_mask", "rm_scores"])  # noqa: E731
    with pytest.raises(RuntimeError, match="without writing"):
        advantage_call_with_scores(reads_only, scores)

    def writes_other_rows():
        trainer_base.tq.kv_batch_get(KEYS[:4], "train", ["response_mask", "rm_scores"])
        trainer_base.tq.kv_batch_put(KEYS[4:8], "train", fields=TensorDict({}, batch_size=4))

    with pytest.raises(RuntimeError, match="writes its rows once"):
        advantage_call_with_scores(writes_other_rows, scores)
    assert "rm_scores" not in memory_tq.rows[KEYS[0]]  # nothing half-written


@pytest.mark.ray
def test_on_real_transfer_queue_the_fused_call_leaves_what_the_plain_path_leaves(ray_session, monkeypatch):
    import transfer_queue as tq

    tq.init(OmegaConf.create({"backend": {"SimpleStorage": {"num_data_storage_units": 1}}}))  # one storage actor: 2 CPUs
    try:
        monkeypatch.setattr(trainer_base, "tq", tq)
        # two partitions of the same TransferQueue: the plain path's and the fused path's
        for partition, run in (("plain", _plain), ("fused", _fused)):
            real = RealStore(tq, partition)
            monkeypatch.setattr(trainer_base, "tq", real)
            _seed(real, 3)
            run(real, PIECES["by groups"])
        fields = ["rm_scores", "advantages", "returns", STALE, "response_mask", "old_log_probs"]
        plain = tq.kv_batch_get(keys=KEYS, partition_id="plain", select_fields=fields)
        fused = tq.kv_batch_get(keys=KEYS, partition_id="fused", select_fields=fields)
        for name in fields:
            a, b = plain[name], fused[name]
            if a.is_nested:
                assert all(torch.equal(x, y) for x, y in zip(a.unbind(), b.unbind())), name
            else:
                assert torch.equal(a, b), name
        assert np.isfinite(fused["advantages"].to_padded_tensor(0.0).numpy()).all()
    finally:
        tq.close()


class RealStore:
    """Real TransferQueue on one partition, with the round trips counted like MemoryStore's."""

    def __init__(self, tq, partition: str):
        self.tq, self.partition = tq, partition
        self.gets = self.puts = 0

    def kv_batch_put(self, keys, partition_id, fields=None, tags=None):
        self.puts += 1
        return self.tq.kv_batch_put(keys=keys, partition_id=self.partition, fields=fields)

    def kv_batch_get(self, keys, partition_id, select_fields=None):
        self.gets += 1
        return self.tq.kv_batch_get(keys=keys, partition_id=self.partition, select_fields=select_fields)


@pytest.mark.local
def test_a_masked_pipelined_step_leaves_every_row_its_score_and_staleness_in_one_write_per_call(memory_tq, monkeypatch):
    """V1Ops as the scheduler drives it: scores attached, failures masked (their scores go in the
    mask's write), advantages per piece (the rest's go in verl's write). Every row ends with its
    score and staleness; no write of scores on their own."""
    from verl_async_rm.strategies import v1
    from verl_async_rm.strategies.rewards import ScoredRows

    monkeypatch.setattr(v1, "tq", memory_tq)
    _seed(memory_tq, 4)
    memory_tq.kv_batch_put(KEYS, "train", TensorDict({"loss_mask": torch.nested.as_nested_tensor(
        [torch.ones(n, dtype=torch.int64) for n in LENGTHS], layout=torch.jagged)}, batch_size=len(KEYS)))
    trainer = object.__new__(v1.AsyncRewardTrainer)
    trainer.__dict__.update(vars(_trainer()))
    trainer._staleness_of_row = STALENESS
    batch = v1.KVBatchMeta(partition_id="train", keys=list(KEYS), tags=[{"response_len": n} for n in LENGTHS])
    ops = v1.V1Ops(trainer, expected_rows=len(KEYS))
    memory_tq.gets = memory_tq.puts = 0
    masked = [KEYS[1], KEYS[6]]
    for piece in (KEYS[:4], KEYS[4:8], KEYS[8:]):
        ops.attach(batch, ScoredRows(piece, [SCORES[k] for k in piece], {}, [k[:4] for k in piece]))
        failing = [k for k in piece if k in masked]
        if failing:
            ops.mask(batch, failing)
        ops.advantages(batch, [k for k in piece if k not in masked], kl=None)
    assert memory_tq.puts == 3 + 2  # one per advantage call, one per mask
    for key in KEYS:
        row = memory_tq.rows[key]
        assert float(row["rm_scores"][-1]) == SCORES[key] and float(row["rm_scores"][:-1].abs().sum()) == 0, key
        assert int(row[STALE]) == STALENESS[key], key
    for key in masked:
        assert float(memory_tq.rows[key]["advantages"].abs().sum()) == 0 and int(memory_tq.rows[key]["response_mask"].sum()) == 0
    assert not ops.unwritten
    fields = ["old_log_probs", "rollout_log_probs", "response_mask"]
    usable = [k for k in KEYS if k not in masked]
    served = fields_of(usable, fields, ops.reads).to_padded_tensor()
    direct = memory_tq.kv_batch_get(usable, "train", fields).to_padded_tensor()
    assert all(torch.equal(served[name], direct[name]) for name in fields)
