"""failure_policy=mask on verl's real functions: the real agent scores a batch (some rewards raise),
the real step scheduler and v0 trainer ops attach, mask and compute advantages with verl's
``compute_advantage``, and a recording stand-in for the worker captures what each actor update
receives (the GPU worker is the only fake). Checked against a batch in which the failed samples
never existed: the same advantages for every estimator ``mask`` accepts, the same PPO loss and the
same gradient through verl's own ``ppo_loss`` (the loss its engine workers run); and the loss modes
``mask`` refuses really do count masked samples."""

from __future__ import annotations

import dataclasses
import random
import uuid

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from verl import DataProto
from verl.trainer.ppo.ray_trainer import compute_advantage
from verl.utils import tensordict_utils as tu
from verl.workers.config import FSDPActorConfig
from verl.workers.utils.losses import ppo_loss
from verl.workers.utils.padding import left_right_2_no_padding
from verl_async_rm.masking import MASKABLE_ESTIMATORS, NO_GROUP_BASELINE
from verl_async_rm.strategies.plan import BATCH_STATISTIC, GROUP_EXACT, StrategyConfig, TrainerShape, plan_mini_batches
from verl_async_rm.integration.settings import settings_from_verl_config
from verl_async_rm.strategies.rewards import BatchRewards
from verl_async_rm.strategies.scheduler import StepScheduler
from verl_async_rm.strategies.v0 import V0Ops
from tests.conftest import HELPERS

pytestmark = pytest.mark.local

REWARD = str(HELPERS / "seam_reward.py")
N, PROMPTS, MINI, PROMPT_LEN, RESPONSE_LEN, VOCAB = 4, 8, 2, 3, 7, 11
GDPO_KEY = "part"  # a reward component the seam reward returns, for GDPO (through the extra info, as verl)


class RecordingTrainer:
    """What ``V0Ops`` needs of verl's trainer: its config, and the update calls (recorded)."""

    def __init__(self, config):
        self.config = config
        self.received: list[tuple[str, DataProto]] = []

    def _update_actor(self, piece: DataProto) -> DataProto:
        self.received.append(("actor", piece))
        return DataProto(meta_info={"metrics": {}})

    def _update_critic(self, piece: DataProto) -> DataProto:
        self.received.append(("critic", piece))
        return DataProto(meta_info={"metrics": {}})


def generated_batch(seed: int):
    """A generated batch as verl's v0 loop hands it over (rows of groups interleaved, responses of
    several lengths, old log-probs and values computed), with a score per row and the rows whose
    reward will raise: every group keeps >= 2 usable samples but one, left with a single one."""
    rng = random.Random(seed)
    order = list(range(PROMPTS * N))
    rng.shuffle(order)
    group_of_row = [f"uid{order[r] // N}" for r in range(PROMPTS * N)]
    gen = torch.Generator().manual_seed(seed)
    rows = PROMPTS * N
    lengths = torch.randint(2, RESPONSE_LEN + 1, (rows,), generator=gen)
    response_mask = (torch.arange(RESPONSE_LEN)[None, :] < lengths[:, None]).long()
    attention_mask = torch.cat([torch.ones(rows, PROMPT_LEN, dtype=torch.long), response_mask], dim=1)
    input_ids = torch.randint(1, VOCAB, (rows, PROMPT_LEN + RESPONSE_LEN), generator=gen) * attention_mask
    batch = DataProto.from_dict(
        tensors={
            "prompts": input_ids[:, :PROMPT_LEN], "responses": input_ids[:, PROMPT_LEN:], "input_ids": input_ids,
            "attention_mask": attention_mask, "position_ids": torch.cumsum(attention_mask, 1) - 1,
            "response_mask": response_mask,
            "old_log_probs": -torch.rand(rows, RESPONSE_LEN, generator=gen) * 3,
            "values": torch.randn(rows, RESPONSE_LEN, generator=gen),
            "sum_pi_squared": torch.rand(rows, RESPONSE_LEN, generator=gen) + 0.1,
        },
        non_tensors={"uid": np.array(group_of_row, dtype=object)},
    )
    batch.meta_info["global_token_num"] = attention_mask.sum(-1).tolist()
    scores = [round(rng.uniform(-1, 1), 3) for _ in range(rows)]
    by_group: dict[str, list[int]] = {}
    for row, group in enumerate(group_of_row):
        by_group.setdefault(group, []).append(row)
    groups = sorted(by_group)
    failing = {by_group[groups[0]][i] for i in range(3)}  # groups[0]: one usable sample left -> dropped
    for group in groups[1:5]:
        failing.add(rng.choice(by_group[group]))  # one failure in four more groups
    return batch, scores, failing, group_of_row


def run_masked_step(estimator: str, pipeline: bool, seed: int = 0, merge: bool = False):
    """``merge``: mini-batches found scored already share an update call (a trainer's default); off
    unless asked, so the pipeline cases see one call per mini-batch whatever the timing."""
    batch, scores, failing, group_of_row = generated_batch(seed)
    base = batch.select_idxs(list(range(len(batch))))  # an untouched copy
    config = OmegaConf.create({
        "reward": {"custom_reward_function": {"path": REWARD, "name": "delayed"},
                   "async_agent": {"actor_name": f"mask-{uuid.uuid4().hex}", "failure_policy": "mask",
                                   "min_group_success": 2, "max_failure_rate": 1.0, "extra_keys": [GDPO_KEY]}},
        "actor_rollout_ref": {"rollout": {"n": N}},
        "algorithm": {"adv_estimator": estimator, "gamma": 1.0, "lam": 0.95, "use_kl_in_reward": False,
                      "norm_adv_by_std_in_grpo": True, "gdpo_reward_keys": [GDPO_KEY]},
    })
    use_critic = estimator == "gae"
    # Unmerged pipeline cases split even a batch scored whole by the time it trains (on a loaded
    # machine the 0-4 ms rewards all land first): one update call per mini-batch, not a race.
    strategy = dataclasses.replace(StrategyConfig(pipeline, 0 if pipeline else 1, "completion"),
                                   split_scored_batches=pipeline and not merge)
    plan = plan_mini_batches(strategy, TrainerShape(train_batch_size=PROMPTS, ppo_mini_batch_size=MINI, rollout_n=N,
                                                    use_critic=use_critic, critic_mini_batch_size=MINI, adv_estimator=estimator))
    plan = dataclasses.replace(plan, merge_ready=merge)
    rewards = BatchRewards(settings_from_verl_config(config), tokenizer=None)
    requests = [{"index": r, "solution_str": f"r{r}", "ground_truth": scores[r], "data_source": "t", "uid": group_of_row[r],
                 "extra_info": {"fail": r in failing, "delay": 0.001 * (r % 5)}} for r in range(len(batch))]
    pending = rewards.submit(requests)
    trainer = RecordingTrainer(config)
    ops = V0Ops(trainer, expected_rows=len(batch))
    scheduler = StepScheduler(strategy, plan, rewards, use_critic=use_critic, reduce_lists=lambda d: d)
    metrics = scheduler.train(ops, batch, pending, update_actor=True, timing_raw={})
    return base, scores, failing, group_of_row, trainer, metrics, batch


def without(base: DataProto, scores, keep: list[int]) -> DataProto:
    """The batch in which only ``keep`` were ever generated, scored as verl's loop scores it."""
    data = base.select_idxs(keep)
    lengths = data.batch["response_mask"].sum(-1)
    token_scores = torch.zeros(len(keep), RESPONSE_LEN)
    token_scores[torch.arange(len(keep)), lengths - 1] = torch.tensor([scores[r] for r in keep])
    data.batch["token_level_scores"] = token_scores
    data.batch["token_level_rewards"] = token_scores
    data.non_tensor_batch[GDPO_KEY] = np.array([scores[r] for r in keep], dtype=object)
    return data


def usable_rows(failing, group_of_row):
    usable = {g: sum(1 for r, gg in enumerate(group_of_row) if gg == g and r not in failing) for g in set(group_of_row)}
    return [r for r, g in enumerate(group_of_row) if r not in failing and usable[g] >= 2]


CASES = [(e, False, False) for e in sorted(MASKABLE_ESTIMATORS)] + [(e, True, False) for e in sorted(GROUP_EXACT)]
CASES += [("grpo", True, True)]  # merged update calls: advantages still per mini-batch, the calls fewer


@pytest.mark.parametrize("estimator,pipeline,merge", CASES,
                         ids=[f"{e}-{'pipeline' if p else 'whole'}{'-merged' if m else ''}" for e, p, m in CASES])
def test_the_update_receives_masked_rows_out_of_the_loss_and_the_others_advantages_as_if_they_never_existed(estimator, pipeline,
                                                                                                            merge):
    base, scores, failing, group_of_row, trainer, metrics, batch = run_masked_step(estimator, pipeline, merge=merge)
    keep = usable_rows(failing, group_of_row)
    masked = sorted(set(range(len(base))) - set(keep))
    assert len(masked) == len(failing) + 1  # the failures, and the one survivor of the dropped group
    assert metrics["async_rm/masked_samples"] == len(masked) and metrics["async_rm/dropped_groups"] == 1
    reference = compute_advantage(without(base, scores, keep), adv_estimator=estimator, gamma=1.0, lam=0.95, num_repeat=N,
                                  norm_adv_by_std_in_grpo=True, config=trainer.config.algorithm)
    expected = dict(zip(keep, reference.batch["advantages"]))
    actor_calls = [piece for role, piece in trainer.received if role == "actor"]
    if merge:  # as many calls as runs of mini-batches found scored together: timing decides, never more than 4
        assert 1 <= len(actor_calls) <= PROMPTS // MINI and metrics["async_reward/update_calls"] == len(actor_calls)
        assert sum(len(piece) for piece in actor_calls) == PROMPTS * N
    else:
        assert len(actor_calls) == (PROMPTS // MINI if pipeline else 1)
    trained = 0
    for piece in actor_calls:
        for i in range(len(piece)):
            # identify the row by its (unique) response tokens and prompt
            row = _row_of(base, piece, i)
            if row in expected:
                torch.testing.assert_close(piece.batch["advantages"][i], expected[row], rtol=1e-5, atol=1e-5)
                assert torch.equal(piece.batch["response_mask"][i], base.batch["response_mask"][row])
                trained += 1
            else:
                assert not piece.batch["response_mask"][i].any() and not piece.batch["advantages"][i].any()
                assert not piece.batch["returns"][i].any()
    assert trained == len(keep)  # every usable row trained once (one epoch)
    if estimator == "grpo":  # and GRPO's are the group statistics of the usable samples alone
        for row in keep:
            group = [scores[r] for r in keep if group_of_row[r] == group_of_row[row]]
            oracle = (scores[row] - np.mean(group)) / (np.std(group, ddof=1) + 1e-6)
            assert float(expected[row][0]) == pytest.approx(oracle, rel=1e-4, abs=1e-5)


def _row_of(base: DataProto, piece: DataProto, i: int) -> int:
    match = (base.batch["input_ids"] == piece.batch["input_ids"][i]).all(-1) & (
        base.batch["old_log_probs"] == piece.batch["old_log_probs"][i]).all(-1)
    [row] = match.nonzero().flatten().tolist()
    return row


# -- the loss verl's engine computes on what the update received ------------------------------------


def policy_loss_and_grad(piece: DataProto, loss_agg_mode: str, mini_batch_size: int):
    """verl's ``ppo_loss`` on ``piece`` as its engine worker runs it: the trainer's
    ``left_right_2_no_padding``, the engine's token count from ``loss_mask`` (fsdp
    ``forward_backward_batch``) and ``global_batch_size`` = the mini-batch size (the trainer's
    ``ppo_mini_batch_size x n``); log-probs from a tiny differentiable policy."""
    torch.manual_seed(0)
    logits = torch.randn(VOCAB, requires_grad=True)
    keys = ["input_ids", "attention_mask", "response_mask", "position_ids", "prompts", "responses", "old_log_probs", "advantages"]
    data = left_right_2_no_padding(piece.select(batch_keys=keys).batch.clone())
    tu.assign_non_tensor(data, dp_size=1, batch_num_tokens=data["loss_mask"].sum().item(), global_batch_size=mini_batch_size)
    ids = data["input_ids"]
    log_probs = torch.nested.nested_tensor_from_jagged(torch.log_softmax(logits, -1)[ids.values()] * 1.5, offsets=ids.offsets())
    config = FSDPActorConfig(strategy="fsdp", ppo_mini_batch_size=MINI, ppo_micro_batch_size_per_gpu=8, rollout_n=N,
                             loss_agg_mode=loss_agg_mode)
    loss, _ = ppo_loss(config, {"log_probs": log_probs}, data)
    loss.backward()
    return loss.detach(), logits.grad


def test_the_masked_update_has_the_loss_and_gradient_of_the_batch_without_the_failed_samples():
    base, scores, failing, group_of_row, trainer, _, batch = run_masked_step("grpo", pipeline=False)
    [(_, piece)] = trainer.received
    keep = [i for i in range(len(piece)) if piece.batch["response_mask"][i].any()]
    assert len(keep) == len(usable_rows(failing, group_of_row))
    for mode in ("token-mean", "token-sum"):
        loss, grad = policy_loss_and_grad(piece, mode, len(piece))
        loss_without, grad_without = policy_loss_and_grad(piece.select_idxs(keep), mode, len(piece))
        assert grad.abs().sum() > 0
        torch.testing.assert_close(loss, loss_without)
        torch.testing.assert_close(grad, grad_without)
    # what mask refuses: seq-mean modes divide by a fixed ppo_mini_batch_size x n, masked rows included
    loss, grad = policy_loss_and_grad(piece, "seq-mean-token-mean", len(piece))
    loss_without, _ = policy_loss_and_grad(piece.select_idxs(keep), "seq-mean-token-mean", len(keep))
    assert not torch.allclose(loss, loss_without)
    torch.testing.assert_close(loss * len(piece) / len(keep), loss_without)


def test_a_group_estimator_on_one_survivor_is_why_min_group_success_is_at_least_two():
    """verl's GRPO gives a group of one its raw score as advantage, not zero: hence the refusal of
    min_group_success=1 with group estimators (NO_GROUP_BASELINE are exempt)."""
    data = without(generated_batch(1)[0], [0.7] * PROMPTS * N, [0])
    out = compute_advantage(data, adv_estimator="grpo", num_repeat=N, config=OmegaConf.create({}))
    assert float(out.batch["advantages"][0, 0]) == pytest.approx(0.7)
    assert "grpo" not in NO_GROUP_BASELINE and BATCH_STATISTIC & NO_GROUP_BASELINE == NO_GROUP_BASELINE


# -- refused at start where it cannot be exact -------------------------------------------------------


def test_the_per_sample_manager_refuses_mask_without_a_strategy_and_main_ppo_refuses_it_first():
    """verl's own entry point with async_agent and no strategy: the manager refuses mask when it is
    built (at start, in the reward workers); with a strategy on (v0 validates through it) it is built."""
    from hydra import compose, initialize_config_module

    from verl_async_rm.integration.reward_manager import AsyncAgentRewardManager
    from verl_async_rm.main_ppo import CONFIG_NAME
    from tests.helpers.harness import prepared

    config = OmegaConf.create({
        "reward": {"custom_reward_function": {"path": REWARD, "name": "delayed"},
                   "async_agent": {"actor_name": f"mask-{uuid.uuid4().hex}", "failure_policy": "mask"}},
        "actor_rollout_ref": {"rollout": {"n": N}},
    })
    with pytest.raises(ValueError, match="needs the trainer strategies"):
        AsyncAgentRewardManager(config, tokenizer=object())
    config.mini_batch_pipeline = True
    AsyncAgentRewardManager(config, tokenizer=object())
    overrides = ["reward.reward_manager.name=async_agent", "actor_rollout_ref.rollout.n=4",
                 "reward.async_agent.failure_policy=mask"]
    with initialize_config_module("verl_async_rm.hydra_conf", version_base=None):
        with pytest.raises(ValueError, match="needs the trainer strategies"):
            prepared(compose(CONFIG_NAME, overrides=overrides))
        with pytest.raises(ValueError, match="still count the masked samples"):
            prepared(compose(CONFIG_NAME, overrides=[*overrides, "off_policy_steps=1",
                                                    "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-mean"]))
        assert prepared(compose(CONFIG_NAME, overrides=[*overrides, "off_policy_steps=1"])).reward.async_agent.failure_policy == "mask"


def test_verls_engines_count_a_mini_batchs_tokens_from_the_loss_mask_we_zero():
    """The token count ``token-mean`` divides by is the engine's sum of ``loss_mask`` over the
    mini-batch (all data-parallel ranks): why zeroing a sample's mask takes it out of the
    denominator too (v0: ``left_right_2_no_padding`` makes ``loss_mask`` the ``response_mask``; v1:
    TransferQueue keeps its own ``loss_mask``, which the strategies zero as well)."""
    import inspect

    from verl.workers.engine.fsdp.transformer_impl import FSDPEngine

    source = inspect.getsource(FSDPEngine.forward_backward_batch)
    assert 'batch_num_tokens = data["loss_mask"].sum()' in source
    assert 'data["loss_mask"] = data["response_mask"]' in inspect.getsource(left_right_2_no_padding)
