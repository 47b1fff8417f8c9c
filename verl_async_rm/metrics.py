"""Counters and latency percentiles of an agent (bounded memory: latencies keep the most recent
window), and the typed statistics an agent reports: one frozen dataclass per source, composed by
``AgentStatistics`` (``metrics()`` is its ``as_dict``)."""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from verl_async_rm.cost import CostStatistics
    from verl_async_rm.engine.flow import FlowStatistics
    from verl_async_rm.engine.pipeline import PipelineStatistics
    from verl_async_rm.engine.stream import StreamStatistics
    from verl_async_rm.engine.tickets import TicketStatistics
    from verl_async_rm.engine.verdicts import VerdictLogStatistics
    from verl_async_rm.shared_limits import SharedLimitsStatistics

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

    def statistics(self) -> SampleStatistics:
        lat = np.fromiter(self.latencies, dtype=float) if self.latencies else None
        p50, p95 = (np.percentile(lat, [50, 95]).tolist() if lat is not None else (float("nan"),) * 2)
        return SampleStatistics(
            submitted=self.submitted,
            completed=self.completed,
            failed=self.failed,
            cancelled=self.cancelled,
            pending=self.submitted - self.completed - self.failed - self.cancelled,
            retries=self.retries,
            throttled=self.throttled,
            hung_calls=self.hung_calls,
            hook_failures=self.hook_failures,
            cache_hits=self.cache_hits,
            cache_misses=self.cache_misses,
            split_groups=self.split_groups,
            failures_by_kind=dict(self.failures_by_kind),
            attempt_errors_by_kind=dict(self.attempt_errors_by_kind),
            latency_p50=p50,
            latency_p95=p95,
            latency_max=float(lat.max()) if lat is not None else float("nan"),
        )


@dataclass(frozen=True)
class SampleStatistics:
    """The counters (``AgentMetrics``) at one moment, with the latency percentiles of its window."""

    submitted: int
    completed: int
    failed: int
    cancelled: int
    pending: int
    retries: int
    throttled: int
    hung_calls: int
    hook_failures: int
    cache_hits: int
    cache_misses: int
    split_groups: int
    failures_by_kind: dict[str, int]
    attempt_errors_by_kind: dict[str, int]
    latency_p50: float  # submit -> settled, seconds (nan before the first)
    latency_p95: float
    latency_max: float


_SAMPLE_HEAD = ("submitted", "completed", "failed", "cancelled", "pending")  # metrics() lists these first


@dataclass(frozen=True)
class AgentStatistics:
    """An agent's statistics at one moment, one frozen part per source (``ScoringEngine.statistics``).
    ``as_dict`` is what ``metrics()`` returns: every part's fields, flat, under their own names."""

    samples: SampleStatistics
    pipeline: PipelineStatistics
    effective_cap: int  # the flow control's window, else max_concurrency
    tickets: TicketStatistics
    stream: StreamStatistics
    stopped: str | None  # the error that stopped scoring for good, as "Type: message"
    flow: FlowStatistics
    cost: CostStatistics
    verdict_log: VerdictLogStatistics
    shared: SharedLimitsStatistics | None = None  # only with shared_limits
    judges: dict | None = None  # only with a judge list: "judge/<name>/<figure>" (engine/fallback.py)

    def as_dict(self) -> dict:
        samples = _flat(self.samples)
        pipeline = _flat(self.pipeline)
        if self.pipeline.threads is None:  # an executor without threads: no key
            del pipeline["threads"]
        return {
            **{key: samples.pop(key) for key in _SAMPLE_HEAD},
            **pipeline,
            "effective_cap": self.effective_cap,
            **_flat(self.tickets),
            **_flat(self.stream),
            "stopped": self.stopped,
            **_flat(self.flow),
            **_flat(self.cost),
            **_flat(self.verdict_log),
            **(_flat(self.shared) if self.shared is not None else {}),
            **(self.judges or {}),
            **samples,
        }


def _flat(statistics) -> dict:
    """A frozen part's fields by name (shallow: ``dataclasses.asdict`` would deep-copy)."""
    return {field.name: getattr(statistics, field.name) for field in fields(statistics)}
