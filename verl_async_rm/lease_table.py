"""Limits shared by every job that names one endpoint: the book-keeping of the cluster's limiter.
Pure (the caller passes the time); the Ray actor around it is ``shared_limits.py``.

Why leases, not a call per request: a request must not pay a round trip to a remote actor (the
agent's zero-latency throughput is ~10^4 requests/s; an actor call costs ~1 ms). So the limiter
hands each job a *lease*, renewed by one heartbeat per job every fraction of a second, whatever
the number of requests:

- **Concurrency**: a job may have at most ``granted`` requests in flight. Grants follow demand
  (queued + in flight), water-filled over the live jobs, spare capacity split equally (a lone job
  holds the whole cap). The limiter counts a job at ``held`` >= ``granted``: a grant that *grows*
  raises ``held`` at once (the job may use it as soon as it hears of it); one that *shrinks* lowers
  ``held`` only once the job has reported that it applied that grant (``applied`` = the grant's
  version) and has no more than that in flight. So the sum of ``held`` never exceeds the cap, and
  every job's requests in flight stay within its ``held``: the endpoint never sees more than the cap,
  while the lease moves from a busy job to a new one within a heartbeat or two.
- **Requests and tokens per minute**: small batches of permits taken from one strict bucket per
  endpoint. A permit is valid for ``permit_ttl`` seconds after the job asked for it; so any request
  sent in a 60-s window used a permit granted in a window of ``60 + permit_ttl`` seconds, and the
  bucket is shaped to admit at most the limit in *that* window (``rate_bound`` below). Each job asks
  for what its queue needs, at most ``batch_s`` seconds' worth of the rate, so one job cannot hoard.
- **Back-off**: a job throttled with a pause (429 + Retry-After) reports until when; every job
  hears of the latest such moment at its next heartbeat and pauses too (one refusal stops all).
- **A crashed job**: its lease expires ``ttl`` seconds after its last heartbeat and is reclaimed.
  (A live job that cannot reach the limiter stops sending after ``ttl / 2`` on its own: see the client.)
- **Conflicting declarations**: every job must declare the same limits for an endpoint while
  another job holds a lease on it (``LimitsConflict``); once none does, new limits are accepted.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from verl_async_rm.errors import LimitsConflict
from verl_async_rm.limits import LeakyBucket


@dataclass(frozen=True)
class EndpointLimits:
    max_concurrency: int
    requests_per_minute: float | None = None
    tokens_per_minute: float | None = None

    def describe(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in asdict(self).items())


def window_bucket(per_minute: float, permit_ttl: float) -> LeakyBucket:
    """A bucket that admits at most ``per_minute`` in any window of ``60 + permit_ttl`` seconds: then
    requests *sent* with its permits (each within ``permit_ttl`` of its grant) stay within
    ``per_minute`` in any 60-s window. (Capacity C, drain r: C + r (60 + ttl) = per_minute.)"""
    window = 60.0 + permit_ttl
    capacity = max(1.0, per_minute / window)
    drain = (per_minute - capacity) / window
    if drain <= 0:
        raise ValueError(f"rate limit {per_minute}/min is too low to share (needs > 1 per {window:g} s)")
    return LeakyBucket(capacity, drain)


@dataclass
class JobLease:
    granted: int = 0
    held: int = 0
    version: int = 0
    demand: int = 0
    last_seen: float = 0.0
    paused_until: float = -math.inf


@dataclass(frozen=True)
class Grant:
    slots: int
    version: int
    requests: float
    tokens: float
    paused_until: float  # the endpoint's back-off, on the limiter's (wall) clock; -inf: none
    permit_ttl: float
    token_capacity: float  # one request's tokens above this are clamped to it (as the local bucket does)


class LeaseTable:
    def __init__(self, ttl: float = 10.0, permit_ttl: float = 2.0, batch_s: float = 0.5):
        self.ttl, self.permit_ttl, self.batch_s = ttl, permit_ttl, batch_s
        self.limits: EndpointLimits | None = None
        self.jobs: dict[str, JobLease] = {}
        self.rpm: LeakyBucket | None = None
        self.tpm: LeakyBucket | None = None
        self.paused_until = -math.inf
        self.reclaimed = 0  # leases of jobs that stopped heartbeating

    # -- membership -----------------------------------------------------------------------------
    def register(self, job: str, limits: EndpointLimits, now: float) -> None:
        self.expire(now)
        if self.limits is not None and limits != self.limits and self.jobs.keys() - {job}:
            raise LimitsConflict(
                f"conflicting limits for this endpoint: this job declares {limits.describe()}, but "
                f"{len(self.jobs.keys() - {job})} running job(s) declared {self.limits.describe()}; "
                "jobs sharing an endpoint must declare the same limits (or name different endpoints)"
            )
        if limits != self.limits:
            self.limits = limits
            self.rpm = window_bucket(limits.requests_per_minute, self.permit_ttl) if limits.requests_per_minute else None
            self.tpm = window_bucket(limits.tokens_per_minute, self.permit_ttl) if limits.tokens_per_minute else None
        self.jobs.setdefault(job, JobLease(last_seen=now))

    def leave(self, job: str) -> None:
        """A job that closes returns its lease at once (its requests have ended)."""
        self.jobs.pop(job, None)

    def expire(self, now: float) -> None:
        for job in [j for j, lease in self.jobs.items() if lease.last_seen < now - self.ttl]:
            del self.jobs[job]
            self.reclaimed += 1

    # -- the heartbeat --------------------------------------------------------------------------
    def heartbeat(self, job: str, *, demand: int, in_use: int, applied: int, want_requests: float = 0.0,
                  want_tokens: float = 0.0, paused_until: float = -math.inf, now: float) -> Grant:
        if self.limits is None or job not in self.jobs:
            raise KeyError(f"job {job!r} holds no lease here (expired after {self.ttl}s without a heartbeat?)")
        self.expire(now)
        if job not in self.jobs:
            raise KeyError(f"job {job!r}'s lease expired (no heartbeat for {self.ttl}s)")
        lease = self.jobs[job]
        lease.last_seen, lease.demand = now, max(0, int(demand))
        if applied == lease.version and in_use <= lease.granted:
            lease.held = lease.granted  # a shrink is confirmed: the job applied it and is within it
        self.paused_until = max(self.paused_until, paused_until)
        self._rebalance(job)
        return Grant(lease.granted, lease.version, self._permits(self.rpm, want_requests, now, whole=True),
                     self._permits(self.tpm, want_tokens, now, whole=False), self.paused_until, self.permit_ttl,
                     self.tpm.capacity if self.tpm is not None else math.inf)

    def _rebalance(self, job: str) -> None:
        targets = fair_shares(self.limits.max_concurrency, {j: lease.demand for j, lease in self.jobs.items()})
        for other, lease in self.jobs.items():
            if targets[other] < lease.granted:  # shrink now; counted at ``held`` until confirmed
                lease.granted = targets[other]
                lease.version += 1
        lease = self.jobs[job]
        if targets[job] > lease.granted:
            free = self.limits.max_concurrency - sum(other.held for other in self.jobs.values())
            grow = min(targets[job] - lease.granted, free + lease.held - lease.granted)
            if grow > 0:
                lease.granted += grow
                lease.held = max(lease.held, lease.granted)
                lease.version += 1

    def _permits(self, bucket: LeakyBucket | None, want: float, now: float, whole: bool) -> float:
        if bucket is None or want <= 0:
            return 0.0
        want = min(want, max(bucket.capacity, bucket.drain_per_s * self.batch_s))
        bucket._drain(now)
        room = bucket.capacity - bucket.level
        grant = min(want, room)
        if whole:
            grant = math.floor(grant + 1e-9)
        if grant <= 0:
            return 0.0
        bucket.level += grant
        return float(grant)

    def snapshot(self) -> dict:
        return {
            "limits": None if self.limits is None else asdict(self.limits),
            "jobs": {j: asdict(lease) for j, lease in self.jobs.items()},
            "held": sum(lease.held for lease in self.jobs.values()),
            "reclaimed": self.reclaimed,
        }


def fair_shares(cap: int, demands: dict[str, int]) -> dict[str, int]:
    """Integer shares of ``cap``: water-filled over the demands (nobody gets more than it wants while
    another wants more), then what is left over split equally (a lone job holds the whole cap, so
    its new work needs no heartbeat to start)."""
    shares = dict.fromkeys(demands, 0)
    left = cap
    wanting = sorted(j for j in demands if demands[j] > 0)
    while left > 0 and wanting:
        each = left // len(wanting)
        if each == 0:  # fewer slots than jobs wanting one: the first ones (by name) get them
            for job in wanting[:left]:
                shares[job] += 1
            left = 0
            break
        for job in wanting:
            give = min(each, demands[job] - shares[job])
            shares[job] += give
            left -= give
        wanting = [j for j in wanting if shares[j] < demands[j]]
    jobs = sorted(demands)
    for i, job in enumerate(jobs):  # the spare, equally (the first ones get the remainder)
        shares[job] += left // len(jobs) + (1 if i < left % len(jobs) else 0)
    return shares
