"""The quick tier's rule, enforced by tests/conftest.py: a quick test (or a test file collected for ``-m quick``)
that imports verl, torch or Ray fails, naming itself; the same import in a local test is fine."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.local

# A module standing in for verl: registering it in sys.modules is what an import does, without paying for one.
TESTS = '''
import sys, types
import pytest
{module_level}

@pytest.mark.quick
def test_clean():
    pass

@pytest.mark.quick
def test_brings_verl():
    sys.modules["verl"] = types.ModuleType("verl")

@pytest.mark.local
def test_local_may():
    sys.modules["torch"] = types.ModuleType("torch")
'''


def run(tmp_path, marks: str, module_level: str = "") -> subprocess.CompletedProcess:
    (tmp_path / "test_probe.py").write_text(TESTS.format(module_level=module_level))
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "tests.conftest", "-p", "no:cacheprovider", "-n", "0",
                           "-rA", "-m", marks, str(tmp_path / "test_probe.py")],
                          capture_output=True, text=True, timeout=300, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})


def test_a_quick_test_that_imports_verl_fails_by_name_and_a_local_one_may(tmp_path):
    result = run(tmp_path, "quick or local")
    outcomes = {line.split("::")[-1].split()[0]: line.split()[0] for line in result.stdout.splitlines()
                if line.startswith(("PASSED", "FAILED")) and "test_probe.py::" in line}
    assert outcomes == {"test_clean": "PASSED", "test_brings_verl": "FAILED", "test_local_may": "PASSED"}, result.stdout[-3000:]
    assert "a quick test imported ['verl']" in result.stdout


def test_a_test_file_that_imports_torch_when_collected_fails_the_quick_collection(tmp_path):
    result = run(tmp_path, "quick", module_level='sys.modules["torch"] = types.ModuleType("torch")')
    assert result.returncode != 0
    assert "imports ['torch'] when collected" in result.stdout + result.stderr, result.stdout[-3000:]
