"""A group judge: one chat-completions call grades a whole GRPO group (``compute_group_score``).

Why a group at once: a judge that sees every candidate answer to one prompt can compare them (rank,
pick the best, spot the one that differs) and costs one request per group instead of one per
sample, which matters under a requests-per-minute quota. The agent treats the call as one request
(cap, RPM; TPM by the members' sizes), retries it whole, and fails every member with its failure
kind when it cannot be judged (see ``verl_async_rm/engine/group_judge.py``).

The prompt lists the reference and the candidates as ``<candidate id="i">`` blocks; the judge
replies with one number per candidate, in order (the loopback ``judge_server`` answers this form:
``default_judge``). A reply with the wrong count of numbers raises ``MalformedJudgeReply``, which
the agent retries; it never becomes a silent 0. Settings as ``llm_judge.JudgeReward``: ``base_url``,
``api_key``, ``model`` (reward kwargs or ``JUDGE_*`` environment variables).
"""

from __future__ import annotations

import math
import re

import openai

from verl_async_rm.errors import RewardFunctionError
from verl_async_rm.user_rewards.llm_judge import MalformedJudgeReply, client_settings, prompt_token_bound

SYSTEM_PROMPT = (
    "You are a strict grader. For each candidate, compare its final answer with the reference answer. "
    "Reply with one number per candidate, in candidate order, separated by spaces: 1 if equal, else 0."
)
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def build_group_messages(group) -> list[dict]:
    references = {str(member.ground_truth) for member in group}
    if len(references) != 1:  # a GRPO group answers one prompt: mixed references mean mixed groups
        raise RewardFunctionError(f"a group's members have different references {sorted(references)[:3]}: uids mixed up?")
    candidates = "\n".join(f'<candidate id="{i}">\n{member.solution_str}\n</candidate>' for i, member in enumerate(group))
    user = f"<reference>\n{references.pop()}\n</reference>\n{candidates}"
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": user}]


def parse_verdicts(content, expected: int) -> list[float]:
    numbers = [float(n) for n in _NUMBER.findall(str(content))]
    if len(numbers) != expected or not all(math.isfinite(n) for n in numbers):
        raise MalformedJudgeReply(f"judge replied {str(content)[:80]!r}: not {expected} numbers, one per candidate")
    return numbers


class GroupJudgeReward:
    """One shared ``AsyncOpenAI`` client; one call per group."""

    def __init__(self, base_url=None, api_key=None, model=None, timeout=60.0):
        base_url, api_key, self.model = client_settings(base_url, api_key, model)
        self.client = openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=timeout)

    async def compute_group_score(self, group) -> list[dict]:
        messages = build_group_messages(group)
        try:
            response = await self.client.chat.completions.create(model=self.model, messages=messages)
            content = response.choices[0].message.content
        except openai.APIResponseValidationError as exc:
            raise MalformedJudgeReply(f"judge body is not a chat completion: {exc}") from None
        except (AttributeError, IndexError, KeyError, TypeError, ValueError) as exc:  # truncated JSON, no choices
            raise MalformedJudgeReply(f"judge body is not a chat completion: {type(exc).__name__}: {exc}") from None
        verdicts = parse_verdicts(content, len(group))
        return [{"score": v, "judge_reply": content} for v in verdicts]

    def estimate_input_tokens(self, group) -> int:
        """What a budget reserves for one call's input: the whole prompt (``llm_judge.prompt_token_bound``)."""
        return prompt_token_bound(build_group_messages(group))

    async def aclose(self) -> None:
        await self.client.close()
