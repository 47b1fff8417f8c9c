"""Strategy settings, their checks against the rest of verl's config, and the shape of a step's
updates. Pure: no verl import, no I/O. Read and checked with the rest of a run's settings
(``integration/settings.read_run_settings``), at start, before a worker is built.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Sequence

MAX_OFF_POLICY_STEPS = 4
# max_staleness=auto: the bound in force before the first step is measured (it only grows: staleness_pool.py,
# "max_staleness: auto"); at step 1 no group is due under any bound >= 1.
AUTO_STALENESS_START = 1
ON_STALE = ("wait", "drop")  # = staleness_pool.ON_STALE (plan stays import-free)
MINI_BATCH_ORDERS = ("completion", "index")

# Advantage estimators of verl 0.9.1 (trainer/ppo/core_algos.py), by what they read of the batch.
# Per group only (statistics over the samples of one uid): a mini-batch of whole groups gives
# exactly the baseline's advantages.
GROUP_EXACT = frozenset(
    {
        "grpo",  # group mean/std
        "grpo_vectorized",
        "rloo",  # leave-one-out mean within the group
        "rloo_vectorized",
        "opo",  # length-weighted group baseline
        "grpo_passk",  # within-group max
        "optimal_token_baseline",  # per-prompt-group, per-timestep baseline
        "tir_optimal_token_baseline",
    }
)
# A statistic over the batch they are given (masked_whiten of the advantages or returns, or GPG's
# alpha = batch size / nonzero scores). Under the pipeline that batch is a mini-batch of whole
# groups: allowed, and listed in docs/guide/strategies.md's differences from stock verl.
BATCH_STATISTIC = frozenset(
    {
        "gae",  # masked_whiten(advantages)
        "reinforce_plus_plus",  # masked_whiten(returns)
        "reinforce_plus_plus_baseline",  # group mean, then masked_whiten
        "gdpo",  # per-dimension group normalisation, then masked_whiten
        "gpg",  # alpha = bsz / count_nonzero(scores)
    }
)
# Needs a second, greedy generation per prompt that the strategies' generation does not run.
EXTRA_GENERATION = frozenset({"remax"})
# Reward managers whose semantics the agent reproduces: naive's compute_score per sample
# (``acc`` = the score when the reward returns a number), and our own.
AGENT_REWARD_MANAGERS = frozenset({"naive", "async_agent"})


@dataclass(frozen=True)
class StrategyConfig:
    mini_batch_pipeline: bool = False
    off_policy_steps: int = 0  # 0: on-policy; k: train on batch t while batches t+1..t+k are generated/scored
    # Which groups make a mini-batch: "completion" (the first scored, the fastest) or "index" (verl's
    # own mini-batches, rows in batch order: exact, but a mini-batch waits for its slowest group).
    mini_batch_order: str = "completion"
    # Score while generating: each sample goes to the agent as its rollout finishes (streaming.py);
    # false: the batch is submitted after generation ends (as before 0.x, for comparison).
    stream_rewards: bool = True
    # The staleness pool (staleness_pool.py): None = off (a step trains on its own batch, waiting for all of it);
    # n = a group still waiting is carried into later steps, up to n of them, then on_stale decides.
    max_staleness: Optional[int] = None
    on_stale: str = "wait"  # "wait" for a due group, or "drop" it (counted)
    # off_policy_steps=auto: the lookahead is chosen each step from measured reward latency vs step
    # compute (pool_driver.choose_lookahead); off_policy_steps then holds the first value (1) and the cap.
    auto_off_policy: bool = False
    # A batch whose rewards are all in when training starts has nothing to overlap: it is trained
    # whole, in one update call as verl does (the split costs a call per mini-batch for nothing).
    # true: split it all the same (the pipeline's own path under an instant reward, in tests).
    split_scored_batches: bool = False
    # max_staleness=auto: the bound is raised each step to ceil(ticket_deadline / median step compute)
    # (staleness_pool.auto_staleness_bound), so a group may be carried as long as the agent may take to settle
    # it; max_staleness then holds the bound before the first measurement (AUTO_STALENESS_START).
    auto_staleness: bool = False

    @property
    def enabled(self) -> bool:
        return self.mini_batch_pipeline or self.off_policy_steps > 0 or self.pooled or self.auto_off_policy

    @property
    def pooled(self) -> bool:
        return self.max_staleness is not None


def _flag(value: Any, name: str) -> bool:
    if value is None:
        return False
    if isinstance(value, bool):
        return value
    raise ValueError(f"{name} must be true or false, got {value!r}")


def strategy_from_mapping(values: Mapping[str, Any]) -> StrategyConfig:
    """Read the flags, accepting the recipe's spellings: ``mini_batch_pipeline`` and the older
    ``update_pipeline`` (they must not disagree), ``off_policy_steps`` and ``mini_batch_order``."""
    pipeline = _flag(values.get("mini_batch_pipeline"), "mini_batch_pipeline")
    legacy = values.get("update_pipeline")
    if legacy is not None:
        # Our config declares mini_batch_pipeline=false, so only an explicit true can contradict.
        legacy = _flag(legacy, "update_pipeline")
        if pipeline and not legacy:
            raise ValueError("update_pipeline=False contradicts mini_batch_pipeline=True: set one of them")
        pipeline = pipeline or legacy
    steps = values.get("off_policy_steps") or 0
    auto = steps == "auto"
    if auto:
        steps = 1  # until the first step is measured
    if isinstance(steps, bool) or not isinstance(steps, int) or not 0 <= steps <= MAX_OFF_POLICY_STEPS:
        raise ValueError(
            f"off_policy_steps must be 'auto' or an integer in [0, {MAX_OFF_POLICY_STEPS}], got {steps!r} "
            "(each step of lag keeps one more generated batch in memory and trains on older samples)"
        )
    order = values.get("mini_batch_order") or "completion"
    if order not in MINI_BATCH_ORDERS:
        raise ValueError(f"mini_batch_order must be one of {MINI_BATCH_ORDERS}, got {order!r}")
    stream = values.get("stream_rewards")
    stream = True if stream is None else _flag(stream, "stream_rewards")
    staleness = values.get("max_staleness")
    auto_staleness = staleness == "auto"
    if auto_staleness:
        staleness = AUTO_STALENESS_START  # until the first step is measured
    if staleness is not None and (isinstance(staleness, bool) or not isinstance(staleness, int) or staleness < 0):
        raise ValueError(f"max_staleness must be null (no pool), 'auto' or an integer >= 0, got {staleness!r}")
    on_stale = values.get("on_stale") or "wait"
    if on_stale not in ON_STALE:
        raise ValueError(f"on_stale must be one of {ON_STALE}, got {on_stale!r}")
    split = _flag(values.get("split_scored_batches"), "split_scored_batches")
    return StrategyConfig(pipeline, steps, order, stream, staleness, on_stale, auto, split, auto_staleness)


# -- the rest of verl's config, as the checks need it ------------------------------------------------


@dataclass(frozen=True)
class TrainerShape:
    """The values of verl's config the strategies depend on (read by ``shape_from_config``)."""

    use_v1: bool = True
    trainer_mode: str = "sync"
    train_batch_size: int = 8
    rollout_n: int = 1
    ppo_mini_batch_size: int = 8
    ppo_epochs: int = 1
    use_critic: bool = False
    critic_mini_batch_size: int = 8
    critic_epochs: int = 1
    adv_estimator: str = "grpo"
    use_pf_ppo: bool = False
    rollout_is_batch_normalize: bool = False
    reward_manager: str = "naive"
    reward_model_enabled: bool = False
    filter_groups: bool = False
    rollout_correction: bool = False  # algorithm.rollout_correction.rollout_is or rollout_rs set
    calculate_log_probs: bool = True  # verl 0.9.1 default
    actor_shuffle: bool = False  # actor.shuffle / critic.shuffle: verl shuffles the rows of an update
    critic_shuffle: bool = False  # call across its mini-batches (verl's default: off)
    world_size: int = 1  # trainer.n_gpus_per_node x trainer.nnodes
    ticket_deadline: Optional[float] = None  # reward.async_agent.ticket_deadline (s): max_staleness=auto's basis
    sync_refill_failed_groups: bool = False  # trainer.v1.sampler.sync_refill_failed_groups: verl replaces rowless prompts


def _select(config: Any, dotted: str, default: Any = None) -> Any:
    node = config
    for part in dotted.split("."):
        if node is None:
            return default
        getter = getattr(node, "get", None)
        node = getter(part) if getter is not None else getattr(node, part, None)
    return default if node is None else node


def _estimator_name(value: Any) -> str:
    return str(getattr(value, "value", value))


def needs_critic(adv_estimator: str, critic_enable: Any) -> bool:
    """verl 0.9.1's ``need_critic``: ``critic.enable`` if set, else GAE."""
    return bool(critic_enable) if critic_enable is not None else adv_estimator == "gae"


def shape_from_config(config: Any, ticket_deadline: Optional[float] = None) -> TrainerShape:
    """verl's side of the shape; ``ticket_deadline`` is the agent's, validated with its settings."""
    estimator = _estimator_name(_select(config, "algorithm.adv_estimator", "grpo"))
    use_critic = needs_critic(estimator, _select(config, "critic.enable"))
    actor_epochs = int(_select(config, "actor_rollout_ref.actor.ppo_epochs", 1))
    return TrainerShape(
        use_v1=bool(_select(config, "trainer.use_v1", True)),
        trainer_mode=str(_select(config, "trainer.v1.trainer_mode", "sync")),
        train_batch_size=int(_select(config, "data.train_batch_size", 1)),
        rollout_n=int(_select(config, "actor_rollout_ref.rollout.n", 1)),
        ppo_mini_batch_size=int(_select(config, "actor_rollout_ref.actor.ppo_mini_batch_size", 1)),
        ppo_epochs=actor_epochs,
        use_critic=use_critic,
        critic_mini_batch_size=int(_select(config, "critic.ppo_mini_batch_size", 1) or 1),
        critic_epochs=int(_select(config, "critic.ppo_epochs", actor_epochs) or actor_epochs),
        adv_estimator=estimator,
        use_pf_ppo=bool(_select(config, "algorithm.use_pf_ppo", False)),
        rollout_is_batch_normalize=bool(_select(config, "algorithm.rollout_correction.rollout_is_batch_normalize", False)),
        reward_manager=str(_select(config, "reward.reward_manager.name", "naive")),
        reward_model_enabled=bool(_select(config, "reward.reward_model.enable", False)),
        filter_groups=bool(_select(config, "algorithm.filter_groups.enable", False)),
        rollout_correction=bool(_select(config, "algorithm.rollout_correction.rollout_is")
                                or _select(config, "algorithm.rollout_correction.rollout_rs")),
        calculate_log_probs=bool(_select(config, "actor_rollout_ref.rollout.calculate_log_probs", False)),
        actor_shuffle=bool(_select(config, "actor_rollout_ref.actor.shuffle", False)),
        critic_shuffle=bool(_select(config, "critic.shuffle", False)),
        world_size=int(_select(config, "trainer.n_gpus_per_node", 1) or 1) * int(_select(config, "trainer.nnodes", 1) or 1),
        ticket_deadline=ticket_deadline,
        sync_refill_failed_groups=bool(_select(config, "trainer.v1.sampler.sync_refill_failed_groups", False)),
    )


V1_MODE = "async_reward"


@dataclass(frozen=True)
class VerlColocateAsync:
    """How ``off_policy_steps`` alone on v1 runs: as verl's own ``trainer_mode=colocate_async`` with the
    agent as its reward manager. That mode already scores each batch's rewards while the next one
    generates, one step behind; a second implementation here would have to earn its place by a measured
    win, and in the end-to-end benchmark against it (``bench/results/e2e_anchor.json``) generation ahead
    won only together with the mini-batch pipeline (which keeps this package's trainer), so the flag
    alone configures verl's mode instead. verl's
    replay buffer bounds the staleness: ``global_steps - submitted_at + 1`` at most
    ``max_off_policy_threshold``, and with ``wait`` a step samples only once no prompt still in flight
    has reached it, so a step never trains a sample more than ``off_policy_steps`` versions old."""

    off_policy_steps: int

    trainer_mode = "colocate_async"
    max_off_policy_strategy = "wait"
    reward_manager = "async_agent"

    @property
    def max_off_policy_threshold(self) -> int:
        return self.off_policy_steps + 1

    def overrides(self) -> dict[str, Any]:
        """verl config key -> value, applied to the run's config before any worker starts."""
        return {
            "trainer.v1.trainer_mode": self.trainer_mode,
            "trainer.v1.sampler.max_off_policy_threshold": self.max_off_policy_threshold,
            "trainer.v1.sampler.max_off_policy_strategy": self.max_off_policy_strategy,
            "reward.reward_manager.name": self.reward_manager,
            "off_policy_steps": 0,
        }


def off_policy_on_verl(strategy: StrategyConfig, shape: TrainerShape, masks_loss: bool) -> Optional[VerlColocateAsync]:
    """``off_policy_steps=1`` alone on v1 (no pipeline, pool or ``auto``), where verl's own mode does the
    same job: verl's ``colocate_async`` (``VerlColocateAsync``); else None, and ``check_strategy``
    decides as before. Left to this package's trainer, or to its refusals: ``failure_policy: mask``
    (verl's modes cannot take failed samples out of the loss), another ``trainer_mode`` (a conflict),
    a reward manager or reward model the agent does not stand in for, and ``off_policy_steps`` > 1
    (verl's colocate_async generates one batch ahead)."""
    alone = not (strategy.mini_batch_pipeline or strategy.pooled or strategy.auto_off_policy)
    agent_scores = shape.reward_manager in AGENT_REWARD_MANAGERS and not shape.reward_model_enabled
    if (shape.use_v1 and strategy.off_policy_steps == 1 and alone and not masks_loss and shape.trainer_mode == "sync"
            and agent_scores):
        return VerlColocateAsync(strategy.off_policy_steps)
    return None


def check_strategy(strategy: StrategyConfig, shape: TrainerShape) -> None:
    """Every combination the strategies cannot run as verl would: one clear error, at start."""
    if not strategy.enabled:
        return
    if shape.reward_manager not in AGENT_REWARD_MANAGERS:
        raise ValueError(
            f"reward.reward_manager.name={shape.reward_manager}: with the strategies on, every reward is scored by "
            f"the async agent, which reproduces only {sorted(AGENT_REWARD_MANAGERS)} (a per-sample compute_score). "
            f"{shape.reward_manager}'s own behaviour (e.g. dapo's overlong penalty) would be silently lost: "
            "fold it into your reward function, or turn the strategies off"
        )
    if shape.reward_model_enabled:
        raise ValueError(
            "reward.reward_model.enable=true: the strategies score through the async agent, not verl's reward "
            "model; call the model from your reward function (e.g. an OpenAI-compatible judge), or turn them off"
        )
    if shape.adv_estimator in EXTRA_GENERATION:
        raise ValueError(
            f"algorithm.adv_estimator={shape.adv_estimator} needs a second, greedy generation per prompt that the "
            "strategies' generation does not run; use another estimator or turn the strategies off"
        )
    off_policy = strategy.off_policy_steps > 0 or strategy.auto_off_policy or strategy.pooled
    if off_policy and shape.rollout_correction and not shape.calculate_log_probs:
        raise ValueError(
            "algorithm.rollout_correction is set but actor_rollout_ref.rollout.calculate_log_probs=false: without the "
            "rollout's log-probs verl skips the correction silently, and these samples are generated by older weights; "
            "set calculate_log_probs=true (or turn the correction off knowingly)"
        )
    if strategy.pooled:
        if strategy.mini_batch_pipeline:
            raise ValueError(
                "max_staleness (the pool) trains each step on groups already scored, so there is nothing for "
                "mini_batch_pipeline to overlap: use one of them"
            )
        if not shape.use_v1:
            raise ValueError("max_staleness (the pool) runs on the v1 trainer only so far; use trainer.use_v1=true")
        if strategy.auto_staleness and shape.ticket_deadline is None:
            raise ValueError(
                "max_staleness=auto carries a group as many steps as reward.async_agent.ticket_deadline may take to "
                "settle it, and no ticket_deadline is set: set one (seconds), or give max_staleness an integer"
            )
    if shape.use_v1 and shape.sync_refill_failed_groups and (strategy.pooled or strategy.stream_rewards):
        raise ValueError(
            "trainer.v1.sampler.sync_refill_failed_groups=true: verl's sampler then draws replacement prompts for those "
            "whose every session failed while it samples the step's batch; their sessions never reach the step's "
            "open ticket (stream_rewards), and the staleness pool (max_staleness) counts, and regenerates on resume, "
            "the prompts of one draw. Leave it off (verl's default: such a prompt is kept with no rows, and a step "
            "trains on the rest, as stock v1 does), or, without max_staleness, set stream_rewards=false"
        )
    if shape.use_v1:
        if strategy.off_policy_steps > 1:
            raise ValueError(
                f"off_policy_steps={strategy.off_policy_steps}: the v1 trainer mode prefetches one batch at most "
                "(verl's sync replay buffer orders batches by step); use 1, or the v0 trainer (trainer.use_v1=False)"
            )
        if shape.trainer_mode not in ("sync", V1_MODE):
            raise ValueError(
                f"the strategies are their own v1 trainer mode ({V1_MODE}); trainer.v1.trainer_mode={shape.trainer_mode} conflicts"
            )
        if shape.filter_groups:
            raise ValueError(
                "algorithm.filter_groups (DAPO dynamic sampling) filters groups by reward inside verl's replay buffer, "
                "before the strategies have scored them; turn one of them off"
            )
    if strategy.mini_batch_pipeline:
        plan_mini_batches(strategy, shape)


# -- a step's updates ------------------------------------------------------------------------------


@dataclass(frozen=True)
class MiniBatchPlan:
    samples_per_mini_batch: int  # actor mini-batch, in samples (ppo_mini_batch_size x n)
    mini_batches: int  # per step (1 without the pipeline: the whole batch at once)
    critic_every: int = 1  # actor mini-batches per critic update call (whole critic mini-batches)
    actor_epochs: int = 1
    critic_epochs: int = 1
    # Mini-batches whose rewards are all in by the time the one before them is ready share one update
    # call per role (merge_update_calls). Off with split_scored_batches (always one call per
    # mini-batch), with actor/critic shuffle (verl would shuffle rows across the merged mini-batches)
    # and on more than one device (verl hands each data-parallel rank a contiguous slice of a call's
    # rows, so a merged call's mini-batches would mix rows of neighbouring ones).
    merge_ready: bool = False


def plan_mini_batches(strategy: StrategyConfig, shape: TrainerShape) -> MiniBatchPlan:
    """How a step's batch is cut into updates; clear errors for shapes the pipeline cannot run."""
    train, mini = shape.train_batch_size, shape.ppo_mini_batch_size
    if mini <= 0 or train % mini:
        raise ValueError(f"ppo_mini_batch_size ({mini}) must divide data.train_batch_size ({train})")
    epochs = dict(actor_epochs=max(1, shape.ppo_epochs), critic_epochs=max(1, shape.critic_epochs))
    if not strategy.mini_batch_pipeline:
        return MiniBatchPlan(train * shape.rollout_n, 1, 1, **epochs)
    estimator = shape.adv_estimator
    if estimator not in GROUP_EXACT | BATCH_STATISTIC:
        raise ValueError(
            f"mini_batch_pipeline does not know whether adv_estimator={estimator!r} works on mini-batches of "
            f"whole groups; supported: {sorted(GROUP_EXACT | BATCH_STATISTIC)}"
        )
    if estimator == "gae" and not shape.use_critic:
        raise ValueError("adv_estimator=gae needs a critic")
    if shape.use_pf_ppo:
        raise ValueError(
            "algorithm.use_pf_ppo resamples the whole batch by reward before the update; mini_batch_pipeline "
            "updates before the batch is scored: turn one of them off"
        )
    if shape.rollout_is_batch_normalize:
        raise ValueError(
            "algorithm.rollout_correction.rollout_is_batch_normalize normalises the IS weights over the whole batch; "
            "under mini_batch_pipeline each mini-batch's weights would be normalised on their own: turn one of them off"
        )
    critic_every = 1
    if shape.use_critic:
        critic = shape.critic_mini_batch_size
        if critic <= 0 or train % critic:
            raise ValueError(f"critic.ppo_mini_batch_size ({critic}) must divide data.train_batch_size ({train})")
        # The critic trains on whole critic mini-batches: it waits for enough actor mini-batches.
        critic_every = math.lcm(mini, critic) // mini
    shuffled = shape.actor_shuffle or (shape.use_critic and shape.critic_shuffle)
    merge_ready = not strategy.split_scored_batches and not shuffled and shape.world_size == 1
    return MiniBatchPlan(mini * shape.rollout_n, train // mini, critic_every, **epochs, merge_ready=merge_ready)


@dataclass(frozen=True)
class UpdateCall:
    """One call to a worker's update within a step. ``pieces`` names the actor mini-batches it
    trains on (``None``: the whole batch, in verl's order)."""

    role: str  # "actor" or "critic"
    pieces: Optional[tuple[int, ...]]
    epochs: int
    step_lr: bool  # the LR scheduler steps once per training step: on the role's last call only
    load: bool  # move parameters/optimizer to the device on entry (offload enabled): first call
    offload: bool  # and back on exit: last call


@dataclass(frozen=True)
class UpdateSchedule:
    calls: tuple[UpdateCall, ...] = field(default_factory=tuple)

    def after_piece(self, piece: int) -> list[UpdateCall]:
        """Calls that can run once actor mini-batch ``piece`` (0-based) has its advantages."""
        return [c for c in self.calls if c.pieces is not None and c.pieces[-1] == piece]

    def later_epochs(self) -> list[UpdateCall]:
        return [c for c in self.calls if c.pieces is None]


def merge_update_calls(calls: Sequence[UpdateCall]) -> list[UpdateCall]:
    """``calls`` (epoch-1 calls of consecutive actor mini-batches, in schedule order) as one call per
    role, critic first as verl updates it: pieces in order, the first call's load, the last call's
    LR step and offload. verl's update splits the rows it is given into mini-batches in order (shuffle
    off), so the merged call runs the same optimizer steps on the same rows as the calls it replaces:
    the parameters are unchanged and the call's fixed cost (dispatch, data transfer, metrics) is paid
    once. Why it matters: a mini-batch pipeline that finds several mini-batches scored at once (the
    first and last steps of a run, a burst of answers) would otherwise pay that cost per mini-batch."""
    merged: list[UpdateCall] = []
    for role in ("critic", "actor"):
        mine = [c for c in calls if c.role == role]
        if not mine:
            continue
        if any(c.pieces is None or c.epochs != 1 for c in mine):
            raise ValueError(f"only epoch-1 calls of whole mini-batches merge, got {mine}")
        pieces = tuple(p for c in mine for p in c.pieces)
        if list(pieces) != list(range(pieces[0], pieces[0] + len(pieces))):
            raise ValueError(f"merged {role} calls must cover consecutive mini-batches in order, got {pieces}")
        merged.append(UpdateCall(role, pieces, 1, step_lr=mine[-1].step_lr, load=mine[0].load, offload=mine[-1].offload))
    return merged


def schedule_updates(plan: MiniBatchPlan, *, use_critic: bool, update_actor: bool) -> UpdateSchedule:
    """Epoch 1 runs mini-batch by mini-batch as rewards arrive (the critic every ``critic_every``
    actor mini-batches); epochs 2..E run as verl runs them, over the whole batch in one call."""
    calls: list[UpdateCall] = []
    roles = (["critic"] if use_critic else []) + (["actor"] if update_actor else [])
    per_role: dict[str, list[tuple[Optional[tuple[int, ...]], int]]] = {}
    for role in roles:
        every = plan.critic_every if role == "critic" else 1
        epochs = plan.critic_epochs if role == "critic" else plan.actor_epochs
        role_calls: list[tuple[Optional[tuple[int, ...]], int]] = []
        if plan.mini_batches == 1:
            role_calls.append(((0,), epochs))  # no pipeline: verl's one call, every epoch
        else:
            for end in range(every - 1, plan.mini_batches, every):
                role_calls.append((tuple(range(end - every + 1, end + 1)), 1))
            if epochs > 1:
                role_calls.append((None, epochs - 1))
        per_role[role] = role_calls
    # Call order: by the piece that unlocks them, critic before actor (as verl), later epochs last.
    ordered: list[tuple[tuple[int, int, int], str, int, int]] = []
    for role, role_calls in per_role.items():
        for position, (pieces, _) in enumerate(role_calls):
            key = (plan.mini_batches if pieces is None else pieces[-1], roles.index(role), position)
            ordered.append((key, role, position, len(role_calls)))
    for _, role, position, count in sorted(ordered):
        pieces, epochs = per_role[role][position]
        first, last = position == 0, position == count - 1
        calls.append(UpdateCall(role, pieces, epochs, step_lr=last, load=first, offload=last))
    return UpdateSchedule(tuple(calls))
