"""What the trainer strategies tell the agent's admission order (``admission_order: deadline``,
engine/admission_order.py) when they submit a batch: that it is validation, and, for verl's own
mini-batches in row order, the first mini-batch that needs each request's group. Only hints given
are passed, so an agent that knows none is called as before."""

from __future__ import annotations

import pytest

from verl_async_rm.integration.settings import settings_from_verl_config
from verl_async_rm.strategies.rewards import BatchRewards, mini_batch_ranks

pytestmark = pytest.mark.quick


class RecordingClient:
    def __init__(self):
        self.calls: list[tuple[int, dict]] = []

    def submit(self, items, group_size=1, **hints) -> str:
        self.calls.append((len(items), hints))
        return f"t{len(self.calls)}"


def rewards(client) -> BatchRewards:
    config = {"reward": {"async_agent": {"extra_keys": []}}, "actor_rollout_ref": {"rollout": {"n": 2}}}
    return BatchRewards(settings_from_verl_config(config), tokenizer=None, client=client)


def requests(uids):
    return [{"solution_str": "x", "uid": uid} for uid in uids]


def test_a_group_goes_with_the_first_mini_batch_that_needs_it():
    # rows in verl's order (balanced: a group's members need not be together), mini-batches of 2 rows
    group_of = ["a", "b", "a", "c", "b", "c"]
    assert mini_batch_ranks([(i,) for i in range(6)], group_of, 2) == [0, 0, 0, 1, 0, 1]
    assert mini_batch_ranks([(5, 4), (1,), (3,)], ["x", "y", "x"], 2) == [1, 0, 1]  # several rows per request


def test_submit_passes_only_the_hints_it_is_given():
    client = RecordingClient()
    rewards(client).submit(requests(["a", "a", "b", "b"]))
    assert client.calls == [(4, {})]  # no hint: the call as before
    client.calls.clear()
    rewards(client).submit(requests(["a", "b", "a", "b"]), validation=True, rows_per_mini_batch=2)
    assert client.calls == [(4, {"validation": True, "ranks": [0, 0, 0, 0]})]
    client.calls.clear()
    rewards(client).submit(requests(["a", "a", "b", "b", "c"]), rows_per_mini_batch=2)
    # one ticket per group size: each with the ranks of its own requests, in order
    assert client.calls == [(1, {"ranks": [2]}), (4, {"ranks": [0, 0, 1, 1]})]
