"""The link between the ``hf_cpu`` engine hosted in the trainer worker and the replica's Ray actor
(cpu_backend/engine_link.py): every call answered to its own caller whatever the order, errors
delivered as the engine raised them, nothing hung when the engine's process dies or never listens.
A stand-in engine (no torch) behind a real socket; tests/rig/test_cpu_router.py runs the real server
behind a real Ray actor."""

from __future__ import annotations

import asyncio
import os
import random
import shutil
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import uuid

import pytest

from verl_async_rm_rig.cpu_backend.engine_link import EngineHost, EngineLink
from verl_async_rm_rig.cpu_backend.server_actor import HFCPUServerActor
from verl_async_rm_rig.cpu_backend.token_output import GeneratedTokens


def fresh_address() -> str:
    return f"\0verl_async_rm-test-{uuid.uuid4().hex}" if sys.platform.startswith("linux") else \
        f"/tmp/vark-{uuid.uuid4().hex[:12]}.sock"


class Unpicklable(Exception):
    def __reduce__(self):
        raise TypeError("cannot pickle me")


class StandInEngine:
    """Coroutine methods like HFCPUServer's, answering after a delay of the caller's choosing."""

    def __init__(self):
        self.loop = asyncio.get_running_loop()  # built on the host's loop, as the real engine is
        self.calls = 0

    async def generate(self, request_id, prompt_ids, sampling_params, **kwargs):
        self.calls += 1
        assert asyncio.get_running_loop() is self.loop  # served on the engine's own loop
        await asyncio.sleep(sampling_params.get("delay", 0))
        return GeneratedTokens(token_ids=list(prompt_ids), log_probs=None, stop_reason="completed", num_preempted=0,
                               extra_fields={"request_id": request_id})

    async def get_state(self):
        return {"calls": self.calls}

    async def fail(self, kind):
        if kind == "value":
            raise ValueError("bad sampling params")
        raise Unpicklable("the engine's own error type")

    async def hang(self):
        await asyncio.sleep(3600)


@pytest.fixture
def host():
    engine_host = EngineHost(StandInEngine, fresh_address())
    yield engine_host
    engine_host.close()


@pytest.mark.local
def test_concurrent_calls_each_get_their_own_answer_whatever_order_they_finish_in(host):
    async def main():
        link = EngineLink(host.address)
        delays = [random.Random(i).random() * 0.05 for i in range(60)]
        outs = await asyncio.gather(*[link.call("generate", f"r{i}", [i, i + 1], {"delay": d})
                                      for i, d in enumerate(delays)])
        return outs, await link.call("get_state")

    outs, state = asyncio.run(main())
    assert [o.extra_fields["request_id"] for o in outs] == [f"r{i}" for i in range(60)]
    assert [o.token_ids for o in outs] == [[i, i + 1] for i in range(60)]
    assert all(type(o) is GeneratedTokens for o in outs)  # rebuilt as ours: the relay never unpickles verl's type
    assert state == {"calls": 60}


@pytest.mark.local
def test_the_engines_errors_reach_the_caller_as_raised_or_as_their_text(host):
    async def main():
        link = EngineLink(host.address)
        with pytest.raises(ValueError, match="bad sampling params"):
            await link.call("fail", "value")
        with pytest.raises(RuntimeError, match="Unpicklable: the engine's own error type"):
            await link.call("fail", "unpicklable")
        with pytest.raises(AttributeError):
            await link.call("no_such_method")
        return await link.call("get_state")  # the link survives its calls' errors

    assert asyncio.run(main()) == {"calls": 0}


@pytest.mark.local
def test_the_adapter_calls_the_engine_in_process_from_its_own_loop(host):
    """The trainer worker's path (weights, sleep and wake): another thread's loop awaits the engine's."""
    out = asyncio.run(host.call("generate", "w", [5], {}))
    assert out.token_ids == [5] and asyncio.run(host.call("get_state")) == {"calls": 1}


@pytest.mark.local
def test_the_relay_actor_forwards_every_method_over_the_link(host):
    """HFCPUServerActor given an engine address builds no server (nothing heavy: test_cpu_router.py)
    and answers from the hosted engine."""
    actor = HFCPUServerActor(settings=None, replica_rank=0, engine_address=host.address)
    assert actor._server is None

    async def main():
        return await actor.generate("a", [1, 2], {}), await actor.get_state()

    out, state = asyncio.run(main())
    assert out.token_ids == [1, 2] and state == {"calls": 1}


@pytest.mark.quick
def test_no_engine_listening_is_a_clear_error_after_the_connect_timeout_not_a_hang():
    address = fresh_address()
    link = EngineLink(address, connect_timeout_s=0.3)
    start = time.monotonic()
    with pytest.raises(ConnectionError, match="no hf_cpu engine listens .* after 0.3 s.*HFServerAdapter"):
        asyncio.run(link.call("get_state"))
    assert time.monotonic() - start < 5


@pytest.mark.local
def test_an_engine_listening_late_is_reached(tmp_path):
    """The relay may connect before the engine listens (it never does under verl, which builds the
    adapter at init_model first): it retries until the deadline."""
    address = fresh_address()

    async def main():
        link = EngineLink(address, connect_timeout_s=10)
        pending = asyncio.ensure_future(link.call("get_state"))
        await asyncio.sleep(0.3)
        assert not pending.done()
        engine_host = await asyncio.to_thread(EngineHost, StandInEngine, address)
        try:
            return await asyncio.wait_for(pending, 5)
        finally:
            engine_host.close()

    assert asyncio.run(main()) == {"calls": 0}


ENGINE_PROCESS = textwrap.dedent(
    """
    import sys, time
    sys.path.insert(0, {tests!r})
    from test_engine_link import StandInEngine
    from verl_async_rm_rig.cpu_backend.engine_link import EngineHost
    EngineHost(StandInEngine, {address!r})
    print("listening", flush=True)
    time.sleep(3600)
    """
)


@pytest.mark.local
def test_calls_in_flight_fail_when_the_engines_process_dies_instead_of_hanging():
    """The trainer worker crashes with requests in flight: each waiting call raises ConnectionError
    at once, and so does every later one."""
    address = fresh_address()
    code = ENGINE_PROCESS.format(tests=os.path.dirname(__file__), address=address)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "listening"

        async def main():
            link = EngineLink(address, connect_timeout_s=5)
            assert await link.call("get_state") == {"calls": 0}
            in_flight = [asyncio.ensure_future(link.call("hang")) for _ in range(5)]
            await asyncio.sleep(0.2)
            proc.kill()
            start = time.monotonic()
            results = await asyncio.wait_for(asyncio.gather(*in_flight, return_exceptions=True), 10)
            waited = time.monotonic() - start
            with pytest.raises(ConnectionError, match="is gone"):
                await link.call("get_state")
            return results, waited

        results, waited = asyncio.run(main())
        assert all(isinstance(r, ConnectionError) for r in results), results
        assert waited < 5
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.quick
def test_a_failing_engine_build_raises_in_the_adapter_and_stops_the_thread():
    def broken():
        raise OSError("no model at /nowhere")

    def engine_threads() -> int:
        return sum(t.name == "hf_cpu-engine" for t in threading.enumerate())

    before = engine_threads()
    with pytest.raises(OSError, match="no model"):
        EngineHost(broken, fresh_address())
    deadline = time.monotonic() + 5
    while engine_threads() > before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert engine_threads() == before


OTHER_USER_CLIENT = textwrap.dedent(
    """
    import os, pickle, socket, struct
    os.setuid(65534)  # nobody
    sock = socket.socket(socket.AF_UNIX)
    sock.connect({address!r})
    body = pickle.dumps((0, "get_state", (), {{}}))
    sock.settimeout(5)
    try:
        sock.sendall(struct.pack("!Q", len(body)) + body)
        print("closed" if sock.recv(1) == b"" else "answered", flush=True)
    except (BrokenPipeError, ConnectionResetError):  # closed before the frame was sent or read
        print("closed", flush=True)
    """
)

OTHER_USER_ENGINE = textwrap.dedent(
    """
    import os, socket, time
    os.setuid(65534)
    sock = socket.socket(socket.AF_UNIX)
    sock.bind({address!r})
    sock.listen()
    print("listening", flush=True)
    conn, _ = sock.accept()
    time.sleep(30)
    """
)

needs_root = pytest.mark.skipif(not sys.platform.startswith("linux") or os.getuid() != 0,
                                reason="runs a peer as another user (Linux, root)")


@pytest.mark.local
@needs_root
def test_the_engine_answers_no_other_user(host):
    """Frames are pickles: a local process of another user must not get one unpickled. (An abstract
    socket has no file permissions: the engine checks its peer's credentials.)"""
    out = subprocess.run([sys.executable, "-c", OTHER_USER_CLIENT.format(address=host.address)],
                         capture_output=True, text=True, timeout=30)
    assert out.stdout.strip() == "closed", out.stderr
    assert asyncio.run(host.call("get_state")) == {"calls": 0}


@pytest.mark.local
@needs_root
def test_the_relay_talks_to_no_other_users_socket():
    """Someone else listening at the engine's address (it is predictable) gets nothing from the relay."""
    address = fresh_address()
    proc = subprocess.Popen([sys.executable, "-c", OTHER_USER_ENGINE.format(address=address)],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "listening"
        with pytest.raises(PermissionError, match="another user's"):
            asyncio.run(EngineLink(address, connect_timeout_s=5).call("get_state"))
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.local
@needs_root
def test_a_filesystem_socket_as_off_linux_checks_its_peer_too(monkeypatch):
    """Off Linux the engine listens on a socket file; its peer is checked there as well (macOS/BSD:
    LOCAL_PEERCRED), not left to the directory's permissions. Emulated here: abstract sockets off, the
    socket in a folder anyone may enter, another user connecting."""
    from verl_async_rm_rig.cpu_backend import engine_link

    monkeypatch.setattr(engine_link, "_ABSTRACT", False)
    open_folder = tempfile.mkdtemp(prefix="vark-", dir="/tmp")  # pytest's tmp_path is closed to other users
    os.chmod(open_folder, 0o777)
    engine_host = EngineHost(StandInEngine, os.path.join(open_folder, "engine.sock"))
    try:
        os.chmod(engine_host.address, 0o777)
        out = subprocess.run([sys.executable, "-c", OTHER_USER_CLIENT.format(address=engine_host.address)],
                             capture_output=True, text=True, timeout=30)
        assert out.stdout.strip() == "closed", out.stderr
        assert asyncio.run(engine_host.call("get_state")) == {"calls": 0}
    finally:
        engine_host.close()
        shutil.rmtree(open_folder, ignore_errors=True)


@pytest.mark.quick
def test_the_socket_directory_must_be_this_users_own_and_closed_to_others(tmp_path):
    """The directory's name is predictable: made first by another user (or left open), a socket of theirs
    could stand in for the engine's. Only a real directory of ours with mode 0700 is used."""
    from verl_async_rm_rig.cpu_backend.engine_link import private_directory

    made = private_directory(str(tmp_path))  # made here: ours, 0700
    assert os.stat(made).st_mode & 0o777 == 0o700 and private_directory(str(tmp_path)) == made
    os.chmod(made, 0o777)  # left open to everyone (or made so by another user)
    with pytest.raises(PermissionError, match="mode 0o777"):
        private_directory(str(tmp_path))
    os.rmdir(made)
    elsewhere = tmp_path / "theirs"
    elsewhere.mkdir(mode=0o700)
    os.symlink(elsewhere, made)  # a link to a folder of someone's
    with pytest.raises(PermissionError, match="not a directory"):
        private_directory(str(tmp_path))
    os.unlink(made)
    if os.getuid() == 0:  # another user's own 0700 directory
        os.mkdir(made, mode=0o700)
        os.chown(made, 65534, 65534)
        with pytest.raises(PermissionError, match="owned by uid 65534"):
            private_directory(str(tmp_path))


@pytest.mark.local
def test_each_runs_replica_has_its_own_address_and_both_ends_derive_the_same(monkeypatch):
    """The five demo lanes share one Ray cluster (one node, a job each, replica 0 each), and runs with
    a cluster each share job ids (every cluster's first job is 01000000): the address must tell them
    apart, and the trainer worker and the replica's actor (same node and job) must agree on it."""
    import ray

    from verl_async_rm_rig.cpu_backend.engine_link import engine_address

    class Context:
        def __init__(self, node, job):
            self.node, self.job = node, job

        def get_node_id(self):
            return self.node

        def get_job_id(self):
            return self.job

    def address(node, job, replica):
        monkeypatch.setattr(ray, "get_runtime_context", lambda: Context(node, job))
        return engine_address(replica)

    lanes_on_one_cluster = {address("n1", f"0{j}000000", 0) for j in range(1, 6)}
    clusters_of_their_own = {address(f"n{k}", "01000000", 0) for k in range(1, 6)}
    replicas_of_one_run = {address("n1", "01000000", r) for r in range(4)}
    assert len(lanes_on_one_cluster) == len(clusters_of_their_own) == 5 and len(replicas_of_one_run) == 4
    assert address("n1", "02000000", 1) == address("n1", "02000000", 1)
