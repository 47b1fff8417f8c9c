"""Credentials out of the HTTP stacks' own logs, while an agent runs.

A judge's ``base_url`` may carry its credentials: ``https://user:secret@host/v1`` (basic auth) or
``https://host/v1?key=secret`` (an API key in the query, as Google's APIs take it). httpx logs every
request's full URL at INFO (``HTTP Request: POST https://user:secret@host/...``), and older openai
clients log it at DEBUG; with logging at INFO (verl, Ray and most training scripts set it) every
request puts the secret in the run's logs. While an agent is open, ``CredentialRedactor`` rewrites
those records: the userinfo and every query value of a URL become ``[REDACTED]``.

Why a filter on named loggers, and not on handlers or the record factory: a logger's filters run
for every record it emits whatever handlers the application adds later, and touch nothing else in
the process. They do not apply to records of child loggers (``httpcore.http11``), so each logger
that emits is named (``HTTP_LOGGERS``; those found at install time under the same prefixes too).
Every query value is redacted, not only ``key=``: vendors name the parameter ``key``, ``api-key``,
``code``, ``sig``, ``token``..., and a URL in a log is for finding the request, not for its query.
"""

from __future__ import annotations

import logging
import re
import threading

REDACTED = "[REDACTED]"

# The loggers of httpx, httpx2 (openai >= 3 ships this fork), httpcore, httpcore2 and openai that log
# URLs, connection details or request options.
HTTP_LOGGER_PREFIXES = ("httpx", "httpx2", "httpcore", "httpcore2", "openai")
HTTP_LOGGERS = (
    "httpx", "httpx2", "openai", "openai._base_client",
    *(f"{core}.{part}" for core in ("httpcore", "httpcore2") for part in ("connection", "http11", "http2", "proxy", "socks")),
)

# scheme://userinfo@ : userinfo may not contain / ? # @ (RFC 3986), so a later "@" in a path or
# query is never taken for one.
_USERINFO = re.compile(r"(?P<scheme>\b[a-zA-Z][a-zA-Z0-9+.\-]*://)[^\s/?#@'\"<>]+@")
# ?name=value or &name=value, in a URL (the value ends at the next parameter, space, quote or fragment)
_QUERY_VALUE = re.compile(r"(?P<name>[?&][^\s=&#'\"<>]+=)[^\s&#'\"<>]*")


def redact(text: str) -> str:
    """``text`` with the userinfo and the query values of every URL in it replaced."""
    if "://" not in text and "=" not in text:
        return text
    text = _USERINFO.sub(rf"\g<scheme>{REDACTED}@", text)
    return _QUERY_VALUE.sub(rf"\g<name>{REDACTED}", text)


class CredentialRedactor(logging.Filter):
    """Rewrites a record's message with ``redact``; never drops a record."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 - a malformed record is the logging module's to report, not ours
            return True
        redacted = redact(message)
        if redacted != message:
            record.msg, record.args = redacted, None
        return True


_lock = threading.Lock()
_holders = 0
_filter = CredentialRedactor()
_installed_on: list[logging.Logger] = []


def _http_loggers() -> list[logging.Logger]:
    names = set(HTTP_LOGGERS)
    names.update(name for name in list(logging.root.manager.loggerDict)
                 if any(name == prefix or name.startswith(prefix + ".") for prefix in HTTP_LOGGER_PREFIXES))
    return [logging.getLogger(name) for name in sorted(names)]


def acquire() -> None:
    """An agent opens: redact from now on (counted: the filter stays while any agent is open)."""
    global _holders
    with _lock:
        _holders += 1
        if _holders == 1:
            _installed_on[:] = _http_loggers()
            for logger in _installed_on:
                logger.addFilter(_filter)


def release() -> None:
    """An agent closed; the last one removes the filter (the application's logging is its own)."""
    global _holders
    with _lock:
        if _holders == 0:
            return
        _holders -= 1
        if _holders == 0:
            for logger in _installed_on:
                logger.removeFilter(_filter)
            _installed_on.clear()


def holders() -> int:
    """How many open agents hold the filter (0: not installed)."""
    with _lock:
        return _holders
