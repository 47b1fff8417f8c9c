"""The built wheels, installed NON-editable into a fresh virtual environment and used from outside the
repository (from a folder holding a user's own ``hydra_conf/`` and ``user_rewards/``, which must not
shadow ours): the CLI, the registration in verl's registries, both entry points' configs; the product's
wheel holds none of the rig, which comes only with its extra.

The fresh environment is installed the way the README installs into an existing verl environment:
``pip install verl-async-rm -c <the environment's own pins>``, so no installed version changes.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import yaml

from tests.conftest import HELPERS, ROOT

pytestmark = [pytest.mark.local, pytest.mark.slow]


def sh(*cmd, cwd=None, timeout=900, env=None) -> subprocess.CompletedProcess:
    result = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, cwd=cwd, timeout=timeout,
                            env=env)
    assert result.returncode == 0, f"{' '.join(map(str, cmd))}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> Path:
    """The product's wheel and the rig's, built from a clean copy (setuptools' build/ folder in a working
    tree keeps files since removed)."""
    source = tmp_path_factory.mktemp("source") / "verl-async-rm"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(
        ".git", ".venv", "build", "dist", "*.egg-info", "outputs", "checkpoints", "__pycache__", ".pytest_cache",
        ".hypothesis"))
    dist = tmp_path_factory.mktemp("dist")
    for project in (source, source / "rig"):
        sh(sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "--wheel-dir", dist, project)
    return dist


@pytest.fixture(scope="module")
def wheel(dist) -> Path:
    (built,) = dist.glob("verl_async_rm-*.whl")
    return built


@pytest.fixture(scope="module")
def env_root(wheel, tmp_path_factory) -> Path:
    """A fresh venv with the product's wheel alone (a GPU user's install) and its dependencies, pinned to
    this environment's versions."""
    root = tmp_path_factory.mktemp("venv")
    # the README's recipe for an existing verl environment: pin everything installed, install against it
    # (this environment's own editable verl-async-rm and its rig are what the wheels replace: left out)
    pins = sh(sys.executable, "-m", "pip", "list", "--format=freeze").stdout
    constraints = root / "constraints.txt"
    constraints.write_text("\n".join(line for line in pins.splitlines() if not line.lower().startswith("verl-async-rm")))
    sh(sys.executable, "-m", "venv", root / "env")
    python = root / "env" / "bin" / "python"
    sh(python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-compile", wheel, "-c", constraints)
    return root


@pytest.fixture(scope="module")
def venv(env_root) -> Path:
    return env_root / "env" / "bin"


@pytest.fixture(scope="module")
def outside(tmp_path_factory) -> Path:
    """A user's working folder, far from the repository, with folders named like ours once were."""
    folder = tmp_path_factory.mktemp("user_project")
    for name in ("hydra_conf", "user_rewards"):
        (folder / name).mkdir()
        (folder / name / "__init__.py").write_text("raise ImportError('the user\\'s own package was imported')\n")
    (folder / "hydra_conf" / "async_ppo_trainer.yaml").write_text("broken: [\n")
    return folder


def clean_env() -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "VERL_ASYNC_RM_CPU")}
    env["RAY_AUTH_MODE"] = "disabled"
    return env


def test_wheel_ships_examples_and_configs_inside_the_package_only(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    assert "verl_async_rm/hydra_conf/async_ppo_trainer.yaml" in names
    assert {"verl_async_rm/user_rewards/gsm8k.py", "verl_async_rm/user_rewards/llm_judge.py"} <= set(names)
    assert "hydra_plugins/verl_async_rm/__init__.py" in names
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith((".dist-info", ".data"))}
    assert tops == {"verl_async_rm", "hydra_plugins"}  # no generic top-level user_rewards, hydra_conf, tests, bench
    rig = ("cpu_backend", "judge_server", "demo", "verl_async_rm_rig")
    assert [n for n in names if any(part in n for part in rig)] == []  # none of the rig


def test_installed_wheel_is_what_runs(venv, outside):
    code = "import verl_async_rm, importlib.metadata as m; print(verl_async_rm.__file__); print(m.version('verl-async-rm'))"
    out = sh(venv / "python", "-c", code, cwd=outside, env=clean_env()).stdout.split()
    assert out[0].startswith(str(venv.parent)) and "site-packages" in out[0] and str(ROOT) not in out[0]


def test_cli_scores_with_the_packaged_example_reward(venv, outside):
    rows = [{"solution_str": f"#### {i}", "ground_truth": "1", "uid": i // 2} for i in range(4)]
    (outside / "in.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    sh(venv / "verl-async-rm", "score", "--input", "in.jsonl", "--group-size", "2", "--output", "out.jsonl",
       "--reward-file", "pkg://verl_async_rm.user_rewards.gsm8k", cwd=outside, env=clean_env())
    scores = [json.loads(line)["score"] for line in (outside / "out.jsonl").read_text().splitlines()]
    assert scores == [0.0, 1.0, 0.0, 0.0]


def test_async_agent_registered_in_both_registries(venv, outside):
    code = (
        "from verl.workers.reward_manager import register\n"
        "from verl.workers.reward_manager import get_reward_manager_cls as old\n"
        "from verl.experimental.reward_loop.reward_manager import get_reward_manager_cls as new\n"
        "print(new('async_agent').__module__, old('async_agent') is new('async_agent'))"
    )
    out = sh(venv / "python", "-c", code, cwd=outside, env=clean_env()).stdout.split()
    assert out == ["verl_async_rm.integration.reward_manager", "True"]


def test_our_entry_point_composes_its_config(venv, outside):
    out = sh(venv / "python", "-m", "verl_async_rm.main_ppo", "--cfg", "job", "reward_model.reward_manager.name=async_agent",
             "+reward.async_agent.max_concurrency=64", "off_policy_steps=1", cwd=outside, env=clean_env()).stdout
    config = yaml.safe_load(out)  # hydra prints the composed job config as YAML
    assert config["reward"]["async_agent"]["max_concurrency"] == 64 and config["off_policy_steps"] == 1
    assert config["reward_model"]["reward_manager"]["name"] == "async_agent"
    assert config["actor_rollout_ref"]["rollout"]["n"] >= 1  # verl's own ppo_trainer underneath


def test_stock_entry_point_moves_the_legacy_spelling(venv, outside):
    shutil.copy(HELPERS / "stock_main_probe.py", outside / "probe.py")
    cases = [["reward_model.reward_manager=async_agent",
              "custom_reward_function.path=pkg://verl_async_rm.user_rewards.gsm8k"]]
    out = sh(venv / "python", "probe.py", json.dumps(cases), cwd=outside, env=clean_env()).stdout
    (run,) = json.loads(next(line for line in out.splitlines() if line.startswith("PROBE"))[len("PROBE"):])
    assert run["exit"] == 0, run["stderr"]
    assert run["config"]["reward"]["reward_manager"]["name"] == "async_agent"
    assert run["config"]["reward"]["custom_reward_function"]["path"] == "pkg://verl_async_rm.user_rewards.gsm8k"


# Last: it installs the rig into the module's venv, which the tests above see as a GPU user's install.
def test_the_product_installs_without_the_rig_and_the_rig_only_with_its_extra(dist, wheel, venv, env_root, outside):
    requires = [line for line in zipfile.ZipFile(wheel).read(
        next(n for n in zipfile.ZipFile(wheel).namelist() if n.endswith("METADATA"))).decode().splitlines()
        if line.startswith("Requires-Dist:")]
    assert [r for r in requires if "verl-async-rm-rig" in r] == ['Requires-Dist: verl-async-rm-rig; extra == "rig"']
    # the rig's dependencies are not the product's; matplotlib only behind the product's own `plot` extra (replay --plot)
    assert not [r for r in requires if any(name in r for name in ("aiohttp", "matplotlib", "cachetools", "pandas"))
                and r != 'Requires-Dist: matplotlib>=3.8; extra == "plot"']
    absent = subprocess.run([venv / "python", "-c", "import verl_async_rm_rig"], capture_output=True, text=True,
                            cwd=outside, env=clean_env())
    assert absent.returncode == 1 and "No module named 'verl_async_rm_rig'" in absent.stderr
    # with its extra (found beside the product's wheel, as an index would serve it): the rig and its demo
    sh(venv / "python", "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-compile",
       f"{wheel}[rig]", "--find-links", dist, "-c", env_root / "constraints.txt")
    assert "--steps" in sh(venv / "python", "-m", "verl_async_rm_rig", "demo", "--help", cwd=outside, env=clean_env()).stdout
