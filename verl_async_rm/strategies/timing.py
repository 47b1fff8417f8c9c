"""Per-step timing of the reward wait and what it overlapped. Pure book-keeping on timestamps."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class RewardTiming:
    """One ticket's life, in seconds on the trainer's monotonic clock."""

    submitted_at: float
    settled_at: list[float] = field(default_factory=list)  # when each chunk the trainer took became ready
    blocked: float = 0.0  # time the trainer spent inside get() for this ticket

    @property
    def latency(self) -> float:
        """Submit to the last chunk ready: how long the rewards took to arrive."""
        return (max(self.settled_at) - self.submitted_at) if self.settled_at else 0.0

    def metrics(self, prefix: str = "async_reward/") -> dict[str, float]:
        latency = self.latency
        hidden = 1.0 - self.blocked / latency if latency > 0 else 1.0
        return {
            f"{prefix}blocked_s": self.blocked,
            f"{prefix}ticket_latency_s": latency,
            f"{prefix}overlap_ratio": float(min(1.0, max(0.0, hidden))),
        }


def latency_metrics(latencies: list[float], prefix: str = "async_reward/") -> dict[str, float]:
    if not latencies:
        return {}
    values = np.asarray(latencies, dtype=float)
    p50, p95 = np.percentile(values, [50, 95])
    return {f"{prefix}latency_p50_s": float(p50), f"{prefix}latency_p95_s": float(p95), f"{prefix}latency_max_s": float(values.max())}
