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
top level imports only the standard library and this package's pure judge model (:mod:`.latency`,
by absolute name: a file loaded by path has no package for a relative import).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import time

from verl_async_rm_rig.cpu_backend.latency import JudgeModel, SimulatedJudgeError

DATA_SOURCE = "verl_async_rm/letter_case"
MIN_CHARS = 8
# A file to which every simulated judge call appends {"start", "end" (Unix s), "outcome"}: the judge's
# access log, from which the demo draws rewards in flight. Set by the demo in the trainer's environment.
JUDGE_LOG_ENV = "VERL_ASYNC_RM_JUDGE_LOG"
INSTRUCTIONS = {
    "lower": "answer in lowercase letters:",
    "upper": "ANSWER IN UPPERCASE LETTERS:",
}
_WORDS = ["apple", "river", "stone", "cloud", "green", "tiger", "music", "paper", "light", "storm", "ocean", "forest", "silver", "candle", "bridge", "garden", "rocket", "window", "yellow", "marble", "pepper", "violet", "winter", "summer"]


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
    return JudgeModel(latency_lo=latency_lo, latency_hi=latency_hi).latency(solution_str)


async def compute_score_with_latency(
    data_source, solution_str, ground_truth, extra_info=None, min_chars: int = MIN_CHARS, **kwargs,
):
    """The toy reward behind a simulated remote judge.

    Reward kwargs (see :mod:`verl_async_rm_rig.cpu_backend.latency`): ``latency_model`` (uniform |
    lognormal), ``latency_lo``/``latency_hi`` or ``latency_p50``/``latency_p99`` seconds, ``hang_prob``,
    ``hang_s``, ``fail_prob``, ``latency_seed``. A bad parameter raises ValueError on the first call.
    With ``VERL_ASYNC_RM_JUDGE_LOG`` set, each call is appended to that file when it ends.
    """
    draw = JudgeModel.from_kwargs(kwargs).draw(solution_str)
    started, outcome = time.time(), "cancelled"  # a hang ends when the agent's timeout cancels it
    try:
        await asyncio.sleep(draw.latency_s)
        if draw.outcome == "fail":
            outcome = "fail"
            raise SimulatedJudgeError(f"simulated judge error after {draw.latency_s:.3f} s")
        # A "hang" sleeps hang_s (an hour by default) above; if it ever wakes, it answers late.
        score = compute_score(data_source, solution_str, ground_truth, extra_info, min_chars=min_chars)
        outcome = "ok"
        return score
    finally:
        _log_call(started, outcome)


def _log_call(started: float, outcome: str) -> None:
    path = os.environ.get(JUDGE_LOG_ENV)
    if path:
        # One short line per write with O_APPEND: concurrent writers (threads, processes) never interleave.
        line = json.dumps({"start": started, "end": time.time(), "outcome": outcome}) + "\n"
        with open(path, "a") as f:
            f.write(line)
