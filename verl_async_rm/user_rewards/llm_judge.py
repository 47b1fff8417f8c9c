"""LLM-as-a-judge rewards over an OpenAI-compatible chat-completions API, in the recipe's spirit.

Two forms, as in the recipe:
- ``compute_score``: a stateless async function; one client per call (simple, but a new connection
  every time);
- ``JudgeReward``: a class holding one shared ``AsyncOpenAI`` client (connection pool, key, model),
  with ``post_process_scores`` replacing unusable (NaN or negative) scores by the group mean.

Settings come from reward kwargs or the environment: ``base_url`` (``JUDGE_BASE_URL``, then
``OPENAI_BASE_URL``), ``api_key`` (``JUDGE_API_KEY``, then ``OPENAI_API_KEY``; with a ``base_url`` and
no key, ``"EMPTY"``, the placeholder self-hosted OpenAI-compatible servers such as vLLM accept when
started without ``--api-key``), ``model`` (``JUDGE_MODEL``; required: there is no sensible default). The client's own retries are off (``max_retries=0``): the agent owns retries,
backoff, rate limits and Retry-After, for all requests together.

The judge is asked for a single number; a reply that is not one (or a body that is not a
completion) raises ``MalformedJudgeReply``, which the agent retries, and never becomes a silent 0.
"""

from __future__ import annotations

import math
import os

import numpy as np
import openai

from verl_async_rm.errors import RetryableError

SYSTEM_PROMPT = (
    "You are a strict grader. Compare the final answer of the response with the reference answer. "
    "Reply with 1 if they are equal and 0 otherwise. Reply with the number only."
)


class MalformedJudgeReply(RetryableError):
    """The judge answered, but not with a usable score."""

    kind = "malformed"


def build_messages(solution_str: str, ground_truth) -> list[dict]:
    user = f"<response>\n{solution_str}\n</response>\n<reference>\n{ground_truth}\n</reference>"
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": user}]


# Chat-template tokens around each message (role, separators) and before the reply: OpenAI's count
# is 3 per message + 3; Llama 3's and ChatML's templates use 4-5. 8 covers them with room to spare.
TEMPLATE_TOKENS = 8


def prompt_token_bound(messages: list[dict]) -> int:
    """An upper bound of the input tokens ``messages`` cost: byte-level BPE tokenizers (OpenAI's,
    Llama 3's, Qwen's; SentencePiece with byte fallback) never make a token of less than one UTF-8
    byte, so the text's byte length bounds its tokens, whatever the language. (About 4x the true count
    for English: a budget reserves that much more per request in flight, and gets it back when the
    judge reports its usage. Pass a tokenizer-exact ``token_estimator`` to the agent for a tighter fit.)"""
    return sum(len(str(m["content"]).encode("utf-8", "surrogatepass")) + TEMPLATE_TOKENS for m in messages) + TEMPLATE_TOKENS


def estimate_input_tokens(data_source, solution_str, ground_truth, extra_info=None) -> int:
    """What a budget reserves for one request's input: the whole judge prompt (``build_messages``),
    not only the response. The agent reads it as the reward's ``estimate_input_tokens``."""
    return prompt_token_bound(build_messages(solution_str, ground_truth))


def parse_score(content) -> float:
    try:
        score = float(str(content).strip())
    except (TypeError, ValueError):
        raise MalformedJudgeReply(f"judge replied {str(content)[:80]!r}, not a number") from None
    if not math.isfinite(score):
        raise MalformedJudgeReply(f"judge replied a non-finite score {score!r}")
    return score


SELF_HOSTED_API_KEY = "EMPTY"


def client_settings(base_url=None, api_key=None, model=None) -> tuple[str | None, str, str]:
    base_url = base_url or os.environ.get("JUDGE_BASE_URL") or os.environ.get("OPENAI_BASE_URL")
    api_key = api_key or os.environ.get("JUDGE_API_KEY") or os.environ.get("OPENAI_API_KEY")
    if not api_key and base_url:
        api_key = SELF_HOSTED_API_KEY
    model = model or os.environ.get("JUDGE_MODEL")
    if not model:
        raise ValueError("the LLM judge needs a model: reward kwarg model=... or JUDGE_MODEL")
    if not api_key:
        raise ValueError("the LLM judge needs api_key (reward kwarg, JUDGE_API_KEY or OPENAI_API_KEY) or a "
                         "self-hosted base_url")
    return base_url, api_key, model


async def judge_once(client: openai.AsyncOpenAI, model: str, solution_str: str, ground_truth) -> dict:
    try:
        response = await client.chat.completions.create(model=model, messages=build_messages(solution_str, ground_truth))
        content = response.choices[0].message.content
    except openai.APIResponseValidationError as exc:
        raise MalformedJudgeReply(f"judge body is not a chat completion: {exc}") from None
    except (AttributeError, IndexError, KeyError, TypeError, ValueError) as exc:  # truncated JSON, no choices
        raise MalformedJudgeReply(f"judge body is not a chat completion: {type(exc).__name__}: {exc}") from None
    # ``usage``: the judge's token usage, read by the agent for cost figures and budgets (cost.py).
    return {"score": parse_score(content), "judge_reply": content, "usage": response.usage}


async def compute_score(
    data_source, solution_str, ground_truth, extra_info=None, base_url=None, api_key=None, model=None, timeout=60.0
):
    base_url, api_key, model = client_settings(base_url, api_key, model)
    async with openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=timeout) as client:
        return await judge_once(client, model, solution_str, ground_truth)


compute_score.estimate_input_tokens = estimate_input_tokens  # a function reward's estimate (engine/spend.py)


class JudgeReward:
    """Stateful judge: one client shared by every request of the agent."""

    def __init__(self, base_url=None, api_key=None, model=None, timeout=60.0):
        base_url, api_key, self.model = client_settings(base_url, api_key, model)
        self.client = openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=timeout)

    async def compute_score(self, data_source, solution_str, ground_truth, extra_info=None):
        return await judge_once(self.client, self.model, solution_str, ground_truth)

    def estimate_input_tokens(self, data_source, solution_str, ground_truth, extra_info=None) -> int:
        return estimate_input_tokens(data_source, solution_str, ground_truth, extra_info)

    async def aclose(self) -> None:
        """Called by the agent when it closes: release the connection pool on the agent's loop."""
        await self.client.close()

    def post_process_scores(self, scores: list[float]) -> list[float]:
        """Replace NaN or negative scores (a judge's 'could not grade') by the mean of the valid ones."""
        values = np.asarray(scores, dtype=float)
        valid = np.isfinite(values) & (values >= 0)
        fill = values[valid].mean() if valid.any() else 0.0
        return np.where(valid, values, fill).tolist()
