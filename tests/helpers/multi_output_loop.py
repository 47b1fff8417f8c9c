"""A v1 agent loop with the shapes verl allows and the strategies must score as verl does
(selected through ``actor_rollout_ref.rollout.agent.agent_loop_config_path``; imported by Ray
workers, so the trainer runs with the repository on PYTHONPATH):

- every session returns two outputs (two samples of the same prompt): verl scores the final one and
  copies its score to the first;
- the session ``FAILING_SESSION`` of every prompt whose dataset index is ``FAILING_INDEX`` mod 4
  raises, so that prompt's group is sampled with its other sessions only;
- the dataset sets ``__rollout_n__`` per prompt (``sessions_for``), so groups differ in size;
- written with ``rowless=True``, the dataset marks every prompt whose index is ``ROWLESS_INDEX``
  mod 4 (``FAIL_EVERY_SESSION`` in its ``extra_info``): every session of it raises, so verl samples
  it with no trajectory at all (as its sync sampler keeps such a prompt by default).
"""

from __future__ import annotations

from verl.experimental.agent_loop.single_turn_agent_loop import SingleTurnAgentLoop

NAME = "multi_output"
FAILING_INDEX, FAILING_SESSION = 1, 1
ROWLESS_INDEX = 3
FAIL_EVERY_SESSION = "fail_every_session"


def sessions_for(index: int) -> int:
    return 2 if index % 3 == 0 else 4


def failing(index: int, session_id: int) -> bool:
    return index % 4 == FAILING_INDEX and session_id == FAILING_SESSION


class MultiOutputAgentLoop(SingleTurnAgentLoop):
    async def run(self, sampling_params, **kwargs):
        index, session = int(kwargs["extra_info"]["index"]), int(kwargs.get("session_id", 0))
        if kwargs["extra_info"].get(FAIL_EVERY_SESSION):
            raise RuntimeError(f"injected failure of every session (prompt {index}, session {session})")
        if failing(index, session):
            raise RuntimeError(f"injected session failure (prompt {index}, session {session})")
        first = await super().run(sampling_params, **kwargs)
        final = await super().run(sampling_params, **kwargs)
        return [first, final]


def write_config(path: str) -> str:
    with open(path, "w") as f:
        f.write(f"- name: {NAME}\n  _target_: {__name__}.MultiOutputAgentLoop\n")
    return path


def write_dataset(source: str, path: str, rowless: bool = False) -> str:
    """The toy training set, every prompt on this loop with its own session count; ``rowless``:
    every session of each ``ROWLESS_INDEX`` mod 4 prompt fails."""
    import pandas as pd

    frame = pd.read_parquet(source)
    frame["agent_name"] = NAME
    frame["__rollout_n__"] = [sessions_for(int(info["index"])) for info in frame["extra_info"]]
    if rowless:
        frame["extra_info"] = [{**info, FAIL_EVERY_SESSION: int(info["index"]) % 4 == ROWLESS_INDEX}
                               for info in frame["extra_info"]]
    frame.to_parquet(path)
    return path
