"""Print the README's result tables from the committed JSON (paste them into README.md after
regenerating a result; tests/test_e2e_report.py checks the README quotes them verbatim).
    python bench/readme_tables.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.agent_throughput import markdown as agent_markdown  # noqa: E402
from bench.backpressure import markdown as backpressure_markdown  # noqa: E402
from bench.e2e import markdown as e2e_markdown  # noqa: E402
from bench.fault_suite import markdown as fault_markdown  # noqa: E402
from verl_async_rm.demo import markdown_table as demo_markdown  # noqa: E402

RESULTS = ROOT / "bench" / "results"


def tables() -> dict[str, str]:
    return {
        "demo": demo_markdown(json.loads((RESULTS / "demo" / "demo.json").read_text())["table"]),
        "e2e": e2e_markdown(json.loads((RESULTS / "e2e.json").read_text())),
        "agent": agent_markdown(json.loads((RESULTS / "agent_throughput.json").read_text())),
        "backpressure": backpressure_markdown(json.loads((RESULTS / "backpressure.json").read_text())),
        "fault_suite": fault_markdown(json.loads((RESULTS / "fault_suite.json").read_text())),
    }


if __name__ == "__main__":
    for name, text in tables().items():
        print(f"<!-- {name} -->\n{text}")
