"""Reading verl's rollout dumps (``trainer.rollout_data_dir``) in the trainer tests."""

from __future__ import annotations

import json
from pathlib import Path


def dump_rows(path: Path) -> list[dict]:
    """One dump file's rows. verl writes each with ``json.dumps(..., ensure_ascii=False)`` and a "\\n",
    so a sampled response may hold U+2028 or U+0085, on which ``str.splitlines`` also splits (a CI
    run lost four tests to that): split on "\\n" alone."""
    return [json.loads(line) for line in path.read_text(encoding="utf-8").split("\n") if line]
