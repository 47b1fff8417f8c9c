"""A v1 agent loop that fails some rollout sessions, and a judge reward whose scores name the sample
they belong to, for the trainer tests of ``async_agent`` on verl's own trainer modes (loaded by verl's
Ray workers: the loop through ``actor_rollout_ref.rollout.agent.agent_loop_config_path``, the reward
by path; the trainer runs with the repository on PYTHONPATH).

- ``ProbeAgentLoop``: verl's single-turn loop; session ``FAILING_SESSION`` of every prompt whose
  dataset index is even raises, before generating (index % 4 == 0) or after (index % 4 == 2), so
  half the groups lose a session and never hand its sample to the reward. Every output carries
  ``probe`` = ``{uid}_{session}`` in its extra fields (the reward receives it in ``extra_info``;
  verl's TransferQueue key of the output is ``{probe}_0``).
- ``ProbeJudge``: asks the loopback judge (real HTTP, so the judge counts requests in flight), logs
  the sample's probe (and the Ray actor it ran in) once the judge answered, raises for about one probe in ten (non-retryable: the
  failure policy decides), and scores ``identity(probe)``: a score that names its sample, so a test
  can tell from a trained row's score, or from the scores a group hook receives, whose answer it is.
  ``post_process_scores`` logs each group it sees.
"""

from __future__ import annotations

import hashlib
import json

from verl.experimental.agent_loop.single_turn_agent_loop import SingleTurnAgentLoop

NAME = "session_probe"
FAILING_SESSION = 1
FAIL_SHARE = 0.1
VALIDATION = "val:"


def failing(index: int, session: int) -> bool:
    return index % 2 == 0 and session == FAILING_SESSION


def identity(probe: str) -> float:
    """A score in [0, 1) that names the sample (2**-32 apart: distinct for every probe of a run)."""
    return int(hashlib.sha1(probe.encode()).hexdigest()[:8], 16) / 2**32


def reward_fails(probe: str) -> bool:
    return hashlib.sha1(f"fail:{probe}".encode()).digest()[0] < round(256 * FAIL_SHARE)


class ProbeAgentLoop(SingleTurnAgentLoop):
    async def run(self, sampling_params, **kwargs):
        index, session = int(kwargs["extra_info"]["index"]), int(kwargs["session_id"])
        if failing(index, session) and index % 4 == 0:
            raise RuntimeError(f"injected session failure before generation (prompt {index}, session {session})")
        output = await super().run(sampling_params, **kwargs)
        if failing(index, session):
            raise RuntimeError(f"injected session failure after generation (prompt {index}, session {session})")
        output.extra_fields["probe"] = f"{kwargs['uid']}_{session}"
        return output


class ProbeJudge:
    def __init__(self, call_log: str, hook_log: str, base_url: str, model: str = "judge-stub"):
        from verl_async_rm.user_rewards.llm_judge import JudgeReward

        self.judge = JudgeReward(base_url=base_url, api_key="x", model=model, timeout=30.0)
        self.call_log, self.hook_log = call_log, hook_log

    async def compute_score(self, data_source, solution_str, ground_truth, extra_info=None):
        from verl_async_rm.user_rewards.llm_judge import judge_once

        # validation runs verl's default loop on the toy validation set: its samples are named by index
        probe = extra_info.get("probe") or f"{VALIDATION}{extra_info['index']}"
        verdict = await judge_once(self.judge.client, self.judge.model, solution_str, ground_truth)
        import ray

        actor = ray.get_runtime_context().get_actor_name() if ray.is_initialized() else None  # who scored it
        with open(self.call_log, "a") as f:
            f.write(json.dumps({"probe": probe, "failed": reward_fails(probe), "actor": actor}) + "\n")
        if reward_fails(probe):
            raise ValueError(f"injected reward failure ({probe})")
        return {"score": identity(probe), "usage": verdict["usage"]}

    def estimate_input_tokens(self, data_source, solution_str, ground_truth, extra_info=None) -> int:
        """What a budget reserves: the shipped judge's bound of the prompt it sends (the same call)."""
        from verl_async_rm.user_rewards.llm_judge import estimate_input_tokens

        return estimate_input_tokens(data_source, solution_str, ground_truth, extra_info)

    def post_process_scores(self, scores):
        with open(self.hook_log, "a") as f:
            f.write(json.dumps(list(scores)) + "\n")
        return scores

    async def aclose(self) -> None:
        await self.judge.aclose()


def write_config(path: str) -> str:
    with open(path, "w") as f:
        f.write(f"- name: {NAME}\n  _target_: {__name__}.ProbeAgentLoop\n")
    return path


def write_dataset(source: str, path: str) -> str:
    """The toy training set, every prompt on this loop."""
    import pandas as pd

    frame = pd.read_parquet(source)
    frame["agent_name"] = NAME
    frame.to_parquet(path)
    return path
