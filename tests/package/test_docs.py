"""The docs name only what exists: every repository path, test, module and setting that README.md and
docs/ mention (in backticks or as a link) is in the tree, so a rename or a deleted test fails here, not in a
reader's hands. Figures are checked where they are made: the tables quoted from bench/results/ by
tests/benchmarks/test_e2e_report.py."""

from __future__ import annotations

import ast
import importlib.util
import re
from pathlib import Path

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.quick

DOCS = [ROOT / "README.md", ROOT / "rig" / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
TOPS = ("verl_async_rm/", "rig/", "tests/", "bench/", "docs/", "examples/", "ci/", "hydra_plugins/", ".ci/")
# The integration's own keys of the reward.async_agent block (integration/settings.py), beside AgentConfig's.
INTEGRATION_KEYS = {"group_size", "group_wait", "group_timeout", "actor_name", "extra_keys", "drift_check"}


def spans(text: str) -> list[str]:
    return re.findall(r"`([^`\n]+)`", text)


def defined_tests() -> set[str]:
    names = set()
    for path in (ROOT / "tests").rglob("test_*.py"):
        names |= set(re.findall(r"^def (test_[a-z0-9_]+)", path.read_text(), flags=re.M))
    return names


def repository_paths(text: str) -> set[str]:
    found = set()
    for span in spans(text):
        for token in re.split(r"[\s,;()]+", span):
            token = token.strip("'\"").rstrip(".:")
            token = re.sub(r"::.*$", "", token)  # tests/x.py::test_y
            if token.startswith(TOPS) and "*" not in token and "<" not in token and "{" not in token:
                found.add(token)
    for link in re.findall(r"\]\(([^)#\s]+)", text):  # markdown links, relative to the page
        if not link.startswith(("http://", "https://", "mailto:")):
            found.add(link)
    return found


@pytest.mark.parametrize("page", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_path_the_docs_name_exists(page):
    text = page.read_text()
    missing = []
    for name in sorted(repository_paths(text)):
        base = page.parent if not name.startswith(TOPS) else ROOT
        if not (base / name).exists() and not (ROOT / name).exists():
            missing.append(name)
    assert missing == []


@pytest.mark.parametrize("page", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_test_the_docs_name_is_defined(page):
    # a name ending in * names a family (test_item01_*): at least one test must start with it
    named = {name for span in spans(page.read_text()) for name in re.findall(r"\b(test_[a-z0-9_]+\*?)(?![\w.])", span)}
    defined = defined_tests()
    missing = [n for n in named if (not any(d.startswith(n[:-1]) for d in defined) if n.endswith("*") else n not in defined)]
    assert sorted(missing) == []


@pytest.mark.parametrize("page", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_module_and_setting_the_docs_name_exists(page):
    from verl_async_rm.config import AgentConfig

    problems = []
    for span in spans(page.read_text()):
        for dotted in re.findall(r"\b((?:verl_async_rm|verl_async_rm_rig)(?:\.[A-Za-z_][A-Za-z0-9_]*)+)", span):
            if not _resolves(dotted):
                problems.append(dotted)
        for key in re.findall(r"\breward\.async_agent\.([a-z_]+)", span):
            if key not in AgentConfig.model_fields and key not in INTEGRATION_KEYS:
                problems.append(f"reward.async_agent.{key}")
    assert sorted(set(problems)) == []


def _resolves(dotted: str) -> bool:
    """A module, or a name defined in one (a class, a function, a constant, a class's method), as far as the
    name goes: found from the source files, not by importing them (many of the package's modules, and the rig's
    package inits, import verl or torch, which the quick tier must not pay for). A module with a lazy
    ``__getattr__`` (the package's public names) is asked, its exports being light by design."""
    parts = dotted.split(".")
    source = _module_file(parts[0], [])
    if source is None:
        return False
    cut = 1
    while cut < len(parts) and (inner := _module_file(parts[cut], [source])) is not None:
        source, cut = inner, cut + 1
    if cut == len(parts):
        return True
    body = ast.parse(source.read_text()).body
    if _defines(body, parts[cut:]):
        return True
    if any(isinstance(node, ast.FunctionDef) and node.name == "__getattr__" for node in body):
        module = importlib.import_module(".".join(parts[:cut]))
        try:
            for attribute in parts[cut:]:
                module = getattr(module, attribute)
        except AttributeError:
            return False
        return True
    return False


def _module_file(name: str, within: list[Path]) -> Path | None:
    """The source file of a top-level module (``within`` empty) or of a submodule of the package whose
    ``__init__.py`` is ``within[0]``; None if there is none. Nothing is imported."""
    if not within:
        spec = importlib.util.find_spec(name)  # a top-level name: finding it imports nothing
        return Path(spec.origin) if spec and spec.origin and spec.origin.endswith(".py") else None
    if within[0].name != "__init__.py":
        return None
    folder = within[0].parent
    for candidate in (folder / name / "__init__.py", folder / f"{name}.py"):
        if candidate.exists():
            return candidate
    return None


def _defines(body: list, names: list[str]) -> bool:
    """Whether these statements define names[0] (and, in a class, names[1:] in turn)."""
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == names[0]:
            return len(names) == 1 or (isinstance(node, ast.ClassDef) and _defines(node.body, names[1:]))
        targets = []
        if isinstance(node, ast.Assign):
            targets = [t.id for t in node.targets if isinstance(t, ast.Name)]
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            targets = [node.target.id]
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            targets = [(alias.asname or alias.name).split(".")[0] for alias in node.names]
        elif isinstance(node, (ast.If, ast.Try)):  # names defined under a version check or an import fallback
            if _defines(node.body + getattr(node, "orelse", []) + [s for h in getattr(node, "handlers", []) for s in h.body], names):
                return True
        if names[0] in targets:
            return len(names) == 1  # an attribute of a constant or an import: not followed
    return False


def test_the_checks_catch_a_missing_name(tmp_path):
    assert "tests/agent/nope.py" in repository_paths("see `tests/agent/nope.py::test_x`")
    assert not _resolves("verl_async_rm.config.NoSuchSetting") and _resolves("verl_async_rm.config.AgentConfig")
    assert _resolves("verl_async_rm.agent.RewardAgent.submit") and not _resolves("verl_async_rm.agent.RewardAgent.nope")
    assert _resolves("verl_async_rm.strategies.v1") and not _resolves("verl_async_rm.strategies.nope")
