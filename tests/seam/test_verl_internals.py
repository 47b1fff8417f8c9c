"""The list of verl internals the product touches, and the rig's list of its own: present in the installed
verl with the parameters we rely on; complete (every private verl attribute the verl-facing code uses is on
its list); and the v0 loop does everything verl's ``fit`` does, or says why not."""

from __future__ import annotations

import ast
import importlib.metadata as metadata
import inspect
import textwrap
from pathlib import Path

import pytest

from verl_async_rm import verl_internals
from verl_async_rm.verl_compat import VerlVersionError
from verl_async_rm_rig.cpu_backend import verl_internals as rig_internals

PACKAGE = Path(verl_internals.__file__).parent
RIG = Path(rig_internals.__file__).parent
VERL_FACING = [*sorted((PACKAGE / "strategies").glob("*.py")), *sorted((PACKAGE / "integration").glob("*.py"))]


@pytest.mark.local
def test_every_listed_internal_exists_in_the_installed_verl_as_we_use_it():
    assert verl_internals.missing() == []
    assert verl_internals.missing(verl_internals.OTHER_INTERNALS) == []
    assert verl_internals.missing_instance_attributes() == []
    assert rig_internals.check() == metadata.version("verl")


@pytest.mark.local
def test_the_rig_refuses_a_verl_that_lacks_one_of_its_internals_by_name():
    with pytest.raises(VerlVersionError, match=r"verl\.utils\.distributed\.nope is missing"):
        rig_internals.check((("verl.utils.distributed", "nope", None, "a test"),), ())


@pytest.mark.local
def test_a_moved_or_changed_internal_is_reported_by_name():
    problems = verl_internals.missing((
        ("verl.trainer.ppo.ray_trainer", "RayPPOTrainer._no_such_method", None, "a test"),
        ("verl.trainer.ppo.ray_trainer", "RayPPOTrainer._update_actor", ("self", "data"), "a test"),
        ("verl.no_such_module", "x", None, "a test"),
    ))
    assert len(problems) == 3
    assert "_no_such_method is missing" in problems[0] and "expected ('self', 'data')" in problems[1]


def _private_uses(path: Path) -> set[str]:
    """Underscore attributes read on self, self.trainer, trainer, engine or a verl module alias."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            names.add(node.attr)
    return names


def _own_names(package: Path = PACKAGE) -> set[str]:
    """Underscore names the package defines itself (functions, methods, attributes it assigns)."""
    names = set()
    for path in package.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                names.add(node.attr)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
    return names


@pytest.mark.quick
def test_every_private_verl_attribute_our_code_touches_is_listed():
    listed = {dotted.split(".")[-1] for _, dotted, _, _ in (*verl_internals.INTERNALS, *verl_internals.OTHER_INTERNALS)}
    listed |= {attribute for _, _, attribute, _, _ in verl_internals.INSTANCE_ATTRIBUTES}
    own = _own_names()
    unlisted = {}
    for path in VERL_FACING:
        for name in _private_uses(path) - own - listed:
            unlisted.setdefault(name, []).append(path.name)
    assert unlisted == {}


@pytest.mark.quick
def test_every_private_verl_attribute_the_rig_touches_is_on_its_list():
    listed = {dotted.split(".")[-1] for _, dotted, _, _ in rig_internals.INTERNALS}
    listed |= {attribute for _, _, attribute, _, _ in rig_internals.INSTANCE_ATTRIBUTES}
    own = _own_names(RIG) | _own_names()  # the rig may use the product's own private names (its tests' business)
    unlisted = {}
    for path in sorted(RIG.glob("*.py")):
        for name in _private_uses(path) - own - listed:
            unlisted.setdefault(name, []).append(path.name)
    assert unlisted == {}


# -- the v0 loop against verl's fit ----------------------------------------------------------------

# What verl's RayPPOTrainer.fit calls that the strategies' v0 loop deliberately does not, and why.
NOT_REPRODUCED = {
    "extract_reward": "rewards come from the agent's tickets (the scheduler), not from rm_scores",
    "self._compute_reward_colocate": "a reward model is refused at start with the strategies on",
    "DataProto.concat": "REMAX's combined greedy rollout: refused at start",
    "slice": "REMAX's combined greedy rollout: refused at start",
    "np.ones": "REMAX: refused at start",
    "np.zeros": "REMAX: refused at start",
    "sum": "REMAX's reward baseline (rm_scores.sum): refused at start",
    "reduce_metrics": "the scheduler's MetricMerger reduces every update call's metrics with it",
    "get": "config and dict reads",
    "extend": "images_seqlens, rebuilt by v0.images_seqlens",
    "keys": "multi_modal_inputs keys, read by v0.images_seqlens",
    "items": "reward extra info, attached by V0Ops.attach",
    "detach": "entropy aggregation",
}


def _calls(function) -> set[str]:
    tree = ast.parse(textwrap.dedent(inspect.getsource(function)))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Name):
                names.add(func.id)
            elif isinstance(func, ast.Attribute):
                value = func.value
                if isinstance(value, ast.Name) and value.id == "self":
                    names.add(f"self.{func.attr}")
                elif isinstance(value, ast.Attribute) and isinstance(value.value, ast.Name) and value.value.id == "self":
                    # V0Ops holds the trainer: self.trainer.X(...) is the trainer's self.X(...)
                    names.add(f"self.{func.attr}" if value.attr == "trainer" else f"self.{value.attr}.{func.attr}")
                elif isinstance(value, ast.Name) and (value.id[0].isupper() or value.id in ("np", "torch", "uuid")):
                    names.add(f"{value.id}.{func.attr}")  # a module or class
                else:
                    names.add(func.attr)  # a method of a local value: the name is what matters
    return names


@pytest.mark.local
def test_the_v0_loop_calls_what_verls_fit_calls():
    """S8: a copy of verl's fit drifts. Every call in verl 0.9.1's ``RayPPOTrainer.fit`` must appear in
    the strategies' v0 loop (its fit and step functions) or in NOT_REPRODUCED with a reason; a verl
    that adds a call to its loop fails here until the loop does it too."""
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer

    from verl_async_rm.strategies import scheduler, v0

    ours = set()
    for function in (v0.AsyncRewardRayPPOTrainer.fit, v0.AsyncRewardRayPPOTrainer._train_step,
                     v0.AsyncRewardRayPPOTrainer._generate, v0.AsyncRewardRayPPOTrainer._compute_policy_inputs,
                     v0.AsyncRewardRayPPOTrainer._save_and_sync, v0.AsyncRewardRayPPOTrainer._gdpo_metrics,
                     v0.V0Ops.attach, v0.V0Ops.advantages, v0.V0Ops.update, scheduler.StepScheduler.train,
                     scheduler.StepScheduler._update, scheduler.Lookahead.top_up):
        ours |= _calls(function)
    verls = _calls(RayPPOTrainer.fit)
    missing = sorted(name for name in verls - ours if name not in NOT_REPRODUCED)
    assert missing == []
    # the pieces S8 named: the dataset hook, GDPO and spec-decode metrics, dumps with the reward's keys
    for name in ("self.train_dataset.on_batch_end", "compute_spec_decode_metrics", "self._log_rollout_data",
                 "compute_variance_proxy_metrics", "self._start_profiling", "self._stop_profiling"):
        assert name in ours, name


# -- checked when a run starts, not only here (issue: a 0.9.x patch release that moved one) --------


@pytest.mark.local
def test_a_run_refuses_to_start_on_a_verl_that_moved_an_internal_naming_each(monkeypatch):
    """The async_agent manager (built at start in each reward worker) and both strategy trainers check
    the whole list before anything else; a verl that lacks one is refused there, every symbol named."""
    from verl_async_rm.integration.reward_manager import AsyncAgentRewardManager
    from verl_async_rm.strategies.v1 import AsyncRewardTrainer

    moved = (("verl.trainer.ppo.ray_trainer", "RayPPOTrainer._gone_in_a_patch_release", None, "v0.py"),
             ("verl.experimental.reward_loop.reward_manager.base", "RewardManagerBase.run_single",
              ("self", "data", "a_new_parameter"), "reward_manager.py"))
    monkeypatch.setattr(verl_internals, "INTERNALS", (*verl_internals.INTERNALS, *moved))
    monkeypatch.setattr(verl_internals.missing, "__defaults__", (verl_internals.INTERNALS,))
    verl_internals._problems.cache_clear()
    try:
        with pytest.raises(VerlVersionError) as refused:
            AsyncAgentRewardManager(None, tokenizer=object())
        message = str(refused.value)
        assert "the async_agent reward manager cannot run on verl" in message
        assert "RayPPOTrainer._gone_in_a_patch_release is missing" in message and "a_new_parameter" in message
        trainer = AsyncRewardTrainer.__new__(AsyncRewardTrainer)  # verl's __init__ calls this hook first
        with pytest.raises(VerlVersionError, match="trainer strategies \\(v1\\) cannot run"):
            trainer._build_replay_buffer()
    finally:
        verl_internals._problems.cache_clear()


@pytest.mark.local
def test_the_installed_verl_passes_the_start_check():
    verl_internals._problems.cache_clear()
    verl_internals.require_all("a run")  # the installed, supported verl: nothing missing
