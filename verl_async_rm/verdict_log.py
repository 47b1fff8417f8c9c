"""The durable verdict log: every settled sample, one JSON line each, appended; and its reading back.

**Format.** One JSON object per line (``VERSION`` in ``"v"``): ``key`` (``request_key``), ``t`` (unix
time), ``ticket`` (one per submitted batch, a training step's; null on the per-sample path),
``index``, ``uid``, ``score`` (the reward's own score, before the failure policy and the group
hook; null if it failed), ``extra`` (its extra info), ``verdict`` (the judge's text, if the extra
info has ``judge_reply``, ``verdict`` or ``explanation``), ``latency_s`` (submit to settled),
``request_s`` (its last attempt, sent to answered), ``attempts``, ``failure`` (the failure kind, null on success), ``error``, ``input_tokens`` /
``output_tokens`` (what the judge reported; null if nothing) and ``cost`` (with prices).

**Crash safety.** Appends go through one background thread (``VerdictWriter``): the event loop only
puts a record on a queue, so a slow disk never stalls scoring. Every ``WRITE_EVERY_S`` (50 ms) the
thread writes whatever has queued up in one ``write`` + ``flush``: a killed process loses at most
the last 50 ms of verdicts (what was written is in the OS page cache), and a resumed run sends those
again. It ``fsync``s at most every ``fsync_s`` seconds and on close, so a machine crash loses at
most that much more. Closing the agent (also on Ctrl-C) writes and fsyncs everything. A kill in the middle of a write leaves a torn last line:
readers skip it, and the writer cuts it off before appending again. A bad line anywhere else is an
error (the file is not ours, or is damaged).

**Resume.** ``load_resume_answers`` reads the successes (the last one per key); failed samples are
not cached, so a resumed run sends them again (a failure is usually transient: a timeout, a 429, a
deadline). One writer per file: two agents must not share a log.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import queue
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Mapping

_log = logging.getLogger(__name__)

VERSION = 1
VERDICT_KEYS = ("judge_reply", "verdict", "explanation")
UNHASHED_KWARGS = frozenset({"api_key"})  # a rotated key does not change a verdict
WRITE_EVERY_S = 0.05  # the writer thread's period: what a killed process can lose (sent again on resume)


def _plain(value: Any) -> Any:
    """JSON for what rewards put in extra info: numpy scalars and arrays as numbers and lists."""
    if hasattr(value, "tolist"):
        return value.tolist()
    return repr(value)


def dumps(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=_plain, ensure_ascii=False)


def request_key(reward_label: str, reward_kwargs: Mapping, data_source: Any, solution_str: Any,
                ground_truth: Any, extra_info: Any) -> str:
    """A stable hash of the reward (its label ``file.py:name`` and kwargs but ``api_key``) and the
    request. Not the sample's position or uid: the same response to the same prompt is the same
    request wherever it sits in a batch."""
    kwargs = {k: v for k, v in dict(reward_kwargs).items() if k not in UNHASHED_KWARGS}
    text = dumps([reward_label, kwargs, data_source, solution_str, ground_truth, extra_info])
    # surrogatepass: a lone surrogate (a sample refused as ``invalid``) must still get a key to be
    # logged under; valid text encodes to the same bytes either way, so no key changes.
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def verdict_text(extra: Mapping) -> str | None:
    for key in VERDICT_KEYS:
        value = extra.get(key)
        if value is not None:
            return str(value)
    return None


def _cut_torn_tail(path: Path) -> int:
    """Cut a last line without its newline (a write killed half-way); returns the bytes cut."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return 0
    if size == 0:
        return 0
    with path.open("rb+") as f:
        f.seek(size - 1)
        if f.read(1) == b"\n":
            return 0
        block, end = 65536, size
        while end > 0:  # find the last newline, reading backwards
            start = max(0, end - block)
            f.seek(start)
            chunk = f.read(end - start)
            at = chunk.rfind(b"\n")
            if at >= 0:
                keep = start + at + 1
                break
            end = start
        else:
            keep = 0
        f.truncate(keep)
        f.flush()
        os.fsync(f.fileno())
    _log.warning("verdict log %s: cut a torn last line (%d bytes) left by an interrupted write", path, size - keep)
    return size - keep


class VerdictWriter:
    """Appends records from any thread; one daemon thread writes them (see the module docstring)."""

    def __init__(self, path: str | os.PathLike, fsync_s: float = 1.0, write_every_s: float = WRITE_EVERY_S):
        self.path = Path(path)
        self.fsync_s = fsync_s
        self.write_every_s = write_every_s
        self._stop = threading.Event()
        _cut_torn_tail(self.path)
        self._file = self.path.open("ab")
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self.error: BaseException | None = None  # a failed write: the engine fails loudly on it
        self.written = 0
        self._thread = threading.Thread(target=self._run, name="verdict-log", daemon=True)
        self._thread.start()

    def append(self, record: dict) -> None:
        self._queue.put(record)

    def _run(self) -> None:
        last_sync = time.monotonic()
        stopping = False
        while not stopping:
            # Wake on a timer, not per record: a thread woken for every put takes the GIL from the
            # event loop at every sample (measured: 3x slower scoring at zero latency).
            self._stop.wait(self.write_every_s)
            stopping = self._stop.is_set()
            batch = []
            while True:  # everything queued meanwhile goes in one write
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            try:
                if batch:
                    self._file.write("".join(dumps(r) + "\n" for r in batch).encode())
                    self._file.flush()
                    self.written += len(batch)
                now = time.monotonic()
                if (batch or stopping) and (stopping or now - last_sync >= self.fsync_s):
                    os.fsync(self._file.fileno())
                    last_sync = now
            except (OSError, TypeError, ValueError) as exc:  # disk full, unserialisable: loud, not lost silently
                if self.error is None:
                    self.error = exc
                    _log.error("verdict log %s: write failed: %s", self.path, exc)

    def close(self, timeout: float = 30.0) -> None:
        """Write what is queued, fsync, close. Idempotent."""
        if self._file.closed:
            return
        self._stop.set()
        self._thread.join(timeout)
        self._file.close()


@dataclass(frozen=True)
class ReadResult:
    records: list[dict]
    torn_tail: bool  # the last line was cut by a kill (skipped)


def iter_records(path: str | os.PathLike) -> Iterator[tuple[int, dict | None, str]]:
    with Path(path).open("rb") as f:
        for number, raw in enumerate(f, 1):
            text = raw.decode("utf-8", errors="replace")
            if not text.strip():
                continue
            try:
                yield number, json.loads(text), text
            except json.JSONDecodeError:
                yield number, None, text


def read_log(path: str | os.PathLike) -> ReadResult:
    """Every record; a torn last line is skipped, a bad line elsewhere raises ValueError."""
    records, bad = [], None
    for number, record, text in iter_records(path):
        if bad is not None:
            raise ValueError(f"{path}:{bad}: not a verdict log record (only a torn last line is tolerated)")
        if record is None:
            if text.endswith("\n"):
                raise ValueError(f"{path}:{number}: not a verdict log record")
            bad = number
            continue
        if not isinstance(record, dict) or "key" not in record:
            raise ValueError(f"{path}:{number}: not a verdict log record (no 'key')")
        records.append(record)
    return ReadResult(records, bad is not None)


@dataclass(frozen=True, slots=True)
class LoggedAnswer:
    score: float
    extra: dict
    attempts: int


def load_resume_answers(path: str | os.PathLike) -> dict[str, LoggedAnswer]:
    """Successes by request key (the last one wins); an absent file is an empty log."""
    if not Path(path).exists():
        return {}
    answers = {}
    for record in read_log(path).records:
        if record.get("failure") is None and record.get("score") is not None:
            answers[record["key"]] = LoggedAnswer(float(record["score"]), dict(record.get("extra") or {}),
                                                  int(record.get("attempts") or 1))
    return answers
