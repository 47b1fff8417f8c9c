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
   are never counted: they ran into the bucket's initial burst.
5. **Pace.** Requests are then spaced at a rate that follows TCP CUBIC's curve in relative terms:
   it restarts at ``headroom`` x the measured rate, comes back to it over ``K`` seconds (concave,
   so it lingers just below the limit), then grows convexly, so a raised limit (or a first estimate
   that came out low) is found within seconds. The next throttle measures again.

Throttles from requests sent before the last event are one congestion event (as TCP counts several
losses in one round trip once): they extend the pause, nothing else. An event that measures nothing
(a 429 storm: no request accepted since the last one) changes nothing but the pause.

No library offers this: aiometer, anyio and aiolimiter have fixed limits, and AWS's adaptive retry
pacer (CUBIC in absolute requests/s) overshoots at low rates, rejecting ~12% at 3 requests/s.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

MIN_RATE = 0.01  # requests/s: a learned pace never goes below one request per 100 s
RELIABLE_EVIDENCE = 10  # a measurement resting on this many answers is kept for the max filter


@dataclass(frozen=True)
class FlowSettings:
    cap: int  # the agent's max_concurrency: the window never exceeds it
    max_pause: float  # bounds every pause, whatever Retry-After says (the agent's backoff_max)
    default_pause: float  # first pause when a throttle carries no Retry-After (the agent's backoff_initial)
    enabled: bool = True
    headroom: float = 0.9  # after a measurement, pace restarts at this share of the measured rate
    cubic: float = 0.004  # CUBIC's C, relative per s^3: back to the measured rate after cbrt((1-headroom)/C) s
    horizon_s: float = 60.0  # throttle events older than this are not used to measure
    release_factor: float = 8.0  # a pace this far above the measured rate without a throttle is dropped
    min_span_s: float = 0.5  # a rate is measured over at least this long


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
        self._epoch = 0  # a send carries the epoch it was sent in: later throttles of it are old news
        self._countable = 1  # answers to epochs below this are never measured (the first, and pre-backlog ones)
        self._quiet_events = 0  # consecutive events without an accepted answer between them
        self._next_send = float("-inf")
        self._latency = 0.0  # smoothed answer latency, seconds
        self._unit = 1.0  # the pace curve's time unit, seconds (see _measure)
        self._accepted = 0  # accepted answers to requests of countable epochs
        self._recent: deque[float] = deque()  # their times, over the last few latencies
        self._log: deque[tuple[float, int]] = deque()  # (event time, self._accepted then)
        self._measured: deque[tuple[float, float]] = deque()  # (time, rate) of well-founded measurements

    # -- queries --------------------------------------------------------------------------------
    def current_rate(self, now: float) -> float | None:
        """The pace now (requests/s), or None when requests are not paced."""
        if self.measured_rate is None:
            return None
        s = self.settings
        k = ((1.0 - s.headroom) / s.cubic) ** (1.0 / 3.0)
        elapsed = max(0.0, now - self._rate_at) / self._unit
        factor = 1.0 + s.cubic * (elapsed - k) ** 3
        if factor > s.release_factor:
            self.measured_rate = None  # paced far above the measured limit without a throttle: it is gone
            return None
        return max(MIN_RATE, self.measured_rate * factor)

    def send_delay(self, now: float) -> float | None:
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

    def throttled_for(self, now: float) -> float:
        """How long every answer has been a throttle (0.0 when the last answer was accepted)."""
        return 0.0 if self.throttled_since is None else now - self.throttled_since

    # -- events ---------------------------------------------------------------------------------
    def on_send(self, now: float) -> int:
        """A request leaves now; returns its epoch, to be passed back with its answer."""
        self.sending += 1
        if self.settings.enabled:
            rate = self.current_rate(now)
            if rate is not None:
                self._next_send = max(now, self._next_send) + 1.0 / rate
        return self._epoch

    def on_answer(
        self, now: float, epoch: int, *, sent_at: float | None = None, throttled: bool = False,
        retry_after: float | None = None,
    ) -> None:
        """The answer to a request sent at ``sent_at`` in ``epoch`` (what ``on_send`` returned).
        Every answer that is not a 429/503 counts as accepted (errors and timeouts included: the
        service took the request)."""
        self.sending = max(0, self.sending - 1)
        if sent_at is not None:
            self._latency = 0.8 * self._latency + 0.2 * max(0.0, now - sent_at)
        if not throttled:
            if epoch >= self._countable:  # never before the first throttle: the hot path stays lean
                self._accepted += 1
                self._recent.append(now)
                while self._recent[0] < now - self._recent_span():
                    self._recent.popleft()
            if epoch < self._epoch:
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
        if self.throttled_since is None:
            self.throttled_since = now
        own = self.settings.default_pause * 2 ** min(self._quiet_events, 30)  # doubling per refused probe
        if retry_after is None or retry_after < 0:
            pause = own
        elif retry_after < self.settings.default_pause and self._quiet_events and epoch >= self._epoch:
            # Told to come back (almost) at once, did, and was refused again with nothing accepted
            # in between: such a header says nothing ("Retry-After: 0" made 334 requests in 10 s to
            # a service answering only 429; 8 without it). Floored at the pause a refusal without
            # it would have got one event earlier: such a storm costs what one without it does.
            # A longer Retry-After is the service's own word and is kept (one probe per window).
            pause = max(retry_after, own / 2)
        else:
            pause = retry_after
        self.paused_until = max(self.paused_until, now + min(pause, self.settings.max_pause))
        if epoch < self._epoch:
            return  # sent before the last event: the same congestion, already handled
        self.events += 1
        self._quiet_events += 1
        self.window = 1  # after the pause: one probe
        self._measure(now)
        self._epoch += 1

    def on_abandoned(self) -> None:
        """A request given up before its answer (deadline, cancel): it teaches nothing."""
        self.sending = max(0, self.sending - 1)

    def on_backlog_cleared(self) -> None:
        """Everything queued has been sent: the agent asked for less than the service allows, so what
        was accepted until now says nothing about the service's rate."""
        self._countable = self._epoch + 1
        self._log.clear()
        self._recent.clear()
        self._measured.clear()

    # -- the rate -----------------------------------------------------------------------------------
    def _measure(self, now: float) -> None:
        """The service's rate, from accepted answers (throughput, not sends: answers still in flight
        are neither counted nor guessed), the larger of two lower bounds:
        - since an earlier event: the latest one at least ``min_span_s`` ago (recent enough to follow a
          changed limit, long enough that counting whole requests does not dominate);
        - over the last few latencies, before the first pace only: after a ramp (slow start), the
          span since the last event is mostly ramp, below the limit; its last round trips ran at it."""
        horizon = now - self.settings.horizon_s
        while self._log and self._log[0][0] < horizon:
            self._log.popleft()
        recent_span = self._recent_span()
        while self._recent and self._recent[0] < now - recent_span:
            self._recent.popleft()
        estimates = []  # (rate, answers it rests on)
        for at, accepted in reversed(self._log):
            span = now - at
            if span >= self.settings.min_span_s:
                estimates.append(((self._accepted - accepted) / span, self._accepted - accepted))
                break
        if self.measured_rate is None and self._log and now - self._log[0][0] >= recent_span:
            # Only for the first pace: once requests are paced, a pause refills the service's bucket,
            # and the burst that drains it after the pause would read as a higher rate.
            estimates.append((len(self._recent) / recent_span, len(self._recent)))
        rate, evidence = max(estimates, default=(0.0, 0))
        # Max filter (as BBR keeps the bottleneck bandwidth): the service's rate is the largest
        # well-founded measurement of the horizon, not the latest. Under throttles that do not
        # come from a rate we exceed (a 429 now and then), what was accepted is just our own pace
        # minus the pauses, and restarting from the latest measurement would spiral down.
        while self._measured and self._measured[0][0] < horizon:
            self._measured.popleft()
        if evidence >= RELIABLE_EVIDENCE:
            self._measured.append((now, rate))
        rate = max([rate, *(r for _, r in self._measured)])
        pace = self.current_rate(now)
        # Throttled while pacing below the rate the service is known to accept: not the limit we
        # pace against (a token bucket would not refuse us here). Pause as asked, keep the curve.
        below_known = pace is not None and pace < self.measured_rate
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
        self._log.append((now, self._accepted))

    def _recent_span(self) -> float:
        return max(self.settings.min_span_s, 3.0 * self._latency)

    def snapshot(self, now: float) -> dict:
        return {
            "paused_s": max(0.0, self.paused_until - now),
            "window": self.window,
            "pace_per_s": self.current_rate(now),
            "throttle_events": self.events,
        }
