"""Opt-in result cache: identical requests are scored once per run (concurrent duplicates share one call).

Off by default because LLM judges are stochastic and a cached score freezes one sample of them.
Bounded: least-recently-used entries are evicted past ``maxsize``. Only successful scores are kept.
"""

from __future__ import annotations

import asyncio
import json
from collections import OrderedDict
from typing import Hashable

from verl_async_rm.outcome import RewardItem, Scored


def request_key(item: RewardItem) -> Hashable:
    def canon(value) -> str:
        return json.dumps(value, sort_keys=True, default=repr)

    return (item.data_source, item.solution_str, canon(item.ground_truth), canon(item.extra_info))


class ResultCache:
    def __init__(self, maxsize: int):
        self.maxsize = maxsize
        self._done: OrderedDict[Hashable, Scored] = OrderedDict()
        self._inflight: dict[Hashable, asyncio.Future] = {}

    def __len__(self) -> int:
        return len(self._done)

    def lookup(self, key: Hashable) -> Scored | asyncio.Future | None:
        """A cached score, a future for an identical request in flight, or None (caller must compute)."""
        hit = self._done.get(key)
        if hit is not None:
            self._done.move_to_end(key)
            return hit
        return self._inflight.get(key)

    def begin(self, key: Hashable) -> None:
        self._inflight[key] = asyncio.get_running_loop().create_future()

    def finish(self, key: Hashable, outcome) -> None:
        """Publish the outcome to waiting duplicates; remember it only if it is a score."""
        future = self._inflight.pop(key, None)
        if isinstance(outcome, Scored):
            self._done[key] = outcome
            if len(self._done) > self.maxsize:
                self._done.popitem(last=False)
        if future is not None and not future.done():
            future.set_result(outcome)
