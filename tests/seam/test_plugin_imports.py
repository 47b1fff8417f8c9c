"""The plugin never breaks verl: every import order of verl's reward-manager registries works in a
fresh process with this package installed, verl's own registries hold exactly what they hold without
it (plus ``async_agent``), and an unsupported verl disables the plugin with one warning."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor

import pytest

pytestmark = pytest.mark.local

# What a process may import first. verl's own tests use several of these (the registry test imports
# ``verl.workers.reward_manager.registry``; the manager tests import ``verl.workers.reward_manager``),
# users register their legacy manager with ``from verl.workers.reward_manager import register``.
FIRST_IMPORTS = [
    "from verl.workers.reward_manager import register",
    "from verl.workers.reward_manager.registry import REWARD_MANAGER_REGISTRY, get_reward_manager_cls, register",
    "from verl.workers.reward_manager.naive import NaiveRewardManager",
    "from verl.experimental.reward_loop.reward_manager import register",
    "from verl.experimental.reward_loop.reward_manager.base import RewardManagerBase",
    "from verl.experimental.reward_loop.reward_manager.limited import RateLimitedRewardManager",
    "from verl.experimental.reward_loop import RewardLoopWorker",
    "from verl.trainer.ppo.reward import load_reward_manager",
    "import verl_async_rm.integration.reward_manager",
]

# After the first import: both registries in both orders, then what a user does with the legacy one.
PROBE = textwrap.dedent(
    """
    import json, sys
    import verl.workers.reward_manager as legacy_pkg
    import verl.experimental.reward_loop.reward_manager as loop_pkg
    from verl.workers.reward_manager import register, get_reward_manager_cls
    from verl.workers.reward_manager.abstract import AbstractRewardManager

    @register("user_manager")
    class UserManager(AbstractRewardManager):
        def __call__(self, data, return_dict=False):
            return None

    assert get_reward_manager_cls("user_manager") is UserManager
    from verl.workers.reward_manager.registry import REWARD_MANAGER_REGISTRY as legacy
    from verl.experimental.reward_loop.reward_manager.registry import REWARD_MANAGER as loop
    legacy.pop("user_manager")

    def names(registry):
        return {k: f"{v.__module__}.{v.__qualname__}" for k, v in sorted(registry.items())}

    try:
        from verl.trainer.ppo.v1 import get_trainer_cls
        get_trainer_cls("async_reward")
        v1_mode = True
    except ValueError:
        v1_mode = False
    print("PROBE" + json.dumps({"legacy": names(legacy), "loop": names(loop),
                                "same_class": legacy.get("async_agent") is loop.get("async_agent"),
                                "v1_mode": v1_mode,
                                "ours_loaded": sorted(m for m in sys.modules if m.split(".")[0] == "verl_async_rm"),
                                "rig_loaded": sorted(m for m in sys.modules if m.split(".")[0] == "verl_async_rm_rig")}))
    """
)


def run_probe(first: str, plugins: str = "auto", before: str = "") -> tuple[dict | None, subprocess.CompletedProcess]:
    env = {**os.environ, "VERL_USE_EXTERNAL_PLUGINS": plugins}
    env.pop("VERL_ASYNC_RM_CPU", None)
    code = f"{before}\n{first}\n{PROBE}"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180, env=env)
    lines = [line for line in result.stdout.splitlines() if line.startswith("PROBE")]
    return (json.loads(lines[-1][len("PROBE"):]) if lines else None), result


# The other processes the tests below start, beside the probes of FIRST_IMPORTS.
UNSUPPORTED = "import verl_async_rm.verl_compat as compat\ncompat.SUPPORTED_VERL = ('0.10', '0.11')"
BROKEN = (
    "import sys, importlib.abc\n"
    "class Broken(importlib.abc.MetaPathFinder):\n"
    "    def find_spec(self, name, path, target=None):\n"
    "        if name == 'verl_async_rm.integration.reward_manager':\n"
    "            raise ImportError('simulated breakage')\n"
    "sys.meta_path.insert(0, Broken())\n"
)
ENTRY_ON_UNSUPPORTED = (
    "import sys, verl_async_rm.verl_compat as compat\n"
    "compat.SUPPORTED_VERL = ('0.10', '0.11')\n"
    "sys.argv = ['main_ppo']\n"
    "from verl_async_rm.main_ppo import cli\n"
    "cli()\n"
)


def run_entry(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180)


@pytest.fixture(scope="module")
def processes():
    """Every process of this module, each fresh, run side by side (each is ~5 s of verl imports; one
    at a time they left a core idle): name -> what it returned."""
    jobs = {
        "stock": lambda: run_probe("import verl", plugins="none"),
        **{first: (lambda first=first: run_probe(first)) for first in FIRST_IMPORTS},
        "unsupported": lambda: run_probe("from verl.workers.reward_manager import register", before=UNSUPPORTED),
        "broken": lambda: run_probe("from verl.workers.reward_manager import register", before=BROKEN),
        "entry_on_unsupported": lambda: run_entry(ENTRY_ON_UNSUPPORTED),
    }
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        return dict(zip(jobs, pool.map(lambda job: job(), jobs.values())))


@pytest.fixture(scope="module")
def stock(processes):
    """verl's registries with this package's plugin switched off: what every other user sees."""
    probe, result = processes["stock"]
    assert probe is not None, result.stderr[-3000:]
    assert "async_agent" not in probe["legacy"] and not probe["v1_mode"]
    return probe


@pytest.fixture(scope="module")
def probes(processes):
    """Every order, each in its own fresh process."""
    return {first: processes[first] for first in FIRST_IMPORTS}


@pytest.mark.parametrize("first", FIRST_IMPORTS)
def test_every_first_import_leaves_both_registries_working_and_stock_plus_async_agent(first, stock, probes):
    probe, result = probes[first]
    assert result.returncode == 0 and probe is not None, result.stderr[-3000:]
    assert "could not register" not in result.stderr and "plugin failed" not in result.stderr, result.stderr[-3000:]
    ours = "verl_async_rm.integration.reward_manager.AsyncAgentRewardManager"
    for registry in ("legacy", "loop"):
        assert probe[registry] == {**stock[registry], "async_agent": ours}  # verl's own entries untouched
    assert probe["same_class"]


def test_unsupported_verl_warns_once_and_leaves_verl_exactly_as_stock(stock, processes):
    """F7: pretend the installed verl (0.9.1) is out of range by narrowing the supported range
    before ``import verl`` (UNSUPPORTED); the plugin must not raise, must say so once, and must install nothing."""
    probe, result = processes["unsupported"]
    assert result.returncode == 0 and probe is not None, result.stderr[-3000:]
    warning = "verl_async_rm supports verl>=0.10,<0.11, but verl 0.9.1 is installed"
    assert result.stderr.count(warning) == 1, result.stderr[-3000:]
    assert "UnsupportedVerlWarning" in result.stderr and "disabled" in result.stderr
    assert probe["legacy"] == stock["legacy"] and probe["loop"] == stock["loop"]
    assert not probe["v1_mode"]
    # nothing of ours beyond the version check ran: no hooks, no manager
    assert probe["ours_loaded"] == ["verl_async_rm", "verl_async_rm.verl_compat", "verl_async_rm.verl_plugin"]
    # the rig's own plugin (installed beside the product here) loaded and, not asked for, activated nothing
    assert probe["rig_loaded"] == ["verl_async_rm_rig", "verl_async_rm_rig.cpu_backend", "verl_async_rm_rig.cpu_backend.verl_plugin"]


def test_our_entry_point_refuses_an_unsupported_verl_at_start(processes):
    result = processes["entry_on_unsupported"]  # ENTRY_ON_UNSUPPORTED
    assert result.returncode != 0
    assert "VerlVersionError" in result.stderr and "installed verl is 0.9.1" in result.stderr, result.stderr[-3000:]


def test_a_failing_registration_is_reported_and_verl_still_imports(stock, processes):
    """A broken manager module (here: made to fail on import, BROKEN) must not take verl's registries down."""
    probe, result = processes["broken"]
    assert result.returncode == 0 and probe is not None, result.stderr[-3000:]
    assert "could not register the async_agent reward manager" in result.stderr and "simulated breakage" in result.stderr
    assert probe["legacy"] == stock["legacy"] and probe["loop"] == stock["loop"]
