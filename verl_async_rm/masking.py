"""``failure_policy: mask`` on the trainer strategies: which rows train, and which configs can mask
exactly. Pure: no verl import, no I/O.

A masked row contributes nothing to the update: the strategies zero its ``response_mask`` (and v1's
``loss_mask``, from which verl's engine counts a mini-batch's tokens) and its advantages/returns, and
compute advantages on the usable rows alone, so group statistics (GRPO mean/std, RLOO's leave-one-out,
batch whitening, ...) are those of a batch in which the masked samples never existed. A row is masked
when its reward failed, or when its group keeps fewer than ``min_group_success`` usable samples (the
group is dropped whole: a baseline of one or two survivors is noise).

What must hold in verl's config for that to be exact (``check_masking``, at start):
- the loss is normalised by tokens (``loss_agg_mode`` ``token-mean``, or ``token-sum``, which is not
  normalised): verl's engine counts a mini-batch's tokens from the mask, so masked rows leave both the
  sum and its denominator. The ``seq-mean-*`` modes divide by a fixed ``ppo_mini_batch_size x n``
  (``global_batch_size``), which would still count every masked row: refused. The critic's value
  loss uses its own ``loss_agg_mode`` and the same mask: the same rule.
- the advantage estimator is one whose statistics come from the rows it is given (every verl 0.9.1
  estimator but ``remax``, whose greedy baseline the strategies do not generate); an estimator we do
  not know (a custom ``register_adv_est``) is refused rather than assumed.
- a group estimator needs two usable samples for a baseline (verl's GRPO gives a lone sample its raw
  score as advantage), so ``min_group_success >= 2`` with them, and ``<= rollout.n``.
- the strategies are on: on verl's own per-sample reward loop (v0, and every v1 trainer mode of verl's:
  ``sync``, ``colocate_async``, ``separate_async``) a reward manager returns one score per sample and
  cannot remove a sample from verl's loss, so ``mask`` there is refused. verl's only way to drop a
  sample is a failed rollout session, which ``colocate_async``/``separate_async`` answer by
  regenerating the whole group (a group judged anew, not a masked sample) and ``sync`` by training
  the group without it; a reward failing is not a session failing.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Hashable, Sequence

from verl_async_rm.config import AgentConfig
from verl_async_rm.strategies.plan import BATCH_STATISTIC, GROUP_EXACT, _select, needs_critic

MASKED_SAMPLES_METRIC = "async_rm/masked_samples"
DROPPED_GROUPS_METRIC = "async_rm/dropped_groups"
# Rollout-dump columns with failure_policy=mask (trainer.rollout_data_dir): what the updates trained on.
LOSS_TOKENS_COLUMN = "async_rm_loss_tokens"  # response_mask tokens (0: masked)
LOSS_MASK_TOKENS_COLUMN = "async_rm_loss_mask_tokens"  # v1: loss_mask tokens, which verl's engine counts
ADVANTAGE_COLUMN = "async_rm_advantage"  # the advantage on the response's first token
MASKABLE_LOSS_AGG_MODES = ("token-mean", "token-sum")
# Statistics over the rows given, groups by uid: run on the usable rows, they are the masked statistics.
MASKABLE_ESTIMATORS = GROUP_EXACT | BATCH_STATISTIC
# Per-sample (or whole-batch) statistics only: a group of one usable sample is meaningful.
NO_GROUP_BASELINE = frozenset({"gae", "reinforce_plus_plus"})


@dataclass(frozen=True)
class MaskDecision:
    """For the rows of whole groups: which train on nothing, and why (counts in samples: a v1
    session with several outputs is one sample over several rows)."""

    masked_rows: tuple  # in the order given
    failed_samples: int  # samples whose reward failed
    masked_samples: int  # failed ones, plus the usable ones of dropped groups
    dropped_groups: int  # groups with fewer than min_group_success usable samples

    @property
    def any(self) -> bool:
        return bool(self.masked_rows)


def decide(rows: Sequence[Any], groups: Sequence[Hashable], samples: Sequence[Hashable], failed: Sequence[Any],
           min_group_success: int) -> MaskDecision:
    """``rows[i]`` belongs to group ``groups[i]`` and sample ``samples[i]`` (the sample whose reward
    it carries) and failed if ``failed[i]`` is truthy. Every group must be given whole."""
    if not len(rows) == len(groups) == len(samples) == len(failed):
        raise ValueError("rows, groups, samples and failed must be aligned")
    if min_group_success < 1:
        raise ValueError(f"min_group_success must be >= 1, got {min_group_success}")
    usable: dict[Hashable, set] = defaultdict(set)
    broken: dict[Hashable, set] = defaultdict(set)
    for group, sample, bad in zip(groups, samples, failed):
        (broken if bad else usable)[group].add(sample)
    overlap = [s for g in broken for s in broken[g] & usable[g]]
    if overlap:
        raise ValueError(f"samples both failed and scored: {overlap[:3]}")
    dropped = {g for g in dict.fromkeys(groups) if len(usable[g]) < min_group_success}
    masked = tuple(row for row, group, bad in zip(rows, groups, failed) if bad or group in dropped)
    failed_samples = sum(len(s) for s in broken.values())
    return MaskDecision(
        masked_rows=masked,
        failed_samples=failed_samples,
        masked_samples=failed_samples + sum(len(usable[g]) for g in dropped),
        dropped_groups=len(dropped),
    )


# -- start-time checks -------------------------------------------------------------------------------


@dataclass(frozen=True)
class MaskShape:
    """The values of verl's config that decide whether masking is exact."""

    masks_loss: bool = False  # the failure policy takes failed samples out of training (``mask``)
    min_group_success: int = AgentConfig.model_fields["min_group_success"].default  # declared once, there
    strategies: bool = False
    adv_estimator: str = "grpo"
    rollout_n: int = 1
    actor_loss_agg_mode: str = "token-mean"
    use_critic: bool = False
    critic_loss_agg_mode: str = "token-mean"
    use_v1: bool = True
    trainer_mode: str = "sync"  # trainer.v1.trainer_mode

    def trainer(self) -> str:
        return f"trainer.v1.trainer_mode={self.trainer_mode}" if self.use_v1 else "v0 trainer (trainer.use_v1=false)"


def mask_shape_from_config(config: Any, masks_loss: bool, min_group_success: int, strategies: bool) -> MaskShape:
    """verl's side of the shape; ours (the policy, ``min_group_success``, whether a strategy is on) comes
    validated from the run's settings (``integration/settings.read_run_settings``)."""
    estimator = str(getattr(_select(config, "algorithm.adv_estimator", "grpo"), "value", _select(config, "algorithm.adv_estimator", "grpo")))
    actor_mode = str(_select(config, "actor_rollout_ref.actor.loss_agg_mode", "token-mean"))
    return MaskShape(
        masks_loss=masks_loss,
        min_group_success=min_group_success,
        strategies=strategies,
        adv_estimator=estimator,
        rollout_n=int(_select(config, "actor_rollout_ref.rollout.n", 1)),
        actor_loss_agg_mode=actor_mode,
        use_critic=needs_critic(estimator, _select(config, "critic.enable")),
        critic_loss_agg_mode=str(_select(config, "critic.loss_agg_mode", actor_mode)),
        use_v1=bool(_select(config, "trainer.use_v1", True)),
        trainer_mode=str(_select(config, "trainer.v1.trainer_mode", "sync")),
    )


def check_masking(shape: MaskShape) -> None:
    """One clear error, at start, for every configuration ``mask`` cannot honour exactly."""
    if not shape.masks_loss:
        return
    if not shape.strategies:
        raise ValueError(
            "reward.async_agent.failure_policy=mask needs the trainer strategies (mini_batch_pipeline=true or "
            f"off_policy_steps>=1). This run trains with verl's own {shape.trainer()}, whose per-sample reward loop "
            "takes one score per sample and has no way to take a sample out of the loss or its group's statistics: "
            "verl drops a sample only when its rollout session fails (colocate_async and separate_async then "
            "regenerate the whole group, sync trains the group without it), never for a failed reward. Turn a "
            "strategy on, or use failure_policy=neutral (a failed sample gets its group's mean: zero advantage "
            "under a group baseline, but it still counts in the loss normalisation and the group's statistics)"
        )
    if shape.adv_estimator not in MASKABLE_ESTIMATORS:
        raise ValueError(
            f"failure_policy=mask: adv_estimator={shape.adv_estimator!r} cannot be masked exactly (its statistics are "
            f"not known to come from the rows it is given alone); supported: {sorted(MASKABLE_ESTIMATORS)}"
        )
    modes = [("actor_rollout_ref.actor.loss_agg_mode", shape.actor_loss_agg_mode)]
    if shape.use_critic:
        modes.append(("critic.loss_agg_mode", shape.critic_loss_agg_mode))
    for name, mode in modes:
        if mode not in MASKABLE_LOSS_AGG_MODES:
            raise ValueError(
                f"failure_policy=mask: {name}={mode} divides by a fixed number of sequences per mini-batch "
                "(ppo_mini_batch_size x n), which would still count the masked samples; use one of "
                f"{MASKABLE_LOSS_AGG_MODES} (the token count verl divides by comes from the mask)"
            )
    minimum = shape.min_group_success
    if isinstance(minimum, bool) or not isinstance(minimum, int) or minimum < 1:
        raise ValueError(f"reward.async_agent.min_group_success must be a positive integer, got {minimum!r}")
    if minimum > shape.rollout_n:
        raise ValueError(
            f"reward.async_agent.min_group_success={minimum} > actor_rollout_ref.rollout.n={shape.rollout_n}: "
            "every group would be dropped"
        )
    if minimum < 2 and shape.adv_estimator not in NO_GROUP_BASELINE and shape.rollout_n > 1:
        raise ValueError(
            f"failure_policy=mask with adv_estimator={shape.adv_estimator}: min_group_success must be >= 2 (a group "
            "with one usable sample has no baseline; verl's GRPO would give it its raw score as advantage)"
        )
