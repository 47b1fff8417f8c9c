"""``RewardAgent``: the thread-safe face of the scoring engine.

The engine runs on a private event loop in one daemon thread, so callers in any thread (a verl
trainer, a Ray actor's own loop, a test) can ``submit`` a whole batch without blocking and later
``get`` whole groups of it. ``get`` blocks on a future that the engine resolves the moment enough
groups are ready: no polling anywhere.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import threading
from typing import Any, Callable, Iterable, Mapping

from verl_async_rm.config import AgentConfig
from verl_async_rm.engine import ScoringEngine
from verl_async_rm.groups import TicketLedger
from verl_async_rm.loader import UserReward, load_reward, wrap_reward
from verl_async_rm.outcome import RewardItem, ScoredChunk

_ITEM_FIELDS = ("solution_str", "ground_truth", "data_source", "extra_info", "uid", "index")


def as_item(raw: RewardItem | Mapping, position: int) -> RewardItem:
    if isinstance(raw, RewardItem):
        return raw
    if not isinstance(raw, Mapping):
        raise TypeError(f"batch item {position} is a {type(raw).__name__}; expected a RewardItem or a mapping")
    unknown = set(raw) - set(_ITEM_FIELDS)
    if unknown:
        raise ValueError(f"batch item {position} has unknown keys {sorted(unknown)}; allowed: {list(_ITEM_FIELDS)}")
    if not isinstance(raw.get("solution_str"), str):
        raise ValueError(f"batch item {position} needs a string 'solution_str'")
    index = raw.get("index", position)
    if isinstance(index, bool) or not isinstance(index, int):
        raise ValueError(f"batch item {position} has a non-integer index {index!r}")
    extra = raw.get("extra_info")
    if extra is not None and not isinstance(extra, Mapping):
        raise ValueError(f"batch item {position} has extra_info of type {type(extra).__name__}; expected a dict")
    return RewardItem(
        index=index,
        solution_str=raw["solution_str"],
        ground_truth=raw.get("ground_truth"),
        data_source=raw.get("data_source") or "",
        extra_info=dict(extra) if extra is not None else None,
        uid=raw.get("uid"),
    )


class RewardAgent:
    """Score whole batches concurrently with a per-response reward; hand back finished GRPO groups.

    >>> with RewardAgent.from_file("verl_async_rm/user_rewards/gsm8k.py", "compute_score") as agent:
    ...     ticket = agent.submit(items, group_size=8)      # returns at once
    ...     chunk = agent.get(ticket, 64)                   # 8 whole groups, as soon as they are done
    """

    def __init__(
        self,
        reward: UserReward | Callable | type | Any,
        config: AgentConfig | Mapping | None = None,
        *,
        reward_kwargs: Mapping | None = None,
        token_estimator: Callable[[RewardItem], int] | None = None,
    ):
        self.config = config if isinstance(config, AgentConfig) else AgentConfig.from_mapping(config)
        self.reward = reward if isinstance(reward, UserReward) else wrap_reward(reward, dict(reward_kwargs or {}))
        if self.config.executor == "process" and self.reward.score_is_async:
            raise ValueError(f"executor='process' is for sync reward functions; {self.reward.label} is async")
        if self.config.tokens_per_minute and token_estimator is None:
            raise ValueError("tokens_per_minute needs a token_estimator(item) -> int")
        self._engine = ScoringEngine(self.reward, self.config, token_estimator)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="reward-agent-loop", daemon=True)
        self._thread.start()
        self._next_ticket = itertools.count()
        self._lock = threading.Lock()
        self._closed = False

    @classmethod
    def from_file(
        cls, path: str, name: str, config: AgentConfig | Mapping | None = None, *, reward_kwargs: Mapping | None = None,
        token_estimator: Callable[[RewardItem], int] | None = None,
    ) -> RewardAgent:
        return cls(load_reward(path, name, dict(reward_kwargs or {})), config, token_estimator=token_estimator)

    # -- the API ----------------------------------------------------------------------------------
    def submit(self, items: Iterable[RewardItem | Mapping], group_size: int = 1) -> int:
        """Start scoring a batch; returns a ticket at once. Bad input raises here, not later."""
        batch = [as_item(raw, position) for position, raw in enumerate(items)]
        ledger = TicketLedger([(item.index, item.uid) for item in batch], group_size)
        with self._lock:
            if self._closed:
                raise RuntimeError("the reward agent is closed")
            ticket = next(self._next_ticket)
            # Scheduled before the ticket is returned, so any later get() finds it (FIFO loop callbacks).
            self._loop.call_soon_threadsafe(self._engine.start_ticket, ticket, ledger, batch)
        return ticket

    def get(self, ticket: int, n: int | None = None, timeout: float | None = None) -> ScoredChunk:
        """Block until whole groups of ``ticket`` totalling ``n`` samples are ready (all that remain if
        fewer; all of them if ``n`` is None). A drained ticket gives an empty chunk."""
        self._check_caller()
        future = asyncio.run_coroutine_threadsafe(self._engine.take(ticket, n), self._loop)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()  # nothing was consumed: the groups stay for the next get
            raise TimeoutError(f"get(ticket={ticket}, n={n}) timed out after {timeout}s") from None

    def get_all(self, ticket: int, timeout: float | None = None) -> ScoredChunk:
        return self.get(ticket, None, timeout)

    async def aget(self, ticket: int, n: int | None = None) -> ScoredChunk:
        """``get`` for callers on another event loop (e.g. an async Ray actor)."""
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(self._engine.take(ticket, n), self._loop))

    async def ascore_in_group(
        self, item: RewardItem | Mapping, uid=None, group_size: int = 1, group_wait: float | None = None
    ) -> tuple[float, dict]:
        """Score one sample as a member of group ``uid`` (expected size ``group_size``) and return its
        ``(score, extra_info)`` once the whole group is resolved (policy, then the group hook). For
        callers that see one sample at a time, such as verl's ``run_single``. A group that stops
        growing for ``group_wait`` seconds is resolved with the members it has."""
        if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1:
            raise ValueError(f"group_size must be a positive integer, got {group_size!r}")
        item = as_item(item, 0)
        coroutine = self._engine.score_in_group(item, uid, group_size, group_wait)
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coroutine, self._loop))

    def cancel(self, ticket: int) -> int:
        """Stop scoring ``ticket`` (e.g. a batch that will never be trained on): no further calls
        are made for it, and its pending and later gets raise ``TicketCancelled``. Returns how many
        of its samples were still unsettled (0 for a ticket already drained or cancelled)."""
        return self._call(self._engine.cancel, ticket)

    def remaining(self, ticket: int) -> int:
        """Samples of ``ticket`` not yet handed out."""
        return self._call(self._engine.remaining, ticket)

    def metrics(self) -> dict:
        return self._call(self._engine.snapshot)

    # -- life cycle -------------------------------------------------------------------------------
    def close(self, timeout: float = 30.0) -> None:
        """Cancel what is in flight, fail pending gets, stop the loop and join its thread."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        if self._loop.is_running():
            asyncio.run_coroutine_threadsafe(self._engine.aclose(), self._loop).result(timeout)
            self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout)
        self._loop.close()

    def __enter__(self) -> RewardAgent:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    # -- helpers ----------------------------------------------------------------------------------
    def _check_caller(self) -> None:
        if threading.current_thread() is self._thread:
            raise RuntimeError("get() called from the agent's own loop (e.g. inside a reward function): use aget()")

    def _call(self, fn: Callable, *args):
        self._check_caller()

        async def run():
            return fn(*args)

        return asyncio.run_coroutine_threadsafe(run(), self._loop).result()
