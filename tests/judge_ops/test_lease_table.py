"""The shared limiter's book-keeping (lease_table.py), pure: whatever the interleaving of heartbeats
(sent, processed and answered at different moments), requests and answers, the jobs together never
have more in flight than the cap; a crashed job's lease is reclaimed; conflicting limits are refused."""

from __future__ import annotations

import math

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from verl_async_rm.lease_table import EndpointLimits, LeaseTable, LimitsConflict, fair_shares, window_bucket

pytestmark = pytest.mark.quick


class Job:
    """A job as the client behaves: it sends at most its last applied grant; one heartbeat at a time."""

    def __init__(self, name):
        self.name, self.cap, self.version, self.in_flight, self.queued = name, 0, -1, 0, 0
        self.report = None  # sent, not processed yet
        self.answer = None  # processed, not received yet


# Each step: one job sends, the limiter processes, the job receives; or a job starts, finishes or
# gets work. Whole heartbeats ("beat") are common so that shrinks and regrowths happen often.
ACTIONS = st.sampled_from(["beat", "beat", "send", "deliver", "receive", "start", "start", "finish", "work", "work"])


@settings(max_examples=100, deadline=None)
@example(cap=4, jobs=2, actions=[("work", 0, 20), ("beat", 0, 1), ("start", 0, 20), ("work", 1, 20), ("beat", 1, 1),
                                 ("start", 1, 20)])  # a shrink freed before the job applied it would break the cap
@given(cap=st.integers(1, 8), jobs=st.integers(2, 3),
       actions=st.lists(st.tuples(ACTIONS, st.integers(0, 2), st.integers(1, 20)), max_size=120))
def test_jobs_never_exceed_the_cap_together(cap, jobs, actions):
    table = LeaseTable(ttl=1e9)
    people = [Job(f"j{i}") for i in range(jobs)]
    for job in people:
        table.register(job.name, EndpointLimits(cap), 0.0)
    for t, (what, who, amount) in enumerate(actions):
        job = people[who % jobs]
        if what == "beat" and job.report is None and job.answer is None:
            answer = table.heartbeat(job.name, now=float(t), demand=job.queued + job.in_flight, in_use=job.in_flight,
                                     applied=job.version)
            job.cap, job.version = answer.slots, answer.version
        elif what == "send" and job.report is None and job.answer is None:
            job.report = dict(demand=job.queued + job.in_flight, in_use=job.in_flight, applied=job.version)
        elif what == "deliver" and job.report is not None:
            job.answer = table.heartbeat(job.name, now=float(t), **job.report)
            job.report = None
        elif what == "receive" and job.answer is not None:
            job.cap, job.version, job.answer = job.answer.slots, job.answer.version, None
        elif what == "start":
            started = min(amount, job.queued, max(0, job.cap - job.in_flight))
            job.queued -= started
            job.in_flight += started
        elif what == "finish":
            job.in_flight -= min(amount, job.in_flight)
        elif what == "work":
            job.queued += amount
        assert sum(j.in_flight for j in people) <= cap
        assert sum(lease.held for lease in table.jobs.values()) <= cap
        assert all(lease.held >= lease.granted for lease in table.jobs.values())


def test_a_shrink_counts_until_the_job_confirms_it():
    """The interleaving that breaks a limiter freeing a shrunk lease at once: a holds all 8 and has
    8 in flight; b asks; a is told 4, but until a confirms, b gets nothing."""
    table = LeaseTable(ttl=1e9)
    table.register("a", EndpointLimits(8), 0.0)
    table.register("b", EndpointLimits(8), 0.0)
    grant = table.heartbeat("a", demand=20, in_use=0, applied=-1, now=1.0)
    assert grant.slots == 8
    assert table.heartbeat("b", demand=20, in_use=0, applied=-1, now=2.0).slots == 0
    assert table.heartbeat("a", demand=20, in_use=8, applied=grant.version, now=3.0).slots == 4  # not yet applied
    assert table.heartbeat("b", demand=20, in_use=0, applied=-1, now=4.0).slots == 0
    version = table.jobs["a"].version
    assert table.heartbeat("a", demand=20, in_use=6, applied=version, now=5.0).slots == 4  # applied, 6 > 4 still in flight
    assert table.heartbeat("b", demand=20, in_use=0, applied=-1, now=6.0).slots == 0
    assert table.heartbeat("a", demand=20, in_use=4, applied=version, now=7.0).slots == 4  # within it: confirmed
    assert table.heartbeat("b", demand=20, in_use=0, applied=-1, now=8.0).slots == 4


def beat(table, job, t, **report):
    report = {"demand": 0, "in_use": 0, "applied": table.jobs[job].version, **report}
    return table.heartbeat(job, now=t, **report)


def test_a_new_job_gets_half_within_two_heartbeats_and_a_crashed_one_is_reclaimed():
    table = LeaseTable(ttl=10.0)
    table.register("a", EndpointLimits(8), 0.0)
    assert beat(table, "a", 0.1, demand=100, in_use=0).slots == 8  # alone: the whole cap
    table.register("b", EndpointLimits(8), 0.2)
    assert beat(table, "b", 0.3, demand=100).slots == 0  # a still holds 8
    assert beat(table, "a", 0.4, demand=100, in_use=8, applied=-5).slots == 4  # told to shrink
    assert beat(table, "a", 0.6, demand=100, in_use=4).slots == 4  # applied and within it: confirmed
    assert beat(table, "b", 0.7, demand=100).slots == 4
    # a crashes: after ttl its lease is reclaimed and b grows to the whole cap.
    assert beat(table, "b", 5.0, demand=100, in_use=4).slots == 4
    assert beat(table, "b", 10.7, demand=100, in_use=4).slots == 8
    assert table.reclaimed == 1 and list(table.jobs) == ["b"]


def test_conflicting_limits_refused_while_another_job_holds_a_lease():
    table = LeaseTable(ttl=10.0)
    table.register("a", EndpointLimits(8, 600), 0.0)
    table.register("b", EndpointLimits(8, 600), 1.0)  # the same: fine
    with pytest.raises(LimitsConflict, match=r"this job declares max_concurrency=4.*declared max_concurrency=8"):
        table.register("c", EndpointLimits(4, 600), 2.0)
    table.leave("a")
    table.leave("b")
    table.register("c", EndpointLimits(4, 600), 3.0)  # nobody left: new limits accepted
    assert table.limits == EndpointLimits(4, 600)


def test_the_back_off_of_one_job_reaches_the_others():
    table = LeaseTable()
    for job in "ab":
        table.register(job, EndpointLimits(4), 0.0)
    beat(table, "a", 1.0, paused_until=31.0)
    assert beat(table, "b", 1.1).paused_until == 31.0


@given(st.integers(0, 64), st.dictionaries(st.sampled_from("abcdef"), st.integers(0, 40), min_size=1))
def test_fair_shares(cap, demands):
    shares = fair_shares(cap, demands)
    assert sum(shares.values()) == cap
    wanting = [j for j in demands if shares[j] < demands[j]]
    for job in demands:  # nobody is given more than it wants while someone else wants more, beyond rounding
        if shares[job] > demands[job]:
            assert not wanting
        for other in wanting:
            assert shares[other] >= min(demands[job], shares[job]) - 1


@given(st.floats(10, 100_000), st.floats(0.1, 10), st.lists(st.floats(0, 5), min_size=1, max_size=400))
def test_permits_used_within_their_ttl_stay_within_the_limit_per_minute(per_minute, ttl, gaps):
    """Permits granted by the window bucket, each used up to ``ttl`` later: at most ``per_minute``
    are used in any 60-s window (the latest use of each, the worst case)."""
    bucket = window_bucket(per_minute, ttl)
    t, uses = 0.0, []
    for gap in gaps:
        t += gap
        bucket._drain(t)
        grant = math.floor(bucket.capacity - bucket.level + 1e-9)
        bucket.level += max(0, grant)
        uses += [t + ttl] * max(0, grant)
    uses.sort()
    start = 0
    for end, at in enumerate(uses):
        while uses[start] <= at - 60.0:
            start += 1
        assert end - start + 1 <= per_minute + 1e-6
