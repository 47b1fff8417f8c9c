"""Limits shared across jobs on one Ray cluster: the limiter actor and the job's side of it.

Set ``shared_limits: {endpoint: "judge-a"}`` and every job naming ``judge-a`` takes its concurrency,
requests/tokens per minute and 429 back-off from one detached named actor,
``async_rm_limiter:judge-a`` (namespace ``shared_limits.namespace``), created by the first job and
found by the others. Why leases and how they keep the sum within the limits: ``lease_table.py``.

The job's side (``SharedLimitsClient``) is one of admission's meters (``engine/meters.py``), in
the place of the job's own rate limits: a request starts when the lease has a slot for it (its
granted share of the endpoint's concurrency) and, with rate limits, a leased permit (pools of
permits read as the local buckets are: ``wait_time``/``take``). The endpoint's back-off reaches the
flow control as a pause (``flow.hold``). A request pays no remote call; one heartbeat per
``heartbeat_s`` (or sooner, when a pool runs dry) renews everything. Without the setting nothing
here is imported or created: a job behaves exactly as before.

A job that cannot reach the limiter for ``lease_ttl / 2`` stops sending (cap 0) until it can; the
limiter reclaims its lease after ``lease_ttl``. Requests such a job already had in flight may then
overlap with the reclaimed slots for their own duration: the bound holds for jobs that crash (their
requests die with them) and for jobs that stay connected.

A limiter that dies (``ray.kill``, its node lost) is found again by name after a failed heartbeat,
re-created if no job has yet (``get_if_exists``), and registered with: a job holds no handle for
good. Every call to it is bounded (``lease_ttl / 4``), so a limiter that hangs is a failed heartbeat
too. A job that can neither reach nor re-create one for ``lease_ttl`` falls back to its own local
limits, with an error logged (jobs sharing the endpoint may then together exceed the shared
limits), and goes back to leasing once a limiter answers again. So a job never waits on the
limiter for longer than ``lease_ttl`` plus a heartbeat. A job that finds its limiter dead sends
nothing new until it has registered with the next one (which knows nothing of the old grants): the
endpoint may then see more than the cap only while requests sent before the death are in flight.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import secrets
import time
from collections import deque
from typing import Any, Callable

from verl_async_rm.engine.meters import RequestRate, TokenRate
from verl_async_rm.errors import LimitsConflict
from verl_async_rm.lease_table import EndpointLimits, LeaseTable
from verl_async_rm.limits import strict_bucket

_log = logging.getLogger(__name__)
ACTOR_PREFIX = "async_rm_limiter:"
REGISTER_GIVE_UP_S = 60.0  # a registration still pending after this long is started afresh


class SharedLimiter:
    """The actor body: one ``LeaseTable`` per endpoint, on the wall clock (jobs on several nodes).
    A plain (sync, one call at a time) actor: calls are serialised, no lock needed."""

    def __init__(self, endpoint: str, lease_ttl: float, permit_ttl: float, batch_s: float):
        self.endpoint = endpoint
        self.table = LeaseTable(ttl=lease_ttl, permit_ttl=permit_ttl, batch_s=batch_s)

    def register(self, job: str, limits: dict, want_requests: float = 0.0, want_tokens: float = 0.0) -> dict:
        self.table.register(job, EndpointLimits(**limits), time.time())
        return self.heartbeat(job, demand=0, in_use=0, applied=-1, want_requests=want_requests, want_tokens=want_tokens)

    def heartbeat(self, job: str, **report) -> dict:
        return dataclasses.asdict(self.table.heartbeat(job, now=time.time(), **report))

    def leave(self, job: str) -> None:
        self.table.leave(job)

    def snapshot(self) -> dict:
        return self.table.snapshot()


def limiter_actor(endpoint: str, namespace: str, lease_ttl: float, permit_ttl: float, batch_s: float):
    """The endpoint's limiter, created if no job has yet (``get_if_exists``: two jobs starting at
    once get the same one). Detached: it outlives the job that created it."""
    import ray

    if not ray.is_initialized():
        raise RuntimeError("shared_limits needs Ray: call ray.init(address=...) on the cluster before building the agent")
    actor_class = ray.remote(num_cpus=0, max_restarts=-1)(SharedLimiter)
    return actor_class.options(
        name=ACTOR_PREFIX + endpoint, namespace=namespace, lifetime="detached", get_if_exists=True,
    ).remote(endpoint, lease_ttl, permit_ttl, batch_s)


class LeasedPermits:
    """Rate permits (requests or tokens) leased from the limiter, each batch usable until its expiry
    (on the loop's clock). The lease's rate meters read it as they read a ``LeakyBucket``."""

    def __init__(self, client: SharedLimitsClient, whole: bool):
        self.client = client
        self.whole = whole
        self.batches: deque[list[float]] = deque()  # [expires_at, amount], in expiry order
        self.total = 0.0  # the amounts in ``batches`` (kept, not summed: this is read per request)
        self.capacity = math.inf  # one request's amount above this is clamped (the shared bucket's capacity)
        self.typical = 1.0  # a request's amount, smoothed: how much to ask for per queued request

    def available(self, now: float) -> float:
        while self.batches and self.batches[0][0] <= now:
            self.total -= self.batches.popleft()[1]
        if not self.batches:
            self.total = 0.0  # no drift from float arithmetic
        return self.total

    def drop(self) -> None:
        self.batches.clear()
        self.total = 0.0

    def add(self, amount: float, expires_at: float) -> None:
        if amount > 0:
            self.batches.append([expires_at, amount])
            self.total += amount

    def wait_time(self, now: float, amount: float = 1.0) -> float:
        amount = min(float(amount), self.capacity)
        if not self.whole:
            self.typical = 0.9 * self.typical + 0.1 * amount
        if self.available(now) + 1e-9 >= amount:
            return 0.0
        self.client.need_permits()
        return self.client.settings.heartbeat_s

    def take(self, now: float, amount: float = 1.0) -> None:
        amount = min(float(amount), self.capacity)
        self.available(now)
        while amount > 1e-12 and self.batches:
            batch = self.batches[0]
            used = min(batch[1], amount)
            batch[1] -= used
            self.total -= used
            amount -= used
            if batch[1] <= 1e-12:
                self.batches.popleft()

    def want(self, queued: int, now: float) -> float:
        return max(0.0, queued * self.typical - self.available(now))


@dataclasses.dataclass(frozen=True)
class SharedLimitsStatistics:
    shared_slots: int  # the lease's concurrency now (the job's own cap while on local limits)
    shared_heartbeats: int  # grants received
    shared_reattached: int  # registrations with a limiter found again (or re-created) after a failure
    shared_local_fallbacks: int  # times no limiter answered for lease_ttl
    shared_on_local_limits: bool  # on the job's own limits now


class SharedLimitsClient:
    """One job's lease on the endpoint's limits, renewed on the engine's loop; admission's meter for
    them (``wait``/``take``). ``bind`` gives it the pipeline it admits for, and starts the renewals."""

    reserves = False

    def __init__(self, flow, config, loop: asyncio.AbstractEventLoop, token_estimate: Callable[[Any], float]):
        """``token_estimate``: a request's tokens for ``tokens_per_minute`` (checked)."""
        import ray

        self.settings = config.shared_limits
        self.flow, self.loop = flow, loop
        self.pipeline = None  # bound once built (``bind``)
        self.job = secrets.token_hex(8)
        self.limits = EndpointLimits(config.max_concurrency, config.requests_per_minute, config.tokens_per_minute)
        self.actor = limiter_actor(self.settings.endpoint, self.settings.namespace, self.settings.lease_ttl,
                                   self.settings.permit_ttl, batch_s=max(0.5, 2 * self.settings.heartbeat_s))
        self.rpm = LeasedPermits(self, whole=True) if config.requests_per_minute else None
        self.tpm = LeasedPermits(self, whole=False) if config.tokens_per_minute else None
        # The rate limits' meters, on the leased permits (on the job's own buckets while ``local``).
        self._requests = RequestRate(self.rpm) if self.rpm is not None else None
        self._tokens = TokenRate(self.tpm, token_estimate) if self.tpm is not None else None
        self._rates = [rate for rate in (self._requests, self._tokens) if rate is not None]
        self._cap = None  # the pipeline's concurrency cap: its requests in flight hold the lease's slots
        self.slots = 0  # granted by the lease: nothing is sent before the first one
        self.version = -1
        self.valid_until = -math.inf
        self.heartbeats = 0
        self.reattached = 0  # registrations with a limiter found again (or re-created) after a failure
        self.local = False  # on the job's own limits: no limiter could be reached for lease_ttl
        self.local_fallbacks = 0
        self._config = config
        self._last_grant = loop.time()
        self._registering: asyncio.Task | None = None
        self._registering_since = -math.inf
        self._need = asyncio.Event()
        self._last_beat = -math.inf
        self._task: asyncio.Task | None = None
        self._closed = False
        sent = loop.time()
        # A job starts with a heartbeat's worth of permits, so its first requests need no round trip
        # (unused, they expire after permit_ttl: a one-off fraction of the rate).
        self._initial_wants = {
            "want_requests": (config.requests_per_minute or 0.0) / 60.0 * self.settings.heartbeat_s,
            "want_tokens": (config.tokens_per_minute or 0.0) / 60.0 * self.settings.heartbeat_s,
        }
        try:  # once, at start, in the builder's thread: a conflict must fail the build, loudly
            grant = ray.get(self.actor.register.remote(self.job, dataclasses.asdict(self.limits), **self._initial_wants),
                            timeout=60)
        except ray.exceptions.RayTaskError as exc:
            if isinstance(exc.cause, LimitsConflict):
                raise LimitsConflict(f"shared_limits endpoint {self.settings.endpoint!r}: {exc.cause}") from None
            raise
        self._apply(grant, sent)

    def bind(self, pipeline) -> None:
        """The pipeline this lease admits for (its queue and slots are the heartbeat's report), and
        the renewals start."""
        self.pipeline = pipeline
        self._cap = pipeline.slots
        if self.loop.is_running():
            self.loop.call_soon_threadsafe(self._start)
        else:
            self.loop.call_soon(self._start)

    # -- admission: a meter (engine/meters.py) ----------------------------------------------------
    def wait(self, sample, now: float) -> float | None:
        """None without a free slot of the lease (a grant, or a request ending, pumps again);
        otherwise the wait for a permit of each rate limit (a dry pool asks for more at once)."""
        if self._cap.in_flight >= self.slots:
            return None
        delay = 0.0
        for rate in self._rates:
            until = rate.wait(sample, now)
            if until > delay:
                delay = until
        return delay

    def take(self, sample, now: float) -> None:
        for rate in self._rates:
            rate.take(sample, now)

    def _pump(self) -> None:
        if self.pipeline is not None:
            self.pipeline.pump()

    def _start(self) -> None:
        if not self._closed:
            self._task = self.loop.create_task(self._renew())

    def need_permits(self) -> None:
        self._need.set()

    async def _renew(self) -> None:
        from ray.exceptions import RayActorError

        interval = self.settings.heartbeat_s
        while not self._closed:
            try:
                await asyncio.wait_for(self._need.wait(), interval)
            except TimeoutError:
                pass
            self._need.clear()
            # A dry pool asks at once, but never more often than 4 times a heartbeat (an empty shared
            # bucket would otherwise be asked on every pump).
            early = self._last_beat + interval / 4 - self.loop.time()
            if early > 0:
                await asyncio.sleep(early)
            self._last_beat = self.loop.time()
            if self.loop.time() > self.valid_until and self.slots and not self.local:
                _log.error("shared_limits %r: no lease renewal for %.1fs; sending stops until the limiter answers",
                           self.settings.endpoint, self.settings.lease_ttl / 2)
                self.slots = 0
            if self._registering is None:
                try:
                    await self._beat()
                    continue
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # noqa: BLE001 - the limiter died, restarted or hangs, or the lease expired
                    _log.warning("shared_limits %r: heartbeat failed (%s: %s); finding the limiter again",
                                 self.settings.endpoint, type(exc).__name__, exc)
                    if isinstance(exc, RayActorError) and not self.local:
                        # The limiter is gone with its book: the next one will hand this job's slots
                        # to others. Nothing new is sent until it registers (what is in flight ends).
                        self.slots = 0
                    self._registering = self.loop.create_task(self._find_and_register())
                    self._registering_since = self.loop.time()
            await self._await_registration()

    @property
    def call_timeout(self) -> float:
        """How long a heartbeat may take: a hung limiter is a failed heartbeat, found well before the
        lease (``lease_ttl / 2``) lapses. At least a heartbeat (the config guarantees it)."""
        return self.settings.lease_ttl / 4

    async def _find_and_register(self) -> tuple:
        """The limiter found again by name, or re-created if it died (a killed actor's handle stays
        dead for good), then registered with. Not bounded by ``call_timeout``: a re-created actor
        needs a worker process started, seconds on a loaded node; the fallback below runs meanwhile."""
        actor = await asyncio.to_thread(
            limiter_actor, self.settings.endpoint, self.settings.namespace, self.settings.lease_ttl,
            self.settings.permit_ttl, batch_s=max(0.5, 2 * self.settings.heartbeat_s))
        await actor.snapshot.remote()  # started: the lease below counts from now, not from the process start
        sent = self.loop.time()
        return actor, await self._register(actor), sent

    async def _await_registration(self) -> None:
        """One heartbeat's wait on the pending registration. If none has succeeded for ``lease_ttl``
        since the last grant, the job falls back to its own limits, loudly, rather than wait forever."""
        done, _ = await asyncio.wait([self._registering], timeout=self.settings.heartbeat_s)
        if not done:
            if self.loop.time() - self._registering_since > REGISTER_GIVE_UP_S:
                self._registering.cancel()  # tried afresh at the next beat
                self._registering = None
            self._fall_back_if_due("no limiter has answered yet")
            return
        task, self._registering = self._registering, None
        try:
            actor, grant, sent = task.result()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - tried again at the next beat
            self._fall_back_if_due(f"{type(exc).__name__}: {exc}")
            return
        self.actor = actor
        self.reattached += 1
        for pool in (self.rpm, self.tpm):  # the old limiter's permits: the new one's bucket does not know them
            if pool is not None:
                pool.drop()
        _log.warning("shared_limits %r: registered again with the limiter", self.settings.endpoint)
        self._apply(grant, sent)

    def _fall_back_if_due(self, why: str) -> None:
        if self.local or self.loop.time() - self._last_grant <= self.settings.lease_ttl:
            return
        config = self._config
        self.local = True
        self.local_fallbacks += 1
        _log.error(
            "shared_limits %r: no limiter answered or could be re-created for %.1fs (%s); this job falls back to "
            "its own limits (%s) until one does: jobs sharing the endpoint may together exceed them meanwhile",
            self.settings.endpoint, self.settings.lease_ttl, why, self.limits.describe())
        if self._requests is not None:
            self._requests.bucket = strict_bucket(config.requests_per_minute)
        if self._tokens is not None:
            self._tokens.bucket = strict_bucket(config.tokens_per_minute)
        self.slots = config.max_concurrency
        self._pump()

    async def _register(self, actor):
        return await actor.register.remote(self.job, dataclasses.asdict(self.limits), **self._initial_wants)

    def _back_to_leasing(self) -> None:
        self.local = False
        if self._requests is not None:
            self._requests.bucket = self.rpm
        if self._tokens is not None:
            self._tokens.bucket = self.tpm
        _log.error("shared_limits %r: a limiter answers again; this job leases the shared limits again "
                   "(it ran on its own limits meanwhile)", self.settings.endpoint)

    async def _beat(self) -> None:
        pipeline, now = self.pipeline, self.loop.time()
        queued = len(pipeline.queue)
        paused = self.flow.paused_until
        report = {
            "demand": queued + pipeline.in_flight,
            "in_use": pipeline.in_flight,
            "applied": self.version,
            "want_requests": self.rpm.want(queued, now) if self.rpm is not None else 0.0,
            "want_tokens": self.tpm.want(queued, now) if self.tpm is not None else 0.0,
            "paused_until": time.time() + (paused - now) if paused > now else -math.inf,
        }
        self._apply(await asyncio.wait_for(self._heartbeat(report), self.call_timeout), now)

    async def _heartbeat(self, report: dict) -> dict:
        return await self.actor.heartbeat.remote(self.job, **report)

    def _apply(self, grant: dict, sent: float) -> None:
        """A grant for a heartbeat sent at ``sent`` (loop clock): permits and the lease count from then."""
        if self.local:
            self._back_to_leasing()
        self.heartbeats += 1
        self._last_grant = self.loop.time()
        self.version = grant["version"]
        self.valid_until = sent + self.settings.lease_ttl / 2
        expires = sent + grant["permit_ttl"]
        if self.rpm is not None:
            self.rpm.add(grant["requests"], expires)
        if self.tpm is not None:
            self.tpm.capacity = grant["token_capacity"]
            self.tpm.add(grant["tokens"], expires)
        pause = grant["paused_until"]
        if pause > time.time():  # another job was told to back off: so is this one
            self.flow.hold(self.loop.time() + pause - time.time())
        self.slots = grant["slots"]
        self._pump()

    def statistics(self) -> SharedLimitsStatistics:
        return SharedLimitsStatistics(self.slots, self.heartbeats, self.reattached, self.local_fallbacks, self.local)

    async def aclose(self) -> None:
        self._closed = True
        if self._registering is not None:
            self._registering.cancel()
        if self._task is not None:
            self._task.cancel()
            await asyncio.wait([self._task], timeout=5)
        try:
            self.actor.leave.remote(self.job)  # the lease returns at once (else after lease_ttl)
        except Exception:  # noqa: BLE001 - Ray already down: the lease expires by itself
            pass
