"""Opt-in result cache: identical requests are scored once per run (concurrent duplicates share one call).

Off by default because LLM judges are stochastic and a cached score freezes one sample of them.
Bounded: least-recently-used entries are evicted past ``maxsize``. Only successful scores are kept.
Pure book-keeping: the first sample of a request is its *leader* (it is sent); identical samples
arriving while it is in flight *follow* it and receive its score. If the leader fails, is
cancelled or expires, its followers are scored on their own (the first becomes the next leader).
"""

from __future__ import annotations

import json
from collections import OrderedDict
from typing import Any, Hashable

from verl_async_rm.items import RewardItem
from verl_async_rm.outcomes import Scored


def request_key(item: RewardItem) -> Hashable:
    def canon(value) -> str:
        return json.dumps(value, sort_keys=True, default=repr)

    return (item.data_source, item.solution_str, canon(item.ground_truth), canon(item.extra_info))


class ResultCache:
    def __init__(self, maxsize: int):
        self.maxsize = maxsize
        self._done: OrderedDict[Hashable, Scored] = OrderedDict()
        self._followers: dict[Hashable, list[Any]] = {}  # key in flight -> samples waiting for it

    def __len__(self) -> int:
        return len(self._done)

    def lookup(self, key: Hashable, sample: Any) -> Scored | None | bool:
        """A cached score; True if ``sample`` now follows an identical request in flight; None if
        ``sample`` leads (the caller must send it)."""
        hit = self._done.get(key)
        if hit is not None:
            self._done.move_to_end(key)
            return hit
        followers = self._followers.get(key)
        if followers is not None:
            followers.append(sample)
            return True
        self._followers[key] = []
        return None

    def finish(self, key: Hashable, outcome: Any) -> list[Any]:
        """The leader of ``key`` ended with ``outcome`` (None: abandoned). Remembers a score; returns
        the followers (they take the score, or are scored on their own)."""
        followers = self._followers.pop(key, [])
        if isinstance(outcome, Scored):
            self._done[key] = outcome
            if len(self._done) > self.maxsize:
                self._done.popitem(last=False)
        return followers
