"""The ``hf_cpu`` rollout engine hosted in the trainer worker's process, and the link its Ray actor
relays verl's calls over.

Why: a replica's engine (``server.HFCPUServer``, a transformers model sampling on CPU) used to run in
a Ray actor of its own, a process that imports torch and transformers (~6 CPU-s, the most of any
start-up stage after verl's own workers: ``bench/startup_profile.py``) only to hold a copy of a model
whose libraries the trainer worker has already loaded. As verl's hybrid engine keeps vLLM's workers in
the trainer's process, the engine now lives in the trainer worker (verl's ``WorkerDict``): the rollout
adapter verl builds there at ``init_model`` (``rollout.HFServerAdapter``) starts it on a thread with
its own event loop (the worker is an async actor: its loop must never block on sampling) and serves
it on a local socket. The replica's actor (``server_actor.HFCPUServerActor``) relays verl's calls to
it and imports no torch; weight updates pass in process instead of through Ray.

Transport: a Unix socket named from the Ray node, the Ray job and the replica (the abstract namespace
on Linux: nothing on disk to clean up), so both ends derive the name without exchanging it, carrying
length-prefixed pickled frames. Pickle runs code, so each end talks only to a peer of its own user: on
Linux both check the other's credentials (an abstract socket has no file permissions); elsewhere the
socket lies in a directory only the user can open. Hand-rolled on asyncio streams because Ray cannot call into verl's
worker (its methods are verl's), and one local peer needs nothing more than the standard library.

Imports nothing heavy at module level (the relay's process loads it).
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import itertools
import logging
import os
import pickle
import socket
import stat
import struct
import sys
import tempfile
import threading
import time
from typing import Any, Callable, Optional

from .token_output import GeneratedTokens

logger = logging.getLogger(__name__)
_HEADER = struct.Struct("!Q")  # frame length
_ABSTRACT = sys.platform.startswith("linux")
CONNECT_TIMEOUT_S = 60.0  # the engine is listening before verl launches the replica: seconds are plenty


def engine_address(replica_rank: int) -> str:
    """The socket of replica ``replica_rank``'s engine in this Ray job (the same in the trainer worker
    and in the replica's actor: one node, one job)."""
    import ray

    context = ray.get_runtime_context()
    digest = hashlib.sha256(f"{context.get_node_id()}|{context.get_job_id()}|{replica_rank}".encode()).hexdigest()[:20]
    name = f"verl_async_rm-hf_cpu-{digest}"
    if _ABSTRACT:
        return "\0" + name  # abstract: vanishes with the process
    return os.path.join(private_directory(tempfile.gettempdir()), name + ".sock")


def private_directory(parent: str) -> str:
    """``parent/verl_async_rm-<uid>``, made if missing; refused unless it is a real directory of this
    user that nobody else may enter. The name is predictable, so another user could have made it first
    (mode 0777, or a link to a folder of theirs) and swapped a socket of theirs in."""
    private = os.path.join(parent, f"verl_async_rm-{os.getuid()}")
    try:
        os.mkdir(private, mode=0o700)
    except FileExistsError:
        pass
    found = os.lstat(private)
    if not stat.S_ISDIR(found.st_mode) or found.st_uid != os.getuid() or found.st_mode & 0o077:
        kind = "a directory" if stat.S_ISDIR(found.st_mode) else "not a directory (a link?)"
        raise PermissionError(
            f"the engine's socket directory {private} is {kind} owned by uid {found.st_uid} with mode "
            f"{stat.S_IMODE(found.st_mode):#o}; it must be this user's ({os.getuid()}) with mode 0700, or another "
            "user could answer the engine's calls. Remove it, or set TMPDIR to a folder of your own."
        )
    return private


def peer_uid(sock: socket.socket) -> int:
    """The user id of the process at the other end of a connected Unix socket: SO_PEERCRED (Linux),
    LOCAL_PEERCRED (macOS and the BSDs: struct xucred, the uid after a version word). Where neither
    exists the peer cannot be known, and a link that unpickles must not run: an error."""
    if hasattr(socket, "SO_PEERCRED"):
        _pid, uid, _gid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
        return uid
    if hasattr(socket, "LOCAL_PEERCRED"):
        _version, uid = struct.unpack("2I", sock.getsockopt(0, socket.LOCAL_PEERCRED, 256)[:8])  # SOL_LOCAL is 0
        return uid
    raise OSError(f"cannot read a Unix socket peer's credentials on {sys.platform}: the CPU backend's engine link needs them")


def _peer_is_us(writer: asyncio.StreamWriter) -> bool:
    """Whether the other end of a Unix socket runs as this process's user, on every platform (the private
    directory of a filesystem socket is a second line, not the only one)."""
    return peer_uid(writer.get_extra_info("socket")) == os.getuid()


async def _send(writer: asyncio.StreamWriter, message: Any) -> None:
    body = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    writer.write(_HEADER.pack(len(body)) + body)
    await writer.drain()


async def _receive(reader: asyncio.StreamReader) -> Any:
    (size,) = _HEADER.unpack(await reader.readexactly(_HEADER.size))
    return pickle.loads(await reader.readexactly(size))


def _encode_result(value: Any) -> tuple[str, Any]:
    # GeneratedTokens pickles as verl's TokenOutput (its __reduce__), which would import verl in the
    # relay: it crosses the socket as its fields and is rebuilt there.
    if isinstance(value, GeneratedTokens):
        return "tokens", dataclasses.asdict(value)
    return "ok", value


def _encode_error(exc: BaseException) -> tuple[str, Any]:
    try:
        pickle.loads(pickle.dumps(exc))
        return "error", exc
    except Exception:  # noqa: BLE001 - an exception that does not survive pickling: its text does
        return "error", RuntimeError(f"{type(exc).__name__}: {exc}")


def _decode(kind: str, value: Any) -> Any:
    if kind == "tokens":
        return GeneratedTokens(**value)
    if kind == "error":
        raise value
    return value


# ------------------------------------------------------------------------------------------------
# host side (the trainer worker)
# ------------------------------------------------------------------------------------------------


class EngineHost:
    """An engine built by ``build()`` on a daemon thread with its own event loop, serving its coroutine
    methods on ``address``. :meth:`call` reaches it from any other thread or loop."""

    def __init__(self, build: Callable[[], Any], address: str) -> None:
        self.address = address
        self._connections: dict[asyncio.Task, asyncio.StreamWriter] = {}
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="hf_cpu-engine", daemon=True)
        self._thread.start()
        try:
            self.engine, self._listener = self._run(self._start(build))
        except BaseException:
            self.loop.call_soon_threadsafe(self.loop.stop)
            raise

    def _run(self, coro) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    async def _start(self, build: Callable[[], Any]):
        engine = build()  # on the engine's loop: the primitives it makes belong to it
        if self.address.startswith("\0") or not os.path.exists(self.address):
            listener = await asyncio.start_unix_server(self._serve, path=self.address)
        else:
            raise FileExistsError(f"hf_cpu engine socket {self.address} exists: another engine of this job?")
        return engine, listener

    async def call(self, method: str, *args, **kwargs) -> Any:
        """Await ``engine.method(*args, **kwargs)`` on the engine's loop, from the caller's loop."""
        future = asyncio.run_coroutine_threadsafe(getattr(self.engine, method)(*args, **kwargs), self.loop)
        return await asyncio.wrap_future(future)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if not _peer_is_us(writer):
            logger.warning("hf_cpu engine at %r: refused a connection from another user", self.address)
            writer.close()
            return
        self._connections[asyncio.current_task()] = writer
        write_lock = asyncio.Lock()
        tasks: set[asyncio.Task] = set()

        async def answer(call_id: int, method: str, args: tuple, kwargs: dict) -> None:
            try:
                reply = _encode_result(await getattr(self.engine, method)(*args, **kwargs))
            except Exception as exc:  # noqa: BLE001 - delivered to the caller, as Ray would
                reply = _encode_error(exc)
            async with write_lock:
                await _send(writer, (call_id, *reply))

        try:
            while True:
                call_id, method, args, kwargs = await _receive(reader)
                task = asyncio.create_task(answer(call_id, method, args, kwargs))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass  # the relay went away: its calls' answers have nowhere to go
        finally:
            for task in tasks:
                task.cancel()
            writer.close()
            self._connections.pop(asyncio.current_task(), None)

    def close(self) -> None:
        """Stop listening, end the open connections (their callers see ConnectionError), stop the thread."""

        async def stop() -> None:
            self._listener.close()
            for writer in self._connections.values():
                writer.close()  # its reader sees the end and the connection's task returns (a cancel would be logged)
            await asyncio.gather(*self._connections, return_exceptions=True)

        try:
            self._run(stop())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout=5)
            if not self._thread.is_alive():
                self.loop.close()
            if not self.address.startswith("\0"):
                try:
                    os.unlink(self.address)
                except FileNotFoundError:
                    pass


# ------------------------------------------------------------------------------------------------
# relay side (the replica's Ray actor)
# ------------------------------------------------------------------------------------------------


class EngineLink:
    """The relay's end: one connection to the engine, opened at the first call (on the relay's loop),
    carrying any number of concurrent calls, each answered by its id."""

    def __init__(self, address: str, connect_timeout_s: float = CONNECT_TIMEOUT_S) -> None:
        self.address = address
        self.connect_timeout_s = connect_timeout_s
        self._ids = itertools.count()
        self._pending: dict[int, asyncio.Future] = {}
        self._writer: Optional[asyncio.StreamWriter] = None
        self._connecting: Optional[asyncio.Task] = None
        self._lost: Optional[BaseException] = None
        self._reading: Optional[asyncio.Task] = None  # held: the loop keeps only weak references to tasks

    async def call(self, method: str, *args, **kwargs) -> Any:
        if self._writer is None:
            if self._connecting is None:
                self._connecting = asyncio.ensure_future(self._connect())
            await asyncio.shield(self._connecting)
        if self._lost is not None:
            raise ConnectionError(f"the hf_cpu engine at {self.address!r} is gone") from self._lost
        call_id = next(self._ids)
        answer = asyncio.get_running_loop().create_future()
        self._pending[call_id] = answer
        try:
            await _send(self._writer, (call_id, method, args, kwargs))
            return _decode(*await answer)
        finally:
            self._pending.pop(call_id, None)

    async def _connect(self) -> None:
        deadline = time.monotonic() + self.connect_timeout_s
        while True:
            try:
                reader, writer = await asyncio.open_unix_connection(self.address)
                break
            except (ConnectionRefusedError, FileNotFoundError) as exc:
                if time.monotonic() > deadline:
                    raise ConnectionError(
                        f"no hf_cpu engine listens at {self.address!r} after {self.connect_timeout_s:g} s: the "
                        "rollout adapter (HFServerAdapter) in verl's trainer worker starts it at init_model"
                    ) from exc
                await asyncio.sleep(0.1)
        if not _peer_is_us(writer):
            writer.close()
            raise PermissionError(f"the socket {self.address!r} is another user's, not this job's hf_cpu engine")
        self._writer = writer
        self._reading = asyncio.get_running_loop().create_task(self._read(reader))

    async def _read(self, reader: asyncio.StreamReader) -> None:
        try:
            while True:
                call_id, kind, value = await _receive(reader)
                answer = self._pending.get(call_id)
                if answer is not None and not answer.done():
                    answer.set_result((kind, value))
        except BaseException as exc:  # noqa: BLE001 - the engine's process ended: fail every waiting call
            self._lost = exc
            for answer in self._pending.values():
                if not answer.done():
                    answer.set_exception(ConnectionError(f"the hf_cpu engine at {self.address!r} is gone: {exc!r}"))
            if not isinstance(exc, Exception):
                raise
        finally:
            self._writer.close()  # on this loop, while it runs (a stream left to the collector closes late)
