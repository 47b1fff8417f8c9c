"""Counters and latency percentiles of an agent. Bounded memory: latencies keep the most recent window."""

from __future__ import annotations

from collections import Counter, deque

import numpy as np

LATENCY_WINDOW = 100_000


class AgentMetrics:
    def __init__(self) -> None:
        self.submitted = 0
        self.completed = 0  # settled with a score
        self.failed = 0  # settled without one (the failure policy decided what it became)
        self.cancelled = 0  # unsettled when their ticket was cancelled or the agent closed
        self.retries = 0
        self.throttled = 0  # answers that were 429/503: flow control, not failures
        self.hung_calls = 0  # calls still running long after they were given up (threads replaced)
        self.hook_failures = 0  # groups whose post_process_scores failed or timed out
        self.cache_hits = 0
        self.cache_misses = 0
        self.split_groups = 0  # streamed groups closed by group_wait before their last member came
        self.failures_by_kind: Counter[str] = Counter()
        self.attempt_errors_by_kind: Counter[str] = Counter()  # every failed attempt, retried or not
        self.latencies: deque[float] = deque(maxlen=LATENCY_WINDOW)

    def snapshot(self, **live) -> dict:
        lat = np.fromiter(self.latencies, dtype=float) if self.latencies else None
        p50, p95 = (np.percentile(lat, [50, 95]).tolist() if lat is not None else (float("nan"),) * 2)
        return {
            "submitted": self.submitted,
            "completed": self.completed,
            "failed": self.failed,
            "cancelled": self.cancelled,
            "pending": self.submitted - self.completed - self.failed - self.cancelled,
            **live,
            "retries": self.retries,
            "throttled": self.throttled,
            "hung_calls": self.hung_calls,
            "hook_failures": self.hook_failures,
            "cache_hits": self.cache_hits,
            "cache_misses": self.cache_misses,
            "split_groups": self.split_groups,
            "failures_by_kind": dict(self.failures_by_kind),
            "attempt_errors_by_kind": dict(self.attempt_errors_by_kind),
            "latency_p50": p50,
            "latency_p95": p95,
            "latency_max": float(lat.max()) if lat is not None else float("nan"),
        }
