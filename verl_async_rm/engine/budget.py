"""Failure budgets: below them the failure policy handles the occasional failure; above them the
failures are systematic (a service down, a wrong URL or key, a reward that raises on every input)
and scoring stops with an error that says so. Pure book-keeping.

Two budgets, one rate (``max_failure_rate``):
- per ticket: more than that share of its samples failed (and at least ``MIN_FAILURES``, so a
  4-sample validation batch with one timeout is the policy's business, not an alarm);
- for the whole agent: more than that share of its last ``window`` settled samples, whatever their
  ticket (this is what stops the per-sample path, which has no tickets, and a huge ticket early).
Failed samples are those settled without a score (after retries, at the deadline, or by a failed
group hook); cancelled samples are not failures.
"""

from __future__ import annotations

import itertools
from collections import Counter, deque
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
    """Failures of one ticket of ``total`` samples against ``max_failure_rate``.

    An open ticket's ``total`` grows as samples are added, so its rate is judged when it is closed,
    not while open: early on, a few failures among the first samples scored (5 of 9) would stop a
    step whose final rate (5 of 32) is well inside the budget. While it is open, the agent-wide
    window (``RecentFailures``) still stops a service that is systematically down."""

    def __init__(self, total: int, max_failure_rate: float, open: bool = False):
        self.total = total
        self.max_failure_rate = max_failure_rate
        self.failed = 0
        self.open = open
        self.digest = FailureDigest()

    def record_failure(self, kind: str, message: str, count: int = 1) -> bool:
        """Count ``count`` failed samples; True once the budget is exceeded."""
        self.failed += count
        self.digest.add(kind, message, count)
        return self.exceeded

    @property
    def exceeded(self) -> bool:
        return not self.open and self.failed >= MIN_FAILURES and self.failed > self.max_failure_rate * self.total

    def describe(self, ticket: str) -> str:
        return (
            f"ticket {ticket}: {self.failed} of {self.total} samples failed, more than max_failure_rate="
            f"{self.max_failure_rate:g} allows: the reward service looks down or misconfigured "
            f"(raise max_failure_rate to tolerate this). {self.digest.describe()}"
        )


class RecentFailures:
    """The agent's last ``window`` settled samples, whatever their ticket or the per-sample path.

    A failure *rate* over a window, not a count of failures in a row: under concurrency, failures
    settle in clusters (every call in flight times out together, a deadline expires a whole
    backlog), so "N in a row" trips on a healthy service with one slow moment, while a service that
    is down fails at a high rate whatever the order."""

    def __init__(self, window: int, max_failure_rate: float):
        self.window = window
        self.max_failure_rate = max_failure_rate
        self._recent: deque[bool] = deque(maxlen=window)
        self.failed = 0
        self.digest = FailureDigest()

    def record(self, failed: bool, kind: str = "", message: str = "") -> bool:
        """True when this sample takes the window over the rate (then the window starts afresh)."""
        if len(self._recent) == self.window and self._recent[0]:
            self.failed -= 1
        self._recent.append(failed)
        if failed:
            self.failed += 1
            self.digest.add(kind, message)
        if len(self._recent) == self.window and self.failed > self.max_failure_rate * self.window:
            return True
        return False

    def record_failures(self, count: int, kind: str, message: str) -> bool:
        """``record(True, kind, message)`` for ``count`` samples at once (a deadline settling a
        backlog): C-level deque operations, not a step per sample. True if the window is over the
        rate once they are in (checked once, at the end: they settled in the same instant)."""
        if count <= 0:
            return False
        overflow = len(self._recent) + count - self.window
        if count >= self.window:
            self._recent.clear()
            self.failed = 0
        elif overflow > 0:
            self.failed -= sum(itertools.islice(self._recent, overflow))
        self._recent.extend(itertools.repeat(True, min(count, self.window)))
        self.failed += min(count, self.window)
        self.digest.add(kind, message, count)
        return len(self._recent) == self.window and self.failed > self.max_failure_rate * self.window

    def describe(self) -> str:
        text = (
            f"{self.failed} of the last {self.window} samples failed (more than max_failure_rate="
            f"{self.max_failure_rate:g}): the reward service looks down or misconfigured. {self.digest.describe()}"
        )
        self._recent.clear()
        self.failed = 0
        self.digest = FailureDigest()
        return text
