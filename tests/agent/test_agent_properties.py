"""Properties of the real agent (threads, event loop, timing) under random completion orders."""

from __future__ import annotations

import asyncio
import threading

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from verl_async_rm.agent import RewardAgent

pytestmark = pytest.mark.quick


class EncodedReward:
    """Score = ticket_tag * 1000 + index, so a sample returned with another's score, or under another
    ticket, is caught. Latency comes from the item: any completion order the test draws."""

    def __init__(self):
        self.hook_calls: list[list[float]] = []
        self.lock = threading.Lock()

    async def compute_score(self, data_source, solution_str, ground_truth, extra_info=None):
        await asyncio.sleep(extra_info["delay"])
        return float(ground_truth)

    def post_process_scores(self, scores):
        with self.lock:
            self.hook_calls.append(list(scores))
        return [s + 0.5 for s in scores]  # visible proof that the hook's output is what get returns


@st.composite
def scenarios(draw):
    tickets = []
    for tag in range(draw(st.integers(1, 3))):
        group_size = draw(st.integers(1, 4))
        groups = draw(st.integers(0, 6))
        n = group_size * groups
        layout = draw(st.permutations(list(range(n))))
        finish_rank = draw(st.permutations(list(range(n))))
        chunk = draw(st.integers(1, 3)) * group_size
        items = [
            {
                "index": index,
                "solution_str": "x",
                "ground_truth": tag * 1000 + index,
                "uid": f"t{tag}-g{position // group_size}",
                "extra_info": {"delay": finish_rank[position] * 0.002},
            }
            for position, index in enumerate(layout)
        ]
        tickets.append((tag, group_size, chunk, items))
    return tickets


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_interleaved_tickets_never_mix_and_return_every_sample_once(scenario):
    reward = EncodedReward()
    with RewardAgent(reward, {"max_concurrency": 16}) as agent:
        submitted = [(tag, gs, chunk, items, agent.submit(items, gs)) for tag, gs, chunk, items in scenario]
        seen: dict[int, list[int]] = {tag: [] for tag, *_ in scenario}
        # Drain tickets alternately, a chunk at a time, as one-step off-policy would.
        active = list(submitted)
        while active:
            for entry in list(active):
                tag, gs, chunk_size, items, ticket = entry
                chunk = agent.get(ticket, chunk_size, timeout=30)
                if not len(chunk):
                    active.remove(entry)
                    continue
                uid_of = {it["index"]: it["uid"] for it in items}
                assert chunk.indices == sorted(chunk.indices)
                assert len(chunk) == min(chunk_size, len(items) - len(seen[tag]))
                assert chunk.scores == [tag * 1000 + i + 0.5 for i in chunk.indices]  # own score, own ticket
                uids = [uid_of[i] for i in chunk.indices]
                assert all(uids.count(u) == gs for u in uids)  # whole groups only
                seen[tag] += chunk.indices
        for tag, gs, chunk, items, ticket in submitted:
            assert sorted(seen[tag]) == sorted(it["index"] for it in items)  # every sample exactly once
    # the hook ran once per group, on that group's scores in sample order
    expected = sorted(
        [tag * 1000 + i for i in sorted(it["index"] for it in items if it["uid"] == uid)]
        for tag, gs, chunk, items in scenario
        for uid in {it["uid"] for it in items}
    )
    assert sorted(reward.hook_calls) == [[float(s) for s in group] for group in expected]
