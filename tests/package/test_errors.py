"""One exception base a user can catch: every exception class the package defines derives from
``verl_async_rm.errors.AsyncRMError`` (found by walking the package's source, so a new exception
class anywhere is checked without importing verl, torch or Ray), and the base is exported."""

from __future__ import annotations

import ast
import builtins

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.quick

BUILTIN_EXCEPTIONS = {name for name, value in vars(builtins).items()
                      if isinstance(value, type) and issubclass(value, BaseException)}
WARNINGS = {name for name in BUILTIN_EXCEPTIONS if issubclass(getattr(builtins, name), Warning)}


def _base_name(node: ast.expr) -> str:
    """``Name`` -> its id; ``a.b.Name`` -> ``Name`` (only the last part says what it is)."""
    return node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", "")


def exception_classes(top: str = "verl_async_rm") -> dict[str, tuple[str, list[str]]]:
    """Class name -> (where it is defined, its bases' names), for every class of the package that is
    an exception: it derives, through classes of the package, from a built-in exception."""
    classes: dict[str, tuple[str, list[str]]] = {}
    for path in sorted((ROOT / top).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                where = f"{path.relative_to(ROOT).as_posix()}:{node.lineno}"
                assert node.name not in classes or not _is_exception(node.name, classes), \
                    f"two exception classes named {node.name}: {classes[node.name][0]} and {where}"
                classes[node.name] = (where, [_base_name(base) for base in node.bases])
    return {name: entry for name, entry in classes.items() if _is_exception(name, classes)}


def _is_exception(name: str, classes: dict, seen: frozenset = frozenset()) -> bool:
    if name in BUILTIN_EXCEPTIONS:
        return True
    if name not in classes or name in seen:
        return False
    return any(_is_exception(base, classes, seen | {name}) for base in classes[name][1])


def _derives_from(name: str, base: str, classes: dict) -> bool:
    if name == base:
        return True
    return any(_derives_from(parent, base, classes) for parent in classes.get(name, ("", []))[1])


def test_every_exception_the_package_defines_derives_from_one_base():
    classes = exception_classes()
    assert {"RewardError", "TicketCancelled", "AgentClosed", "RewardFunctionError", "LimitsConflict",
            "RewardChanged", "EstimateRefused", "VerlVersionError", "RewardAgentStopped"} <= set(classes)
    outside = sorted(f"{name} ({where})" for name, (where, _) in classes.items()
                     if not name.startswith("_") and not _derives_from(name, "AsyncRMError", classes)
                     and not any(_derives_from(name, warning, classes) for warning in WARNINGS))
    assert outside == []


# Outside errors.py, and why: on a verl it does not support, verl's plugin loads nothing of ours
# beyond the version check (tests/seam/test_plugin_imports.py), which raises VerlVersionError.
ELSEWHERE = {"AsyncRMError": "verl_async_rm/__init__.py", "VerlVersionError": "verl_async_rm/verl_compat.py"}


def test_the_tree_lives_in_errors_py_and_keeps_the_built_in_bases():
    """Defined in errors.py (the tree documented at its top; the two of ``ELSEWHERE`` imported there),
    each keeps the built-in base an existing ``except`` clause may name."""
    from verl_async_rm import errors

    classes = exception_classes()
    elsewhere = sorted(f"{name} ({where})" for name, (where, _) in classes.items()
                       if not where.startswith(ELSEWHERE.get(name, "verl_async_rm/errors.py"))
                       and not name.startswith("_")
                       and not any(_derives_from(name, warning, classes) for warning in WARNINGS)
                       and not _derives_from(name, "RetryableError", classes))  # a reward's own reasons to retry
    assert elsewhere == []
    assert set(errors.__all__) == {name for name in classes if _derives_from(name, "AsyncRMError", classes)
                                   and not _derives_from(name, "RetryableError", classes)} | {"RetryableError"}
    kept = {errors.RewardError: RuntimeError, errors.TicketCancelled: RuntimeError, errors.AgentClosed: RuntimeError,
            errors.RewardAgentStopped: RuntimeError, errors.VerlVersionError: RuntimeError,
            errors.RewardFunctionError: TypeError, errors.EstimateRefused: ValueError,
            errors.LimitsConflict: ValueError, errors.RewardChanged: ValueError}
    for cls, builtin in kept.items():
        assert issubclass(cls, errors.AsyncRMError) and issubclass(cls, builtin), cls
    for name in ("FailureBudgetExceeded", "BudgetExceeded"):
        assert issubclass(getattr(errors, name), errors.RewardError)
    for name in errors.__doc__.split("AsyncRMError", 1)[1].split("Not in the tree")[0].split():
        if name.isidentifier() and name[0].isupper() and name.endswith(("Error", "Exceeded", "Cancelled", "Closed",
                                                                         "Stopped", "Refused", "Conflict", "Changed")):
            assert issubclass(getattr(errors, name), errors.AsyncRMError), f"the docstring names {name}"


def test_the_base_and_the_public_exceptions_are_exported():
    import verl_async_rm
    from verl_async_rm import errors

    assert verl_async_rm.AsyncRMError is errors.AsyncRMError and "AsyncRMError" in verl_async_rm.__all__
    for name in ("RewardError", "FailureBudgetExceeded", "BudgetExceeded", "TicketCancelled", "AgentClosed",
                 "RewardFunctionError", "RetryableError"):
        assert getattr(verl_async_rm, name) is getattr(errors, name) and name in verl_async_rm.__all__


def test_the_walk_finds_an_exception_outside_the_tree(tmp_path, monkeypatch):
    import tests.package.test_errors as here

    package = tmp_path / "pkg"
    package.mkdir()
    (package / "a.py").write_text("class Base(ValueError):\n    pass\n\n\nclass Deeper(Base):\n    pass\n\n\n"
                                  "class NotAnError:\n    pass\n\n\nclass Loud(UserWarning):\n    pass\n")
    monkeypatch.setattr(here, "ROOT", tmp_path)
    found = here.exception_classes("pkg")
    assert set(found) == {"Base", "Deeper", "Loud"} and not _derives_from("Deeper", "AsyncRMError", found)
