"""The CPU backend's fast-polling samplers and the launcher's choice of them, in process: verl's async
replay buffer (``ReplayBufferAsync``, for ``colocate_async``) polling TransferQueue faster than its
fixed 2 s and otherwise verl's own (staleness threshold, drop / wait, refill); ``separate_async``
refused at start with the reason."""

from __future__ import annotations

import copy
import types

import pytest
from omegaconf import OmegaConf

from verl_async_rm_rig.cpu_backend import v1_sampler
from verl_async_rm_rig.cpu_backend.launch import SEPARATE_ASYNC_REFUSAL, CPURunConfig, build_overrides

pytestmark = pytest.mark.local
POLL_S = 0.05


def overrides(tmp_path, *extra: str, poll=POLL_S) -> dict[str, str]:
    cfg = CPURunConfig(out_dir=str(tmp_path), model_dir=str(tmp_path / "m"), train_file="t.parquet",
                       val_file="v.parquet", v1_poll_interval_s=poll, extra_overrides=list(extra))
    return dict(o.split("=", 1) for o in build_overrides(cfg))


@pytest.mark.parametrize(
    "extra, sampler",
    [
        ((), "FastPollReplayBuffer"),  # verl's default mode: sync
        (("trainer.v1.trainer_mode=colocate_async",), "FastPollReplayBufferAsync"),
        (("+trainer.v1.trainer_mode=colocate_async",), "FastPollReplayBufferAsync"),
        (("trainer.v1.trainer_mode=colocate_async", "trainer.v1.trainer_mode=sync"), "FastPollReplayBuffer"),  # last wins
    ],
)
def test_the_launcher_picks_verls_sampler_of_the_runs_trainer_mode(tmp_path, extra, sampler):
    ov = overrides(tmp_path, *extra)
    assert ov["trainer.v1.sampler.custom_sampler.name"] == sampler
    assert ov["+trainer.v1.sampler.sampler_kwargs.poll_interval"] == repr(POLL_S)
    assert hasattr(v1_sampler, sampler)


def test_separate_async_is_refused_at_start_with_the_reason(tmp_path, capsys):
    for poll in (POLL_S, None):
        with pytest.raises(ValueError, match="separate_async cannot run on the CPU backend") as refused:
            overrides(tmp_path, "trainer.v1.trainer_mode=separate_async", poll=poll)
        assert "checkpoint engine" in str(refused.value) and "resource pool" in str(refused.value)
    from verl_async_rm_rig.cpu_backend.__main__ import main

    out = tmp_path / "run"
    with pytest.raises(SystemExit) as cli:
        main(["--out", str(out), "trainer.v1.trainer_mode=separate_async"])
    assert cli.value.code == 2
    err = capsys.readouterr().err
    assert SEPARATE_ASYNC_REFUSAL in err and "Traceback" not in err
    assert not out.exists()  # refused before building a model, data or a cluster


def build_with_verl(trainer_mode: str, *, threshold=8, strategy="drop", refill=None):
    """verl's own construction of a custom sampler (PPOTrainer._build_replay_buffer), from its config."""
    from verl.trainer.ppo.v1.trainer_base import PPOTrainer

    config = OmegaConf.create({"trainer": {"v1": {trainer_mode: {}, "sampler": {
        "max_off_policy_threshold": threshold, "max_off_policy_strategy": strategy,
        "custom_sampler": {"path": v1_sampler.__file__,
                           "name": "FastPollReplayBuffer" if trainer_mode == "sync" else "FastPollReplayBufferAsync"},
        "sampler_kwargs": {"poll_interval": POLL_S, "train_batch_size": 2}}}}})
    trainer = types.SimpleNamespace(config=config, trainer_mode=trainer_mode,
                                    _add_prompts_to_generate=refill or (lambda n: n))
    return PPOTrainer._build_replay_buffer(trainer)


def test_verl_builds_the_async_sampler_as_its_own_async_buffer():
    from verl.trainer.ppo.v1.replay_buffer import ReplayBufferAsync

    buffer = build_with_verl("colocate_async", threshold=3, strategy="wait")
    assert isinstance(buffer, ReplayBufferAsync) and buffer.poll_interval == POLL_S
    assert (buffer.max_off_policy_threshold, buffer.max_off_policy_strategy) == (3, "wait")
    with pytest.raises(ValueError, match="takes FastPollReplayBufferAsync"):
        v1_sampler.FastPollReplayBuffer(trainer_mode="colocate_async", sampler_kwargs={"train_batch_size": 2},
                                        trainer_config={}, max_off_policy_threshold=8, max_off_policy_strategy="drop")
    assert type(build_with_verl("sync")).__name__ == "FastPollReplayBuffer"  # verl loads the file by path: its own module
    with pytest.raises(ValueError, match="takes FastPollReplayBuffer"):
        v1_sampler.FastPollReplayBufferAsync(trainer_mode="sync", sampler_kwargs={}, trainer_config={},
                                             max_off_policy_threshold=8, max_off_policy_strategy="drop")


class FakeTransferQueue:
    """The prompt tags verl's buffer reads (``kv_list``) and clears (``kv_clear``); ``script[k]`` runs
    before the k-th read, as rollouts finishing between two polls."""

    def __init__(self, tags: dict[str, dict], script: dict[int, callable]):
        self.tags, self.script, self.reads, self.cleared = tags, script, 0, []

    def kv_list(self, partition_id=None):
        if self.reads in self.script:
            self.script[self.reads](self.tags)
        self.reads += 1
        return {"train": copy.deepcopy(self.tags)}

    def kv_clear(self, partition_id, keys):
        self.cleared.append(sorted(keys))
        for key in keys:
            self.tags.pop(key, None)


def prompt(step: int, status: str) -> dict:
    return {"is_prompt": True, "status": status, "global_steps": step}


def trajectory(uid: str, step: int) -> tuple[str, dict]:
    return f"{uid}_0_0", {"status": "success", "global_steps": step, "min_global_steps": step - 1,
                          "max_global_steps": step - 1}


def finish(uid: str, step: int):
    def apply(tags):
        tags[uid]["status"] = "finished"
        key, tag = trajectory(uid, step)
        tags[key] = tag

    return apply


@pytest.fixture
def fake_verl_io(monkeypatch):
    """verl's replay buffer module with a scripted TransferQueue and its poll sleeps recorded."""
    import time

    from verl.trainer.ppo.v1 import replay_buffer

    sleeps: list[float] = []

    def install(tq: FakeTransferQueue):
        monkeypatch.setattr(replay_buffer, "tq", tq)
        monkeypatch.setattr(replay_buffer, "time", types.SimpleNamespace(sleep=sleeps.append, time=time.time))
        return sleeps

    return install


def test_drop_evicts_a_finished_stale_group_refills_it_and_polls_fast(fake_verl_io):
    """At step 5 with threshold 2: a group from step 3 (span 3) is dropped and refilled at once; the
    fresh groups, one still running, are sampled once it finishes, after one fast poll."""
    refills: list[int] = []
    tags = {"old": prompt(3, "finished"), "a": prompt(5, "finished"), "b": prompt(4, "running")}
    tags.update([trajectory("old", 3), trajectory("a", 5)])
    tq = FakeTransferQueue(tags, {2: finish("b", 4)})  # read 0 evicts (and reads again at once), 1 waits
    sleeps = fake_verl_io(tq)
    buffer = build_with_verl("colocate_async", threshold=2, strategy="drop", refill=lambda n: refills.append(n) or n)
    batch, metrics = buffer.sample(global_steps=5, partition_id="train", batch_size=2)
    assert sorted(k.split("_")[0] for k in batch.keys) == ["a", "b"]
    assert refills == [1] and metrics["training/off_policy/evicted_samples"] == 1
    assert "old" not in tq.tags
    assert sleeps == [POLL_S]  # verl's ReplayBufferAsync would have slept 2.0 s


def test_wait_holds_the_sample_until_a_stale_in_flight_group_finishes(fake_verl_io):
    """``wait``: enough groups are sampleable, but one in flight has reached the threshold, so the
    sample waits for it (and then trains it, the oldest first) instead of dropping it."""
    tags = {"a": prompt(5, "finished"), "c": prompt(5, "finished"), "late": prompt(4, "running")}
    tags.update([trajectory("a", 5), trajectory("c", 5)])
    tq = FakeTransferQueue(tags, {3: finish("late", 4)})
    sleeps = fake_verl_io(tq)
    buffer = build_with_verl("colocate_async", threshold=2, strategy="wait")
    batch, metrics = buffer.sample(global_steps=5, partition_id="train", batch_size=2)
    assert sleeps == [POLL_S] * 3
    assert "late" in {k.split("_")[0] for k in batch.keys}
    assert not any("evicted" in key for key in metrics)
