"""Failure budgets: below them the failure policy handles the occasional failure; above them the
failures are systematic (a service down, a wrong URL or key, a reward that raises on every input)
and scoring stops with an error that says so. Pure book-keeping.

Two budgets:
- per ticket: more than ``max_failure_rate`` of its samples failed (and at least ``MIN_FAILURES``,
  so a 4-sample validation batch with one timeout is the policy's business, not an alarm);
- for the whole agent: ``max_consecutive_failures`` samples in a row failed, whatever their ticket
  (this is what stops the per-sample path, which has no tickets, and a huge ticket early).
Failed samples are those settled without a score (after retries, at the deadline, or by a failed
group hook); cancelled samples are not failures.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

MIN_FAILURES = 5  # a ticket's rate budget only applies from this many failures on
SAMPLE_MESSAGES = 3  # first messages kept for the error
MESSAGE_CHARS = 300  # each cut to this length in the error


@dataclass
class FailureDigest:
    """Failure kinds and the first few messages: what the error shows. Bounded memory."""

    kinds: Counter = field(default_factory=Counter)
    messages: list[str] = field(default_factory=list)

    def add(self, kind: str, message: str, count: int = 1) -> None:
        self.kinds[kind] += count
        if len(self.messages) < SAMPLE_MESSAGES:
            self.messages.append(message if len(message) <= MESSAGE_CHARS else message[:MESSAGE_CHARS] + " ...")

    def describe(self) -> str:
        kinds = ", ".join(f"{kind} x{count}" for kind, count in self.kinds.most_common())
        firsts = " | ".join(f"[{i + 1}] {m}" for i, m in enumerate(self.messages))
        return f"failure kinds: {kinds}. First messages: {firsts}"


class TicketBudget:
    """Failures of one ticket of ``total`` samples against ``max_failure_rate``."""

    def __init__(self, total: int, max_failure_rate: float):
        self.total = total
        self.max_failure_rate = max_failure_rate
        self.failed = 0
        self.digest = FailureDigest()

    def record_failure(self, kind: str, message: str, count: int = 1) -> bool:
        """Count ``count`` failed samples; True once the budget is exceeded."""
        self.failed += count
        self.digest.add(kind, message, count)
        return self.exceeded

    @property
    def exceeded(self) -> bool:
        return self.failed >= MIN_FAILURES and self.failed > self.max_failure_rate * self.total

    def describe(self, ticket: str) -> str:
        return (
            f"ticket {ticket}: {self.failed} of {self.total} samples failed, more than max_failure_rate="
            f"{self.max_failure_rate:g} allows: the reward service looks down or misconfigured "
            f"(raise max_failure_rate to tolerate this). {self.digest.describe()}"
        )


class ConsecutiveFailures:
    """Samples settled in a row without a score, across every ticket and the per-sample path."""

    def __init__(self, limit: int | None):
        self.limit = limit
        self.count = 0
        self.digest = FailureDigest()

    def record(self, failed: bool, kind: str = "", message: str = "") -> bool:
        """True when this failure reaches the limit (once per run of failures)."""
        if not failed:
            if self.count:
                self.count = 0
                self.digest = FailureDigest()
            return False
        self.count += 1
        self.digest.add(kind, message)
        return self.limit is not None and self.count == self.limit

    def describe(self) -> str:
        return (
            f"{self.count} samples in a row failed (max_consecutive_failures={self.limit}): the reward "
            f"service looks down or misconfigured. {self.digest.describe()}"
        )
