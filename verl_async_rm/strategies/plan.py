"""Strategy settings and their validation against the trainer's shape. Pure: no verl, no I/O."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

# Advantages computed within a GRPO group: a mini-batch of whole groups gives exactly the baseline's.
GROUP_EXACT = frozenset({"grpo", "grpo_vectorized", "rloo", "rloo_vectorized", "opo", "grpo_passk"})
# Group-based, then normalized over the batch they are given: under the pipeline that is the
# mini-batch, so the normalization statistics are the mini-batch's (documented difference).
MINI_BATCH_NORMALIZED = frozenset({"reinforce_plus_plus_baseline", "gpg", "gae"})
# Need the whole batch (batch-wide baselines or an extra generation pass): refused with the pipeline.
WHOLE_BATCH = frozenset({"reinforce_plus_plus", "remax", "gdpo", "optimal_token_baseline", "tir_optimal_token_baseline"})
MAX_OFF_POLICY_STEPS = 4


@dataclass(frozen=True)
class StrategyConfig:
    mini_batch_pipeline: bool = False
    off_policy_steps: int = 0  # 0: on-policy; k: train on batch t while batches t+1..t+k are generated/scored

    @property
    def enabled(self) -> bool:
        return self.mini_batch_pipeline or self.off_policy_steps > 0


def _flag(value: Any, name: str) -> bool:
    if value is None:
        return False
    if isinstance(value, bool):
        return value
    raise ValueError(f"{name} must be true or false, got {value!r}")


def strategy_from_mapping(values: Mapping[str, Any]) -> StrategyConfig:
    """Read the flags, accepting the recipe's spellings: ``mini_batch_pipeline`` and the older
    ``update_pipeline`` (they must not disagree), and ``off_policy_steps``."""
    pipeline = _flag(values.get("mini_batch_pipeline"), "mini_batch_pipeline")
    legacy = values.get("update_pipeline")
    if legacy is not None:
        # Our config declares mini_batch_pipeline=false, so only an explicit true can contradict.
        legacy = _flag(legacy, "update_pipeline")
        if pipeline and not legacy:
            raise ValueError("update_pipeline=False contradicts mini_batch_pipeline=True: set one of them")
        pipeline = pipeline or legacy
    steps = values.get("off_policy_steps") or 0
    if isinstance(steps, bool) or not isinstance(steps, int) or not 0 <= steps <= MAX_OFF_POLICY_STEPS:
        raise ValueError(
            f"off_policy_steps must be an integer in [0, {MAX_OFF_POLICY_STEPS}], got {steps!r} "
            "(each step of lag keeps one more generated batch in memory and trains on older samples)"
        )
    return StrategyConfig(pipeline, steps)


@dataclass(frozen=True)
class MiniBatchPlan:
    samples_per_mini_batch: int
    mini_batches: int


def plan_mini_batches(
    strategy: StrategyConfig,
    *,
    train_batch_size: int,
    ppo_mini_batch_size: int,
    rollout_n: int,
    adv_estimator: str,
    use_critic: bool,
) -> MiniBatchPlan:
    """How a step's batch is cut into updates; clear errors for shapes the pipeline cannot run."""
    if ppo_mini_batch_size <= 0 or train_batch_size % ppo_mini_batch_size:
        raise ValueError(
            f"ppo_mini_batch_size ({ppo_mini_batch_size}) must divide data.train_batch_size ({train_batch_size})"
        )
    if not strategy.mini_batch_pipeline:
        return MiniBatchPlan(train_batch_size * rollout_n, 1)
    estimator = str(getattr(adv_estimator, "value", adv_estimator))
    if estimator in WHOLE_BATCH:
        raise ValueError(
            f"mini_batch_pipeline cannot run algorithm.adv_estimator={estimator}: it needs the whole batch "
            f"at once; use one of {sorted(GROUP_EXACT | MINI_BATCH_NORMALIZED)} or turn the pipeline off"
        )
    if estimator not in GROUP_EXACT | MINI_BATCH_NORMALIZED:
        raise ValueError(
            f"mini_batch_pipeline does not know whether adv_estimator={estimator!r} works on mini-batches of "
            f"whole groups; supported: {sorted(GROUP_EXACT | MINI_BATCH_NORMALIZED)}"
        )
    if estimator == "gae" and not use_critic:
        raise ValueError("adv_estimator=gae needs a critic")
    return MiniBatchPlan(ppo_mini_batch_size * rollout_n, train_batch_size // ppo_mini_batch_size)
