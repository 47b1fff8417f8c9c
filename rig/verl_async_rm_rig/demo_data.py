"""A self-contained demo set: GSM8K-style arithmetic problems with several candidate responses each.

The installed package must not depend on files outside it, so the demo makes its own data. Each
problem gets ``group_size`` responses (a GRPO group): some right, some with an arithmetic slip, in
the answer formats models write, so the group's scores vary.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

FORMATS = ("#### {a}", "The answer is {a}.", "\\boxed{{{a}}}", "A: {a}", "So she has {a} left.")


def make_responses(problems: int, group_size: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for p in range(problems):
        apples, eaten, bought = rng.randint(10, 99), rng.randint(1, 9), rng.randint(1, 30)
        truth = apples - eaten + bought
        question = f"Ana has {apples} apples, eats {eaten} and buys {bought} more. How many apples does she have?"
        for k in range(group_size):
            answer = truth if rng.random() < 0.6 else truth + rng.choice([-10, -1, 1, 2])
            work = f"{apples} - {eaten} = {apples - eaten}. {apples - eaten} + {bought} = {answer}."
            rows.append(
                {
                    "data_source": "demo/arithmetic",
                    "prompt": question,
                    "solution_str": f"{work} {rng.choice(FORMATS).format(a=answer)}",
                    "ground_truth": str(truth),
                    "uid": f"q{p}",
                    "extra_info": {"problem": p, "sample": k},
                }
            )
    return rows


def write_jsonl(rows: list[dict], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    return path
