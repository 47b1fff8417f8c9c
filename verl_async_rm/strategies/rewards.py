"""A generated batch's rewards as one agent ticket: submit the moment generation ends, take whole
groups back (all, or a mini-batch's worth) as verl's token-level reward tensors."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Optional

import numpy as np
import torch

from verl_async_rm.integration.client import AgentClient
from verl_async_rm.integration.decode import decode_requests, group_size_of, valid_response_lengths
from verl_async_rm.integration.settings import settings_from_verl_config
from verl_async_rm.outcome import ScoredChunk
from verl_async_rm.strategies.timing import RewardTiming


@dataclass
class PendingRewards:
    ticket: int
    samples: int
    group_size: int
    timing: RewardTiming
    latencies: list[float] = field(default_factory=list)
    failed: int = 0
    keys: Optional[list] = None  # v1: request i of the ticket is the TransferQueue key keys[i]


class BatchRewards:
    def __init__(self, config, tokenizer):
        self.settings = settings_from_verl_config(config)
        self.client = AgentClient(self.settings)
        self.tokenizer = tokenizer

    def submit(self, batch, keys: Optional[list] = None) -> PendingRewards:
        requests = decode_requests(batch, self.tokenizer, self.settings.reward_fn_key)
        group_size = group_size_of(requests)
        submitted_at = time.monotonic()
        ticket = self.client.submit(requests, group_size)
        return PendingRewards(ticket, len(requests), group_size, RewardTiming(submitted_at), keys=keys)

    def take(self, pending: PendingRewards, n: int | None = None) -> ScoredChunk:
        start = time.monotonic()
        chunk = self.client.take(pending.ticket, n)
        pending.timing.blocked += time.monotonic() - start
        pending.timing.settled_at.append(pending.timing.submitted_at + chunk.ready_after)
        pending.latencies += [x for x in chunk.latencies if x is not None]
        pending.failed += int(sum(chunk.extra_info.get("reward_failed", [])))
        return chunk

    def cancel(self, pending: PendingRewards) -> int:
        """A batch that will never be trained on (generated past the last step): stop its calls."""
        return self.client.cancel(pending.ticket)


def attach_rewards(batch, chunk: ScoredChunk) -> None:
    """Put the chunk's scores on the last valid response token (``token_level_scores``) of ``batch``,
    whose rows are the chunk's samples in the chunk's order, and its extra info beside them."""
    lengths = valid_response_lengths(batch)
    scores = torch.zeros_like(batch.batch["responses"], dtype=torch.float32)
    rows = torch.arange(len(chunk.indices))
    scores[rows, lengths - 1] = torch.as_tensor(chunk.scores, dtype=torch.float32)
    batch.batch["token_level_scores"] = scores
    attach_extra_info(batch, chunk.extra_info)


def object_array(values) -> np.ndarray:
    """A 1-d object array of ``values`` (np.array would build a 2-d array from equal-length lists)."""
    values = list(values)
    array = np.empty(len(values), dtype=object)
    array[:] = values
    return array


def attach_extra_info(batch, extra_info: dict[str, list]) -> None:
    """Per-sample extra info beside the batch's rows, as verl keeps reward extra info."""
    for key, values in extra_info.items():
        batch.non_tensor_batch[key] = object_array(values)
