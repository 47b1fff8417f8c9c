"""async_agent inside real verl 0.9.1: registries, RewardLoopWorker, global limits, legacy call, selectors."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid

import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_module
from tensordict import TensorDict

from tests.conftest import REWARDS, ROOT
from verl import DataProto

GSM8K_REWARD = str(ROOT / "verl_async_rm" / "user_rewards" / "gsm8k.py")


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory):
    from verl_async_rm_rig.cpu_backend.tiny_model import build_tokenizer

    out = tmp_path_factory.mktemp("tokenizer")
    build_tokenizer(str(out))
    return str(out)


@pytest.fixture(scope="session")
def tokenizer(tokenizer_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tokenizer_dir)


def verl_config(tokenizer_dir, *overrides, config_module="verl.trainer.config", name="ppo_trainer"):
    with initialize_config_module(config_module, version_base=None):
        return compose(name, overrides=[f"actor_rollout_ref.model.path={tokenizer_dir}", *overrides])


def make_batch(tokenizer, responses, truths, uids, data_source="openai/gsm8k", prompt="Q: how many?"):
    """A DataProto as verl's rollout hands it over: left-padded prompts, right-padded responses."""
    prompt_ids = tokenizer(prompt)["input_ids"]
    encoded = [tokenizer(r)["input_ids"] for r in responses]
    width = max(map(len, encoded)) + 2  # padding, so valid lengths come from the mask
    pad = tokenizer.pad_token_id or 0
    resp = torch.full((len(responses), width), pad, dtype=torch.long)
    mask = torch.zeros((len(responses), len(prompt_ids) + width), dtype=torch.long)
    for i, ids in enumerate(encoded):
        resp[i, : len(ids)] = torch.tensor(ids)
        mask[i, : len(prompt_ids) + len(ids)] = 1
    prompts = torch.tensor([prompt_ids] * len(responses))
    batch = TensorDict(
        {"prompts": prompts, "responses": resp, "attention_mask": mask, "input_ids": torch.cat([prompts, resp], 1)},
        batch_size=len(responses),
    )
    non_tensor = {
        "data_source": np.array([data_source] * len(responses), dtype=object),
        "reward_model": np.array([{"ground_truth": t} for t in truths], dtype=object),
        "uid": np.array(uids, dtype=object),
        "extra_info": np.array([{"index": i} for i in range(len(responses))], dtype=object),
    }
    return DataProto(batch=batch, non_tensor_batch=non_tensor), [len(ids) for ids in encoded]


def gsm8k_samples(path, problems=6):
    rows = [json.loads(line) for line in open(path)][:problems]
    responses, truths, uids = [], [], []
    for p, row in enumerate(rows):
        truth = row["answer"].split("####")[-1].strip()
        wrong = row["answer"].rsplit("####", 1)[0] + f"#### {int(truth.replace(',', '')) + 1}"
        for response in (row["answer"], wrong, row["answer"], wrong):
            responses.append(response)
            truths.append(truth)
            uids.append(f"p{p}")
    return responses, truths, uids


@pytest.mark.local
def test_registered_in_both_registries_by_the_entry_point_alone():
    code = (
        "from verl.experimental.reward_loop.reward_manager import get_reward_manager_cls as new\n"
        "from verl.workers.reward_manager import get_reward_manager_cls as old\n"
        "print(new('async_agent').__module__, old('async_agent') is new('async_agent'))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["verl_async_rm.integration.reward_manager", "True"]


@pytest.mark.ray
def test_registered_inside_a_ray_worker(ray_session):
    ray = ray_session

    @ray.remote
    def resolve():
        from verl.experimental.reward_loop.reward_manager import get_reward_manager_cls

        return get_reward_manager_cls("async_agent").__name__

    assert ray.get(resolve.remote()) == "AsyncAgentRewardManager"


@pytest.mark.ray
def test_reward_loop_worker_scores_equal_naive(ray_session, tokenizer, tokenizer_dir, gsm8k_path):
    from verl.experimental.reward_loop import RewardLoopWorker

    ray = ray_session
    responses, truths, uids = gsm8k_samples(gsm8k_path)
    data, _ = make_batch(tokenizer, responses, truths, uids)
    common = [f"reward.custom_reward_function.path={GSM8K_REWARD}", "actor_rollout_ref.rollout.n=4"]
    scores = {}
    for manager in ("naive", "async_agent"):
        extra = [f"+reward.async_agent.actor_name=agent-{uuid.uuid4().hex[:6]}"] if manager == "async_agent" else []
        config = verl_config(tokenizer_dir, *common, f"reward.reward_manager.name={manager}", *extra)
        worker = ray.remote(RewardLoopWorker).remote(config)
        outputs = ray.get(worker.compute_score_batch.remote(data))
        scores[manager] = [o["reward_score"] for o in outputs]
        if manager == "async_agent":
            assert {o["reward_extra_info"]["reward_failed"] for o in outputs} == {0}
            assert len({tuple(o["reward_extra_info"]) for o in outputs}) == 1  # same keys for every sample
        ray.kill(worker)
    assert scores["naive"] == scores["async_agent"] == [1.0, 0.0, 1.0, 0.0] * 6


@pytest.mark.ray
def test_global_cap_across_reward_workers_and_one_hook_per_group(ray_session, tokenizer, tokenizer_dir, tmp_path):
    from verl.experimental.reward_loop import RewardLoopManager

    from verl_async_rm_rig.judge_server import JudgeServer, JudgeServerConfig

    ray = ray_session
    groups, n = 16, 4
    responses = [f"#### {g}" if k % 2 == 0 else f"#### {g + 1}" for g in range(groups) for k in range(n)]
    # uid by position modulo the group count: every group is spread over all four reward workers
    uids = [f"u{i % groups}" for i in range(groups * n)]
    truths = [str(int(u[1:])) for u in uids]
    responses = [f"#### {t}" if (i // groups) % 2 == 0 else f"#### {int(t) + 1}" for i, t in enumerate(truths)]
    data, _ = make_batch(tokenizer, responses, truths, uids)
    hook_log = tmp_path / "hooks.txt"
    with JudgeServer(JudgeServerConfig(latency=0.2)) as server:
        kwargs = {"hook_log": str(hook_log), "base_url": server.base_url, "api_key": "k", "model": "m"}
        config = verl_config(
            tokenizer_dir,
            f"reward.custom_reward_function.path={REWARDS / 'counting_judge.py'}",
            "reward.custom_reward_function.name=CountingJudge",
            *[f"+reward.custom_reward_function.reward_kwargs.{k}='{v}'" for k, v in kwargs.items()],
            "reward.reward_manager.name=async_agent",
            "reward.num_workers=4",
            f"actor_rollout_ref.rollout.n={n}",
            "+reward.async_agent.max_concurrency=8",
            f"+reward.async_agent.actor_name=agent-{uuid.uuid4().hex[:6]}",
        )
        manager = RewardLoopManager(config)
        try:
            out = manager.compute_rm_score(data)
        finally:
            for worker in manager.reward_loop_workers:
                ray.kill(worker)
        stats = server.stats()
    assert stats.peak_in_flight == 8  # the cap holds for the four workers together, and is reached
    assert stats.requests == groups * n
    lines = hook_log.read_text().splitlines()
    assert len(lines) == groups and all(len(line.split()) == n for line in lines)  # once per whole group
    scores = out.batch["rm_scores"].sum(-1).tolist()
    assert scores == [1.0 if (i // groups) % 2 == 0 else 0.0 for i in range(groups * n)]


@pytest.mark.ray
def test_legacy_call_returns_token_level_tensor_and_aligned_extra_info(tokenizer, tokenizer_dir):
    from verl_async_rm.integration.reward_manager import AsyncAgentRewardManager

    responses = ["#### 3", "the answer is 4", "#### 5", "nothing"]
    data, lengths = make_batch(tokenizer, responses, ["3", "3", "5", "5"], ["a", "a", "b", "b"])
    config = verl_config(
        tokenizer_dir,
        f"reward.custom_reward_function.path={REWARDS / 'examples.py'}",
        "reward.custom_reward_function.name=async_plain",
        f"+reward.async_agent.actor_name=agent-{uuid.uuid4().hex[:6]}",
    )
    manager = AsyncAgentRewardManager(config, tokenizer, None)
    # async_plain scores solution == ground truth exactly; rewrite truths to the decoded responses
    decoded = tokenizer.batch_decode([data.batch["responses"][i, :n] for i, n in enumerate(lengths)], skip_special_tokens=True)
    data.non_tensor_batch["reward_model"] = np.array(
        [{"ground_truth": d if i % 2 == 0 else "no"} for i, d in enumerate(decoded)], dtype=object
    )
    result = manager(data, return_dict=True)
    tensor = result["reward_tensor"]
    assert tensor.shape == data.batch["responses"].shape and tensor.dtype == torch.float32
    expected = torch.zeros_like(tensor)
    for i, n in enumerate(lengths):
        expected[i, n - 1] = 1.0 if i % 2 == 0 else 0.0
    assert torch.equal(tensor, expected)  # score on the last valid token, zeros elsewhere
    extra = result["reward_extra_info"]
    assert extra["judge"] == ["async"] * 4 and extra["reward_failed"] == [0, 0, 0, 0]
    assert torch.equal(manager(data), tensor)


@pytest.mark.local
def test_both_selectors_resolve_to_async_agent(tokenizer, tokenizer_dir):
    from verl.trainer.ppo.reward import load_reward_manager

    from verl_async_rm.integration.reward_manager import AsyncAgentRewardManager
    from tests.helpers.harness import prepared

    reward = f"reward.custom_reward_function.path={GSM8K_REWARD}"
    name = f"agent-{uuid.uuid4().hex[:6]}"
    stock = verl_config(tokenizer_dir, reward, "reward.reward_manager.name=async_agent", f"+reward.async_agent.actor_name={name}")
    assert isinstance(load_reward_manager(stock, tokenizer), AsyncAgentRewardManager)
    ours = verl_config(
        tokenizer_dir, reward, "reward_model.reward_manager.name=async_agent", f"reward.async_agent.actor_name={name}",
        "reward.async_agent.max_concurrency=16", config_module="verl_async_rm.hydra_conf", name="async_ppo_trainer",
    )
    ours = prepared(ours)
    assert ours.reward.reward_manager.name == "async_agent" and ours.reward_model.reward_manager is None
    manager = load_reward_manager(ours, tokenizer)
    assert isinstance(manager, AsyncAgentRewardManager) and manager.settings.agent.max_concurrency == 16
    with pytest.raises(Exception, match="reward_manager"):  # why ours exists: verl's config refuses the old spelling
        verl_config(tokenizer_dir, "reward_model.reward_manager.name=async_agent")


@pytest.mark.local
def test_bad_settings_fail_at_start(tokenizer_dir):
    from tests.helpers.harness import prepared

    def ours(*overrides):
        return verl_config(tokenizer_dir, "reward_model.reward_manager.name=async_agent", *overrides,
                           config_module="verl_async_rm.hydra_conf", name="async_ppo_trainer")

    with pytest.raises(ValueError, match="reward.async_agent: .*max_concurrency"):
        prepared(ours("reward.async_agent.max_concurrency=-2"))
    with pytest.raises(ValueError, match="group_size"):
        prepared(ours("reward.async_agent.group_size=0"))
    with pytest.raises(FileNotFoundError, match="reward file not found"):
        prepared(ours("reward.custom_reward_function.path=/nope.py"))
    with pytest.raises(ValueError, match="max_concurency"):
        prepared(ours("+reward.async_agent.max_concurency=3"))


@pytest.mark.local
def test_strategy_flags_in_both_spellings_and_their_checks(tokenizer_dir):
    from verl_async_rm.main_ppo import AGENT_LOOP_CLASS, V1_MODE, accept_recipe_spellings
    from tests.helpers.harness import prepared

    argv = ["+mini_batch_pipeline=True", "+update_pipeline=True", "+off_policy_steps=1", "+foo.bar=1", "trainer.x=1"]
    assert accept_recipe_spellings(argv) == [
        "mini_batch_pipeline=True", "update_pipeline=True", "off_policy_steps=1", "+foo.bar=1", "trainer.x=1",
    ]

    def ours(*overrides):
        reward = f"reward.custom_reward_function.path={GSM8K_REWARD}"
        return prepared(verl_config(tokenizer_dir, reward, *accept_recipe_spellings(list(overrides)),
                                   config_module="verl_async_rm.hydra_conf", name="async_ppo_trainer"))

    assert ours("+update_pipeline=True").trainer.v1.trainer_mode == V1_MODE  # v1 is verl's default trainer
    v0 = ours("+mini_batch_pipeline=True", "trainer.use_v1=False")
    assert v0.actor_rollout_ref.rollout.agent.agent_loop_manager_class == AGENT_LOOP_CLASS
    stock = ours()
    assert stock.trainer.v1.trainer_mode == "sync" and not stock.actor_rollout_ref.rollout.agent.get("agent_loop_manager_class")
    with pytest.raises(ValueError, match="prefetches one batch at most"):
        ours("off_policy_steps=2")
    with pytest.raises(ValueError, match="conflicts"):
        ours("off_policy_steps=1", "trainer.v1.trainer_mode=colocate_async")
    with pytest.raises(ValueError, match="contradicts"):
        ours("mini_batch_pipeline=true", "+update_pipeline=False")


@pytest.mark.local
def test_strategies_off_hand_verl_its_own_config(tokenizer_dir):
    """Both flags off, main_ppo passes verl's main exactly the config verl's own entry point composes
    (plus this package's keys, which verl never reads): the stock trainer, same seed, same run."""
    from omegaconf import OmegaConf

    from tests.helpers.harness import prepared

    overrides = [f"reward.custom_reward_function.path={GSM8K_REWARD}", "trainer.use_v1=False", "data.seed=3"]
    ours = OmegaConf.to_container(prepared(verl_config(tokenizer_dir, *overrides, config_module="verl_async_rm.hydra_conf",
                                                      name="async_ppo_trainer")))
    stock = OmegaConf.to_container(verl_config(tokenizer_dir, *overrides))
    for key in ("mini_batch_pipeline", "update_pipeline", "off_policy_steps", "mini_batch_order", "stream_rewards",
                "max_staleness", "on_stale"):
        ours.pop(key)
    assert ours["reward"].pop("async_agent")["group_wait"] == 10.0
    assert ours == stock


@pytest.mark.local
@pytest.mark.parametrize("first", ["verl_async_rm.strategies.v1", "verl.trainer.ppo.v1"])
def test_v1_mode_registered_whichever_module_is_imported_first(first):
    code = f"import {first}\nfrom verl.trainer.ppo.v1 import get_trainer_cls\nprint(get_trainer_cls('async_reward').__name__)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split()[-1] == "AsyncRewardTrainer"
