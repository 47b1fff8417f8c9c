"""The client protocol: the one set of verbs every face of the agent offers, in process
(``agent.RewardAgent``) or across processes (``ray_agent.RayRewardClient``). Code that talks to an
agent (the verl reward manager, the trainer strategies, the CLI) is written against this."""

from __future__ import annotations

from typing import Hashable, Iterable, Mapping, Protocol, Sequence

from verl_async_rm.items import RewardItem
from verl_async_rm.outcomes import ScoredChunk


class RewardClient(Protocol):
    def submit(self, items: Iterable[RewardItem | Mapping], group_size: int | Mapping[Hashable, int] = 1, *,
               validation: bool = False, ranks: Sequence[int] | None = None) -> str:
        """Start scoring a batch; a ticket, at once (group sizes: one, or per uid). ``validation`` and
        ``ranks`` (one per item, smaller first) order admission under ``admission_order: deadline``."""

    def open_ticket(self, group_size: int | Mapping[Hashable, int] = 1, *, validation: bool = False) -> str:
        """A ticket whose samples come later, by ``add``, until ``close_ticket``."""

    def add(self, ticket: str, items: Iterable[RewardItem | Mapping]) -> None:
        """More samples of an open ticket; they start scoring at once."""

    def close_ticket(self, ticket: str) -> None:
        """No more samples for an open ticket."""

    def get(self, ticket: str, n: int | None = None, timeout: float | None = None) -> ScoredChunk:
        """Whole groups of ``ticket`` totalling ``n`` samples (all remaining when None), as soon as
        they are ready; ``TimeoutError`` after ``timeout`` s with nothing consumed."""

    def cancel(self, ticket: str) -> int:
        """Stop scoring ``ticket``; how many of its samples were unsettled."""

    def remaining(self, ticket: str) -> int:
        """Samples of ``ticket`` not handed out yet."""

    def metrics(self) -> dict:
        """Counters, latencies, flow-control state."""

    async def score_in_group(self, item: RewardItem | Mapping, uid: Hashable | None = None, group_size: int = 1,
                             group_wait: float | None = None, *, session: Hashable | None = None,
                             attempt: Hashable | None = None, validation: bool = False) -> tuple[float, dict]:
        """One sample, answered once its whole group is resolved (``session``: which rollout of the
        group it is; ``attempt``: which dispatch of the prompt, a group of its own; ``validation``:
        it belongs to a validation pass, which ``admission_order: deadline`` serves first)."""

    async def withdraw(self, uid: Hashable, session: Hashable, attempt: Hashable | None = None) -> None:
        """Session ``session`` of group ``uid`` will send no sample (its rollout failed): the group
        is resolved with the members it has, without waiting for it."""

    def close(self) -> None:
        """Release the agent (the actor: close it for every caller)."""
