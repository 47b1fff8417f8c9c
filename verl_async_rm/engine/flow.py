"""Back-pressure from the reward service: 429/503 are flow control, not failures. Pure (the caller
passes the time), so it is tested in virtual time, exhaustively.

What the agent does when the service says "slow down" (one instance, shared by every request):
1. **Pause.** Nobody sends until the service's ``Retry-After`` (bounded by ``max_pause``; without a
   header, ``default_pause`` doubling per consecutive throttle event). A ``Retry-After`` shorter than
   ``default_pause`` that comes again on the probe, nothing accepted in between, is floored at what
   the pause without a header would have been one event earlier: "Retry-After: 0" from a service
   that only refuses is no licence to retry in a loop.
2. **Probe.** After the pause one request goes (the window is 1): at most one probe per pause.
3. **Ramp.** Each accepted answer opens the window by one, so it doubles per round trip (TCP's slow
   start), back to the full cap; once the service's rate is known, pacing takes over at once.
4. **Learn the rate.** A rate-limited service (a token bucket, as real APIs use) accepts r requests
   per second once its burst is spent. Between two throttle events its bucket was empty at both
   ends, so the requests we sent in between, minus those it rejected, measure r (from below: tokens
   it refilled while we sent less are lost, never counted). Requests sent before the first event
   are never counted: they ran into the bucket's initial burst. Everything is timed by when the
   requests were *sent* (an event: when the refused request left), not by when their answers were
   handled: answers held up by a busy loop (a loaded machine) and then handled in a bunch would
   read as a burst the service never accepted (19/s measured against a true 3/s, kept by the
   max filter below).
5. **Pace.** Requests are then spaced at a rate that follows TCP CUBIC's curve in relative terms:
   it restarts at ``headroom`` x the measured rate, comes back to it over ``K`` seconds (concave,
   so it lingers just below the limit), then grows convexly, so a raised limit (or a first estimate
   that came out low) is found within seconds. The next throttle measures again. The curve stands
   still while the agent has nothing to send. The metrics report both: the pace now
   (``pace_per_s``, which probes above the rate) and the rate measured (``service_rate_per_s``).

Throttles from requests sent before the last event are one congestion event (as TCP counts several
losses in one round trip once): they extend the pause, nothing else. An event that measures nothing
(a 429 storm: no request accepted since the last one) changes nothing but the pause.

No library offers this: aiometer, anyio and aiolimiter have fixed limits, and AWS's adaptive retry
pacer (CUBIC in absolute requests/s) overshoots at low rates, rejecting ~12% at 3 requests/s.
"""

from __future__ import annotations

from collections import deque
from dataclasses import asdict, dataclass

MIN_RATE = 0.01  # requests/s: a learned pace never goes below one request per 100 s
RELIABLE_EVIDENCE = 10  # a measurement resting on this many answers is kept for the max filter
MAX_RECORDED = 200_000  # send times kept per kind for the measurements (bounded memory between rare events)


@dataclass(frozen=True)
class FlowSettings:
    cap: int  # the agent's max_concurrency: the window never exceeds it
    max_pause: float  # bounds every pause, whatever Retry-After says (the agent's backoff_max)
    default_pause: float  # first pause when a throttle carries no Retry-After (the agent's backoff_initial)
    enabled: bool = True
    headroom: float = 0.9  # after a measurement, pace restarts at this share of the measured rate
    cubic: float = 0.004  # CUBIC's C, relative per s^3: back to the measured rate after cbrt((1-headroom)/C) s
    horizon_s: float = 60.0  # throttle events older than this are not used to measure (but the last one)
    release_factor: float = 8.0  # a pace this far above the measured rate without a throttle is dropped
    min_span_s: float = 0.5  # a rate is measured over at least this long


@dataclass(frozen=True)
class FlowStatistics:
    paused_s: float  # until the pause ends (0.0: not paused)
    window: int | None  # sends allowed in flight while recovering (None: only the cap)
    pace_per_s: float | None  # the pace now, which probes above the rate (None: not paced)
    service_rate_per_s: float | None  # the service's rate as last measured
    throttle_events: int  # congestion events so far


@dataclass
class Span:
    """The requests sent between two throttle events (a token bucket was empty at both ends), by
    when they were sent, and what became of them as far as their answers have come."""

    start: float
    end: float
    sent: int
    accepted: int
    refused: int
    measured_at: float

    @property
    def rate(self) -> float:
        """A lower bound of the service's rate: what it is known to have accepted."""
        return self.accepted / (self.end - self.start)

    @property
    def estimate(self) -> float:
        """The rate once the answers still in flight are in, if they fare as those already back did
        (the refusal that ends a span often comes back first: counting only what is back would
        take a slow service for a fraction of itself)."""
        answered = self.accepted + self.refused
        in_flight = max(0, self.sent - answered)
        expected = self.accepted + (in_flight * self.accepted / answered if answered else 0.0)
        return expected / (self.end - self.start)


class FlowControl:
    def __init__(self, settings: FlowSettings):
        self.settings = settings
        self.paused_until = float("-inf")
        self.window: int | None = None  # sends in flight allowed while recovering; None: only the cap
        self.measured_rate: float | None = None  # the service's rate, as last measured (requests/s)
        self.sending = 0  # sent and not yet answered
        self.events = 0  # congestion events so far
        self.throttles = 0  # throttled answers so far
        self.throttled_since: float | None = None  # first throttle since the last accepted answer
        self._rate_at = 0.0
        self.epoch = 0  # a send carries the epoch it was sent in: later throttles of it are old news
        self._countable = 1  # answers to epochs below this are never measured (the first, and pre-backlog ones)
        self._quiet_events = 0  # consecutive events without an accepted answer between them
        self._next_send = float("-inf")
        self._latency = 0.0  # smoothed answer latency, seconds
        self._unit = 1.0  # the pace curve's time unit, seconds (see _measure)
        self._idle_since: float | None = None  # nothing to send since then: the pace curve stands still
        self._accepted: deque[float] = deque()  # send times of accepted requests of countable epochs (horizon)
        self._refused: deque[float] = deque()  # send times of refused ones
        self._sent: deque[float] = deque()  # send times of every request of a countable epoch
        self._log: deque[float] = deque()  # send times of the refused requests that made events (horizon)
        self._spans: deque[Span] = deque()  # measurements between two events, of the horizon (the max filter's)

    # -- queries --------------------------------------------------------------------------------
    def current_rate(self, now: float) -> float | None:
        """The pace now (requests/s), or None when requests are not paced. A query: reading it (the
        agent's metrics) changes nothing."""
        if self.measured_rate is None:
            return None
        factor = self._factor(now)
        if factor > self.settings.release_factor:
            return None  # paced far above the measured limit without a throttle: it is gone
        return max(MIN_RATE, self.measured_rate * factor)

    def _factor(self, now: float) -> float:
        """The pace curve (CUBIC's, relative to the measured rate) at ``now``. Its clock stands still
        while the agent has nothing to send (between two batches): probing upward is probing only
        while requests go out, and an idle agent's pace must not drift away from what the service
        was measured to accept (as TCP keeps an application-limited window from growing)."""
        s = self.settings
        k = ((1.0 - s.headroom) / s.cubic) ** (1.0 / 3.0)
        if self._idle_since is not None:
            now = min(now, self._idle_since)
        elapsed = max(0.0, now - self._rate_at) / self._unit
        return 1.0 + s.cubic * (elapsed - k) ** 3

    def _drop_released_pace(self, now: float) -> None:
        if self.measured_rate is not None and self._factor(now) > self.settings.release_factor:
            self.measured_rate = None

    # -- admission: a meter (engine/meters.py) -------------------------------------------------
    reserves = False

    def wait(self, sample: object, now: float) -> float | None:
        """0.0: a request may be sent now; > 0: seconds until one may; None: wait for an answer."""
        if not self.settings.enabled:
            return 0.0
        if now < self.paused_until:
            return self.paused_until - now
        if self.window is not None and self.sending >= self.window:
            return None
        if now < self._next_send and self.current_rate(now) is not None:
            return self._next_send - now
        return 0.0

    def send_delay(self, now: float) -> float | None:
        """``wait`` for any request."""
        return self.wait(None, now)

    def throttled_for(self, now: float) -> float:
        """How long every answer has been a throttle (0.0 when the last answer was accepted)."""
        return 0.0 if self.throttled_since is None else now - self.throttled_since

    # -- events ---------------------------------------------------------------------------------
    def on_send(self, now: float) -> int:
        """A request leaves now; returns its epoch, to be passed back with its answer."""
        self.take(None, now)
        return self.epoch

    def take(self, sample: object, now: float) -> None:
        """A request leaves now (the meter's ``take``): it carries ``epoch``, passed back with its answer."""
        self.sending += 1
        if self.settings.enabled:
            if self._idle_since is not None:  # sending again: the curve resumes where it stood
                self._rate_at += max(0.0, now - self._idle_since)
                self._idle_since = None
            if self.measured_rate is not None:  # (asked only then: a call per request saved on the hot path)
                rate = self.current_rate(now)
                if rate is not None:
                    self._next_send = max(now, self._next_send) + 1.0 / rate
                else:
                    self.measured_rate = None  # released (see current_rate)
            if self.epoch >= self._countable:  # never before the first throttle: the hot path stays lean
                self._record(self._sent, now, now)

    def on_answer(
        self, now: float, epoch: int, *, sent_at: float | None = None, throttled: bool = False,
        retry_after: float | None = None,
    ) -> None:
        """The answer to a request sent at ``sent_at`` in ``epoch`` (``self.epoch`` when it was sent).
        Every answer that is not a 429/503 counts as accepted (errors and timeouts included: the
        service took the request)."""
        self.sending = max(0, self.sending - 1)
        if sent_at is not None:
            self._latency = 0.8 * self._latency + 0.2 * max(0.0, now - sent_at)
        if not throttled:
            if epoch >= self._countable:  # never before the first throttle: the hot path stays lean
                sent = now if sent_at is None else sent_at
                self._record(self._accepted, sent, now)
                if self._spans and sent <= self._spans[-1].end:
                    self._count_late(sent, accepted=True)
            if epoch < self.epoch:
                return  # sent before the last event (the burst that ran into it): says nothing new
            self._quiet_events = 0
            self.throttled_since = None
            if self.window is not None:
                self.window += 1  # +1 per answer: doubles per round trip
                if self.window >= self.settings.cap or self.current_rate(now) is not None:
                    self.window = None  # full cap reached, or the pace now keeps the rate
            return
        self.throttles += 1
        if not self.settings.enabled:
            return
        if epoch >= self._countable:
            sent = now if sent_at is None else sent_at
            self._record(self._refused, sent, now)
            if self._spans and sent <= self._spans[-1].end:
                self._count_late(sent, accepted=False)
        if self.throttled_since is None:
            self.throttled_since = now
        own = self.settings.default_pause * 2 ** min(self._quiet_events, 30)  # doubling per refused probe
        if retry_after is None or retry_after < 0:
            pause = own
        elif retry_after < self.settings.default_pause and self._quiet_events and epoch >= self.epoch:
            # Told to come back (almost) at once, did, and was refused again with nothing accepted
            # in between: such a header says nothing ("Retry-After: 0" made 334 requests in 10 s to
            # a service answering only 429; 8 without it). Floored at the pause a refusal without
            # it would have got one event earlier: such a storm costs what one without it does.
            # A longer Retry-After is the service's own word and is kept (one probe per window).
            pause = max(retry_after, own / 2)
        else:
            pause = retry_after
        self.paused_until = max(self.paused_until, now + min(pause, self.settings.max_pause))
        if epoch < self.epoch:
            return  # sent before the last event: the same congestion, already handled
        self.events += 1
        self._quiet_events += 1
        self.window = 1  # after the pause: one probe
        self._measure(now, now if sent_at is None else sent_at)
        self.epoch += 1

    def hold(self, until: float) -> None:
        """Pause until ``until`` as if this agent had been throttled (another job sharing the
        endpoint was: ``shared_limits.py``)."""
        self.paused_until = max(self.paused_until, until)

    def on_abandoned(self) -> None:
        """A request given up before its answer (deadline, cancel): it teaches nothing."""
        self.sending = max(0, self.sending - 1)

    def on_backlog_cleared(self, now: float | None = None) -> None:
        """Everything queued has been sent: the agent asked for less than the service allows, so what
        was accepted until now says nothing about the service's rate. From ``now`` until the next
        send the pace curve stands still."""
        self._countable = self.epoch + 1
        self._log.clear()
        self._accepted.clear()
        self._refused.clear()
        self._sent.clear()
        self._spans.clear()
        if now is not None and self._idle_since is None:
            self._idle_since = now

    # -- the rate -----------------------------------------------------------------------------------
    def _measure(self, now: float, event_at: float) -> None:
        """The service's rate, from accepted requests, timed by when they were sent, up to
        ``event_at`` (when the request refused now was sent). The larger of two estimates:
        - since an earlier event: the latest one at least ``min_span_s`` before (recent enough to
          follow a changed limit, long enough that counting whole requests does not dominate):
          what the service accepted in between, the requests still in flight expected to fare as
          those already answered (``Span.estimate``); their answers, as they come, correct it
          (``_count_late``), and what is known accepted (``Span.rate``) feeds the max filter;
        - over the last few latencies, before the first pace only: after a ramp (slow start), the
          span since the last event is mostly ramp, below the limit; its last round trips ran at it.
          (Not a bound when the ramp drained a refilled bucket: never kept by the max filter.)"""
        self._drop_released_pace(now)
        horizon = now - self.settings.horizon_s
        while len(self._log) > 1 and self._log[0] < horizon:  # the last event is kept, however old
            self._log.popleft()
        while self._spans and self._spans[0].measured_at < horizon:
            self._spans.popleft()
        accepted = self._accepted
        estimates = []  # (rate, answers it rests on)
        for earlier in reversed(self._log):
            if event_at - earlier >= self.settings.min_span_s:
                span = Span(earlier, event_at, _between(self._sent, earlier, event_at), _between(accepted, earlier, event_at),
                            _between(self._refused, earlier, event_at), now)
                self._spans.append(span)
                estimates.append((span.estimate, span.accepted))
                break
        recent_span = self._recent_span()
        if self.measured_rate is None and self._log and event_at - self._log[0] >= recent_span:
            # Only for the first pace: once requests are paced, a pause refills the service's bucket,
            # and the burst that drains it after the pause would read as a higher rate.
            count = sum(1 for sent in accepted if event_at - recent_span < sent <= event_at)
            estimates.append((count / recent_span, count))
        rate, evidence = max(estimates, default=(0.0, 0))
        # Max filter (as BBR keeps the bottleneck bandwidth): the service's rate is the largest
        # well-founded measurement of the horizon, not the latest. Under throttles that do not
        # come from a rate we exceed (a 429 now and then), what was accepted is just our own pace
        # minus the pauses, and restarting from the latest measurement would spiral down. Only what
        # is known accepted between two events counts: a bound; estimates and the recent window are not.
        known = self._known_rate()
        if known is not None:
            rate = max(rate, known)
        pace = self.current_rate(now)
        # Throttled while pacing below the rate the service is known to accept: not the limit we
        # pace against (a token bucket would not refuse us here). Pause as asked, keep the curve.
        below_known = pace is not None and known is not None and pace < known
        if rate > 0 and not below_known:  # nothing accepted (a storm of 429s): nothing learned
            self.measured_rate = max(MIN_RATE, rate)
            self._rate_at = now
            # The curve's second: long enough for answers to come back and for a few requests to be
            # sent (up to 10), so each cycle below and above the limit is measured rather than
            # guessed. A rate measured on fewer answers is rough (one answer in half a second says
            # 2/s of a 3/s limit): its curve is shorter, so the next throttle, and a better
            # measurement, come soon.
            self._unit = max(0.25, 2.0 * self._latency, min(evidence, 10) / self.measured_rate)
            self._next_send = max(self._next_send, self.paused_until)
        self._log.append(event_at)

    def _record(self, times: deque[float], at: float, now: float) -> None:
        """Keep a request's send time for the measurements: back to the horizon, or to the last
        event if that is older (the next span starts there), and never more than MAX_RECORDED."""
        times.append(at)
        oldest = now - self.settings.horizon_s
        if self._log and self._log[-1] < oldest:
            oldest = self._log[-1]
        while times[0] < oldest or len(times) > MAX_RECORDED:
            times.popleft()

    def _known_rate(self) -> float | None:
        return max((span.rate for span in self._spans if span.accepted >= RELIABLE_EVIDENCE), default=None)

    def _count_late(self, sent: float, accepted: bool) -> None:
        """An answer to a request sent inside a span measured already (the refusal that ended it came
        back first: a burst; a slow service's answers in flight). Counted now, the span's estimate
        becomes what the service did, and the pace goes up with it if that is the latest span or a
        well-founded one."""
        for span in reversed(self._spans):
            if span.start < sent <= span.end:
                if accepted:
                    span.accepted += 1
                else:
                    span.refused += 1
                rate = span.estimate
                latest = span is self._spans[-1]
                if self.measured_rate is not None and rate > self.measured_rate and (
                        latest or span.accepted >= RELIABLE_EVIDENCE):
                    self.measured_rate = rate
                    self._unit = max(0.25, 2.0 * self._latency, min(span.accepted, 10) / rate)  # as in _measure
                return
            if span.end < sent:
                return

    def _recent_span(self) -> float:
        return max(self.settings.min_span_s, 3.0 * self._latency)

    def statistics(self, now: float) -> FlowStatistics:
        return FlowStatistics(
            paused_s=max(0.0, self.paused_until - now),
            window=self.window,
            pace_per_s=self.current_rate(now),
            service_rate_per_s=self.measured_rate,
            throttle_events=self.events,
        )

    def snapshot(self, now: float) -> dict:
        return asdict(self.statistics(now))


def _between(times: deque[float], start: float, end: float) -> int:
    """How many of ``times`` (send times, nearly in order) fall in (start, end]."""
    return sum(1 for at in times if start < at <= end)
