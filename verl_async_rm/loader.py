"""Load the user's per-response reward (a function or a class) and describe how to call it.

Rules, in the recipe's spirit:
- a *function* ``compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs)``
  is called per response with the configured keyword arguments;
- a *class* is instantiated once per agent with the configured keyword arguments (its shared
  state: client, tokens, model name); its ``compute_score`` is called per response and its
  optional ``post_process_scores(scores) -> scores`` once per completed group;
- a *group judge* class defines ``compute_group_score(group)`` instead of ``compute_score``: one call
  per complete GRPO group (``group`` is the members' ``RewardItem`` list, in index order), returning
  one score per member (see ``engine/group_judge.py``). A class defining both is refused: which one
  a run uses must not depend on a precedence rule the user may not know (one class per mode).
Either may be ``async def``; that is detected here, once.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib.util
import inspect
import os
import sys
import threading
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable

from verl_async_rm.errors import RewardFunctionError

SCORE_PARAMS = ("data_source", "solution_str", "ground_truth", "extra_info")


PKG_PREFIX = "pkg://"  # verl's spelling for a module path: pkg://package.module (or package/module)
FILE_PREFIX = "file://"
_FILE_LOADS = threading.RLock()  # see load_module


@dataclass(frozen=True)
class RewardSpec:
    """Where a reward lives; enough to load it again in another process."""

    path: str | None  # a file, ``file://`` + a file, ``pkg://package.module``; None: ``name`` is "package.module:attribute"
    name: str
    kwargs: dict = field(default_factory=dict)

    @property
    def label(self) -> str:
        """How errors name the reward: ``file.py:name`` or ``package.module:attribute``."""
        if self.path is None:
            return self.name
        if self.path.startswith(PKG_PREFIX):
            return f"{_pkg_module(self.path)}:{self.name}"
        return f"{os.path.basename(self.path)}:{self.name}"


def _pkg_module(path: str) -> str:
    return path[len(PKG_PREFIX) :].replace("/", ".").strip(".")


@dataclass(frozen=True)
class UserReward:
    label: str  # "file.py:name", used in every error message
    score_fn: Callable[..., Any]
    score_is_async: bool
    call_kwargs: dict  # passed to every compute_score call (functions only; classes got them at init)
    group_hook: Callable[[list[float]], Any] | None = None
    hook_is_async: bool = False
    spec: RewardSpec | None = None
    instance: Any = None  # a class reward's instance; its close()/aclose() runs when the agent closes
    group_fn: Callable[[list], Any] | None = None  # a group judge's compute_group_score (then score_fn is None)
    # What it was configured with (a function's call kwargs, a class's constructor kwargs; None for an
    # instance built by the caller): part of its identity in the verdict log.
    kwargs: dict | None = None

    @property
    def is_group_judge(self) -> bool:
        return self.group_fn is not None


def _is_async(fn: Callable) -> bool:
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(fn, "__call__", None))


def _check_signature(fn: Callable, label: str, kwargs: dict) -> None:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):  # builtins and some C callables have no signature: trust them
        return
    probe = dict.fromkeys(SCORE_PARAMS) | dict(kwargs)
    try:
        sig.bind(**probe)
    except TypeError as exc:
        raise RewardFunctionError(
            f"{label} cannot be called as compute_score(data_source, solution_str, ground_truth, "
            f"extra_info=None, **{sorted(kwargs)}): {exc}"
        ) from None


def load_module(path: str):
    """A reward module by path, as verl's ``custom_reward_function.path`` accepts it: a file path
    (optionally ``file://``), or ``pkg://package.module`` for an installed module."""
    if path.startswith(PKG_PREFIX):
        return importlib.import_module(_pkg_module(path))
    if path.startswith(FILE_PREFIX):
        path = path[len(FILE_PREFIX) :]
    path = os.path.abspath(os.path.expanduser(path))
    if not os.path.isfile(path):
        raise FileNotFoundError(f"reward file not found: {path}")
    # A stable, unique module name per file, so two reward files with the same stem never collide
    # and pickling (process pool) can find the module again in this process.
    digest = hashlib.sha1(path.encode()).hexdigest()[:10]
    module_name = f"_verl_async_rm_user_{os.path.splitext(os.path.basename(path))[0]}_{digest}"
    # The module is in sys.modules while it executes (its own code may need to find itself), so a
    # second loader must not take it from there before it has finished: it would get a half-run
    # module ("has no attribute 'compute_score'"). importlib's per-module locks only cover the
    # import statement's path, not this load-by-file; one re-entrant lock (a reward file that loads
    # another reward file at import time) serialises these rare loads without deadlock cycles.
    with _FILE_LOADS:
        if module_name in sys.modules:
            return sys.modules[module_name]
        spec = importlib.util.spec_from_file_location(module_name, path)
        if spec is None or spec.loader is None:
            raise RewardFunctionError(f"cannot import {path} as a Python module")
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        try:
            spec.loader.exec_module(module)
        except BaseException as exc:
            del sys.modules[module_name]
            if isinstance(exc, Exception):  # the user's file is broken: say where, not a traceback through importlib
                raise RewardFunctionError(f"reward file {path} failed to import: {type(exc).__name__}: {exc}"
                                          f"{_where_in(exc, path)}") from exc
            raise
        return module


def _where_in(exc: BaseException, path: str) -> str:
    """`` (at file.py:12)``: the last line of ``path`` the error passed through (a SyntaxError
    names its line itself)."""
    if isinstance(exc, SyntaxError):
        return ""
    lines = [frame.lineno for frame in traceback.extract_tb(exc.__traceback__) if frame.filename == path]
    return f" (at {os.path.basename(path)}:{lines[-1]})" if lines else ""


def _find(spec: RewardSpec) -> Any:
    """The object a spec names: ``name`` in the file ``path``, or ``"package.module:attribute"``."""
    if spec.path is None:
        module_name, sep, attribute = spec.name.partition(":")
        if not sep:
            raise ValueError(f"without a path, the reward name must read 'package.module:attribute', got {spec.name!r}")
        return getattr(importlib.import_module(module_name), attribute)
    module = load_module(spec.path)
    if not hasattr(module, spec.name):
        public = sorted(n for n, v in vars(module).items() if callable(v) and not n.startswith("_"))
        raise AttributeError(f"{spec.path} has no attribute {spec.name!r}; callables there: {public}")
    return getattr(module, spec.name)


def source_file(reward: UserReward) -> str | None:
    """The file holding the code that scores: the spec's file, else where the class (of an instance)
    or the function was defined; None when there is none (a builtin, code typed at a prompt)."""
    spec = reward.spec
    if spec is not None and spec.path is not None and not spec.path.startswith(PKG_PREFIX):
        path = spec.path[len(FILE_PREFIX):] if spec.path.startswith(FILE_PREFIX) else spec.path
        return os.path.abspath(os.path.expanduser(path))
    target = type(reward.instance) if reward.instance is not None else reward.score_fn
    while isinstance(target, functools.partial):
        target = target.func
    if not (inspect.isroutine(target) or inspect.isclass(target)):  # a callable object: its class's code
        target = type(target)
    try:
        path = inspect.getsourcefile(inspect.unwrap(target))
    except TypeError:  # a builtin or C callable: no Python source
        return None
    return os.path.abspath(path) if path is not None and os.path.isfile(path) else None


def load_reward(path: str | None, name: str, kwargs: dict | None = None) -> UserReward:
    """From a file (``path`` + ``name``), or from an importable module when ``path`` is None and
    ``name`` reads ``"package.module:attribute"``."""
    spec = RewardSpec(path, name, dict(kwargs or {}))
    return wrap_reward(_find(spec), kwargs, spec=spec)


def wrap_reward(obj: Any, kwargs: dict | None = None, *, spec: RewardSpec | None = None) -> UserReward:
    """Accept a function, a class (instantiated here with ``kwargs``) or an instance with ``compute_score``."""
    kwargs = dict(kwargs or {})
    label = spec.label if spec is not None else getattr(obj, "__qualname__", None) or type(obj).__qualname__
    if inspect.isclass(obj):
        _check_scoring_methods(obj, label)
        try:
            instance = obj(**kwargs)
        except TypeError as exc:
            raise RewardFunctionError(f"cannot instantiate {label} with kwargs {sorted(kwargs)}: {exc}") from None
        return dataclasses.replace(_from_instance(instance, label, spec), kwargs=kwargs)
    if not inspect.isroutine(obj) and (callable(getattr(obj, "compute_score", None))
                                       or callable(getattr(obj, GROUP_METHOD, None))):
        _check_scoring_methods(obj, label)
        if kwargs:
            raise RewardFunctionError(f"{label} is an instance: configure it before passing it, not with kwargs")
        return _from_instance(obj, label, spec)
    if not callable(obj):
        raise RewardFunctionError(f"{label} is a {type(obj).__name__}, not a function or a class")
    _check_signature(obj, label, kwargs)
    return UserReward(label, obj, _is_async(obj), kwargs, spec=spec, kwargs=kwargs)


GROUP_METHOD = "compute_group_score"


def _check_scoring_methods(obj: Any, label: str) -> None:
    """Exactly one of ``compute_score`` (per sample) and ``compute_group_score`` (per group)."""
    per_sample = callable(getattr(obj, "compute_score", None))
    per_group = callable(getattr(obj, GROUP_METHOD, None))
    if per_sample and per_group:
        raise RewardFunctionError(
            f"{label} defines both compute_score and {GROUP_METHOD}: define one (a per-sample reward, or a "
            "group judge called once per complete group); there is no precedence rule between them"
        )
    if not per_sample and not per_group:
        raise RewardFunctionError(f"class {label} has no compute_score method (nor {GROUP_METHOD})")
    if per_group:
        _check_group_signature(getattr(obj, GROUP_METHOD), f"{label}.{GROUP_METHOD}")


def _check_group_signature(fn: Callable, label: str) -> None:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return
    params = list(sig.parameters.values())
    if params and params[0].name == "self":  # checked on the class: the unbound method
        params = params[1:]
    try:
        inspect.Signature(params).bind([])
    except TypeError as exc:
        raise RewardFunctionError(f"{label} cannot be called as {GROUP_METHOD}(group): {exc}") from None


def _from_instance(instance: Any, label: str, spec: RewardSpec | None) -> UserReward:
    hook = getattr(instance, "post_process_scores", None)
    if hook is not None and not callable(hook):
        raise RewardFunctionError(f"{label}.post_process_scores is not callable")
    group_fn = getattr(instance, GROUP_METHOD, None)
    if callable(group_fn):
        return UserReward(
            label=label, score_fn=None, score_is_async=_is_async(group_fn), call_kwargs={}, group_hook=hook,
            hook_is_async=hook is not None and _is_async(hook), spec=spec, instance=instance, group_fn=group_fn,
        )
    score_fn = instance.compute_score
    _check_signature(score_fn, f"{label}.compute_score", {})
    return UserReward(
        label=label,
        score_fn=score_fn,
        score_is_async=_is_async(score_fn),
        call_kwargs={},
        group_hook=hook,
        hook_is_async=hook is not None and _is_async(hook),
        spec=spec,
        instance=instance,
    )


def _check_constructor(cls: type, label: str, kwargs: dict) -> None:
    try:
        sig = inspect.signature(cls)
    except (TypeError, ValueError):
        return
    try:
        sig.bind(**kwargs)
    except TypeError as exc:
        raise RewardFunctionError(f"cannot instantiate {label} with kwargs {sorted(kwargs)}: {exc}") from None


def _close(instance: Any) -> None:
    """Release what a checked instance holds (``aclose()`` or ``close()``, as the agent does)."""
    closer = getattr(instance, "aclose", None) or getattr(instance, "close", None)
    if not callable(closer):
        return
    result = closer()
    if inspect.isawaitable(result):
        import asyncio

        asyncio.run(result)


def check_spec(spec: RewardSpec, *, construct: bool = False) -> None:
    """Fail early on a bad path, name, signature or keyword arguments.

    A class is checked against its constructor's signature; with ``construct=True`` (once, at start,
    in the driver) it is also built with its kwargs and closed again, so what only its constructor
    checks (e.g. a judge's missing ``model``) fails at start, not at the first reward in an actor."""
    target = _find(spec)
    label = spec.label
    if inspect.isclass(target):
        _check_scoring_methods(target, label)
        _check_constructor(target, label, spec.kwargs)
        if construct:
            try:
                instance = target(**spec.kwargs)
            except Exception as exc:  # noqa: BLE001 - any constructor error is a configuration error here
                raise RewardFunctionError(f"cannot instantiate {label} with kwargs {sorted(spec.kwargs)}: "
                                          f"{type(exc).__name__}: {exc}") from exc
            try:
                if callable(getattr(instance, "compute_score", None)):
                    _check_signature(instance.compute_score, f"{label}.compute_score", {})
            finally:
                _close(instance)
    elif not callable(target):
        raise RewardFunctionError(f"{label} is a {type(target).__name__}, not a function or a class")
    else:
        _check_signature(target, label, spec.kwargs)
