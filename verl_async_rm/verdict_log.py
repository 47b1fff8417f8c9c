"""The durable verdict log: every settled sample, one JSON line each, appended; and its reading back.

**Format.** One JSON object per line (``VERSION`` in ``"v"``). Each agent that opens the log first
writes a *reward record*: ``reward_identity`` (what scores: see below), ``reward`` (its id), ``accepts``
(ids of other rewards whose answers it adopted, ``accept_reward_change``). Then one record per
settled sample: ``reward`` (the id of what scored it), ``request`` (``request_key``: what was asked),
``key`` (``verdict_key``: both together), ``sample`` (the sample, unique in the log), ``t`` (unix
time), ``ticket`` (one per submitted batch, a training step's; null on the per-sample path),
``index``, ``uid``, ``score`` (the reward's own score, before the failure policy and the group
hook; null if it failed), ``extra`` (its extra info), ``verdict`` (the judge's text, if the extra
info has ``judge_reply``, ``verdict`` or ``explanation``), ``latency_s`` (submit to settled),
``request_s`` (its last attempt, sent to answered), ``attempts``, ``failure`` (the failure kind, null on success), ``error``, ``input_tokens`` /
``output_tokens`` (what the judge reported; null if nothing) and ``cost`` (with prices). A group hook
(``post_process_scores``) that fails after its samples were logged appends one more record per
sample it failed, ``"stage": "hook"``, with the same ``sample`` and the hook's failure: readers take
it as that sample's outcome (the judge's own verdict stays resumable; the hook runs again).

**Reward identity.** What scored is named by ``RewardIdentity``: the reward's name, the file holding
its code and a SHA-256 of that file, or the ``reward_version`` the user sets instead of the hash (so
edits the user declares irrelevant keep the log), plus its kwargs (but ``api_key``; for an instance
the caller built, whose kwargs are unknown, its plain public attributes). Its id is a hash of the
name, the source hash (or the version) and the kwargs: the same code checked out in another folder
is the same reward; a different file of the same name, or a fixed bug, is not. The reward record
shows the kwargs with secret-looking values hidden and credentials cut out of URLs.

**Crash safety.** Appends go through one background thread (``VerdictWriter``): the event loop only
puts a record on a queue, so a slow disk never stalls scoring. Every ``WRITE_EVERY_S`` (50 ms) the
thread writes whatever has queued up in one ``write`` + ``flush``: a killed process loses at most
the last 50 ms of verdicts (what was written is in the OS page cache), and a resumed run sends those
again. It ``fsync``s at most every ``fsync_s`` seconds and on close, so a machine crash loses at
most that much more. Closing the agent (also on Ctrl-C) writes and fsyncs everything. A kill in the middle of a write leaves a torn last line:
readers skip it, and the writer cuts it off before appending again. A bad line anywhere else is an
error (the file is not ours, or is damaged).

**Resume.** ``plan_resume`` reads the successes of this reward (the last one per request); failed
samples are not cached, so a resumed run sends them again (a failure is usually transient: a
timeout, a 429, a deadline). A log holding answers of another reward is refused at start, both
rewards named (``RewardChanged``), unless the user accepts the change (``accept_reward_change``):
then every answer in the log is reused, and the new reward record says it adopted them, so later
resumes of the same reward reuse them without asking again. A log written before identities were
recorded (``"v": 1``) cannot be matched and is refused. One writer per file: two agents must not
share a log.

**Group judges.** A member's verdict depends on its whole group: its ``request`` is a hash of its own
request among the sorted requests of its group (the order members arrived in does not matter), and a
group call is answered from the log only when every member is; otherwise the group is sent again.

**What was judged (``verdict_log_inputs``).** A record holds what was judged only as its hash. With
the setting on, the agent also keeps the judged item in a sidecar file beside the log
(``inputs_path``: ``RUN.verdicts.jsonl`` -> ``RUN.verdicts.inputs.jsonl``), one line per request, the
first time the request is logged (a retry, a repeated request, a resumed answer or a hook record adds
nothing): ``{"request": KEY, "data_source", "solution_str", "ground_truth", "extra_info"}``, so the
sidecar is itself a valid ``score``/``replay --input`` file. Kept apart from the log so that resuming
and ``verl-async-rm log`` never read the responses (they can be long). The values are stored in their
JSON form, the very text the request key hashes (``dumps``: numpy values as numbers and lists, any
other object as its ``repr``); a reader re-hashes each line and trusts only a line whose hash is its
key (``read_logged_inputs``), so a value JSON cannot hold as it was (a dict with integer keys whose
order changes as text) is reported, never joined to another request. The same writer thread writes
both files, the sidecar's lines before the records they belong to, with the same flush and fsync
cadence, and cuts a torn last line of either. A group judge's members (requests hashing their whole
group) are not kept: their requests cannot be re-derived from one member.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import queue
import re
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping
from urllib.parse import urlsplit, urlunsplit

from verl_async_rm.errors import RewardChanged

_log = logging.getLogger(__name__)

VERSION = 2
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


def _sha256(text: str) -> str:
    # surrogatepass: a lone surrogate (a sample refused as ``invalid``) must still get a key to be
    # logged under; valid text encodes to the same bytes either way, so no key changes.
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def request_key(data_source: Any, solution_str: Any, ground_truth: Any, extra_info: Any) -> str:
    """A stable hash of what was asked. Not the sample's position or uid: the same response to the
    same prompt is the same request wherever it sits in a batch."""
    return _sha256(dumps([data_source, solution_str, ground_truth, extra_info]))


INPUT_FIELDS = ("data_source", "solution_str", "ground_truth", "extra_info")  # in request_key's order
_INPUT_REQUEST = re.compile(rb'^\{"request": "([0-9a-f]{64})"')


def inputs_path(log_path: str | os.PathLike) -> Path:
    """The sidecar beside a verdict log that keeps what was judged (``verdict_log_inputs``)."""
    path = Path(log_path)
    stem = path.name.removesuffix(".jsonl")
    return path.with_name(f"{stem}.inputs.jsonl")


def input_line(request: str, data_source: Any, solution_str: Any, ground_truth: Any, extra_info: Any) -> bytes:
    """One sidecar line: the request key first (readers find it without parsing the body), then the
    item in the JSON form its key hashes. A lone surrogate (a sample refused as invalid) cannot be
    written as UTF-8: such a line is written ASCII-escaped, which reads back to the same text."""
    body = {"data_source": data_source, "solution_str": solution_str, "ground_truth": ground_truth,
            "extra_info": extra_info}
    text = f'{{"request": "{request}", ' + dumps(body)[1:] + "\n"
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        return (f'{{"request": "{request}", '
                + json.dumps(body, sort_keys=True, default=_plain, ensure_ascii=True)[1:] + "\n").encode("ascii")


def _sidecar_lines(path: Path) -> Iterator[tuple[int, bytes, bool]]:
    """(line number, raw line, whether it ends in a newline), blank lines skipped."""
    with path.open("rb") as f:
        for number, raw in enumerate(f, 1):
            if raw.strip():
                yield number, raw, raw.endswith(b"\n")


def logged_input_requests(path: str | os.PathLike) -> set[int]:
    """The requests a sidecar holds, as ``input_seen`` keys (read from each line's head only)."""
    seen: set[int] = set()
    if not Path(path).exists():
        return seen
    for _, raw, _ in _sidecar_lines(Path(path)):
        match = _INPUT_REQUEST.match(raw)
        if match is not None:
            seen.add(input_seen(match[1].decode()))
    return seen


def input_seen(request: str) -> int:
    """What the writer remembers of a request it kept the input of: its key's first 64 bits (a set of
    ints, not of 64-character strings, for a run's millions of requests; two requests sharing them
    would only leave the second without a kept input, reported by the replay, never mismatched)."""
    return int(request[:16], 16)


@dataclass(frozen=True)
class LoggedInputs:
    items: dict[str, dict]  # by request: the item, as a ``score --input`` row's fields
    mismatched: set[str]  # requests whose kept line does not hash to them


def read_logged_inputs(path: str | os.PathLike, wanted: Iterable[str]) -> LoggedInputs:
    """The kept inputs of the ``wanted`` requests (streamed: only those are parsed). Each is re-hashed:
    a line whose item does not hash to its key is not used (``mismatched``). A torn last line is
    skipped; a bad line elsewhere raises ValueError."""
    wanted = set(wanted)
    items: dict[str, dict] = {}
    mismatched: set[str] = set()
    for number, raw, complete in _sidecar_lines(Path(path)):
        match = _INPUT_REQUEST.match(raw)
        if match is None:
            if not complete:
                break  # a torn last line
            raise ValueError(f"{path}:{number}: not a line of kept inputs (no leading 'request')")
        request = match[1].decode()
        if request not in wanted or request in items:
            continue
        try:
            row = json.loads(raw)
        except json.JSONDecodeError:
            if not complete:
                break
            raise ValueError(f"{path}:{number}: not a line of kept inputs (not JSON)") from None
        if not isinstance(row, dict) or not all(key in row for key in INPUT_FIELDS):
            raise ValueError(f"{path}:{number}: not a line of kept inputs (it needs {', '.join(INPUT_FIELDS)})")
        if request_key(*(row[key] for key in INPUT_FIELDS)) != request:
            mismatched.add(request)
            continue
        mismatched.discard(request)
        items[request] = {key: row[key] for key in INPUT_FIELDS}
    return LoggedInputs(items, mismatched)


def group_request_keys(member_requests: list[str]) -> list[str]:
    """The request of each member of a group judge's call: its own request within its group. The
    group is the sorted multiset of its members' requests (arrival order on the per-sample path
    varies between runs); identical members are told apart by their occurrence."""
    group = _sha256(dumps(sorted(member_requests)))
    seen: Counter[str] = Counter()
    keys = []
    for request in member_requests:
        keys.append(_sha256(dumps(["group", group, request, seen[request]])))
        seen[request] += 1
    return keys


def verdict_key(reward_id: str, request: str) -> str:
    """What scored and what was asked: the record's ``key``."""
    return _sha256(f"{reward_id}/{request}")


# Whole words of a setting's name (max_tokens is no secret; hf_token, api_key, auth_header are).
_SECRET_NAME = re.compile(r"(?:^|_)(?:key|apikey|token|secret|password|passwd|auth|authorization|credentials?)(?:_|$)",
                          re.IGNORECASE)


def shown(settings: Mapping) -> dict:
    """Settings as the log and error messages show them: values of secret-looking names hidden, and
    credentials cut out of URLs (``user:pass@``, the query). The id hashes the real values."""
    out = {}
    for name, value in settings.items():
        if _SECRET_NAME.search(str(name)):
            value = "<hidden>"
        elif isinstance(value, str) and "://" in value:
            parts = urlsplit(value)
            if parts.username or parts.password or parts.query:
                value = urlunsplit((parts.scheme, parts.netloc.rpartition("@")[2], parts.path, "", ""))
        out[name] = value
    return out


def _plain_attributes(instance: Any) -> dict:
    """A caller-built instance's configuration, as far as it shows: its public attributes holding
    plain values (a model name, a temperature), not clients or state objects."""
    return {name: value for name, value in sorted(getattr(instance, "__dict__", {}).items())
            if not name.startswith("_") and (value is None or isinstance(value, (str, int, float, bool)))}


@dataclass(frozen=True)
class RewardIdentity:
    """What scores (see the module docstring). ``file`` and ``source_sha256`` are None when the code
    has no source file (a builtin, code typed at a prompt): then only ``reward_version`` tells runs
    apart, and resuming needs it. ``attributes``: for an instance the caller built (its constructor
    kwargs are unknown), its plain public attributes stand in for them."""

    name: str
    file: str | None
    source_sha256: str | None
    reward_version: str | None
    kwargs: dict = field(default_factory=dict)
    attributes: dict = field(default_factory=dict)

    @classmethod
    def of(cls, name: str, file: str | None, reward_version: str | None, kwargs: Mapping | None,
           instance: Any = None) -> RewardIdentity:
        source = None
        if file is not None:
            with open(file, "rb") as f:
                source = hashlib.sha256(f.read()).hexdigest()
        hashed = {k: v for k, v in dict(kwargs or {}).items() if k not in UNHASHED_KWARGS}
        attributes = {} if instance is None else \
            {k: v for k, v in _plain_attributes(instance).items() if k not in UNHASHED_KWARGS}
        return cls(name, file, source, None if reward_version is None else str(reward_version), hashed, attributes)

    @property
    def id(self) -> str:
        what = {"version": self.reward_version} if self.reward_version is not None else {"source": self.source_sha256}
        settings = [self.kwargs, self.attributes] if self.attributes else [self.kwargs]
        return _sha256(dumps([self.name, what, *settings]))[:16]

    @property
    def verifiable(self) -> bool:
        """Whether a changed reward would get a new id."""
        return self.reward_version is not None or self.source_sha256 is not None

    def as_record(self) -> dict:
        return {"name": self.name, "file": self.file, "source_sha256": self.source_sha256,
                "reward_version": self.reward_version, "kwargs": shown(self.kwargs), "attributes": shown(self.attributes)}

    def describe(self) -> str:
        return describe_reward(self.as_record(), self.id)


def describe_reward(identity: Mapping, reward_id: str | None) -> str:
    """One line naming a reward, from its record (``RewardIdentity.as_record``)."""
    version, source = identity.get("reward_version"), identity.get("source_sha256")
    what = f"reward_version {version!r}" if version is not None else \
        (f"source sha256 {source[:12]}" if source else "source unknown")
    where = f" in {identity['file']}" if identity.get("file") else ""
    settings = f", kwargs {dumps(identity.get('kwargs') or {})}"
    if identity.get("attributes"):
        settings += f", attributes {dumps(identity['attributes'])}"
    return f"{identity.get('name')}{where} ({what}{settings}; id {reward_id})"


def reward_record(identity: RewardIdentity, accepts: Iterable[str] = ()) -> dict:
    return {"v": VERSION, "t": time.time(), "reward": identity.id, "reward_identity": identity.as_record(),
            "accepts": sorted(accepts)}


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

    def __init__(self, path: str | os.PathLike, fsync_s: float = 1.0, write_every_s: float = WRITE_EVERY_S,
                 header: dict | None = None, inputs: str | os.PathLike | None = None):
        """``header``: a first record (the reward record), written before this returns. ``inputs``: the
        sidecar of kept inputs (``append_input``), written before the records queued with them."""
        self.path = Path(path)
        self.fsync_s = fsync_s
        self.write_every_s = write_every_s
        self._stop = threading.Event()
        _cut_torn_tail(self.path)
        self.inputs_path = None if inputs is None else Path(inputs)
        self._inputs = None
        if self.inputs_path is not None:
            _cut_torn_tail(self.inputs_path)
            self._inputs = self.inputs_path.open("ab")
        self._file = self.path.open("ab")
        if header is not None:
            self._file.write((dumps(header) + "\n").encode())
            self._file.flush()
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._input_queue: queue.SimpleQueue = queue.SimpleQueue()
        self.error: BaseException | None = None  # a failed write: the engine fails loudly on it
        self.written = 0
        self.inputs_written = 0
        self._thread = threading.Thread(target=self._run, name="verdict-log", daemon=True)
        self._thread.start()

    def append(self, record: dict) -> None:
        self._queue.put(record)

    def append_input(self, request: str, data_source: Any, solution_str: Any, ground_truth: Any, extra_info: Any) -> None:
        """Queue a kept input (serialised on the writer thread, off the event loop: responses can be long)."""
        self._input_queue.put((request, data_source, solution_str, ground_truth, extra_info))

    @staticmethod
    def _drain(source: queue.SimpleQueue) -> list:
        batch = []
        while True:
            try:
                batch.append(source.get_nowait())
            except queue.Empty:
                return batch

    def _run(self) -> None:
        last_sync = time.monotonic()
        stopping = False
        while not stopping:
            # Wake on a timer, not per record: a thread woken for every put takes the GIL from the
            # event loop at every sample (measured: 3x slower scoring at zero latency).
            self._stop.wait(self.write_every_s)
            stopping = self._stop.is_set()
            # everything queued meanwhile goes in one write; inputs drained first, so a record's kept
            # input is always written (and flushed, and fsynced) before the record itself
            inputs = self._drain(self._input_queue) if self._inputs is not None else []
            batch = self._drain(self._queue)
            try:
                if inputs:
                    self._inputs.write(b"".join(input_line(*entry) for entry in inputs))
                    self._inputs.flush()
                    self.inputs_written += len(inputs)
                if batch:
                    self._file.write("".join(dumps(r) + "\n" for r in batch).encode())
                    self._file.flush()
                    self.written += len(batch)
                now = time.monotonic()
                if (batch or inputs or stopping) and (stopping or now - last_sync >= self.fsync_s):
                    if self._inputs is not None:
                        os.fsync(self._inputs.fileno())
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
        if self._inputs is not None:
            self._inputs.close()


@dataclass(frozen=True)
class ReadResult:
    records: list[dict]  # the samples' records, in order
    torn_tail: bool  # the last line was cut by a kill (skipped)
    rewards: list[dict] = field(default_factory=list)  # the reward records, in order


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
    records, rewards, bad = [], [], None
    for number, record, text in iter_records(path):
        if bad is not None:
            raise ValueError(f"{path}:{bad}: not a verdict log record (only a torn last line is tolerated)")
        if record is None:
            if text.endswith("\n"):
                raise ValueError(f"{path}:{number}: not a verdict log record")
            bad = number
            continue
        if isinstance(record, dict) and "reward_identity" in record:
            rewards.append(record)
            continue
        if not isinstance(record, dict) or "key" not in record:
            raise ValueError(f"{path}:{number}: not a verdict log record (no 'key')")
        records.append(record)
    return ReadResult(records, bad is not None, rewards)


@dataclass(frozen=True, slots=True)
class LoggedAnswer:
    score: float
    extra: dict
    attempts: int


@dataclass(frozen=True)
class ResumePlan:
    answers: dict[str, LoggedAnswer]  # by request key
    accepts: frozenset[str] = frozenset()  # other rewards' ids whose answers are reused


LEGACY = "(a log written before reward identities were recorded)"


def plan_resume(log: ReadResult, identity: RewardIdentity, accept_reward_change: bool, path: Any = "the verdict log") -> ResumePlan:
    """The answers a resumed run may reuse: the successes of ``identity`` and of the rewards it
    adopted before (the last one per request). Raises ``RewardChanged``, naming both rewards, when
    the log holds answers of another reward, unless ``accept_reward_change``: then all are reused."""
    own = identity.id
    adopted = {own}
    described: dict[str | None, str] = {}
    for record in log.rewards:
        reward = record.get("reward")
        described[reward] = describe_reward(record["reward_identity"], reward)
        if reward == own:
            adopted.update(record.get("accepts") or ())
    successes = [r for r in log.records if r.get("failure") is None and r.get("score") is not None and r.get("stage") is None]
    foreign = {r.get("reward") for r in successes} - adopted
    if None in foreign:
        raise RewardChanged(
            f"{path} holds {sum(r.get('reward') is None for r in successes)} answers {LEGACY}: they cannot be matched "
            f"to requests. Start a new verdict log, or set verdict_log_resume=false to append to this one without "
            f"reusing it")
    if foreign and not accept_reward_change:
        counts = Counter(r.get("reward") for r in successes if r.get("reward") in foreign)
        theirs = "; ".join(f"{count} answers by {described.get(reward, f'reward id {reward}')}" for reward, count in counts.most_common())
        raise RewardChanged(
            f"{path} was written by another reward: it holds {theirs}. This run scores with {identity.describe()}. "
            "Its answers would not be this reward's: use another verdict log, or accept the change "
            "(verl-async-rm score --accept-reward-change; setting verdict_log_accept_reward_change=true) to reuse them")
    if own in {r.get("reward") for r in successes} and not identity.verifiable and not accept_reward_change:
        raise RewardChanged(
            f"{path}: {identity.describe()} has no source file to hash, so whether its code changed since the log "
            "was written cannot be told: set reward_version (change it when the reward changes), or accept the "
            "change (verdict_log_accept_reward_change=true)")
    answers = {}
    for record in successes:
        if accept_reward_change or record.get("reward") in adopted:
            answers[record["request"]] = LoggedAnswer(float(record["score"]), dict(record.get("extra") or {}),
                                                      int(record.get("attempts") or 1))
    return ResumePlan(answers, frozenset((adopted | foreign) - {own}))


def load_resume_answers(path: str | os.PathLike, identity: RewardIdentity, accept_reward_change: bool = False) -> ResumePlan:
    """``plan_resume`` over the file at ``path``; an absent file is an empty log."""
    if not Path(path).exists():
        return ResumePlan({})
    return plan_resume(read_log(path), identity, accept_reward_change, path)
