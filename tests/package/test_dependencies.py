"""Dependencies declared exactly: every third-party import of the product maps to a requirement of
its pyproject.toml, every import of the rig, the benchmarks and the tests to a requirement of the rig's
(rig/pyproject.toml) or the product's, in the right extra; and every requirement is imported or has a
stated reason."""

from __future__ import annotations

import ast
import importlib.metadata as metadata
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.conftest import ROOT

pytestmark = pytest.mark.quick

OWN = {"verl_async_rm", "verl_async_rm_rig", "tests", "bench", "hydra_plugins"}
# What each part of the repository may import: (distribution, its extras installed where it runs). The
# rig's requirements include the product's (it depends on it).
SCOPES = {  # the first prefix that matches wins: the specific ones first
    "verl_async_rm/replay_plot.py": ("product", ("plot",)),  # `replay --plot`, imported only then
    "verl_async_rm": ("product", ()),
    "hydra_plugins": ("product", ()),
    "rig": ("rig", ()),
    "bench": ("rig", ("bench",)),
    "tests": ("rig", ("dev",)),
}
# Declared but imported by no file of ours, on purpose:
NOT_IMPORTED = {
    "fastapi": "verl imports it on the trainer path without declaring it",
    "uvicorn": "verl imports it on the trainer path without declaring it",
    "pyarrow": "pandas' parquet engine, for the CPU backend's toy dataset",
    "pytest-timeout": "a pytest plugin (the suite's `timeout` option)",
    "verl-async-rm": "the rig depends on the product",
    "verl-async-rm-rig": "the product's rig extra; the rig's dev pulls in its bench extra",
    "verl": "gpu extras: verl's own pinned GPU extras",
}


PYPROJECTS = {"product": ROOT / "pyproject.toml", "rig": ROOT / "rig" / "pyproject.toml"}


def pyproject(distribution: str = "product") -> dict:
    import tomllib  # Python >= 3.11; the suite runs there (ci/install.sh's venv)

    return tomllib.loads(PYPROJECTS[distribution].read_text())["project"]


def requirements(distribution: str = "product") -> dict[str, set[str]]:
    """Extra name ("" for the core) -> canonical distribution names, with self-references resolved; the
    rig's core includes the product's core (it depends on the product)."""
    project = pyproject(distribution)
    raw = {"": project["dependencies"], **project.get("optional-dependencies", {})}
    parsed = {extra: [Requirement(r) for r in reqs] for extra, reqs in raw.items()}
    own = canonicalize_name(project["name"])

    def names(extra: str) -> set[str]:
        out = set()
        for req in parsed[extra]:
            if canonicalize_name(req.name) == own:
                for sub in req.extras:
                    out |= names(sub)
            out.add(canonicalize_name(req.name))
        return out

    found = {extra: names(extra) for extra in parsed}
    if distribution == "rig":
        found[""] |= requirements("product")[""]
    return found


def third_party_imports(path: Path) -> set[str]:
    """Top-level names of absolute imports anywhere in the file (lazy imports inside functions too)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return {name for name in found if name not in sys.stdlib_module_names and name not in OWN}


def scope_of(path: Path) -> tuple[str, tuple[str, ...]]:
    relative = path.relative_to(ROOT).as_posix()
    return next(scope for prefix, scope in SCOPES.items() if relative == prefix or relative.startswith(prefix + "/"))


def source_files() -> list[Path]:
    return sorted(p for top in SCOPES for p in (ROOT / top).rglob("*.py"))


def test_every_third_party_import_is_declared_in_the_right_extra():
    declared = {distribution: requirements(distribution) for distribution in PYPROJECTS}
    distributions = metadata.packages_distributions()
    missing = []
    for path in source_files():
        distribution, extras = scope_of(path)
        allowed = declared[distribution][""].union(*(declared[distribution][extra] for extra in extras))
        for name in sorted(third_party_imports(path)):
            dists = {canonicalize_name(d) for d in distributions.get(name, [])}
            if not dists:
                missing.append(f"{path.relative_to(ROOT)}: imports {name}, which no installed distribution provides")
            elif not dists & allowed:
                extras = sorted(f"{d}:{e or 'core'}" for d in declared for e, names in declared[d].items() if dists & names)
                missing.append(f"{path.relative_to(ROOT)}: imports {name} ({'/'.join(sorted(dists))}), "
                               f"not declared for it (declared in: {extras or 'nothing'})")
    assert not missing, "\n".join(missing)


def test_every_requirement_is_imported_or_has_a_reason():
    distributions = metadata.packages_distributions()
    imported = set()
    for path in source_files():
        for name in third_party_imports(path):
            imported |= {canonicalize_name(d) for d in distributions.get(name, [])}
    declared = set().union(*(names for d in PYPROJECTS for names in requirements(d).values()))
    unexplained = declared - imported - {canonicalize_name(n) for n in NOT_IMPORTED}
    assert not unexplained, f"declared but never imported, and no reason given: {sorted(unexplained)}"
    stale = {canonicalize_name(n) for n in NOT_IMPORTED} & imported - {"verl", "verl-async-rm", "verl-async-rm-rig"}
    assert not stale, f"imported now, drop them from NOT_IMPORTED: {sorted(stale)}"


def test_the_check_would_catch_an_undeclared_import(tmp_path):
    """The scan itself: a lazy import inside a function is found, the standard library is not."""
    probe = tmp_path / "probe.py"
    probe.write_text("import os, json\nfrom collections import deque\ndef f():\n    import scipy.stats\n    from yaml import safe_load\n")
    assert third_party_imports(probe) == {"scipy", "yaml"}
    assert "scipy" in requirements("rig")["bench"] and "scipy" not in requirements("rig")[""]


def test_gpu_extras_are_verls_own_pinned_extras_of_the_supported_release():
    from verl_async_rm.verl_compat import SUPPORTED_VERL

    verl_extras = set(metadata.metadata("verl").get_all("Provides-Extra"))
    for extra in ("gpu", "gpu-megatron"):
        (req,) = [Requirement(r) for r in pyproject()["optional-dependencies"][extra]]
        assert req.name == "verl" and req.extras <= verl_extras and "vllm" in req.extras
        (pin,) = req.specifier
        assert pin.operator == "==" and pin.version == SUPPORTED_VERL[0] == metadata.version("verl")
