"""Admission: when a queued request may start. Every limit is a small meter with one protocol, and
the request pipeline's pump asks the list of them in order for the sample at the head of its queue
(aiometer's shape: a new limit is a new meter, not an edit of the request loop).

The protocol (``Meter``):
- ``wait(sample, now)``: 0.0 if this meter lets ``sample`` start now, the seconds until it may, or
  None: not before an event that pumps again (a request ending, a lease renewed). Raising refuses
  the sample: it fails as ``invalid`` and is never sent (a token estimate that is not a number).
- ``take(sample, now)``: ``sample`` starts now; take what ``wait`` found (a slot, a permit, its
  tokens, a reservation).
- ``reserves``: True for a meter that holds something back for the request (the judge budget's
  reservation): it is asked after the others, and only once they all let the sample start now.

The pump stops at the first None; the largest wait arms one timer that pumps again (so 40,000
queued samples wait as plain records, not as parked coroutines). An ending is not part of the
protocol: each meter that needs it learns it as it must (the cap: when the call really ends, which
for a thread that outlived its timeout is later than its answer; the flow control: the answer or
throttle, with the epoch its send carried; the budget: the usage the judge reported), so the
pipeline tells each one itself.

The meters, in the order the engine gives them to the pipeline:
- ``ConcurrencyCap`` (here): ``max_concurrency`` slots, held until a call really ends;
- ``FlowControl`` (``flow.py``): a 429/503 pause, the probe window, the learned pace;
- ``RequestRate`` and ``TokenRate`` (here): ``requests_per_minute``, ``tokens_per_minute``;
- ``SharedLimitsClient`` (``shared_limits.py``), in their place with ``shared_limits``: the lease on
  an endpoint's limits shared across jobs (its slots and leased permits, or the job's own limits
  when no limiter answers);
- ``Spending`` (``spend.py``): the judge budget's reservation (``reserves``).

Why our own meters rather than aiometer itself: aiometer awaits each meter in a task per request,
with fixed limits that count tasks. Ours are asked by one pump for *when* the head may start, and
carry what aiometer has no place for: a request's own cost in tokens (estimated per request, a
group judge's call the sum of its members'), 429 flow control that pauses, probes and learns the
service's pace from its answers, budget reservations released with the usage the judge reports,
and a lease shared across jobs whose slots and permits change with each heartbeat.
"""

from __future__ import annotations

from typing import Any, Callable, Protocol

from verl_async_rm.limits import LeakyBucket, strict_bucket


class Meter(Protocol):
    reserves: bool

    def wait(self, sample: Any, now: float) -> float | None:
        """0.0: ``sample`` may start now; > 0: seconds until it may; None: not before an event."""

    def take(self, sample: Any, now: float) -> None:
        """``sample`` starts now."""


class ConcurrencyCap:
    """``limit`` requests at once. A slot is taken when a request starts and given back by the
    pipeline (``in_flight``) when its call really ends: a thread that keeps running after its
    timeout keeps its slot until it returns or is declared hung (``pipeline.py``)."""

    __slots__ = ("limit", "in_flight", "peak")
    reserves = False

    def __init__(self, limit: int):
        self.limit = limit
        self.in_flight = 0  # calls holding a slot
        self.peak = 0

    def wait(self, sample: Any, now: float) -> float | None:
        return None if self.in_flight >= self.limit else 0.0

    def take(self, sample: Any, now: float) -> None:
        self.in_flight += 1
        if self.in_flight > self.peak:
            self.peak = self.in_flight


class RequestRate:
    """``requests_per_minute``: one unit of ``bucket`` per request (a ``limits.LeakyBucket``, or
    anything that reads like one: the shared lease's pool of permits)."""

    __slots__ = ("bucket",)
    reserves = False

    def __init__(self, bucket: LeakyBucket):
        self.bucket = bucket

    def wait(self, sample: Any, now: float) -> float:
        return self.bucket.wait_time(now)

    def take(self, sample: Any, now: float) -> None:
        self.bucket.take(now)


class TokenRate:
    """``tokens_per_minute``: a request's estimated tokens of ``bucket``, estimated once per sample
    (``estimate``: checked, ``limits.checked_estimate``; raising refuses the sample)."""

    __slots__ = ("bucket", "estimate")
    reserves = False

    def __init__(self, bucket: LeakyBucket, estimate: Callable[[Any], float]):
        self.bucket = bucket
        self.estimate = estimate

    def wait(self, sample: Any, now: float) -> float:
        tokens = sample.tokens
        if tokens is None:
            tokens = sample.tokens = self.estimate(sample.item)
        return self.bucket.wait_time(now, tokens)

    def take(self, sample: Any, now: float) -> None:
        self.bucket.take(now, sample.tokens)


def rate_meters(requests_per_minute: float | None, tokens_per_minute: float | None,
                token_estimate: Callable[[Any], float]) -> list[Meter]:
    """The job's own rate limits, as configured: a strict bucket each (``limits.strict_bucket``)."""
    meters: list[Meter] = []
    if requests_per_minute:
        meters.append(RequestRate(strict_bucket(requests_per_minute)))
    if tokens_per_minute:
        meters.append(TokenRate(strict_bucket(tokens_per_minute), token_estimate))
    return meters
