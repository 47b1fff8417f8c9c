"""The training commands the README and the guide show, as written: each composes on its entry point,
passes the start-time checks (the judge class is built), and the README's judge command's reward then
scores through a real judge server (only its ``base_url`` replaced by the test server's)."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys

import pytest
from hydra import compose, initialize_config_module

from tests.conftest import ROOT

FENCE = re.compile(r"```bash\n(.*?)```", re.S)
# The pages that show training commands, in reading order: the README's quick start, then the guide's.
PAGES = (ROOT / "README.md", ROOT / "docs" / "guide" / "verl.md", ROOT / "docs" / "guide" / "strategies.md")


def readme_commands(module: str, pages=PAGES) -> list[list[str]]:
    """Every command line of these pages that runs ``python -m <module>``, as its hydra overrides."""
    commands = []
    for block in (block for page in pages for block in FENCE.findall(page.read_text())):
        text = block.replace("\\\n", " ")
        for line in text.splitlines():
            words = shlex.split(line, comments=True)
            if words[:3] == ["python", "-m", module]:
                commands.append([w for w in words[3:] if w != "..."])
    return commands


@pytest.mark.local
def test_the_readme_shows_verls_entry_point_and_the_guide_ours():
    assert len(readme_commands("verl.trainer.main_ppo", [ROOT / "README.md"])) == 1
    assert len(readme_commands("verl_async_rm.main_ppo")) == 3  # the async_agent manager, the strategies, mask


@pytest.mark.local
def test_stock_entry_point_command_runs_as_written(tmp_path, monkeypatch):
    """verl's own main_ppo with the README's overrides (tests/helpers/stock_main_probe.py), then its reward
    scores a sample against a live OpenAI-compatible judge."""
    from verl_async_rm import RewardAgent
    from verl_async_rm.integration.settings import settings_from_verl_config
    from verl_async_rm_rig.judge_server import JudgeServer, JudgeServerConfig

    (overrides,) = readme_commands("verl.trainer.main_ppo", [ROOT / "README.md"])
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JUDGE_", "OPENAI_"))}  # as written, no env
    env["PYTHONPATH"] = str(ROOT)
    result = subprocess.run([sys.executable, "-m", "tests.helpers.stock_main_probe", json.dumps([overrides])],
                            capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)
    (run,) = json.loads(next(line for line in result.stdout.splitlines() if line.startswith("PROBE"))[5:])
    assert run["exit"] == 0, run["stderr"]
    config = run["config"]
    assert config["reward"]["reward_manager"]["name"] == "async_agent"
    assert config["reward"]["custom_reward_function"]["name"] == "JudgeReward"
    assert config["reward"]["async_agent"] == {"max_concurrency": 64, "requests_per_minute": 3000}

    from omegaconf import OmegaConf

    for var in ("JUDGE_API_KEY", "OPENAI_API_KEY", "JUDGE_MODEL", "JUDGE_BASE_URL", "OPENAI_BASE_URL"):
        monkeypatch.delenv(var, raising=False)
    settings = settings_from_verl_config(OmegaConf.create(config))
    with JudgeServer(JudgeServerConfig(latency=0.01)) as server:
        kwargs = {**settings.reward.kwargs, "base_url": server.base_url}
        with RewardAgent.from_file(settings.reward.path, settings.reward.name, settings.agent,
                                   reward_kwargs=kwargs) as agent:
            chunk = agent.get_all(agent.submit([{"solution_str": "so #### 18", "ground_truth": "18"},
                                                {"solution_str": "so #### 17", "ground_truth": "18"}]))
        assert server.stats().requests == 2
    assert chunk.scores == [1.0, 0.0] and chunk.extra_info["reward_failed"] == [0, 0]


@pytest.mark.local
def test_our_entry_point_commands_compose_and_pass_the_start_checks():
    from verl_async_rm.main_ppo import CONFIG_NAME, accept_recipe_spellings
    from tests.helpers.harness import prepared

    configs = []
    for overrides in readme_commands("verl_async_rm.main_ppo"):
        with initialize_config_module("verl_async_rm.hydra_conf", version_base=None):
            configs.append(prepared(compose(CONFIG_NAME, overrides=accept_recipe_spellings(overrides))))
    in_verl, strategies, masked = configs
    assert masked.mini_batch_pipeline and masked.reward.async_agent.failure_policy == "mask"
    assert masked.reward.async_agent.min_group_success == 2
    assert in_verl.reward.reward_manager.name == "async_agent" and in_verl.reward.async_agent.max_concurrency == 64
    assert strategies.mini_batch_pipeline and strategies.off_policy_steps == 1
    assert strategies.reward.custom_reward_function.reward_kwargs.model == "judge"
