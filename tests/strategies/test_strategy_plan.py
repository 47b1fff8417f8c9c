"""Strategy flags, start-time refusals and the shape of a step's updates: pure logic."""

from __future__ import annotations

import inspect
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from verl_async_rm.strategies.plan import (
    BATCH_STATISTIC,
    EXTRA_GENERATION,
    GROUP_EXACT,
    MiniBatchPlan,
    StrategyConfig,
    TrainerShape,
    VerlColocateAsync,
    check_strategy,
    merge_update_calls,
    off_policy_on_verl,
    plan_mini_batches,
    schedule_updates,
    shape_from_config,
    strategy_from_mapping,
)
from verl_async_rm.strategies.timing import RewardTiming, latency_metrics

SHAPE = TrainerShape(train_batch_size=8, ppo_mini_batch_size=2, rollout_n=4)
PIPELINE = StrategyConfig(True)


@pytest.mark.quick
def test_flags_and_the_recipe_spellings():
    assert strategy_from_mapping({}) == StrategyConfig(False, 0)
    assert strategy_from_mapping({"mini_batch_pipeline": True}).mini_batch_pipeline
    assert strategy_from_mapping({"update_pipeline": True}).mini_batch_pipeline  # the recipe's older flag
    assert strategy_from_mapping({"off_policy_steps": 1}) == StrategyConfig(False, 1)
    assert strategy_from_mapping({"mini_batch_order": "index"}).mini_batch_order == "index"
    assert not strategy_from_mapping({"mini_batch_pipeline": True}).split_scored_batches  # scored batches: whole
    assert strategy_from_mapping({"split_scored_batches": True}).split_scored_batches
    with pytest.raises(ValueError, match="split_scored_batches"):
        strategy_from_mapping({"split_scored_batches": "yes"})
    assert not StrategyConfig().enabled and StrategyConfig(off_policy_steps=2).enabled
    with pytest.raises(ValueError, match="contradicts"):
        strategy_from_mapping({"mini_batch_pipeline": True, "update_pipeline": False})
    for bad in (-1, 5, 1.5, True):
        with pytest.raises(ValueError, match="off_policy_steps"):
            strategy_from_mapping({"off_policy_steps": bad})
    with pytest.raises(ValueError, match="true or false"):
        strategy_from_mapping({"mini_batch_pipeline": "yes"})
    with pytest.raises(ValueError, match="mini_batch_order"):
        strategy_from_mapping({"mini_batch_order": "random"})


@pytest.mark.local
def test_every_estimator_of_the_installed_verl_is_classified():
    """The classification is read from verl 0.9.1's core_algos; a verl with a new estimator fails here."""
    from verl.trainer.ppo.core_algos import ADV_ESTIMATOR_REGISTRY, AdvantageEstimator

    known = GROUP_EXACT | BATCH_STATISTIC | EXTRA_GENERATION
    assert {e.value for e in AdvantageEstimator} == known
    assert set(ADV_ESTIMATOR_REGISTRY) == known
    assert not (GROUP_EXACT & BATCH_STATISTIC) and not (EXTRA_GENERATION & (GROUP_EXACT | BATCH_STATISTIC))


@pytest.mark.local
@pytest.mark.parametrize("estimator", sorted(GROUP_EXACT))
def test_group_exact_estimators_read_only_their_group(estimator):
    """Shuffling the other groups' rewards never changes a group's advantages (verl's own functions)."""
    import numpy as np
    import torch

    from verl.trainer.ppo.core_algos import get_adv_estimator_fn
    from verl.trainer.config import AlgoConfig

    generator = torch.Generator().manual_seed(0)
    rewards = torch.zeros(8, 5)
    rewards[:, -1] = torch.rand(8, generator=generator)
    mask = torch.ones(8, 5)
    uids = np.array(["a"] * 4 + ["b"] * 4, dtype=object)
    kwargs = dict(response_mask=mask, index=uids, config=AlgoConfig())
    if "optimal_token_baseline" in estimator:
        kwargs.update(old_log_probs=torch.full((8, 5), -1.0), sum_pi_squared=torch.full((8, 5), 0.2), rollout_is_weights=None)
    fn = get_adv_estimator_fn(estimator)
    first, _ = fn(token_level_rewards=rewards, **kwargs)
    changed = rewards.clone()
    changed[4:, -1] = torch.rand(4, generator=generator) * 7
    second, _ = fn(token_level_rewards=changed, **kwargs)
    assert torch.allclose(first[:4], second[:4])


@pytest.mark.local
@pytest.mark.parametrize("estimator", sorted(BATCH_STATISTIC - {"gae", "gdpo"}))
def test_batch_statistic_estimators_do_read_other_groups(estimator):
    """The counterpart: these change a group's advantages when another group's rewards change, which
    is why docs/guide/strategies.md lists them as a difference under the pipeline."""
    import numpy as np
    import torch

    from verl.trainer.config import AlgoConfig
    from verl.trainer.ppo.core_algos import get_adv_estimator_fn

    rewards = torch.zeros(8, 5)
    rewards[:, -1] = torch.tensor([0.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0])
    uids = np.array(["a"] * 4 + ["b"] * 4, dtype=object)
    fn = get_adv_estimator_fn(estimator)
    first, _ = fn(token_level_rewards=rewards, response_mask=torch.ones(8, 5), index=uids, config=AlgoConfig())
    changed = rewards.clone()
    changed[4:, -1] = torch.tensor([5.0, 6.0, 7.0, 0.0])  # also more nonzero scores (GPG reads their count)
    second, _ = fn(token_level_rewards=changed, response_mask=torch.ones(8, 5), index=uids, config=AlgoConfig())
    assert not torch.allclose(first[:4], second[:4])


@pytest.mark.quick
@pytest.mark.parametrize("estimator", sorted(GROUP_EXACT | BATCH_STATISTIC - {"gae"}))
def test_pipeline_plans_whole_group_mini_batches(estimator):
    plan = plan_mini_batches(PIPELINE, TrainerShape(**{**SHAPE.__dict__, "adv_estimator": estimator}))
    assert (plan.samples_per_mini_batch, plan.mini_batches) == (8, 4)


@pytest.mark.quick
def test_without_the_pipeline_one_update_takes_the_batch():
    plan = plan_mini_batches(StrategyConfig(False, 1), SHAPE)
    assert (plan.samples_per_mini_batch, plan.mini_batches) == (32, 1)


def shape(**changes) -> TrainerShape:
    return TrainerShape(**{**SHAPE.__dict__, **changes})


@pytest.mark.quick
@pytest.mark.parametrize(
    "strategy, changes, match",
    [
        (PIPELINE, {"adv_estimator": "my_custom"}, "does not know"),
        (PIPELINE, {"adv_estimator": "gae"}, "needs a critic"),
        (PIPELINE, {"ppo_mini_batch_size": 3}, "must divide"),
        (PIPELINE, {"adv_estimator": "gae", "use_critic": True, "use_pf_ppo": True}, "use_pf_ppo"),
        (PIPELINE, {"rollout_is_batch_normalize": True}, "batch_normalize"),
        (PIPELINE, {"use_critic": True, "critic_mini_batch_size": 3}, "critic.ppo_mini_batch_size"),
        (StrategyConfig(False, 1), {"adv_estimator": "remax"}, "greedy generation"),
        (StrategyConfig(False, 1), {"reward_manager": "dapo"}, "overlong penalty"),
        (StrategyConfig(False, 1), {"reward_manager": "prime"}, "reward_manager.name=prime"),
        (StrategyConfig(False, 1), {"reward_model_enabled": True}, "reward_model.enable"),
        (StrategyConfig(False, 2), {}, "prefetches one batch at most"),
        (StrategyConfig(False, 1), {"trainer_mode": "colocate_async"}, "conflicts"),
        (StrategyConfig(False, 1), {"filter_groups": True}, "filter_groups"),
    ],
)
def test_what_cannot_run_as_verl_is_refused_at_start(strategy, changes, match):
    with pytest.raises(ValueError, match=match):
        check_strategy(strategy, shape(**changes))


@pytest.mark.quick
@pytest.mark.parametrize(
    "strategy, changes",
    [
        (StrategyConfig(), {"adv_estimator": "remax", "reward_manager": "dapo"}),  # strategies off: stock verl
        (StrategyConfig(False, 2), {"use_v1": False}),
        (PIPELINE, {"reward_manager": "async_agent", "ppo_epochs": 2}),
        (PIPELINE, {"adv_estimator": "gae", "use_critic": True, "critic_mini_batch_size": 4}),
        (StrategyConfig(False, 1), {"trainer_mode": "async_reward"}),
    ],
)
def test_what_runs_as_verl_is_accepted(strategy, changes):
    check_strategy(strategy, shape(**changes))


@pytest.mark.local
def test_shape_is_read_from_verls_config():
    from hydra import compose, initialize_config_module

    with initialize_config_module("verl.trainer.config", version_base=None):
        config = compose("ppo_trainer", overrides=[
            "algorithm.adv_estimator=grpo", "data.train_batch_size=16", "actor_rollout_ref.rollout.n=4",
            "actor_rollout_ref.actor.ppo_mini_batch_size=4", "actor_rollout_ref.actor.ppo_epochs=2",
            "critic.ppo_mini_batch_size=8", "reward.reward_manager.name=dapo", "trainer.use_v1=false",
        ])
    read = shape_from_config(config)
    assert read == TrainerShape(
        use_v1=False, trainer_mode="sync", train_batch_size=16, rollout_n=4, ppo_mini_batch_size=4, ppo_epochs=2,
        use_critic=False, critic_mini_batch_size=8, critic_epochs=2, adv_estimator="grpo", reward_manager="dapo",
        world_size=8,  # verl's default trainer.n_gpus_per_node; shuffle off by default
    )
    # the shape names every field check_strategy and plan_mini_batches read
    assert set(inspect.signature(TrainerShape).parameters) == set(TrainerShape.__dataclass_fields__)


@pytest.mark.quick
def test_critic_mini_batches_that_do_not_divide_the_actors_accumulate():
    """F6: actor mini-batches of 2 prompts, critic of 4 (or 3): the critic trains on whole critic
    mini-batches, every lcm(actor, critic) prompts."""
    plan = plan_mini_batches(PIPELINE, shape(adv_estimator="gae", use_critic=True, critic_mini_batch_size=4))
    assert plan.critic_every == 2
    plan = plan_mini_batches(PIPELINE, shape(train_batch_size=12, adv_estimator="gae", use_critic=True, critic_mini_batch_size=3))
    assert plan.critic_every == 3 and plan.mini_batches == 6


@pytest.mark.quick
@given(
    mini_batches=st.integers(1, 8),
    critic_every=st.integers(1, 4),
    actor_epochs=st.integers(1, 3),
    critic_epochs=st.integers(1, 3),
    use_critic=st.booleans(),
    update_actor=st.booleans(),
)
def test_update_schedule_does_per_step_what_verls_one_call_does(mini_batches, critic_every, actor_epochs, critic_epochs,
                                                                 use_critic, update_actor):
    """Per role and step: every mini-batch trained once per epoch, epoch 1 piece by piece and in
    order, later epochs over the whole batch; the LR scheduler stepped once, on the last call; one
    load (the first call) and one offload (the last)."""
    if mini_batches % critic_every:
        critic_every = 1
    plan = MiniBatchPlan(8, mini_batches, critic_every, actor_epochs, critic_epochs)
    calls = schedule_updates(plan, use_critic=use_critic, update_actor=update_actor).calls
    roles = (["critic"] if use_critic else []) + (["actor"] if update_actor else [])
    assert {c.role for c in calls} == set(roles)
    for role in roles:
        mine = [c for c in calls if c.role == role]
        epochs = critic_epochs if role == "critic" else actor_epochs
        trained = [p for c in mine if c.pieces is not None for p in c.pieces for _ in range(c.epochs)]
        whole = sum(c.epochs for c in mine if c.pieces is None)
        if mini_batches == 1:
            assert whole == 0 and trained == [0] * epochs
        else:
            assert trained == list(range(mini_batches)) and whole == epochs - 1
            size = critic_every if role == "critic" else 1
            assert all(len(c.pieces) == size for c in mine if c.pieces is not None)
        assert [c.step_lr for c in mine] == [False] * (len(mine) - 1) + [True]
        assert [c.load for c in mine] == [True] + [False] * (len(mine) - 1)
        assert [c.offload for c in mine] == [False] * (len(mine) - 1) + [True]
    # a call only uses pieces that exist when it runs; the critic goes before the actor, as in verl
    for earlier, later in zip(calls, calls[1:]):
        end = lambda c: math.inf if c.pieces is None else c.pieces[-1]  # noqa: E731
        assert end(earlier) <= end(later)


@pytest.mark.quick
@given(
    mini_batches=st.integers(2, 8),
    critic_every=st.integers(1, 4),
    actor_epochs=st.integers(1, 3),
    use_critic=st.booleans(),
    ready_after=st.lists(st.booleans(), min_size=8, max_size=8),
)
def test_merged_update_calls_train_what_the_separate_calls_train(mini_batches, critic_every, actor_epochs, use_critic,
                                                                  ready_after):
    """The scheduler holds a mini-batch's calls back while the next one is scored already, then sends
    them merged (plan.merge_update_calls): whatever the runs of ready mini-batches, each role trains
    every mini-batch once in epoch 1 and in order, loads once (first call), offloads and steps the LR
    once (last call), and never trains a mini-batch before it is ready."""
    if mini_batches % critic_every:
        critic_every = 1
    plan = MiniBatchPlan(8, mini_batches, critic_every, actor_epochs, actor_epochs, merge_ready=True)
    schedule = schedule_updates(plan, use_critic=use_critic, update_actor=True)
    sent, deferred = [], []
    for part in range(mini_batches):
        deferred += schedule.after_piece(part)
        if part + 1 < mini_batches and ready_after[part]:  # the next mini-batch was scored already
            continue
        if deferred:
            merged = merge_update_calls(deferred)
            assert len(merged) == len({c.role for c in deferred})  # one call per role
            sent += [(part, c) for c in merged]
        deferred = []
    sent += [(mini_batches, c) for c in schedule.later_epochs()]
    for role in ["actor"] + (["critic"] if use_critic else []):
        mine = [(part, c) for part, c in sent if c.role == role]
        separate = [c for c in schedule.calls if c.role == role]
        trained = [p for _, c in mine if c.pieces is not None for p in c.pieces]
        assert trained == list(range(mini_batches))
        assert all(max(c.pieces) <= part for part, c in mine if c.pieces is not None)  # sent once ready
        calls = [c for _, c in mine]
        assert [c.load for c in calls] == [True] + [False] * (len(calls) - 1)
        assert [c.offload for c in calls] == [False] * (len(calls) - 1) + [True]
        assert [c.step_lr for c in calls] == [False] * (len(calls) - 1) + [True]
        assert sum(c.epochs for c in calls if c.pieces is None) == sum(c.epochs for c in separate if c.pieces is None)
        assert len(calls) <= len(separate)


@pytest.mark.quick
def test_only_epoch_one_calls_of_consecutive_mini_batches_merge():
    plan = MiniBatchPlan(8, 4, 1, 2, 2, merge_ready=True)
    calls = schedule_updates(plan, use_critic=False, update_actor=True).calls
    with pytest.raises(ValueError, match="epoch-1"):
        merge_update_calls([calls[0], calls[-1]])  # the later-epochs call
    with pytest.raises(ValueError, match="consecutive"):
        merge_update_calls([calls[0], calls[2]])


@pytest.mark.quick
def test_merging_is_off_where_it_would_change_the_mini_batches():
    """One call per mini-batch with split_scored_batches, with actor or critic shuffle (verl shuffles
    a call's rows across its mini-batches) and on several devices (each rank gets a contiguous slice)."""
    assert plan_mini_batches(PIPELINE, SHAPE).merge_ready
    assert not plan_mini_batches(StrategyConfig(True, split_scored_batches=True), SHAPE).merge_ready
    assert not plan_mini_batches(PIPELINE, shape(actor_shuffle=True)).merge_ready
    assert not plan_mini_batches(PIPELINE, shape(adv_estimator="gae", use_critic=True, critic_shuffle=True)).merge_ready
    assert plan_mini_batches(PIPELINE, shape(critic_shuffle=True)).merge_ready  # no critic: its shuffle is moot
    assert not plan_mini_batches(PIPELINE, shape(world_size=2)).merge_ready
    read = shape_from_config({"actor_rollout_ref": {"actor": {"shuffle": True}}, "critic": {"shuffle": False},
                              "trainer": {"n_gpus_per_node": 4, "nnodes": 2}})
    assert (read.actor_shuffle, read.critic_shuffle, read.world_size) == (True, False, 8)


@pytest.mark.quick
def test_reward_timing_overlap():
    timing = RewardTiming(submitted_at=10.0, settled_at=[12.0, 14.0], blocked=1.0)
    assert timing.latency == 4.0
    assert timing.metrics()["async_reward/overlap_ratio"] == pytest.approx(0.75)  # 3 of 4 s hidden
    assert RewardTiming(0.0).metrics()["async_reward/overlap_ratio"] == 1.0
    assert latency_metrics([1.0, 2.0, 3.0])["async_reward/latency_max_s"] == 3.0 and latency_metrics([]) == {}


@pytest.mark.quick
def test_pool_and_auto_lookahead_flags():
    pooled = strategy_from_mapping({"off_policy_steps": "auto", "max_staleness": 2, "on_stale": "drop"})
    assert (pooled.auto_off_policy, pooled.off_policy_steps, pooled.max_staleness, pooled.on_stale) == (True, 1, 2, "drop")
    assert pooled.enabled and pooled.pooled and pooled.stream_rewards
    assert not strategy_from_mapping({"mini_batch_pipeline": True}).pooled
    assert not strategy_from_mapping({"stream_rewards": False, "mini_batch_pipeline": True}).stream_rewards
    auto = strategy_from_mapping({"max_staleness": "auto"})
    assert (auto.auto_staleness, auto.max_staleness, auto.pooled) == (True, 1, True)  # 1 until the first step is measured
    assert not pooled.auto_staleness
    for bad in ({"max_staleness": -1}, {"max_staleness": "1"}, {"max_staleness": "Auto"}, {"on_stale": "skip"},
                {"off_policy_steps": "often"}, {"stream_rewards": "yes"}):
        with pytest.raises(ValueError):
            strategy_from_mapping(bad)


@pytest.mark.quick
@pytest.mark.parametrize(
    "values, changes, match",
    [
        ({"max_staleness": 1, "mini_batch_pipeline": True}, {}, "nothing for mini_batch_pipeline"),
        ({"max_staleness": 1, "off_policy_steps": 1}, {"use_v1": False}, "v1 trainer only"),
        ({"off_policy_steps": 1}, {"rollout_correction": True, "calculate_log_probs": False}, "calculate_log_probs"),
        ({"off_policy_steps": "auto"}, {"rollout_correction": True, "calculate_log_probs": False}, "calculate_log_probs"),
        ({"max_staleness": 0}, {"rollout_correction": True, "calculate_log_probs": False}, "calculate_log_probs"),
        ({"max_staleness": "auto"}, {"ticket_deadline": None}, "no ticket_deadline is set"),
    ],
)
def test_pool_combinations_that_would_be_wrong_are_refused(values, changes, match):
    with pytest.raises(ValueError, match=match):
        check_strategy(strategy_from_mapping(values), shape(**changes))


@pytest.mark.quick
def test_the_auto_bound_reads_the_agents_ticket_deadline_from_verls_config():
    from omegaconf import OmegaConf

    from verl_async_rm.integration.settings import read_run_settings

    config = OmegaConf.create({"reward": {"async_agent": {"ticket_deadline": 12.5, "request_timeout": 10}}, "max_staleness": "auto"})
    assert read_run_settings(config).shape.ticket_deadline == 12.5  # read and checked with the strategy
    assert read_run_settings(OmegaConf.create({"reward": {"async_agent": {}}})).shape.ticket_deadline is None
    with pytest.raises(ValueError, match="ticket_deadline"):
        read_run_settings(OmegaConf.create({"reward": {"async_agent": {}}, "max_staleness": "auto"}))


@pytest.mark.quick
def test_verls_refill_of_prompts_whose_sessions_all_failed_is_refused_at_start_where_it_would_break_mid_run():
    """verl's sync_refill_failed_groups draws replacement prompts inside its sampler, mid-step: the
    step's open ticket (stream_rewards) never gets their sessions, and the pool counts and
    regenerates the prompts of one draw. Read once from verl's config with the rest of the shape."""
    from omegaconf import OmegaConf

    from verl_async_rm.integration.settings import read_run_settings

    refill = {"trainer": {"v1": {"sampler": {"sync_refill_failed_groups": True}}}, "reward": {"async_agent": {}}}
    for values in ({"max_staleness": 1}, {"max_staleness": 1, "stream_rewards": False}, {"mini_batch_pipeline": True}):
        with pytest.raises(ValueError, match="sync_refill_failed_groups"):
            read_run_settings(OmegaConf.create({**refill, **values}))
    assert read_run_settings(OmegaConf.create({**refill, "mini_batch_pipeline": True, "stream_rewards": False})).shape.sync_refill_failed_groups
    assert not read_run_settings(OmegaConf.create({"reward": {"async_agent": {}}, "max_staleness": 1})).shape.sync_refill_failed_groups
    read_run_settings(OmegaConf.create(refill))  # the strategies off: verl's business
    read_run_settings(OmegaConf.create({**refill, "off_policy_steps": 1}))  # verl's colocate_async: verl's business too


@pytest.mark.quick
def test_on_policy_correction_without_rollout_log_probs_stays_verls_business():
    check_strategy(strategy_from_mapping({"mini_batch_pipeline": True}), shape(rollout_correction=True, calculate_log_probs=False))
    check_strategy(strategy_from_mapping({"max_staleness": 1, "off_policy_steps": 1}),
                   shape(rollout_correction=True, calculate_log_probs=True))


@pytest.mark.quick
@given(pipeline=st.booleans(), pooled=st.booleans(), auto=st.booleans(), steps=st.integers(0, 4), masks=st.booleans(),
       use_v1=st.booleans(), mode=st.sampled_from(["sync", "colocate_async", "async_reward"]),
       manager=st.sampled_from(["naive", "async_agent", "dapo"]), reward_model=st.booleans())
def test_off_policy_steps_alone_on_v1_is_verls_colocate_async_and_nothing_else_is(pipeline, pooled, auto, steps, masks,
                                                                                 use_v1, mode, manager, reward_model):
    """Exactly ``off_policy_steps=1`` with no other strategy, on v1's default mode, scored by the agent,
    without ``mask``: verl's colocate_async, one step of staleness at most (verl's threshold counts
    the step it was submitted at, so 2), waiting rather than dropping."""
    strategy = StrategyConfig(mini_batch_pipeline=pipeline, off_policy_steps=steps, max_staleness=1 if pooled else None,
                              auto_off_policy=auto)
    trainer = TrainerShape(use_v1=use_v1, trainer_mode=mode, reward_manager=manager, reward_model_enabled=reward_model)
    expected = (steps == 1 and not (pipeline or pooled or auto) and not masks and use_v1 and mode == "sync"
                and manager != "dapo" and not reward_model)
    verl_mode = off_policy_on_verl(strategy, trainer, masks)
    assert (verl_mode is not None) == expected
    if verl_mode is not None:
        assert verl_mode == VerlColocateAsync(1) and verl_mode.overrides() == {
            "trainer.v1.trainer_mode": "colocate_async", "trainer.v1.sampler.max_off_policy_threshold": 2,
            "trainer.v1.sampler.max_off_policy_strategy": "wait", "reward.reward_manager.name": "async_agent",
            "off_policy_steps": 0}


@pytest.mark.quick
def test_the_settings_of_an_off_policy_run_on_v1_are_those_of_verls_colocate_async_with_the_agent():
    """Read once: the strategy is off and the shape is colocate_async's, so every later process, which
    reads the config ``write_verl_mode`` rewrote, reads the same settings; written, it is not redone."""
    from omegaconf import OmegaConf

    from verl_async_rm.integration.settings import read_run_settings, write_verl_mode

    config = OmegaConf.create({"reward": {"async_agent": {}, "reward_manager": {"name": "naive"}}, "off_policy_steps": 1})
    settings = read_run_settings(config)
    assert settings.verl_mode == VerlColocateAsync(1) and not settings.strategy.enabled and settings.uses_agent
    assert (settings.shape.trainer_mode, settings.shape.reward_manager, settings.mask.trainer_mode) == \
        ("colocate_async", "async_agent", "colocate_async")
    write_verl_mode(config, settings.verl_mode)
    assert OmegaConf.select(config, "trainer.v1.trainer_mode") == "colocate_async"
    assert OmegaConf.select(config, "trainer.v1.sampler.max_off_policy_threshold") == 2
    again = read_run_settings(config)
    assert again.verl_mode is None and (again.strategy, again.shape) == (settings.strategy, settings.shape)
    masked = OmegaConf.create({"reward": {"async_agent": {"failure_policy": "mask"}}, "off_policy_steps": 1,
                               "actor_rollout_ref": {"rollout": {"n": 4}}})  # mask: this package's trainer
    assert read_run_settings(masked).verl_mode is None and read_run_settings(masked).strategy.off_policy_steps == 1
