"""GSM8K in verl's RL parquet format (the shape verl's own GSM8K examples train on):
``$DATA_DIR/train.parquet`` and ``$DATA_DIR/test.parquet``.

    python examples/gpu/prepare_gsm8k.py --out ~/data/gsm8k                 # from the Hugging Face hub
    python examples/gpu/prepare_gsm8k.py --out ~/data/gsm8k --jsonl-dir DIR   # DIR: a local train.jsonl/test.jsonl

Each row: the question plus an instruction to end with "#### <answer>" as the user prompt,
``data_source="openai/gsm8k"``, ``reward_model.ground_truth`` = the reference's final number.
"""

from __future__ import annotations

import argparse
import json
import os

INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'
DATA_SOURCE = "openai/gsm8k"


def final_answer(solution: str) -> str:
    """The number after the reference solution's last ``####``, without thousands separators."""
    if "####" not in solution:
        raise ValueError(f"GSM8K solution without '####': {solution[-80:]!r}")
    return solution.rsplit("####", 1)[1].strip().replace(",", "")


def to_row(example: dict, split: str, index: int) -> dict:
    return {
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": f"{example['question']} {INSTRUCTION}"}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": final_answer(example["answer"])},
        "extra_info": {"split": split, "index": index, "question": example["question"], "answer": example["answer"]},
    }


def load_split(split: str, jsonl_dir: str | None) -> list[dict]:
    if jsonl_dir:
        with open(os.path.join(jsonl_dir, f"{split}.jsonl")) as f:
            return [json.loads(line) for line in f if line.strip()]
    from datasets import load_dataset  # verl's dependency

    return list(load_dataset("openai/gsm8k", "main", split=split))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=os.path.expanduser("~/data/gsm8k"), help="folder for the parquet files")
    parser.add_argument("--jsonl-dir", help="read train.jsonl/test.jsonl from here instead of the hub")
    args = parser.parse_args(argv)
    import pandas as pd

    os.makedirs(args.out, exist_ok=True)
    for split in ("train", "test"):
        rows = [to_row(example, split, i) for i, example in enumerate(load_split(split, args.jsonl_dir))]
        path = os.path.join(args.out, f"{split}.parquet")
        pd.DataFrame(rows).to_parquet(path)
        print(f"{path}: {len(rows)} rows")


if __name__ == "__main__":
    main()
