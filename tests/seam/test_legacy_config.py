"""verl's legacy reward keys: moved to ``reward.*`` on both entry points, never silently ignored.

verl 0.9.1's stock ``main_ppo`` composes ``reward_model.reward_manager``/``custom_reward_function``
and then ignores them; with this package installed, a run that selects ``async_agent`` gets them
moved (hydra plugin + callback, ``integration/stock_entry.py``), and any other run is untouched.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf

from tests.conftest import REWARDS, ROOT
from verl_async_rm.integration.group_sizes import V1_CLASS
from verl_async_rm.integration.legacy_config import (
    exact_spelling,
    legacy_selector,
    migrate_legacy_reward_config,
    selects_async_agent,
)

pytestmark = pytest.mark.local

LEGACY_BLOCK = [
    "custom_reward_function.path=/r/judge.py",
    "custom_reward_function.name=Judge",
    "+custom_reward_function.reward_kwargs.model=m",
    "reward_model.num_workers=3",
    "+reward_model.reward_kwargs.overlong=1",
    "reward_model.enable=true",
    "reward_model.model.path=/models/rm",
    "reward_model.rollout.name=vllm",
    "reward_model.rollout.tensor_model_parallel_size=4",
    "sandbox_fusion.url=http://127.0.0.1:9",
]


def leaves(tree: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            out.update(leaves(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def stock_config(*overrides):
    with initialize_config_module("verl.trainer.config", version_base=None):
        return compose("ppo_trainer", overrides=list(overrides))


def ours_config(*overrides):
    from verl_async_rm.main_ppo import CONFIG_NAME, accept_recipe_spellings

    with initialize_config_module("verl_async_rm.hydra_conf", version_base=None):
        return compose(CONFIG_NAME, overrides=accept_recipe_spellings(list(overrides)))


SELECTORS = ["reward_model.reward_manager=async_agent", "+reward_model.reward_manager.name=async_agent"]


@pytest.mark.parametrize("selector", SELECTORS)
def test_the_whole_legacy_block_moves_to_reward(selector):
    config = stock_config(selector, *LEGACY_BLOCK)
    assert legacy_selector(config) == "async_agent" and selects_async_agent(config)
    moved = migrate_legacy_reward_config(config)
    assert "reward_model.reward_manager -> reward.reward_manager.name" in moved and len(moved) == len(LEGACY_BLOCK) + 1
    reward = OmegaConf.to_container(config.reward)
    assert reward["reward_manager"]["name"] == "async_agent"
    assert reward["custom_reward_function"] == {"path": "/r/judge.py", "name": "Judge", "reward_kwargs": {"model": "m"}}
    assert reward["num_workers"] == 3 and reward["reward_kwargs"] == {"overlong": 1}
    assert reward["reward_model"]["model_path"] == "/models/rm" and reward["reward_model"]["rollout"]["name"] == "vllm"
    assert reward["sandbox_fusion"]["url"] == "http://127.0.0.1:9"
    # the legacy keys are emptied, in verl's shape (a string slot for the selector)
    assert config.reward_model.reward_manager is None and config.custom_reward_function.path is None
    assert legacy_selector(config) is None and migrate_legacy_reward_config(config) == []  # idempotent


@pytest.mark.parametrize("selector", SELECTORS)
def test_the_migration_sets_what_verls_own_migration_sets(selector):
    """verl's ``migrate_legacy_reward_impl`` sets the same values; it replaces custom_reward_function
    and sandbox_fusion wholesale (dropping their other defaults to None), where ours merges key by key."""
    from verl.experimental.reward_loop import migrate_legacy_reward_impl

    ours = stock_config(selector, *LEGACY_BLOCK)
    migrate_legacy_reward_config(ours)
    verl_side = stock_config("reward_model.reward_manager=async_agent", *LEGACY_BLOCK)
    migrate_legacy_reward_impl(verl_side)
    verl_values = {k: v for k, v in leaves(OmegaConf.to_container(verl_side.reward)).items() if v is not None}
    our_values = leaves(OmegaConf.to_container(ours.reward))
    assert {k: our_values.get(k) for k in verl_values} == verl_values


def test_a_legacy_path_without_name_keeps_the_default_name():
    config = stock_config("reward_model.reward_manager=async_agent", "custom_reward_function.path=/r/x.py")
    migrate_legacy_reward_config(config)
    assert OmegaConf.to_container(config.reward.custom_reward_function) == {"path": "/r/x.py", "name": "compute_score"}


def test_the_printed_spelling_composes_to_the_same_reward_config():
    """The spelling a refusal prints is the real thing: composed, it gives what the migration gives."""
    legacy = stock_config("reward_model.reward_manager=async_agent", *LEGACY_BLOCK)
    spelling = exact_spelling(legacy).split()
    assert spelling[0] == "reward.reward_manager.name=async_agent"
    migrated = copy.deepcopy(legacy)
    migrate_legacy_reward_config(migrated)
    assert OmegaConf.to_container(stock_config(*spelling).reward) == OmegaConf.to_container(migrated.reward)


def run_stock_main(cases: list[list[str]], tmp_path, without_plugin: bool = False) -> list[dict]:
    """verl's stock main_ppo in a fresh process (tests/helpers/stock_main_probe.py), one result per case."""
    cmd = [sys.executable, "-m", "tests.helpers.stock_main_probe", json.dumps(cases)] + (["--without-plugin"] if without_plugin else [])
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)
    lines = [line for line in result.stdout.splitlines() if line.startswith("PROBE")]
    assert result.returncode == 0 and lines, result.stderr[-3000:]
    return json.loads(lines[-1][len("PROBE"):])


EXAMPLES = str(REWARDS / "examples.py")
LEGACY_REWARD = [f"custom_reward_function.path={EXAMPLES}", "custom_reward_function.name=plain"]
CASES = {
    "string": ["reward_model.reward_manager=async_agent", *LEGACY_REWARD],
    "plus_name": ["+reward_model.reward_manager.name=async_agent", *LEGACY_REWARD],
    "current_selector_legacy_reward": ["reward.reward_manager.name=async_agent", *LEGACY_REWARD],
    "megatron_config": ["--config-name=ppo_megatron_trainer", "reward_model.reward_manager=async_agent", *LEGACY_REWARD],
    "name_without_plus": ["reward_model.reward_manager.name=async_agent"],
    "multirun": ["-m", "reward_model.reward_manager=async_agent", f"custom_reward_function.path={EXAMPLES}",
                 "hydra.sweep.dir=."],
    "bad_reward_kwargs": ["reward_model.reward_manager=async_agent", *LEGACY_REWARD,
                          "+custom_reward_function.reward_kwargs.bonnus=1"],
    "judge_without_model": ["reward.reward_manager.name=async_agent",
                            "reward.custom_reward_function.path=pkg://verl_async_rm.user_rewards.llm_judge",
                            "reward.custom_reward_function.name=JudgeReward"],
    "other_manager": ["reward_model.reward_manager=batch", f"custom_reward_function.path={EXAMPLES}"],
    "plain": ["data.train_batch_size=32"],
}


@pytest.fixture(scope="module")
def stock_runs(tmp_path_factory):
    names = list(CASES)
    cases = [CASES[n] for n in names]
    # two independent processes (each its own cwd): side by side, each mostly importing verl
    with ThreadPoolExecutor(2) as pool:
        with_us = pool.submit(run_stock_main, cases, tmp_path_factory.mktemp("with"))
        without_us = pool.submit(run_stock_main, cases, tmp_path_factory.mktemp("without"), without_plugin=True)
        return dict(zip(names, with_us.result())), dict(zip(names, without_us.result()))


@pytest.mark.parametrize("case", ["string", "plus_name", "current_selector_legacy_reward", "megatron_config"])
def test_stock_main_ppo_runs_async_agent_with_the_legacy_reward(case, stock_runs):
    ours, stock = stock_runs
    run = ours[case]
    assert run["exit"] == 0, run["stderr"]
    reward = run["config"]["reward"]
    assert reward["reward_manager"]["name"] == "async_agent"
    assert reward["custom_reward_function"] == {"path": EXAMPLES, "name": "plain"}
    assert "legacy reward config moved" in run["stderr"]
    # exact groups on verl's per-sample path, as through our entry point (integration/group_sizes.py)
    assert run["config"]["actor_rollout_ref"]["rollout"]["agent"]["agent_loop_manager_class"] == V1_CLASS
    assert not stock[case]["config"]["actor_rollout_ref"]["rollout"]["agent"].get("agent_loop_manager_class")
    # without us, verl ran its naive manager with its default reward: the silent failure fixed here
    if case != "current_selector_legacy_reward":
        assert stock[case]["config"]["reward"]["reward_manager"]["name"] == "naive"
    assert stock[case]["config"]["reward"]["custom_reward_function"]["path"] is None


def test_stock_main_ppo_names_the_spelling_where_it_cannot_honour_the_legacy_keys(stock_runs):
    ours, _ = stock_runs
    # hydra refuses a key verl's legacy schema does not have, and names the spelling that works (above)
    assert ours["name_without_plus"]["exit"] == 1 and ours["name_without_plus"]["config"] is None
    assert "+reward_model.reward_manager.name=async_agent" in ours["name_without_plus"]["stderr"]
    # multirun composes every job anew, out of the callback's reach: refused at start, never naive
    multirun = ours["multirun"]
    assert multirun["exit"] == 1 and multirun["config"] is None
    assert f"Use: reward.reward_manager.name=async_agent reward.custom_reward_function.path={EXAMPLES}" in multirun["stderr"]


@pytest.mark.parametrize(
    "case, match",
    [("bad_reward_kwargs", r"examples.py:plain cannot be called .*'bonnus'"),
     ("judge_without_model", r"cannot instantiate verl_async_rm.user_rewards.llm_judge:JudgeReward .*needs .*model")],
)
def test_stock_main_ppo_checks_the_reward_at_start(case, match, stock_runs):
    """Before any Ray worker: a wrong reward kwarg, or a class whose constructor refuses its config."""
    import re

    run = stock_runs[0][case]
    assert run["exit"] == 1 and run["config"] is None
    assert "async_agent cannot start" in run["stderr"] and re.search(match, run["stderr"]), run["stderr"]


@pytest.mark.parametrize("case", ["other_manager", "plain"])
def test_stock_main_ppo_is_untouched_when_async_agent_is_not_selected(case, stock_runs):
    ours, stock = stock_runs
    assert ours[case]["exit"] == stock[case]["exit"] == 0, ours[case]["stderr"]
    assert ours[case]["config"] == stock[case]["config"]  # key for key what verl composes without us
    assert "verl_async_rm" not in ours[case]["stderr"]


def test_our_entry_point_takes_plus_spellings_and_migrates_the_whole_legacy_block():
    from verl_async_rm.main_ppo import prepare

    gsm8k = ROOT / "verl_async_rm" / "user_rewards" / "gsm8k.py"
    config = ours_config(
        "reward_model.reward_manager=async_agent", f"custom_reward_function.path={gsm8k}",
        "custom_reward_function.name=compute_score", "+custom_reward_function.reward_kwargs.latency_hi=0",
        "+reward.async_agent.max_concurrency=64", "reward.async_agent.max_attempts=5", "+mini_batch_pipeline=false",
    )
    settings = prepare(config)
    assert settings.agent.agent.max_concurrency == 64 and settings.agent.reward.kwargs == {"latency_hi": 0}
    assert config.reward.reward_manager.name == "async_agent"
    assert config.reward.custom_reward_function.name == "compute_score"
    assert config.reward.custom_reward_function.reward_kwargs == {"latency_hi": 0}
    assert config.reward.async_agent.max_concurrency == 64 and config.reward.async_agent.max_attempts == 5
    assert config.reward_model.reward_manager is None and config.custom_reward_function.path is None
    # every spelling of the selector composes on ours
    for selector in ("reward_model.reward_manager.name=async_agent", "+reward_model.reward_manager.name=async_agent",
                     "reward_model.reward_manager=async_agent"):
        config = ours_config(selector)
        assert prepare(config).reward_manager == "async_agent" == config.reward.reward_manager.name
    # a misspelt setting keeps its '+' and is refused by the settings check, by name
    with pytest.raises(ValueError, match="max_concurency"):
        prepare(ours_config("reward.reward_manager.name=async_agent", "+reward.async_agent.max_concurency=3"))


@pytest.mark.parametrize(
    "main, ours_added",
    [("pkg://verl.trainer/config", True), ("pkg://verl.trainer.config", True), ("pkg://my_app.conf", False),
     ("file:///tmp/my_configs", False)],
)
def test_the_search_path_plugin_acts_on_verls_config_directory_only(main, ours_added):
    from hydra._internal.config_search_path_impl import ConfigSearchPathImpl

    from verl_async_rm.integration.stock_entry import VerlConfigSearchPath

    search_path = ConfigSearchPathImpl()
    search_path.append("hydra", "pkg://hydra.conf")
    search_path.append("main", main)
    VerlConfigSearchPath().manipulate_search_path(search_path)
    entries = [(e.provider, e.path) for e in search_path.get_path()]
    if ours_added:  # just before verl's directory: it shadows verl's legacy_reward_impl and nothing else
        assert entries == [("hydra", "pkg://hydra.conf"), ("verl-async-rm", "verl-async-rm-legacy://verl"), ("main", main)]
    else:
        assert entries == [("hydra", "pkg://hydra.conf"), ("main", main)]


def test_the_search_path_plugin_stays_out_on_an_unsupported_verl(monkeypatch):
    from hydra._internal.config_search_path_impl import ConfigSearchPathImpl

    from verl_async_rm import verl_compat
    from verl_async_rm.integration.stock_entry import VerlConfigSearchPath

    monkeypatch.setattr(verl_compat, "SUPPORTED_VERL", ("0.10", "0.11"))
    search_path = ConfigSearchPathImpl()
    search_path.append("main", "pkg://verl.trainer/config")
    VerlConfigSearchPath().manipulate_search_path(search_path)
    assert [(e.provider, e.path) for e in search_path.get_path()] == [("main", "pkg://verl.trainer/config")]
