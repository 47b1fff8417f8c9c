"""Toy task "letter case", in verl's RL parquet format, that a tiny random model can learn on CPU.

Each prompt asks for letters of one case ("lower" or "upper") followed by a few filler words.
The reward is the fraction of response characters of the asked case (over at least
``MIN_CHARS`` characters, so an empty or one-letter answer cannot score high).

Why this task: with GSM8K's exact-match reward a random model scores 0 on every sample, every
GRPO group has zero variance, advantages are 0 and nothing trains. Here a random byte-level
model already emits ~8% letters of the asked case, so rewards inside a group differ from step 0,
and raising them only needs the policy to shift probability mass towards 26 tokens (then to
condition on the prompt), which a ~80k-parameter model does within a few dozen steps.

This file is also verl's ``custom_reward_function.path``: verl loads it by file path, so the
top level imports only the standard library.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import random

DATA_SOURCE = "verl_async_rm/letter_case"
MIN_CHARS = 8
INSTRUCTIONS = {
    "lower": "answer in lowercase letters:",
    "upper": "ANSWER IN UPPERCASE LETTERS:",
}
_WORDS = (
    "apple river stone cloud green tiger music paper light storm ocean forest silver candle "
    "bridge garden rocket window yellow marble pepper violet winter summer"
).split()


def score_text(text: str, target: str, min_chars: int = MIN_CHARS) -> float:
    if target == "lower":
        hits = sum(1 for ch in text if "a" <= ch <= "z")
    elif target == "upper":
        hits = sum(1 for ch in text if "A" <= ch <= "Z")
    else:
        raise ValueError(f"unknown target case {target!r}")
    return hits / max(len(text), min_chars)


def compute_score(data_source, solution_str, ground_truth, extra_info=None, min_chars: int = MIN_CHARS, **kwargs):
    """verl reward function (``reward.custom_reward_function.name=compute_score``)."""
    return float(score_text(solution_str, str(ground_truth), int(min_chars)))


def _prompt(rng: random.Random, target: str) -> str:
    words = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(1, 3)))
    return f"{INSTRUCTIONS[target]} {words if target == 'lower' else words.upper()}"


def make_rows(n: int, split: str, seed: int) -> list[dict]:
    rng = random.Random(f"{seed}-{split}")
    rows = []
    for i in range(n):
        target = "lower" if i % 2 == 0 else "upper"
        rows.append(
            {
                "data_source": DATA_SOURCE,
                "prompt": [{"role": "user", "content": _prompt(rng, target)}],
                "ability": "toy",
                "reward_model": {"style": "rule", "ground_truth": target},
                "extra_info": {"split": split, "index": i},
            }
        )
    return rows


def write_dataset(out_dir: str, n_train: int = 256, n_val: int = 16, seed: int = 0) -> tuple[str, str]:
    """Write ``train.parquet`` and ``val.parquet``; returns their paths."""
    import pandas as pd

    os.makedirs(out_dir, exist_ok=True)
    paths = []
    for split, n in (("train", n_train), ("val", n_val)):
        path = os.path.join(out_dir, f"{split}.parquet")
        pd.DataFrame(make_rows(n, split, seed)).to_parquet(path)
        paths.append(path)
    return paths[0], paths[1]


def corpus_for_tokenizer() -> list[str]:
    """Text the tokenizer's BPE merges are trained on (instructions and words, both cases)."""
    rng = random.Random(0)
    lines = [_prompt(rng, t) for t in ("lower", "upper") for _ in range(200)]
    return lines + ["user", "assistant", "system"]


def simulated_latency(solution_str: str, latency_lo: float, latency_hi: float) -> float:
    """Uniform in [lo, hi], drawn from the response text itself, so every run that produces the same
    response waits the same time (a scaled analog of the recipe's uniform 1-40 s)."""
    if latency_hi <= 0:
        return 0.0
    digest = hashlib.sha1(solution_str.encode()).digest()
    return latency_lo + (latency_hi - latency_lo) * int.from_bytes(digest[:8], "big") / 2**64


async def compute_score_with_latency(
    data_source, solution_str, ground_truth, extra_info=None, latency_lo: float = 0.0, latency_hi: float = 0.0,
    min_chars: int = MIN_CHARS, **kwargs,
):
    """The toy reward behind a simulated remote call (``reward_kwargs``: latency_lo, latency_hi seconds)."""
    await asyncio.sleep(simulated_latency(solution_str, float(latency_lo), float(latency_hi)))
    return compute_score(data_source, solution_str, ground_truth, extra_info, min_chars=min_chars)
