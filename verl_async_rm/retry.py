"""Which failures are worth another attempt, and how long to wait before it.

Retried: timeouts, connection errors, HTTP 408/409/429 and 5xx (from ``openai``, ``httpx``, ``aiohttp``
or anything carrying ``status_code``/``status``), and user exceptions marked retryable (raise
``RetryableError`` or set ``retryable = True`` on the exception). Never retried: other 4xx (400, 401,
403, 404, ...), invalid returns, and any other user exception: retrying a bug only hides it.
"""

from __future__ import annotations

import asyncio
import email.utils
import time
from dataclasses import dataclass

from tenacity import stop_after_attempt, wait_random_exponential
from tenacity.wait import wait_base

from verl_async_rm.errors import RetryableError  # noqa: F401 - where rewards have imported it from

RETRYABLE_STATUS = frozenset({408, 409, 429, 500, 502, 503, 504})
THROTTLE_STATUS = frozenset({429, 503})


@dataclass(frozen=True)
class FailureInfo:
    kind: str  # short cause: timeout, connection, http_429, http_500, error, ...
    retryable: bool
    throttled: bool  # the service asked us to slow down (429/503)
    retry_after: float | None


def status_code_of(exc: BaseException) -> int | None:
    for attr in ("status_code", "status"):
        value = getattr(exc, attr, None)
        if isinstance(value, int):
            return value
    response = getattr(exc, "response", None)
    value = getattr(response, "status_code", None)
    return value if isinstance(value, int) else None


def retry_after_of(exc: BaseException) -> float | None:
    """Seconds from a ``retry_after`` attribute or a Retry-After header (delta-seconds or HTTP date)."""
    value = getattr(exc, "retry_after", None)
    if value is None:
        headers = getattr(getattr(exc, "response", None), "headers", None) or getattr(exc, "headers", None)
        if headers is not None:
            value = headers.get("retry-after") or headers.get("Retry-After")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except (TypeError, ValueError):
        try:
            when = email.utils.parsedate_to_datetime(str(value))
        except (TypeError, ValueError):
            return None
        return max(0.0, when.timestamp() - time.time())


def _is_connection_error(exc: BaseException) -> bool:
    if isinstance(exc, ConnectionError):
        return True
    # openai.APIConnectionError, httpx.ConnectError/TransportError, aiohttp.ClientConnectionError:
    # matched by name to avoid importing every HTTP stack on the hot path.
    names = {cls.__name__ for cls in type(exc).__mro__}
    return bool(names & {"APIConnectionError", "TransportError", "ClientConnectionError", "ServerDisconnectedError"})


def classify(exc: BaseException) -> FailureInfo:
    if isinstance(exc, (TimeoutError, asyncio.TimeoutError)) or type(exc).__name__ in ("APITimeoutError", "ReadTimeout"):
        return FailureInfo("timeout", True, False, None)
    if type(exc).__name__ == "ProcessExpired":  # pebble: the worker process died (crash, OOM kill); it is replaced
        return FailureInfo("worker_died", True, False, None)
    status = status_code_of(exc)
    if status is not None:
        retry_after = retry_after_of(exc)
        return FailureInfo(f"http_{status}", status in RETRYABLE_STATUS, status in THROTTLE_STATUS, retry_after)
    if _is_connection_error(exc):
        return FailureInfo("connection", True, False, None)
    if getattr(exc, "retryable", False) is True:
        kind = getattr(exc, "kind", None)
        throttled = getattr(exc, "throttled", False) is True  # a reward's own "slow down" signal
        return FailureInfo(kind if isinstance(kind, str) else "retryable_error", True, throttled, retry_after_of(exc))
    return FailureInfo("error", False, False, None)


class _AttemptState:
    """The fields of tenacity's RetryCallState that its stop and wait strategies read."""

    __slots__ = ("attempt_number", "retry_after")

    def __init__(self, attempt_number: int, retry_after: float | None):
        self.attempt_number = attempt_number
        self.retry_after = retry_after


class wait_at_least_retry_after(wait_base):
    """Tenacity wait: the inner wait, never shorter than the service's Retry-After, never longer
    than ``maximum``. What wins: the ticket deadline (it settles the sample whatever the wait),
    then ``maximum`` (``backoff_max``), then Retry-After, then the jittered backoff."""

    def __init__(self, inner: wait_base, maximum: float):
        self.inner = inner
        self.maximum = maximum

    def __call__(self, retry_state) -> float:
        return min(self.maximum, max(self.inner(retry_state), retry_state.retry_after or 0.0))


class RetryPolicy:
    """When a failed attempt is tried again, and after how long: tenacity's composable strategies
    (``stop_after_attempt``, ``wait_random_exponential``: exponential backoff with full jitter),
    evaluated per failed attempt.

    Why not ``tenacity.AsyncRetrying`` itself: its loop runs inside one coroutine, so a retrying
    sample would keep a task (and, around the call, a concurrency slot) while it sleeps. Here a
    failed attempt ends its task; the sample waits as plain data on a timer and then re-enters the
    admission queue (cap, pause, pace, deadline) like any other request.
    Throttles (429/503) never reach this policy: they are flow control (``engine.flow``), and they
    do not use up attempts.
    """

    def __init__(self, max_attempts: int, backoff_initial: float, backoff_max: float):
        self.stop = stop_after_attempt(max_attempts)
        self.wait = wait_at_least_retry_after(wait_random_exponential(multiplier=backoff_initial, max=backoff_max), backoff_max)

    def next_delay(self, failed_attempts: int, retry_after: float | None = None) -> float | None:
        """Seconds to wait before the next attempt, or None when the attempts are used up."""
        state = _AttemptState(failed_attempts, retry_after)
        if self.stop(state):
            return None
        return self.wait(state)
