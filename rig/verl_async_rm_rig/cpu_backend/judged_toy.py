"""The toy task's reward behind the loopback HTTP judge: bench/e2e.py's ``judge_real`` regime.

Where ``toy_task.compute_score_with_latency`` simulates a judge in process, this reward asks a real
HTTP server (:mod:`verl_async_rm_rig.judge_server`: its token bucket answers 429 with Retry-After, it
injects 500s and hangs, its latency is lognormal) through the real ``openai.AsyncOpenAI`` client,
exactly as the shipped LLM judge does (``verl_async_rm/user_rewards/llm_judge.py``: its messages, its
reply parsing, ``max_retries=0``: whoever calls the reward owns retries, rate limits and timeouts).
The server judges with :func:`toy_judge`, the toy task's own score of the response, so every reward
manager gets the right score or a failure, never another rule.

Every call appends one line to the judge log (``toy_task.JUDGE_LOG_ENV``, as the simulated judge
does): start, end, outcome (``ok``, ``429``, ``500``, ``timeout``, ``cancelled``, ...), the dataset
split, and a key of (ground truth, response) that bench/e2e.py joins with verl's rollout dump to
count the samples trained on a failed call's 0.

verl loads this file by path (``custom_reward_function.path``): its imports are absolute.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import time
import weakref

import openai

from verl_async_rm.user_rewards.llm_judge import MalformedJudgeReply, judge_once
from verl_async_rm_rig.cpu_backend.toy_task import JUDGE_LOG_ENV, MIN_CHARS, score_text

JUDGE_MODEL = "toy-judge"
API_KEY = "loopback"  # the loopback server checks none; the client needs one
_RESPONSE_OPEN, _RESPONSE_CLOSE = "<response>\n", "\n</response>\n<reference>\n"
_REFERENCE_CLOSE = "\n</reference>"


def sample_key(solution_str: str, ground_truth) -> str:
    """What a judge call and a rollout-dump row share: the response and its ground truth."""
    return hashlib.sha1(f"{ground_truth}\x00{solution_str}".encode()).hexdigest()[:16]


def parse_judge_prompt(content: str) -> tuple[str, str] | None:
    """(response, reference) of ``llm_judge.build_messages``'s user message, byte for byte (the
    response may hold anything, newlines included: only the template's own frame is cut), or None."""
    if not content.startswith(_RESPONSE_OPEN) or not content.endswith(_REFERENCE_CLOSE):
        return None
    middle = content[len(_RESPONSE_OPEN):-len(_REFERENCE_CLOSE)]
    cut = middle.rfind(_RESPONSE_CLOSE)  # the reference ("lower"/"upper") never holds the frame
    if cut < 0:
        return None
    return middle[:cut], middle[cut + len(_RESPONSE_CLOSE):]


def toy_judge(messages: list[dict]) -> str:
    """The loopback server's rule for the toy task: the toy score of the response, as a number the
    LLM judge's parser reads back exactly (``repr`` of a float round-trips)."""
    users = [m for m in messages if isinstance(m, dict) and m.get("role") == "user"]
    parsed = parse_judge_prompt(users[-1].get("content") or "") if users else None
    if parsed is None:
        raise ValueError("not a toy-task judge prompt")
    response, reference = parsed
    return repr(float(score_text(response, reference.strip(), MIN_CHARS)))


# One client per (event loop, server, timeout): its connection pool belongs to the loop that made it.
# verl's rate_limited manager calls on its worker's loop; the agent on its own loop thread.
_clients: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict]" = weakref.WeakKeyDictionary()


def _client(base_url: str, timeout: float) -> openai.AsyncOpenAI:
    per_loop = _clients.setdefault(asyncio.get_running_loop(), {})
    key = (base_url, float(timeout))
    if key not in per_loop:
        per_loop[key] = openai.AsyncOpenAI(base_url=base_url, api_key=API_KEY, max_retries=0, timeout=float(timeout))
    return per_loop[key]


def outcome_of(error: BaseException | None) -> str:
    """The judge log's name for how a call ended."""
    if error is None:
        return "ok"
    if isinstance(error, asyncio.CancelledError):
        return "cancelled"  # a caller's timeout (verl's rate_limited: asyncio.wait_for; the agent's)
    if isinstance(error, openai.APITimeoutError):
        return "timeout"
    if isinstance(error, openai.APIStatusError):
        return str(error.status_code)
    if isinstance(error, MalformedJudgeReply):
        return "malformed"
    return type(error).__name__


async def compute_score_via_judge(data_source, solution_str, ground_truth, extra_info=None, base_url=None,
                                  timeout: float = 60.0, model: str = JUDGE_MODEL, **kwargs):
    """verl reward function: the toy score, from the loopback judge at ``base_url`` (reward kwarg)."""
    if not base_url:
        raise ValueError("compute_score_via_judge needs the judge server's base_url (reward kwarg base_url)")
    started, error = time.time(), None
    try:
        result = await judge_once(_client(base_url, timeout), model, solution_str, ground_truth)
        return float(result["score"])
    except BaseException as exc:  # logged, then raised unchanged: the caller's retry policy decides
        error = exc
        raise
    finally:
        _log_call(started, outcome_of(error), solution_str, ground_truth, extra_info)


def _log_call(started: float, outcome: str, solution_str: str, ground_truth, extra_info) -> None:
    path = os.environ.get(JUDGE_LOG_ENV)
    if not path:
        return
    split = extra_info.get("split") if isinstance(extra_info, dict) else None
    line = json.dumps({"start": started, "end": time.time(), "outcome": outcome, "split": split,
                       "key": sample_key(solution_str, ground_truth)}) + "\n"
    with open(path, "a") as f:  # one short line per write with O_APPEND: writers never interleave
        f.write(line)
