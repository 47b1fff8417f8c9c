"""The toy reward, for trainer tests that look where the seam's bugs live (loaded by path).

- Fails, deterministically, on about one response in ten (``fails``; ``fail_share`` sets the share):
  a non-retryable error, so the agent's failure policy settles it and some mini-batches carry
  failures while others do not.
- Reports whether it received what verl's naive manager hands a reward (``saw_inputs``): the
  dataset's ``extra_info``, an agent-loop field (``max_global_steps``), ``num_turns`` and
  ``rollout_reward_scores``.
"""

import hashlib

from verl_async_rm_rig.cpu_backend.toy_task import compute_score as toy_score

NAIVE_KEYS = ("split", "max_global_steps", "num_turns", "rollout_reward_scores")


DEFAULT_FAIL_SHARE = 0.1


def fails(solution_str: str, share: float = DEFAULT_FAIL_SHARE) -> bool:
    return hashlib.sha1(solution_str.encode()).digest()[0] < round(256 * share)


def compute_score(data_source, solution_str, ground_truth, extra_info=None, fail=True, fail_share=DEFAULT_FAIL_SHARE, **kwargs):
    if fail and fails(solution_str, fail_share):
        raise ValueError("injected failure")
    extra_info = extra_info or {}
    saw = all(key in extra_info for key in NAIVE_KEYS) and extra_info["max_global_steps"] is not None
    return {"score": toy_score(data_source, solution_str, ground_truth), "saw_inputs": int(saw)}


async def delayed(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    """For the scheduler's tests: the ground truth as the score, after ``extra_info["delay"]`` seconds
    (so groups finish in a chosen order); ``extra_info["fail"]`` raises instead."""
    import asyncio

    await asyncio.sleep(extra_info.get("delay", 0.0))
    if extra_info.get("fail"):
        raise ValueError("injected failure")
    return {"score": float(ground_truth), "verdict": "ok", "part": float(ground_truth)}  # part: a GDPO component


async def slow_some(data_source, solution_str, ground_truth, extra_info=None, slow_share=0.15, slow_s=6.0, **kwargs):
    """``compute_score`` without failures, but about ``slow_share`` of the responses (the same hash as
    the failures) answer after ``slow_s`` seconds: a batch's training starts with some groups still
    out and the rest in hand, so the pipeline meets mini-batches that are scored already. Each
    response is scored as its rollout finishes, so ``slow_s`` must outlast the rest of the step's
    generation and old-log-prob pass (~2.3 s here; 1.5 s let a slow CI machine finish every slow
    answer before training began, and the step then trained whole)."""
    import asyncio

    if fails(solution_str, slow_share):
        await asyncio.sleep(slow_s)
    return compute_score(data_source, solution_str, ground_truth, extra_info, fail=False)
