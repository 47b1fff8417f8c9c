"""A loopback OpenAI-compatible "judge" server with fault injection, for tests, benchmarks and demos.

Why this exists: the reward agent's retries, rate limiting and failure policies are only
trustworthy if they are exercised against *real* HTTP through the *real* ``openai.AsyncOpenAI``
client -- mocks of the client would happily accept behaviour the real one never produces
(header parsing, exception mapping, connection pooling, timeouts). This module is a small
aiohttp server that speaks just enough of the chat-completions API for that client, judges
deterministically (so tests can assert scores), injects seeded faults, and counts what it saw
(so tests can compare the server's view with the client's).

Python use (sync or async; the server runs on its own event loop in a daemon thread)::

    with JudgeServer(JudgeServerConfig(latency=(0.1, 0.3), rate_429=0.1)) as server:
        client = openai.AsyncOpenAI(base_url=server.base_url, api_key="x", max_retries=0)
        ...
        server.stats().outcomes["429"]

    async with JudgeServer(cfg) as server:   # start/stop off the caller's loop via to_thread
        ...

Command line::

    python -m verl_async_rm_rig.judge_server --port 0 --latency 0.5:2.0 --rate-429 0.1
    python -m verl_async_rm_rig.judge_server --bucket-capacity 30 --bucket-refill 3 --storm 60:20

Flow control as real APIs do it (for testing a client's back-pressure): a token bucket
(``bucket_capacity`` C, ``bucket_refill_per_s`` r: "30 requests per 10 s" is C=30, r=3) that answers
429 with ``Retry-After`` = the time until a token is available (optionally rounded up to whole
seconds), the older sliding-window ``rpm_limit``, and 429 "storms" (every request refused for a
while, with a fixed Retry-After). Every request is logged (arrival, outcome, finish; bounded) so a
test can compute goodput, the share rejected after the first 429, probes per Retry-After window
during a storm and the concurrency the client reached.

Endpoints: ``POST /v1/chat/completions``, ``GET /v1/models``, ``GET /stats[?window=S]``,
``POST /stats/reset``, ``POST /storm?duration=S[&retry_after=R]``. Only loopback addresses may be bound: this is a test fixture, never a
service, and must not be reachable from outside the machine.
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import itertools
import json
import math
import random
import re
import signal
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from aiohttp import web

__all__ = [
    "OUTCOMES",
    "MALFORMED_KINDS",
    "JudgeServerConfig",
    "JudgeServer",
    "JudgeStats",
    "RequestRecord",
    "TokenBucket",
    "REJECTED_OUTCOMES",
    "THROTTLE_OUTCOMES",
    "default_judge",
    "partial_credit_judge",
    "extract_last_number",
    "group_prompt",
    "lognormal_latency",
    "max_requests_in_window",
]

# Every chat request ends in exactly one of these, so the counts always sum to ``requests``
# (once nothing is in flight). "rate_limited" is the server's own limiter (token bucket or rpm
# window), "storm" a request refused during a 429 storm; "429" is a random injected fault.
# "bad_request"/"judge_error" are not faults: they flag a broken caller/judge. "outage": a request
# that arrived during an outage window, answered 500 at once (a judge that is down).
OUTCOMES = ("ok", "429", "500", "503", "hang", "malformed", "rate_limited", "storm", "bad_request", "judge_error", "outage")
# Refused at the front door by the server's flow control (never processed, no token taken).
REJECTED_OUTCOMES = ("rate_limited", "storm")
# Every outcome answered with HTTP 429.
THROTTLE_OUTCOMES = ("429", "rate_limited", "storm")
MALFORMED_KINDS = ("truncated", "no_choices", "non_numeric")

_LOOPBACK_NAMES = {"localhost"}
_MIN_ERROR_BODY = 256  # bytes: room for the OpenAI error envelope around a padded message


# --------------------------------------------------------------------------- judging rule

# Commas are only dropped *between digits* ("1,234" -> "1234") so that "3, 4" stays two numbers.
_DIGIT_COMMA = re.compile(r"(?<=\d),(?=\d)")
# A leading "-" counts as a sign only when it is not glued to a word/number ("3-5" ends in 5, not -5).
_NUMBER = re.compile(r"(?:(?<![\w.])-)?\d+(?:\.\d+)?")
_RESPONSE = re.compile(r"<response>(.*)</response>", re.DOTALL)  # greedy: first open .. last close
_REFERENCE = re.compile(r"<reference>(.*?)</reference>", re.DOTALL)


def extract_last_number(text: str) -> float | None:
    """The last number in ``text`` (``\\boxed{18}``, ``#### 18`` and "is 1,234." all end in one)."""
    found = _NUMBER.findall(_DIGIT_COMMA.sub("", text))
    return float(found[-1]) if found else None


def _text_of(content: Any) -> str:
    # OpenAI allows content as a string or as a list of parts ({"type": "text", "text": ...}).
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""


# A group judge's prompt (one call for a whole group): a reference and numbered candidates.
_CANDIDATE = re.compile(r'<candidate id="(\d+)">(.*?)</candidate>', re.DOTALL)


def group_prompt(messages: list[dict]) -> tuple[str, list[str]] | None:
    """(reference, candidates in id order) of a group judge's prompt, or None if it is not one. A
    fixture's parser: a candidate that itself contains ``</candidate>`` is cut there."""
    users = [m for m in messages if isinstance(m, dict) and m.get("role") == "user"]
    text = _text_of(users[-1].get("content")) if users else ""
    candidates = _CANDIDATE.findall(text)
    if not candidates:
        return None
    rest = _CANDIDATE.sub("", text)
    ref = _REFERENCE.search(rest)
    ordered = [body for _, body in sorted(candidates, key=lambda c: int(c[0]))]
    return (ref.group(1) if ref else ""), ordered


def default_judge(messages: list[dict]) -> str:
    """"1" if the last number in ``<response>`` equals the number in ``<reference>``, else "0".
    A group prompt (``<candidate id="i">`` blocks, see ``group_prompt``) gets one such verdict per
    candidate, in id order, space-separated ("1 0 1 1"): the ranking mode of the same endpoint.

    The reference is searched *outside* the response span, so a policy response that itself
    contains ``<reference>..</reference>`` cannot overwrite the real reference, whatever order
    the prompt template puts the two blocks in.
    """
    group = group_prompt(messages)
    if group is not None:
        want = extract_last_number(group[0])
        return " ".join("1" if want is not None and extract_last_number(c) == want else "0" for c in group[1])
    users = [m for m in messages if isinstance(m, dict) and m.get("role") == "user"]
    if not users:
        return "0"
    text = _text_of(users[-1].get("content"))
    resp = _RESPONSE.search(text)
    if resp is None:
        return "0"
    ref = _REFERENCE.search(text[: resp.start()] + text[resp.end() :])
    if ref is None:
        return "0"
    got, want = extract_last_number(resp.group(1)), extract_last_number(ref.group(1))
    return "1" if got is not None and want is not None and got == want else "0"


def partial_credit_judge(messages: list[dict]) -> str:
    """A deliberately different judge (for judge replay, ``verl-async-rm replay``): "1" for the right
    number, "0.5" for one off by at most 2 (an arithmetic slip), else "0"; group prompts as
    ``default_judge``. It agrees with it on what is right and disagrees on near misses."""
    if group_prompt(messages) is not None:
        return default_judge(messages)
    users = [m for m in messages if isinstance(m, dict) and m.get("role") == "user"]
    text = _text_of(users[-1].get("content")) if users else ""
    resp = _RESPONSE.search(text)
    ref = _REFERENCE.search(text[: resp.start()] + text[resp.end():]) if resp else None
    got = extract_last_number(resp.group(1)) if resp else None
    want = extract_last_number(ref.group(1)) if ref else None
    if got is None or want is None:
        return "0"
    return "1" if got == want else ("0.5" if abs(got - want) <= 2 else "0")


JUDGES = {"exact": default_judge, "partial": partial_credit_judge}  # the command line's --judge


# --------------------------------------------------------------------------- config


def _is_loopback(host: str) -> bool:
    if host in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback  # 127.0.0.0/8 and ::1
    except ValueError:
        return False  # any other name: we refuse to resolve it, it could point anywhere


@dataclass(frozen=True)
class JudgeServerConfig:
    """All behaviour of one server. Rates are per-request probabilities, drawn when a request arrives."""

    host: str = "127.0.0.1"
    port: int = 0  # 0 = ephemeral, so parallel tests never collide
    model: str = "judge-stub"
    # Seconds before answering: a fixed float, or (lo, hi) for uniform [lo, hi].
    latency: float | tuple[float, float] = 0.0
    # ... or, when set, lognormal given by its median and 99th percentile (p50, p99) seconds: the
    # heavy tail a hosted judge shows (replaces ``latency``).
    latency_lognormal: tuple[float, float] | None = None
    rate_429: float = 0.0
    rate_500: float = 0.0
    rate_503: float = 0.0
    rate_hang: float = 0.0
    rate_malformed: float = 0.0
    malformed_kinds: tuple[str, ...] = MALFORMED_KINDS  # chosen uniformly per malformed reply
    retry_after_s: float = 1.0  # Retry-After on injected 429/503 (fractional allowed)
    hang_seconds: float = 3600.0
    # Server-side limiter: at most rpm_limit *accepted* requests per rpm_window_s seconds, else 429.
    # rpm_window_s defaults to a minute; a shorter window compresses time in tests.
    rpm_limit: int | None = None
    rpm_window_s: float = 60.0
    # Server-side token bucket: capacity C tokens (starts full), refilled at r tokens/s; each accepted
    # request takes one. Without a whole token: 429 with Retry-After = the time until there is one.
    bucket_capacity: int | None = None
    bucket_refill_per_s: float = 1.0
    # Round every Retry-After the server sends up to whole seconds (as many APIs do); else to the ms.
    retry_after_whole_seconds: bool = False
    # A 429 storm: during [storm_start_s, storm_start_s + storm_duration_s) after start(), every
    # request gets 429 with Retry-After storm_retry_after_s. ``JudgeServer.start_storm`` adds one at run time.
    storm_start_s: float | None = None
    storm_duration_s: float = 0.0
    storm_retry_after_s: float = 1.0
    # An outage: during [outage_start_s, outage_start_s + outage_duration_s) after start(), every
    # request is answered 500 at once (the judge is down). ``JudgeServer.start_outage`` adds one at run time.
    outage_start_s: float | None = None
    outage_duration_s: float = 0.0
    # Size in bytes of the body of injected 500s (0 = the usual small error body): a valid OpenAI
    # error JSON whose message is padded, so clients that copy error text are exercised.
    error_body_bytes: int = 0
    seed: int | None = 0  # None = nondeterministic
    judge: Callable[[list[dict]], str] = default_judge
    # Token usage reported per completion: usage(messages, reply) -> (prompt_tokens, completion_tokens);
    # None = words in the messages and the reply. The sums of what 200 answers reported are in stats().
    usage: Callable[[list[dict], str], tuple[int, int]] | None = None
    max_timestamps: int = 1_000_000  # arrival timestamps kept for sliding-window stats (bounded memory)
    max_records: int = 200_000  # per-request records (arrival, outcome, finish) kept, most recent
    shutdown_timeout_s: float = 1.0  # grace for in-flight non-hung handlers on close()

    def __post_init__(self) -> None:
        if not _is_loopback(self.host):
            raise ValueError(f"JudgeServer binds loopback only (127.0.0.0/8, ::1, localhost); got host={self.host!r}")
        if not (isinstance(self.port, int) and 0 <= self.port <= 65535):
            raise ValueError(f"port must be in [0, 65535], got {self.port!r}")
        lat = self.latency
        if isinstance(lat, (list, tuple)):
            if len(lat) != 2:
                raise ValueError(f"latency range must be (lo, hi), got {lat!r}")
            lat = (float(lat[0]), float(lat[1]))
            object.__setattr__(self, "latency", lat)  # normalise lists so the config stays hashable
            lo, hi = lat
        else:
            lo = hi = float(lat)
        if not (math.isfinite(lo) and math.isfinite(hi) and 0 <= lo <= hi):
            raise ValueError(f"latency must satisfy 0 <= lo <= hi, got {self.latency!r}")
        if self.latency_lognormal is not None:
            quantiles = self.latency_lognormal
            if not isinstance(quantiles, (list, tuple)) or len(quantiles) != 2:
                raise ValueError(f"latency_lognormal must be (p50, p99) seconds, got {quantiles!r}")
            p50, p99 = (float(q) for q in quantiles)
            if not (math.isfinite(p50) and math.isfinite(p99) and 0 < p50 <= p99):
                raise ValueError(f"latency_lognormal must satisfy 0 < p50 <= p99, got {quantiles!r}")
            object.__setattr__(self, "latency_lognormal", (p50, p99))
        rates = self._rates()
        for name, r in rates.items():
            if not (isinstance(r, (int, float)) and 0.0 <= r <= 1.0):
                raise ValueError(f"{name} must be in [0, 1], got {r!r}")
        if sum(rates.values()) > 1.0 + 1e-9:
            raise ValueError(f"fault rates sum to {sum(rates.values())} > 1")
        object.__setattr__(self, "malformed_kinds", tuple(self.malformed_kinds))
        bad = set(self.malformed_kinds) - set(MALFORMED_KINDS)
        if bad or not self.malformed_kinds:
            raise ValueError(f"malformed_kinds must be a non-empty subset of {MALFORMED_KINDS}, got {self.malformed_kinds!r}")
        if not (self.retry_after_s >= 0 and math.isfinite(self.retry_after_s)):
            raise ValueError(f"retry_after_s must be >= 0, got {self.retry_after_s!r}")
        if not self.hang_seconds > 0:
            raise ValueError(f"hang_seconds must be > 0, got {self.hang_seconds!r}")
        if self.rpm_limit is not None and (not isinstance(self.rpm_limit, int) or self.rpm_limit < 1):
            raise ValueError(f"rpm_limit must be a positive int or None, got {self.rpm_limit!r}")
        if not self.rpm_window_s > 0:
            raise ValueError(f"rpm_window_s must be > 0, got {self.rpm_window_s!r}")
        if self.bucket_capacity is not None:
            if isinstance(self.bucket_capacity, bool) or not isinstance(self.bucket_capacity, int) or self.bucket_capacity < 1:
                raise ValueError(f"bucket_capacity must be a positive int or None, got {self.bucket_capacity!r}")
            if not (math.isfinite(self.bucket_refill_per_s) and self.bucket_refill_per_s > 0):
                raise ValueError(f"bucket_refill_per_s must be > 0, got {self.bucket_refill_per_s!r}")
        if self.storm_start_s is not None:
            if not (math.isfinite(self.storm_start_s) and self.storm_start_s >= 0):
                raise ValueError(f"storm_start_s must be >= 0, got {self.storm_start_s!r}")
            if not (math.isfinite(self.storm_duration_s) and self.storm_duration_s > 0):
                raise ValueError(f"storm_duration_s must be > 0 with a storm_start_s, got {self.storm_duration_s!r}")
        if self.outage_start_s is not None:
            if not (math.isfinite(self.outage_start_s) and self.outage_start_s >= 0):
                raise ValueError(f"outage_start_s must be >= 0, got {self.outage_start_s!r}")
            if not (math.isfinite(self.outage_duration_s) and self.outage_duration_s > 0):
                raise ValueError(f"outage_duration_s must be > 0 with an outage_start_s, got {self.outage_duration_s!r}")
        if not (math.isfinite(self.storm_retry_after_s) and self.storm_retry_after_s >= 0):
            raise ValueError(f"storm_retry_after_s must be >= 0, got {self.storm_retry_after_s!r}")
        if isinstance(self.error_body_bytes, bool) or not isinstance(self.error_body_bytes, int) or not (
            self.error_body_bytes == 0 or self.error_body_bytes >= _MIN_ERROR_BODY
        ):
            raise ValueError(f"error_body_bytes must be 0 or >= {_MIN_ERROR_BODY}, got {self.error_body_bytes!r}")
        if self.max_timestamps < 1:
            raise ValueError("max_timestamps must be >= 1")
        if self.max_records < 1:
            raise ValueError("max_records must be >= 1")
        if not callable(self.judge):
            raise ValueError("judge must be callable")

    def _rates(self) -> dict[str, float]:
        return {
            "rate_429": self.rate_429,
            "rate_500": self.rate_500,
            "rate_503": self.rate_503,
            "rate_hang": self.rate_hang,
            "rate_malformed": self.rate_malformed,
        }


# --------------------------------------------------------------------------- flow control (pure)


class TokenBucket:
    """``capacity`` tokens, full at the start, refilled continuously at ``refill_per_s``; an accepted
    request takes one whole token. Pure: time is passed in, so the arithmetic is tested exactly.

    Written here rather than taken from aiolimiter (not a dependency) because a server needs
    "take a token now, or tell me how long until there is one" without waiting, and aiolimiter only
    offers an awaiting ``acquire``.
    """

    _EPS = 1e-9  # a client that waits exactly Retry-After must not lose to float rounding

    def __init__(self, capacity: float, refill_per_s: float, now: float) -> None:
        if not capacity >= 1 or not refill_per_s > 0:
            raise ValueError(f"bad token bucket capacity={capacity!r} refill_per_s={refill_per_s!r}")
        self.capacity = float(capacity)
        self.refill_per_s = float(refill_per_s)
        self.tokens = float(capacity)
        self.updated = now

    def _refill(self, now: float) -> None:
        if now > self.updated:
            self.tokens = min(self.capacity, self.tokens + (now - self.updated) * self.refill_per_s)
            self.updated = now

    def try_take(self, now: float) -> float:
        """Take a token and return 0.0, or take nothing and return the seconds until one is available."""
        self._refill(now)
        if self.tokens >= 1.0 - self._EPS:
            self.tokens = max(0.0, self.tokens - 1.0)
            return 0.0
        return (1.0 - self.tokens) / self.refill_per_s

    def allowance(self, seconds: float) -> float:
        """The most requests this bucket accepts in any window of ``seconds``: C + r * seconds."""
        return self.capacity + self.refill_per_s * seconds


def storm_retry_after(storms: Sequence[tuple[float, float, float]], now: float) -> float | None:
    """Retry-After of the storm ``(start, end, retry_after)`` covering ``now`` (half-open), else None."""
    for start, end, retry_after in storms:
        if start <= now < end:
            return retry_after
    return None


def retry_after_header(seconds: float, whole_seconds: bool = False) -> float:
    """The Retry-After value to send: never earlier than ``seconds`` (rounded UP to the millisecond,
    or to whole seconds), so a client that waits exactly that long finds capacity."""
    seconds = max(0.0, seconds)
    if whole_seconds:
        return float(math.ceil(seconds - 1e-9))
    return math.ceil(seconds * 1000 - 1e-6) / 1000


_Z99 = 2.3263478740408408  # the standard normal's 99th percentile (statistics.NormalDist().inv_cdf(0.99))


def lognormal_latency(rng: random.Random, p50: float, p99: float) -> float:
    """A lognormal draw whose median is ``p50`` and 99th percentile ``p99`` (sigma = ln(p99/p50) / z99),
    the same parametrisation as the CPU backend's simulated judges (cpu_backend/latency.py)."""
    return p50 * math.exp(math.log(p99 / p50) / _Z99 * rng.gauss(0.0, 1.0))


# --------------------------------------------------------------------------- stats


def max_requests_in_window(timestamps: Sequence[float], window_s: float) -> int:
    """Max number of (sorted) timestamps inside any half-open window ``[t, t + window_s)``."""
    if window_s <= 0:
        raise ValueError("window_s must be > 0")
    best, lo = 0, 0
    for hi, t in enumerate(timestamps):  # two pointers: O(n)
        while timestamps[lo] + window_s <= t:  # same float expression as the definition
            lo += 1
        best = max(best, hi - lo + 1)
    return best


@dataclass(frozen=True)
class RequestRecord:
    """One chat request as the server saw it (``time.monotonic()`` of the server's process)."""

    arrived: float
    outcome: str | None  # one of OUTCOMES; None while its body is still being read
    finished: float | None  # None while in flight

    @property
    def throttled(self) -> bool:
        return self.outcome in THROTTLE_OUTCOMES


@dataclass(frozen=True)
class JudgeStats:
    """An immutable snapshot of the server's counters (taken under the server's lock)."""

    requests: int  # chat-completion requests that arrived (since start / last reset)
    in_flight: int  # handlers running now (hung ones included)
    peak_in_flight: int  # max simultaneous handlers seen
    outcomes: Mapping[str, int]  # every key of OUTCOMES present; decided at arrival
    arrivals: tuple[float, ...] = field(repr=False)  # time.monotonic() per arrival, sorted; last max_timestamps only
    elapsed_s: float = 0.0  # since start / last reset
    records: tuple[RequestRecord, ...] = field(default=(), repr=False)  # arrival order; last max_records only
    storms: tuple[tuple[float, float, float], ...] = ()  # (start, end, retry_after), monotonic seconds
    prompt_tokens_served: int = 0  # usage reported by the 200 answers (a completion that was scored)
    completion_tokens_served: int = 0

    def max_requests_in_window(self, window_s: float) -> int:
        return max_requests_in_window(self.arrivals, window_s)

    # ---- flow control: what a test of a client's back-pressure needs

    @property
    def rejected(self) -> int:
        """Requests refused by the server's flow control (limiters, storms): never processed."""
        return sum(self.outcomes.get(k, 0) for k in REJECTED_OUTCOMES)

    @property
    def accepted(self) -> int:
        """Requests admitted by the flow control (they may still meet an injected fault)."""
        return self.requests - self.rejected - self.outcomes.get("bad_request", 0)

    @property
    def first_throttle_at(self) -> float | None:
        """Arrival time of the first request answered with a 429 (any kind), if any."""
        return next((r.arrived for r in self.records if r.throttled), None)

    def throttled_share_after_first_throttle(self) -> float:
        """Of the requests that arrived after the first 429-answered one, the share answered 429 too
        (0.0 if none arrived after it): a client that honours back-pressure keeps this small."""
        first = self.first_throttle_at
        if first is None:
            return 0.0
        later = [r for r in self.records if r.arrived > first and r.outcome is not None]
        return sum(r.throttled for r in later) / len(later) if later else 0.0

    def count(self, outcomes: Sequence[str] | str, start: float = -math.inf, end: float = math.inf) -> int:
        """Requests with one of ``outcomes`` that arrived in ``[start, end)``."""
        wanted = (outcomes,) if isinstance(outcomes, str) else tuple(outcomes)
        return sum(1 for r in self.records if r.outcome in wanted and start <= r.arrived < end)

    def arrivals_per_window(self, start: float, end: float, window_s: float) -> list[int]:
        """Arrivals in each consecutive window ``[start + k w, start + (k+1) w)`` that starts before
        ``end`` (the last one clipped at ``end``): e.g. probes per Retry-After window of a storm."""
        if not window_s > 0:
            raise ValueError("window_s must be > 0")
        counts = [0] * max(0, math.ceil((end - start) / window_s - 1e-9))  # float noise must not add a window
        for r in self.records:
            if start <= r.arrived < end:
                counts[min(len(counts) - 1, int((r.arrived - start) // window_s))] += 1
        return counts

    def in_flight_at(self, t: float) -> int:
        """Requests the server was handling at time ``t`` (arrived at or before, not yet finished)."""
        return sum(1 for r in self.records if r.arrived <= t and (r.finished is None or r.finished > t))

    def peak_in_flight_between(self, start: float, end: float) -> int:
        """Most requests handled at once at any moment of ``[start, end]``."""
        events = []
        for r in self.records:
            if r.arrived <= end and (r.finished is None or r.finished > start):
                events.append((max(r.arrived, start), 1))
                if r.finished is not None and r.finished <= end:
                    events.append((r.finished, -1))
        events.sort(key=lambda e: (e[0], e[1]))  # a finish before an arrival at the same instant
        best = level = 0
        for _, step in events:
            level += step
            best = max(best, level)
        return best

    @property
    def requests_per_minute(self) -> float:
        """Mean arrival rate over the whole run (since start / reset), idle time included."""
        return 60.0 * self.requests / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def to_dict(self, windows: Sequence[float] = (1.0, 60.0)) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "in_flight": self.in_flight,
            "peak_in_flight": self.peak_in_flight,
            "outcomes": dict(self.outcomes),
            "accepted": self.accepted,
            "rejected": self.rejected,
            "storms": len(self.storms),
            "elapsed_s": round(self.elapsed_s, 6),
            "requests_per_minute": round(self.requests_per_minute, 3),
            "max_requests_in_window": {f"{w:g}": self.max_requests_in_window(w) for w in windows},
        }


class _Counters:
    # Mutated on the server's loop thread, read by stats() from any thread: one lock for both.
    def __init__(self, max_timestamps: int, max_records: int) -> None:
        self.lock = threading.Lock()
        self._max = max_timestamps
        self._max_records = max_records
        self.storms: list[tuple[float, float, float]] = []  # flow-control config, survives reset()
        self.outages: list[tuple[float, float]] = []  # (start, end) monotonic; survives reset()
        self.reset()

    def reset(self) -> None:
        with self.lock:
            self.requests = 0
            self.in_flight = getattr(self, "in_flight", 0)  # live handlers survive a reset
            self.peak = self.in_flight
            self.outcomes = dict.fromkeys(OUTCOMES, 0)
            self.arrivals: deque[float] = deque(maxlen=self._max)
            # [arrived, outcome, finished] per request, mutated in place until it finishes
            self.records: deque[list] = deque(maxlen=self._max_records)
            self.prompt_tokens = self.completion_tokens = 0
            self.t0 = time.monotonic()

    def snapshot(self) -> JudgeStats:
        with self.lock:
            return JudgeStats(
                requests=self.requests,
                in_flight=self.in_flight,
                peak_in_flight=self.peak,
                outcomes=dict(self.outcomes),
                arrivals=tuple(self.arrivals),
                elapsed_s=time.monotonic() - self.t0,
                records=tuple(RequestRecord(*r) for r in self.records),
                storms=tuple(self.storms),
                prompt_tokens_served=self.prompt_tokens,
                completion_tokens_served=self.completion_tokens,
            )


# --------------------------------------------------------------------------- server


def _fmt_seconds(s: float) -> str:
    return f"{s:.3f}".rstrip("0").rstrip(".") or "0"


def _padded_error_body(size: int) -> bytes:
    """An OpenAI error JSON of exactly ``size`` bytes (the message padded with 'x')."""
    body = {"error": {"message": "", "type": "server_error", "param": None, "code": None}}
    prefix = "Injected internal error; padding: "
    pad = size - len(json.dumps(body).encode()) - len(prefix)
    body["error"]["message"] = prefix + "x" * pad
    data = json.dumps(body).encode()
    assert len(data) == size, (len(data), size)
    return data


def _error(status: int, message: str, err_type: str, code: str | None, retry_after: float | None = None) -> web.Response:
    # OpenAI's error body shape; the client surfaces it as exc.body / exc.message.
    headers = {}
    if retry_after is not None:
        # The openai client reads retry-after-ms first, then retry-after (float seconds OK).
        # ``retry_after`` is already rounded up (retry_after_header), so both headers agree.
        headers["Retry-After"] = _fmt_seconds(retry_after)
        headers["retry-after-ms"] = str(int(round(retry_after * 1000)))
    body = {"error": {"message": message, "type": err_type, "param": None, "code": code}}
    return web.json_response(body, status=status, headers=headers)


class JudgeServer:
    """The server. ``start()``/``close()`` or use as a (sync or async) context manager.

    The aiohttp app runs on a private event loop in a daemon thread, so a plain synchronous
    pytest test can drive it, and an async caller's loop is never blocked by server work.
    ``close()`` cancels hung handlers first, so shutdown takes well under a second even with
    ``hang_seconds=3600`` requests outstanding.
    """

    def __init__(self, config: JudgeServerConfig | None = None) -> None:
        self.config = config or JudgeServerConfig()
        seed = self.config.seed
        # Separate streams so changing the latency config does not reshuffle which requests fail.
        self._fault_rng = random.Random(None if seed is None else f"{seed}/faults")
        self._latency_rng = random.Random(None if seed is None else f"{seed}/latency")
        self._counters = _Counters(self.config.max_timestamps, self.config.max_records)
        self._accepted: deque[float] = deque()  # rpm limiter window (accepted arrivals only)
        cfg = self.config
        self._bucket = (
            TokenBucket(cfg.bucket_capacity, cfg.bucket_refill_per_s, time.monotonic())
            if cfg.bucket_capacity is not None else None
        )  # fmt: skip
        self._big_error = _padded_error_body(cfg.error_body_bytes) if cfg.error_body_bytes else None
        self._ids = itertools.count(1)
        self._handlers: set[asyncio.Task] = set()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._start_error: BaseException | None = None
        self._port: int | None = None

    # ---- lifecycle

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("JudgeServer is not running")
        return self._port

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:PORT/v1`` -- pass as ``base_url`` to ``openai.AsyncOpenAI``."""
        host = "127.0.0.1" if self.config.host == "localhost" else self.config.host
        if ":" in host:
            host = f"[{host}]"
        return f"http://{host}:{self.port}/v1"

    def start(self) -> "JudgeServer":
        if self._thread is not None:
            raise RuntimeError("JudgeServer already started")
        self._ready, self._start_error = threading.Event(), None  # allow start() again after close()
        self._thread = threading.Thread(target=self._thread_main, name="judge-server", daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._start_error is not None:
            self._thread.join()
            self._thread = None
            raise self._start_error
        cfg = self.config
        if cfg.storm_start_s is not None:
            self.start_storm(cfg.storm_duration_s, cfg.storm_retry_after_s, delay_s=cfg.storm_start_s)
        if cfg.outage_start_s is not None:
            self.start_outage(cfg.outage_duration_s, delay_s=cfg.outage_start_s)
        return self

    def start_outage(self, duration_s: float, delay_s: float = 0.0) -> tuple[float, float]:
        """From ``delay_s`` seconds from now, for ``duration_s`` seconds, answer every request 500 at
        once (the judge is down). Returns the window (monotonic start, end)."""
        if not (math.isfinite(duration_s) and duration_s > 0 and math.isfinite(delay_s) and delay_s >= 0):
            raise ValueError(f"bad outage: duration_s={duration_s!r} delay_s={delay_s!r}")
        start = time.monotonic() + delay_s
        with self._counters.lock:
            self._counters.outages.append((start, start + duration_s))
        return start, start + duration_s

    def start_storm(self, duration_s: float, retry_after_s: float | None = None, delay_s: float = 0.0) -> tuple[float, float]:
        """From ``delay_s`` seconds from now, for ``duration_s`` seconds, answer every request 429 with
        Retry-After ``retry_after_s`` (default: the config's). Returns the window (monotonic start, end)."""
        retry = self.config.storm_retry_after_s if retry_after_s is None else retry_after_s
        if not (math.isfinite(duration_s) and duration_s > 0 and delay_s >= 0 and math.isfinite(retry) and retry >= 0):
            raise ValueError(f"bad storm: duration_s={duration_s!r} retry_after_s={retry!r} delay_s={delay_s!r}")
        start = time.monotonic() + delay_s
        with self._counters.lock:
            self._counters.storms.append((start, start + duration_s, float(retry)))
        return start, start + duration_s

    def close(self, timeout: float = 10.0) -> None:
        """Stop serving and join the thread. Idempotent; safe to call from any thread but the server's."""
        thread, loop, stop = self._thread, self._loop, self._stop
        if thread is None:
            return
        if loop is not None and stop is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(stop.set)
            except RuntimeError:  # loop already closed under us
                pass
        thread.join(timeout)
        if thread.is_alive():
            raise RuntimeError("JudgeServer thread did not stop in time")
        self._thread = None
        self._port = None

    def __enter__(self) -> "JudgeServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> "JudgeServer":
        # Startup blocks on a threading.Event; do it off the caller's loop.
        await asyncio.to_thread(self.start)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await asyncio.to_thread(self.close)

    def _thread_main(self) -> None:
        try:
            asyncio.run(self._serve())
        except BaseException as e:  # noqa: BLE001 - reported to start() if startup failed
            if not self._ready.is_set():
                self._start_error = e
        finally:
            self._ready.set()

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/stats", self._stats)
        app.router.add_post("/stats/reset", self._reset)
        app.router.add_post("/storm", self._storm)
        # handler_cancellation: a client that times out and disconnects cancels its handler, so
        # "in_flight" reflects what is really still running (aiohttp >= 3.9 defaults it off).
        runner = web.AppRunner(
            app,
            handle_signals=False,
            access_log=None,
            handler_cancellation=True,
            shutdown_timeout=self.config.shutdown_timeout_s,
        )
        await runner.setup()
        try:
            host = "127.0.0.1" if self.config.host == "localhost" else self.config.host
            site = web.TCPSite(runner, host, self.config.port)
            await site.start()
            self._port = runner.addresses[0][1]
            self._ready.set()
            await self._stop.wait()
            # Cancel hung/slow handlers before aiohttp's graceful wait, or it would wait for them.
            for task in list(self._handlers):
                task.cancel()
        finally:
            await runner.cleanup()

    # ---- stats

    def stats(self) -> JudgeStats:
        return self._counters.snapshot()

    def reset_stats(self) -> None:
        """Zero the counters and timestamps (in-flight handlers stay counted). RNG and limiter untouched."""
        self._counters.reset()

    # ---- handlers

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response(
            {"object": "list", "data": [{"id": self.config.model, "object": "model", "created": 0, "owned_by": "verl-async-rm"}]}
        )

    async def _stats(self, request: web.Request) -> web.Response:
        snap = self.stats()
        windows: list[float] = [1.0, 60.0]
        if "window" in request.query:
            try:
                w = float(request.query["window"])
                if not w > 0:
                    raise ValueError
            except ValueError:
                return _error(400, "window must be a positive number", "invalid_request_error", None)
            windows.append(w)
        return web.json_response(snap.to_dict(windows))

    async def _reset(self, request: web.Request) -> web.Response:
        self.reset_stats()
        return web.json_response({"ok": True})

    async def _storm(self, request: web.Request) -> web.Response:
        try:
            q = request.query
            retry = float(q["retry_after"]) if "retry_after" in q else None
            start, end = self.start_storm(float(q["duration"]), retry, float(q.get("delay", 0.0)))
        except (KeyError, ValueError) as e:
            return _error(400, f"need ?duration=S[&retry_after=R][&delay=D], positive: {e}", "invalid_request_error", None)
        now = time.monotonic()
        return web.json_response({"starts_in_s": round(start - now, 6), "ends_in_s": round(end - now, 6)})

    def _decide(self, messages: list[dict], record: list) -> tuple[str, float, Any]:
        """Fault, delay and payload for one valid request; counted immediately (hangs never finish).
        For a refused request (storm, limiter) the delay is its Retry-After, already rounded up."""
        c = self._counters
        with c.lock:
            outcome, delay, payload = self._decide_locked(messages, time.monotonic(), arrived=record[0])
            c.outcomes[outcome] += 1
            record[1] = outcome
            return outcome, delay, payload

    def _decide_locked(self, messages: list[dict], now: float, arrived: float) -> tuple[str, float, Any]:
        cfg = self.config
        # Flow control first. Refused requests draw no randomness and take no token: the i-th
        # *accepted* request always gets the same fault, however the limiter's timing falls.
        # A storm covers the requests that *arrived* in it (the record's time), not those whose
        # body happened to be read in it.
        if any(start <= arrived < end for start, end in self._counters.outages):
            return "outage", 0.0, None
        storm = storm_retry_after(self._counters.storms, arrived)
        if storm is not None:
            return "storm", retry_after_header(storm, cfg.retry_after_whole_seconds), None
        if cfg.rpm_limit is not None:
            while self._accepted and self._accepted[0] <= now - cfg.rpm_window_s:
                self._accepted.popleft()
            if len(self._accepted) >= cfg.rpm_limit:
                wait = self._accepted[0] + cfg.rpm_window_s - now
                return "rate_limited", retry_after_header(wait, cfg.retry_after_whole_seconds), None
        if self._bucket is not None:
            wait = self._bucket.try_take(now)
            if wait > 0:
                return "rate_limited", retry_after_header(wait, cfg.retry_after_whole_seconds), None
        if cfg.rpm_limit is not None:
            self._accepted.append(now)
        u = self._fault_rng.random()
        outcome = "ok"
        for name, rate in (
            ("429", cfg.rate_429),
            ("500", cfg.rate_500),
            ("503", cfg.rate_503),
            ("hang", cfg.rate_hang),
            ("malformed", cfg.rate_malformed),
        ):
            if u < rate:
                outcome = name
                break
            u -= rate
        lat = cfg.latency
        if cfg.latency_lognormal is not None:
            delay = lognormal_latency(self._latency_rng, *cfg.latency_lognormal)
        else:
            delay = self._latency_rng.uniform(*lat) if isinstance(lat, tuple) else lat
        payload: Any = None
        if outcome == "malformed":
            payload = self._fault_rng.choice(cfg.malformed_kinds)
        elif outcome in ("ok", "hang"):
            try:  # judge now, so a judge bug is counted as such rather than as "ok"
                payload = str(cfg.judge(messages))
            except Exception as e:  # noqa: BLE001
                outcome, payload = "judge_error", f"{type(e).__name__}: {e}"
        if outcome == "hang":
            delay = cfg.hang_seconds
        return outcome, delay, payload

    def _completion(self, body: dict, content: str) -> dict:
        n = body.get("n") if isinstance(body.get("n"), int) and body.get("n", 1) > 0 else 1
        if self.config.usage is not None:
            prompt_tokens, completion_tokens = self.config.usage(body["messages"], content)
        else:
            prompt_tokens = sum(len(_text_of(m.get("content")).split()) for m in body["messages"] if isinstance(m, dict))
            completion_tokens = max(1, len(content.split())) * n
        return {
            "id": f"chatcmpl-judge-{next(self._ids)}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model") or self.config.model,
            "choices": [
                {"index": i, "message": {"role": "assistant", "content": content}, "finish_reason": "stop", "logprobs": None}
                for i in range(n)
            ],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            },
        }

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        task = asyncio.current_task()
        if task is not None:
            self._handlers.add(task)
        c = self._counters
        with c.lock:  # arrival is stamped before anything can await
            now = time.monotonic()
            c.requests += 1
            c.in_flight += 1
            c.peak = max(c.peak, c.in_flight)
            c.arrivals.append(now)
            record = [now, None, None]  # arrived, outcome, finished
            c.records.append(record)
        try:
            try:
                body = await request.json()
                if not isinstance(body, dict) or not isinstance(body.get("messages"), list) or body.get("stream"):
                    raise ValueError("need a JSON object with a 'messages' list (stream is not supported)")
            except Exception as e:  # noqa: BLE001
                with c.lock:
                    c.outcomes["bad_request"] += 1
                    record[1] = "bad_request"
                return _error(400, f"bad request: {e}", "invalid_request_error", None)

            outcome, delay, payload = self._decide(body["messages"], record)
            # The front door answers at once, as real APIs do.
            if outcome == "rate_limited":
                return _error(429, "Rate limit reached", "requests", "rate_limit_exceeded", delay)
            if outcome == "storm":
                return _error(429, "Rate limit reached (storm)", "requests", "rate_limit_exceeded", delay)
            if outcome == "outage":
                return _error(500, "The judge is down (outage)", "server_error", None)
            if delay > 0:
                await asyncio.sleep(delay)  # hang: hang_seconds; cancelled by client disconnect or close()

            retry = retry_after_header(self.config.retry_after_s, self.config.retry_after_whole_seconds)
            if outcome == "429":
                return _error(429, "Injected rate limit", "requests", "rate_limit_exceeded", retry)
            if outcome == "500":
                if self._big_error is not None:
                    return web.Response(body=self._big_error, status=500, content_type="application/json")
                return _error(500, "Injected internal error", "server_error", None)
            if outcome == "503":
                return _error(503, "Injected overload", "server_error", None, retry)
            if outcome == "judge_error":
                return _error(500, f"judge raised {payload}", "server_error", "judge_error")
            if outcome == "malformed":
                good = self._completion(body, "1")
                if payload == "truncated":
                    text = json.dumps(good)
                    return web.Response(text=text[: len(text) // 2], content_type="application/json")
                if payload == "no_choices":
                    del good["choices"]
                    return web.json_response(good)
                return web.json_response(self._completion(body, "I cannot decide; it looks plausible."))
            completion = self._completion(body, payload)  # ok, or a hang that outlived its client
            with c.lock:
                c.prompt_tokens += completion["usage"]["prompt_tokens"]
                c.completion_tokens += completion["usage"]["completion_tokens"]
            return web.json_response(completion)
        finally:
            with c.lock:
                c.in_flight -= 1
                record[2] = time.monotonic()
            if task is not None:
                self._handlers.discard(task)


# --------------------------------------------------------------------------- CLI


def _parse_latency(text: str) -> float | tuple[float, float]:
    if ":" in text:
        lo, hi = text.split(":", 1)
        return (float(lo), float(hi))
    return float(text)


def _parse_storm(text: str) -> tuple[float, float]:
    start, sep, duration = text.partition(":")
    if not sep:
        raise argparse.ArgumentTypeError(f"needs START:DURATION seconds, got {text!r}")
    return float(start), float(duration)


def main(argv: Sequence[str] | None = None) -> int:
    cfg = parse_config(argv)

    # SIGTERM (a benchmark script killing us) should also print the counters. SIGINT is installed
    # explicitly because a shell's background job inherits SIGINT=ignored, and Ctrl-C must work.
    def _interrupt(*_: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGINT, _interrupt)
    with JudgeServer(cfg) as server:
        print(server.base_url, flush=True)
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            pass
        print(json.dumps(server.stats().to_dict()), flush=True)
    return 0


def parse_config(argv: Sequence[str] | None = None) -> JudgeServerConfig:
    """The server's configuration from its command line (tests start the servers a guide's example
    names in process, from the same arguments)."""
    p = argparse.ArgumentParser(prog="python -m verl_async_rm_rig.judge_server", description=__doc__.split("\n")[0])
    p.add_argument("--host", default="127.0.0.1", help="loopback only")
    p.add_argument("--port", type=int, default=0, help="0 = ephemeral")
    p.add_argument("--model", default="judge-stub")
    p.add_argument("--latency", type=_parse_latency, default=0.0, help="seconds: FIXED or LO:HI (uniform)")
    p.add_argument("--latency-lognormal", type=_parse_latency, default=None, metavar="P50:P99",
                   help="lognormal latency given by its median and 99th percentile, seconds (replaces --latency)")
    p.add_argument("--rate-429", type=float, default=0.0)
    p.add_argument("--rate-500", type=float, default=0.0)
    p.add_argument("--rate-503", type=float, default=0.0)
    p.add_argument("--rate-hang", type=float, default=0.0)
    p.add_argument("--rate-malformed", type=float, default=0.0)
    p.add_argument("--malformed-kinds", default=",".join(MALFORMED_KINDS), help="comma list of " + ",".join(MALFORMED_KINDS))
    p.add_argument("--retry-after", type=float, default=1.0, help="Retry-After seconds on injected 429/503")
    p.add_argument("--hang-seconds", type=float, default=3600.0)
    p.add_argument("--rpm-limit", type=int, default=None)
    p.add_argument("--rpm-window", type=float, default=60.0, help="limiter window seconds (default 60)")
    p.add_argument("--bucket-capacity", type=int, default=None, help="token bucket: capacity (burst) in requests")
    p.add_argument("--bucket-refill", type=float, default=1.0, help="token bucket: tokens per second")
    p.add_argument("--retry-after-whole-seconds", action="store_true", help="round every Retry-After up to whole seconds")
    p.add_argument("--storm", type=_parse_storm, default=None, metavar="START:DURATION",
                   help="429 storm: every request refused from START to START+DURATION seconds after start")
    p.add_argument("--outage", type=_parse_storm, default=None, metavar="START:DURATION",
                   help="answer every request 500 at once for DURATION seconds from START seconds after start (the judge is down)")
    p.add_argument("--storm-retry-after", type=float, default=1.0, help="Retry-After seconds during a storm")
    p.add_argument("--error-body-bytes", type=int, default=0, help="body size of injected 500s (0 = small)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--judge", choices=sorted(JUDGES), default="exact",
                   help="exact: 1 if the response's last number is the reference's, else 0; partial: also 0.5 when off by <= 2")
    a = p.parse_args(argv)
    try:
        cfg = JudgeServerConfig(
            host=a.host,
            port=a.port,
            model=a.model,
            latency=a.latency,
            latency_lognormal=a.latency_lognormal,
            rate_429=a.rate_429,
            rate_500=a.rate_500,
            rate_503=a.rate_503,
            rate_hang=a.rate_hang,
            rate_malformed=a.rate_malformed,
            malformed_kinds=tuple(k for k in a.malformed_kinds.split(",") if k),
            retry_after_s=a.retry_after,
            hang_seconds=a.hang_seconds,
            rpm_limit=a.rpm_limit,
            rpm_window_s=a.rpm_window,
            bucket_capacity=a.bucket_capacity,
            bucket_refill_per_s=a.bucket_refill,
            retry_after_whole_seconds=a.retry_after_whole_seconds,
            storm_start_s=a.storm[0] if a.storm else None,
            storm_duration_s=a.storm[1] if a.storm else 0.0,
            storm_retry_after_s=a.storm_retry_after,
            outage_start_s=a.outage[0] if a.outage else None,
            outage_duration_s=a.outage[1] if a.outage else 0.0,
            error_body_bytes=a.error_body_bytes,
            seed=a.seed,
            judge=JUDGES[a.judge],
        )
    except ValueError as e:
        p.error(str(e))
    return cfg


if __name__ == "__main__":
    raise SystemExit(main())
