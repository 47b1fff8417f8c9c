"""The trainer tests read verl's rollout dumps line by line; a sampled response may hold any
character, written raw (verl dumps with ensure_ascii=False)."""

from __future__ import annotations

import json

import pytest

from tests.helpers.rollout_dump import dump_rows

pytestmark = pytest.mark.quick


def test_a_response_holding_unicode_line_breaks_stays_one_row(tmp_path):
    rows = [{"output": "a\u2028b\x85c\x1cd\u2029e"}, {"output": "plain"}, {"output": "\r"}]
    path = tmp_path / "1.jsonl"
    with path.open("w", encoding="utf-8") as f:  # as verl's _write_generations writes them
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    assert len(path.read_text(encoding="utf-8").splitlines()) > len(rows)  # the trap this avoids
    assert dump_rows(path) == rows
