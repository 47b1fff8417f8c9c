"""The drift check during training: ``reward.async_agent.drift_check`` read into typed settings, and
the monitor this package's trainers call at every step (``DriftMonitor.metrics``).

A check re-judges a fixed calibration set (``replay.DriftCheck``: groups of a past run's verdict
log, read with the inputs that run kept, or an input file) every ``every_n_steps`` steps and adds
its agreement to verl's step metrics as ``async_rm/drift/*``.

**Why in the background (the default).** A check is a calibration batch sent to the judge: with
16 groups of 8 and a hosted judge, seconds to minutes. Run inside the step, it would stall the
trainer for exactly that long every N steps, the wait this package exists to remove. So a due
check starts on a daemon thread and the step goes on; its metrics are added to the first step
that finds it finished, with ``async_rm/drift/step`` saying at which step it was started (the
judge does not depend on the policy: a check measures the judge at the time it ran, wherever it is
reported). A check still running when the next one is due is not doubled: that one is skipped
(``async_rm/drift/skipped``, cumulative). The last training step waits for a running check, so the
last result is not lost. ``background: false`` runs the check inside the step instead (the step
then takes a calibration batch longer every N steps; its metrics are that step's).

A check never stops training: a judge that fails is counted in ``not_compared``; a check that
raises is logged and counted (``async_rm/drift/errors``).

Only light imports here (no verl, torch or Ray): the settings are read in every process.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from verl_async_rm.config import AgentConfig
from verl_async_rm.loader import RewardSpec
from verl_async_rm.score_file import REFERENCE_KEY

_log = logging.getLogger(__name__)

KEY = "reward.async_agent.drift_check"
PREFIX = "async_rm/drift/"
# what the check's own agent may not take from the run: it keeps its own fresh verdict log and asks
# afresh (replay.OWN_SETTINGS, cache), and a budget would be a budget per check, not the run's
NOT_INHERITED = ("verdict_log", "verdict_log_resume", "verdict_log_accept_reward_change", "verdict_log_inputs",
                 "cache", "token_budget", "money_budget")
DEFAULTS: dict[str, Any] = {
    "log": None, "input": None, "groups": 16, "seed": 0, "old_reward": None, "every_n_steps": 50,
    "background": True, "reward_file": None, "reward_name": None, "reward_kwargs": None, "settings": {},
    "response_key": "solution_str", "ground_truth_key": REFERENCE_KEY,
}
PATH_KEYS = ("log", "input", "reward_file")


@dataclass(frozen=True)
class DriftCheckSettings:
    log: str  # the past run's verdict log
    input: str | None  # the file it scored; None: the inputs it kept beside its log (verdict_log_inputs)
    groups: int | None  # whole GRPO groups drawn from the log (None: every sample)
    seed: int
    old_reward: str | None  # which reward's verdicts, when the log holds several
    every_n_steps: int
    background: bool
    reward: RewardSpec  # the judge asked at each check: by default the run's own
    settings: dict = field(default_factory=dict)  # the check's agent settings (validated)
    response_key: str = "solution_str"
    ground_truth_key: str = REFERENCE_KEY
    run_reward_path: str | None = None  # the run's own reward file (how a missing judge file is named)


def _named(key: str) -> str:
    return f"{KEY}.{key}"


def _positive_int(value: Any, key: str, allow_none: bool = False) -> int | None:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{_named(key)} must be a positive integer{' or null' if allow_none else ''}, got {value!r}")
    return value


def _path(path: Any, key: str) -> str:
    if not isinstance(path, str) or not path.strip():
        raise ValueError(f"{_named(key)} must be a path, got {path!r}")
    return path


def _readable_file(path: str, key: str, hint: str = "") -> str:
    if os.path.isdir(path):
        raise ValueError(f"{_named(key)} {path!r} is a directory; name a file")
    if not os.path.isfile(path):
        raise ValueError(f"{_named(key)} {path!r}: no such file{hint}")
    if not os.access(path, os.R_OK):
        raise ValueError(f"{_named(key)} {path!r} cannot be read")
    return path


def drift_settings_from_mapping(block: Mapping | None, run_reward: RewardSpec, run_agent: AgentConfig) -> DriftCheckSettings | None:
    """The checked settings, or None when the check is off (no block, or ``log`` null with every
    other key at its default). Every problem is a ValueError naming the key. Cheap, and no file is
    looked at: this runs in every process verl hands the config to, some perhaps on nodes without the
    files; ``check_at_start`` checks them where the run starts, and the trainer reads them."""
    if block is None:
        return None
    if not isinstance(block, Mapping):
        raise ValueError(f"{KEY} must be a mapping (log: PATH, every_n_steps: N, ...), got {block!r}")  # noqa: TRY004 - a setting's error, as every one here
    block = dict(block)
    unknown = sorted(set(block) - set(DEFAULTS))
    if unknown:
        raise ValueError(f"{KEY}: unknown key(s) {unknown}; known: {sorted(DEFAULTS)}")
    values = {**DEFAULTS, **block}
    if values["log"] is None:
        changed = sorted(k for k in block if block[k] != DEFAULTS[k])
        if changed:
            raise ValueError(f"{_named('log')} is required to turn the drift check on (given: {', '.join(changed)})")
        return None
    log = _path(values["log"], "log")
    source = _path(values["input"], "input") if values["input"] is not None else None
    groups = _positive_int(values["groups"], "groups", allow_none=True)
    every = _positive_int(values["every_n_steps"], "every_n_steps")
    seed = values["seed"]
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"{_named('seed')} must be an integer, got {seed!r}")  # noqa: TRY004 - a setting's error, as every one here
    if not isinstance(values["background"], bool):
        raise ValueError(f"{_named('background')} must be true or false, got {values['background']!r}")  # noqa: TRY004 - a setting's error, as every one here
    for key in ("old_reward", "reward_name"):
        if values[key] is not None and (not isinstance(values[key], str) or not values[key]):
            raise ValueError(f"{_named(key)} must be a non-empty string or null, got {values[key]!r}")
    for key in ("response_key", "ground_truth_key"):
        if not isinstance(values[key], str) or not values[key]:
            raise ValueError(f"{_named(key)} must be a non-empty string, got {values[key]!r}")
    # the judge asked: each of file, name and kwargs not given is the run's own
    reward_file = values["reward_file"]
    if reward_file is not None:
        reward_file = _path(reward_file, "reward_file")
    kwargs = values["reward_kwargs"]
    if kwargs is not None and not isinstance(kwargs, Mapping):
        raise ValueError(f"{_named('reward_kwargs')} must be a mapping or null, got {kwargs!r}")
    reward = RewardSpec(reward_file if reward_file is not None else run_reward.path,
                        values["reward_name"] or (run_reward.name if reward_file is None else "compute_score"),
                        dict(kwargs) if kwargs is not None else dict(run_reward.kwargs))
    overrides = values["settings"] or {}
    if not isinstance(overrides, Mapping):
        raise ValueError(f"{_named('settings')} must be a mapping of agent settings, got {overrides!r}")  # noqa: TRY004 - a setting's error, as every one here
    refused = [k for k in overrides if k in NOT_INHERITED]
    if refused:
        raise ValueError(f"{_named('settings')}.{refused[0]}: a drift check keeps its own fresh verdict log, asks the "
                         "judge afresh (no cache) and has no budget of its own")
    inherited = {k: v for k, v in run_agent.model_dump().items() if k not in NOT_INHERITED}
    try:
        settings = AgentConfig.from_mapping({**inherited, **overrides}).model_dump()
    except ValueError as exc:
        raise ValueError(f"{_named('settings')}: {exc}") from None
    settings = {k: v for k, v in settings.items() if k not in NOT_INHERITED}
    return DriftCheckSettings(log=log, input=source, groups=groups, seed=seed, old_reward=values["old_reward"],
                              every_n_steps=every, background=values["background"], reward=reward, settings=settings,
                              response_key=values["response_key"], ground_truth_key=values["ground_truth_key"],
                              run_reward_path=run_reward.path)


def absolute_paths(block: Mapping | None) -> dict:
    """The block with its paths made absolute (the driver's folder): verl's trainer runs in a Ray
    actor, whose working folder need not be the driver's. Written back where a run starts."""
    out = dict(block or {})
    for key in PATH_KEYS:
        value = out.get(key)
        if isinstance(value, str) and value.strip() and not value.startswith("pkg://"):
            out[key] = os.path.abspath(value)
    return out


def load_calibration(settings: DriftCheckSettings):
    """The calibration set (``replay.load_selected``), each problem a ValueError naming the key."""
    from verl_async_rm.replay import Selection, load_selected

    try:
        return load_selected(Path(settings.log), Path(settings.input) if settings.input is not None else None,
                             Selection(groups=settings.groups, seed=settings.seed), settings.old_reward,
                             settings.response_key, settings.ground_truth_key)
    except ValueError as exc:
        message = str(exc)
        for flag, key in (("--log", "log"), ("--input", "input"), ("--old-reward", "old_reward"), ("--groups", "groups")):
            if message.startswith(flag):
                message = _named(key) + message[len(flag):]
                break
        raise ValueError(f"{KEY}: {message}" if not message.startswith(KEY) else message) from None


def check_files(settings: DriftCheckSettings) -> None:
    """The files exist and can be read, each named by its key."""
    from verl_async_rm.verdict_log import inputs_path

    _readable_file(settings.log, "log")
    if settings.input is not None:
        _readable_file(settings.input, "input")
    elif not inputs_path(settings.log).is_file():
        raise ValueError(f"{_named('input')} is null, and the log {settings.log!r} keeps no inputs (no "
                         f"{inputs_path(settings.log).name} beside it): name the file that run scored, or have the run "
                         "keep them (reward.async_agent.verdict_log_inputs=true)")
    path = settings.reward.path
    if path is not None and not path.startswith("pkg://"):
        _readable_file(path.removeprefix("file://"), "reward_file" if path != settings.run_reward_path else "reward_file "
                       "(the run's reward.custom_reward_function.path)")


def check_at_start(settings: DriftCheckSettings) -> None:
    """What a run checks before any worker starts: the files exist, the calibration set loads (log
    readable, the selection non-empty, every selected sample's input found) and the judge loads."""
    from verl_async_rm.loader import check_spec

    check_files(settings)
    load_calibration(settings)
    try:
        check_spec(settings.reward, construct=True)
    except Exception as exc:  # noqa: BLE001 - any reward problem is a configuration error here
        raise ValueError(f"{KEY}: its judge {settings.reward.label}: {type(exc).__name__}: {exc}") from None


class DriftMonitor:
    """What a trainer calls once per training step (``metrics(step, last)``); see the module docstring."""

    def __init__(self, check: Callable[[int], dict], every_n_steps: int, background: bool = True):
        """``check(step)``: a ``replay.DriftCheck`` (the metrics of a check at ``step``; {} if not due)."""
        self.check = check
        self.every_n_steps = every_n_steps
        self.background = background
        self.skipped = 0
        self.errors = 0
        self._running: tuple[int, float, threading.Thread, dict] | None = None  # (step, started, thread, result box)

    @classmethod
    def build(cls, settings: DriftCheckSettings, workdir: str | None = None) -> DriftMonitor:
        from verl_async_rm.agent import RewardAgent
        from verl_async_rm.loader import load_reward
        from verl_async_rm.replay import DriftCheck

        spec = settings.reward

        def make_agent(agent_settings: dict) -> RewardAgent:
            return RewardAgent(load_reward(spec.path, spec.name, dict(spec.kwargs)), agent_settings)

        check_files(settings)
        check = DriftCheck(load_calibration(settings), make_agent, settings.every_n_steps, config=settings.settings,
                           workdir=Path(workdir) if workdir is not None else None)
        return cls(check, settings.every_n_steps, settings.background)

    def due(self, step: int) -> bool:
        return step % self.every_n_steps == 0

    def _run(self, step: int, box: dict) -> None:
        try:
            box["metrics"] = self.check(step)
        except Exception as exc:  # noqa: BLE001 - a check must never stop training
            box["error"] = exc

    def _finish(self, step: int, started: float, box: dict) -> dict[str, float]:
        self._running = None
        if "error" in box:
            self.errors += 1
            _log.warning("drift check started at step %d failed: %s: %s", step, type(box["error"]).__name__, box["error"])
            return {PREFIX + "errors": float(self.errors)}
        out = dict(box.get("metrics") or {})
        if out:
            out[PREFIX + "step"] = float(step)
            out[PREFIX + "seconds"] = time.monotonic() - started
            out[PREFIX + "skipped"] = float(self.skipped)
        return out

    def metrics(self, step: int, last: bool = False) -> dict[str, float]:
        """This step's drift metrics: {} on most steps. ``last``: the run's last training step (a
        running check is waited for)."""
        if not self.background:
            if not self.due(step):
                return {}
            started, box = time.monotonic(), {}
            self._run(step, box)
            return self._finish(step, started, box)
        out: dict[str, float] = {}
        if self._running is not None and not self._running[2].is_alive():
            out.update(self._finish(self._running[0], self._running[1], self._running[3]))
        if self.due(step):
            if self._running is not None:
                self.skipped += 1
                _log.warning("drift check due at step %d skipped: the one started at step %d is still running "
                             "(raise every_n_steps, or use fewer groups)", step, self._running[0])
            else:
                box: dict = {}
                thread = threading.Thread(target=self._run, args=(step, box), name=f"drift-check-{step}", daemon=True)
                self._running = (step, time.monotonic(), thread, box)
                thread.start()
        if last and self._running is not None:
            self._running[2].join()
            out.update(self._finish(self._running[0], self._running[1], self._running[3]))
        return out

    def wait(self, timeout: float | None = None) -> None:
        """Block until a running check ends (tests; the end of a run)."""
        if self._running is not None:
            self._running[2].join(timeout)

