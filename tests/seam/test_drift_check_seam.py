"""The drift check in verl's trainer (verl_async_rm/drift.py): where it runs and where it is refused.

- this package's trainers (the strategies) add ``async_rm/drift/*`` to the step's metrics: the v1
  ``AsyncRewardTrainer.step`` and the v0 ``AsyncRewardRayPPOTrainer._train_step``, driven step by step
  with verl's state stubbed (what the step does besides is the strategy tests' business), with a real
  monitor asking a real judge about a real past log: a check beside the steps is reported at the first
  step after it ends, labelled with the step it started at, and the last step waits for it;
- verl's own trainers (the ``async_agent`` manager alone on v0 and each v1 mode, ``off_policy_steps``
  alone on v1) are refused at start, on both entry points, with the reason and the way out;
- at start the block's paths are made absolute in the config every later process reads (the trainer
  runs in a Ray actor) and the calibration set is loaded (a bad one stops the run, its key named).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from omegaconf import OmegaConf

from tests.judge_ops.test_replay import Past
from tests.seam.test_seam_prepare import ours, verls
from verl_async_rm.config import AgentConfig
from verl_async_rm.drift import DriftMonitor, drift_settings_from_mapping
from verl_async_rm.loader import RewardSpec

pytestmark = pytest.mark.local


@pytest.fixture
def past(tmp_path) -> Past:
    return Past(tmp_path, keep_inputs=True)


def monitor(past: Past, every: int) -> DriftMonitor:
    settings = drift_settings_from_mapping({"log": str(past.log), "groups": 2, "every_n_steps": every},
                                           RewardSpec(str(past.dir / "exact.py"), "compute_score", {}), AgentConfig())
    return DriftMonitor.build(settings, workdir=str(past.dir))


def drive(step_once, trainer, steps: int) -> dict[int, dict]:
    """Each step's metrics; between steps, a running check is let finish (so which step reports it is
    decided by the monitor's rule, not by how fast the machine is)."""
    seen = {}
    for step in range(1, steps + 1):
        trainer.global_steps = step
        metrics: dict = {}
        step_once(trainer, metrics, step == steps)
        seen[step] = {k: v for k, v in metrics.items() if k.startswith("async_rm/drift/")}
        trainer.drift.wait(30)
    return seen


def assert_reported_at_the_right_steps(seen: dict[int, dict]) -> None:
    reported = {step: m["async_rm/drift/step"] for step, m in seen.items() if m}
    assert reported == {4: 3.0, 7: 6.0, 9: 9.0}  # the step after it started; the last step waits for its own
    for metrics in (m for m in seen.values() if m):
        assert metrics["async_rm/drift/spearman"] == pytest.approx(1) and metrics["async_rm/drift/not_compared"] == 0


def test_the_v1_strategy_trainer_adds_the_drift_metrics_to_its_steps(past):
    import verl_async_rm.strategies.v1 as v1

    trainer = object.__new__(v1.AsyncRewardTrainer)  # verl's state stubbed: only the step's own calls run
    current = SimpleNamespace(weights_step=0, batch=SimpleNamespace(keys=[]), rewards=SimpleNamespace(timing=SimpleNamespace(blocked=0.0)))
    trainer.strategy = SimpleNamespace(pooled=False)
    trainer.on_sample_begin = trainer.on_sample_end = lambda: None
    trainer.lookahead = SimpleNamespace(top_up=lambda *args: None, pop=lambda: current)
    trainer._train_on = lambda current, metrics, timing_raw, staleness_of_row: "batch"
    trainer._measure = lambda *args: None
    trainer.scheduler = SimpleNamespace(reward_metrics=lambda current, step: {"async_reward/failed": 0})
    trainer._auto_lookahead = lambda: {}
    trainer._heap_metrics = {}
    trainer.total_training_steps = 9
    trainer.drift = monitor(past, every=3)

    def step_once(t, metrics, last):
        assert t.step(metrics, {}) == "batch" and "async_reward/failed" in metrics

    assert_reported_at_the_right_steps(drive(step_once, trainer, 9))


def test_the_v0_strategy_trainer_adds_the_drift_metrics_to_its_steps(past):
    import verl_async_rm.strategies.v0 as v0

    class Batch:
        non_tensor_batch: dict = {}

        def __len__(self):
            return 2

    trainer = object.__new__(v0.AsyncRewardRayPPOTrainer)
    trainer.plan = SimpleNamespace(samples_per_mini_batch=2, mini_batches=1)
    trainer.config = OmegaConf.create({"trainer": {"critic_warmup": 0, "rollout_data_dir": None},
                                       "algorithm": {"use_kl_in_reward": False}})
    trainer._compute_policy_inputs = lambda *args: None
    trainer.scheduler = SimpleNamespace(train=lambda *args, **kwargs: {}, reward_metrics=lambda current, step: {})
    trainer._save_and_sync = lambda *args: None
    trainer._heap_metrics = {}
    trainer.drift = monitor(past, every=3)

    def step_once(t, metrics, last):
        t._train_step(SimpleNamespace(batch=Batch(), weights_step=0, metrics={}, rewards=None), metrics, {}, last)

    assert_reported_at_the_right_steps(drive(step_once, trainer, 9))


DRIFT = "+reward.async_agent.drift_check.log={log}"


@pytest.mark.parametrize("overrides", [
    ["trainer.use_v1=false"],
    ["trainer.v1.trainer_mode=sync"], ["trainer.v1.trainer_mode=colocate_async"], ["trainer.v1.trainer_mode=separate_async"],
    ["+off_policy_steps=1"],  # alone on v1: verl's colocate_async with the agent
])
def test_verls_own_trainers_are_refused_at_start_with_the_reason_on_both_entry_points(past, overrides):
    from tests.helpers.harness import prepared
    from verl_async_rm.integration.settings import read_run_settings
    from verl_async_rm.integration.stock_entry import AsyncAgentStartCallback

    given = ["reward.reward_manager.name=async_agent", DRIFT.format(log=past.log), *overrides]
    reason = r"drift_check needs one of this package's trainers.*mini_batch_pipeline=true mini_batch_order=index"
    with pytest.raises(ValueError, match=reason):
        read_run_settings(verls(*given))
    with pytest.raises(SystemExit, match=reason):
        AsyncAgentStartCallback().on_run_start(verls(*given))
    with pytest.raises(ValueError, match=reason):
        prepared(ours(*[o.lstrip("+") for o in given]))


@pytest.mark.parametrize("use_v1", [True, False])
def test_with_a_strategy_it_starts_with_its_paths_made_absolute(past, monkeypatch, use_v1):
    from tests.helpers.harness import prepared
    from verl_async_rm.integration.settings import read_run_settings

    monkeypatch.chdir(past.dir)
    config = prepared(ours("mini_batch_pipeline=true", "mini_batch_order=index", f"trainer.use_v1={str(use_v1).lower()}",
                           "reward.async_agent.drift_check.log=old.verdicts.jsonl",
                           "reward.async_agent.drift_check.every_n_steps=5"))
    assert config.reward.async_agent.drift_check.log == str(past.log)  # absolute, for the trainer's actor
    drift = read_run_settings(config).agent.drift_check
    assert drift.every_n_steps == 5 and drift.log == str(past.log) and drift.reward.name == "compute_score"
    # a calibration set that cannot be joined stops the run at start, its key named
    (past.dir / "other.jsonl").write_text('{"solution_str": "x", "ground_truth": "1"}\n')
    with pytest.raises(ValueError, match=r"reward.async_agent.drift_check.input .*not in it"):
        prepared(ours("mini_batch_pipeline=true", f"trainer.use_v1={str(use_v1).lower()}",
                      f"reward.async_agent.drift_check.log={past.log}", f"reward.async_agent.drift_check.input={past.dir}/other.jsonl"))
