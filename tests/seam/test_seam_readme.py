"""The README's strategy sections name the tests that keep each statement true: every test they
name exists (a renamed or deleted test fails here, not silently in the README)."""

from __future__ import annotations

import re

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.quick
SECTIONS = ("## Trainer strategies: hiding the reward wait", "## What differs from stock verl")


def section(text: str, title: str) -> str:
    start = text.index(title)
    end = text.find("\n## ", start + len(title))
    return text[start: end if end != -1 else len(text)]


def test_every_test_the_strategy_sections_name_exists():
    readme = (ROOT / "README.md").read_text()
    named = set()
    for title in SECTIONS:
        named |= set(re.findall(r"\b(test_[a-z0-9_]+)\b(?!\.py)", section(readme, title)))  # not file names
    defined = set()
    for path in (ROOT / "tests").rglob("test_*.py"):
        defined |= set(re.findall(r"^def (test_[a-z0-9_]+)", path.read_text(), flags=re.M))
    assert len(named) >= 10
    assert sorted(named - defined) == []
