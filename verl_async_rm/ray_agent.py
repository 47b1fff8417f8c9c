"""The agent as a named async Ray actor, so it runs beside the trainer and every process shares it.

The engine runs on the actor's own event loop (``AsyncRewardAgent``): a call reaches it with no
thread hop. Every actor method returns at once, except ``get`` (which waits for its groups, by
its timeout at the latest) and ``next_answers`` (one long-poll per caller process, see below), so
callers never exhaust the actor's concurrency, whatever the number of samples in flight.

The per-sample path (verl's ``run_single``: one call per sample, answered once the sample's whole
group is resolved) must not hold an actor slot per waiting sample: 10,000 samples waiting for
their groups would take every slot, and the members those groups wait for could never get in.
So ``join_group`` only registers the sample and returns; the group's answers go to the caller's
*outbox*, which the caller's ``RayRewardClient`` drains with one pending ``next_answers`` call.

``get_or_create_agent_actor`` finds the job's actor by name, and refuses one that was built with
another reward or other settings (a second job with the same actor name would otherwise silently
score with the first job's reward).

Ray is imported lazily to keep ``import verl_async_rm`` light.
"""

from __future__ import annotations

import asyncio
import itertools
import uuid
from typing import Any, Hashable, Mapping

from verl_async_rm.agent import AsyncRewardAgent, _check_group_size, as_item
from verl_async_rm.config import AgentConfig
from verl_async_rm.errors import AgentClosed
from verl_async_rm.loader import RewardSpec, load_reward
from verl_async_rm.outcomes import ScoredChunk

DEFAULT_ACTOR_NAME = "verl_async_rm_agent"
ACTOR_MAX_CONCURRENCY = 10_000  # concurrent get/next_answers calls; per-sample calls do not hold one


def fingerprint(reward: RewardSpec | Any, config: Mapping | AgentConfig | None) -> dict:
    """What makes two agents interchangeable: the same reward and the same settings."""
    config = config if isinstance(config, AgentConfig) else AgentConfig.from_mapping(config)
    if isinstance(reward, RewardSpec):
        described = {"path": reward.path, "name": reward.name, "kwargs": reward.kwargs}
    else:
        described = {"object": f"{type(reward).__module__}.{getattr(reward, '__qualname__', type(reward).__qualname__)}"}
    return {"reward": described, "config": config.model_dump()}


class _Outbox:
    """Answers of one caller process's waiting samples, until it collects them."""

    def __init__(self) -> None:
        self.answers: list[tuple[int, bool, Any]] = []
        self.ready = asyncio.Event()

    def put(self, member: int, value: Any) -> None:
        ok = not isinstance(value, BaseException)
        self.answers.append((member, ok, value if ok else _portable(value)))
        self.ready.set()


def _portable(error: BaseException) -> BaseException:
    """The error as a fresh instance of its class (tracebacks do not cross processes)."""
    try:
        return type(error)(*error.args)
    except Exception:  # noqa: BLE001 - an exception class with an unusual constructor
        return RuntimeError(f"{type(error).__name__}: {error}")


class RewardAgentActor:
    """Actor body. ``reward`` is a ``RewardSpec`` (path/name/kwargs, loaded inside the actor) or any
    picklable reward accepted by ``RewardAgent``."""

    def __init__(self, reward: RewardSpec | Any, config: Mapping | None = None):
        self._reward = reward
        self._config = dict(config or {})
        self._fingerprint = fingerprint(reward, self._config)
        self._agent: AsyncRewardAgent | None = None
        self._outboxes: dict[str, _Outbox] = {}

    def _ensure(self) -> AsyncRewardAgent:
        if self._agent is None:  # built on the actor's loop, at the first call (no await in between)
            reward = self._reward
            if isinstance(reward, RewardSpec):
                reward = load_reward(reward.path, reward.name, reward.kwargs)
            self._agent = AsyncRewardAgent(reward, self._config)
        return self._agent

    async def fingerprint(self) -> dict:
        self._ensure()  # a reward that cannot load fails here, at connect time
        return self._fingerprint

    async def submit(self, items: list, group_size: int = 1, validation: bool = False, ranks: list | None = None) -> str:
        return self._ensure().submit(items, group_size, validation=validation, ranks=ranks)

    async def open_ticket(self, group_size=1, validation: bool = False) -> str:
        return self._ensure().open_ticket(group_size, validation=validation)

    async def add(self, ticket: str, items: list) -> None:
        self._ensure().add(ticket, items)

    async def close_ticket(self, ticket: str) -> None:
        self._ensure().close_ticket(ticket)

    async def get(self, ticket: str, n: int | None = None, timeout: float | None = None) -> ScoredChunk:
        return await self._ensure().get(ticket, n, timeout)

    async def cancel(self, ticket: str) -> int:
        return self._ensure().cancel(ticket)

    async def remaining(self, ticket: str) -> int:
        return self._ensure().remaining(ticket)

    async def metrics(self) -> dict:
        return self._ensure().metrics()

    async def config(self) -> dict:
        return self._ensure().config.model_dump()

    async def join_group(self, subscriber: str, member: int, item: dict, uid: Hashable | None, group_size: int,
                         group_wait: float | None, session: Hashable | None = None, attempt: Hashable | None = None,
                         validation: bool = False) -> None:
        """Register one sample of group ``uid``; its answer goes to ``subscriber``'s outbox."""
        agent = self._ensure()
        outbox = self._outboxes.setdefault(subscriber, _Outbox())
        _check_group_size(group_size)
        agent.engine.join_group(as_item(item, 0), uid, group_size, group_wait, lambda value: outbox.put(member, value),
                                session, attempt, validation)

    async def withdraw(self, uid: Hashable, session: Hashable, attempt: Hashable | None = None) -> None:
        await self._ensure().withdraw(uid, session, attempt)

    async def next_answers(self, subscriber: str) -> list[tuple[int, bool, Any]]:
        """The answers waiting for ``subscriber``, as soon as there is at least one."""
        outbox = self._outboxes.setdefault(subscriber, _Outbox())
        while not outbox.answers:
            if self._agent is not None and self._agent.engine.closed is not None:
                raise AgentClosed("the reward agent was closed")
            outbox.ready.clear()
            await outbox.ready.wait()
        answers, outbox.answers = outbox.answers, []
        return answers

    async def close(self) -> None:
        if self._agent is not None:
            await self._agent.aclose()
        for outbox in self._outboxes.values():
            outbox.ready.set()  # wakes every next_answers: they see the agent closed


class RayRewardClient:
    """The client protocol over the actor: ``submit``/``get``/``cancel``/``remaining``/``metrics`` from
    any thread (blocking), ``score_in_group`` from an event loop."""

    def __init__(self, actor):
        self.actor = actor
        self._subscriber = uuid.uuid4().hex
        self._members = itertools.count()
        self._waiting: dict[int, asyncio.Future] = {}
        self._receiver: asyncio.Task | None = None

    def submit(self, items: list, group_size: int = 1, *, validation: bool = False, ranks: list | None = None) -> str:
        import ray

        return ray.get(self.actor.submit.remote(list(items), group_size, validation,
                                                None if ranks is None else list(ranks)))

    def open_ticket(self, group_size=1, *, validation: bool = False) -> str:
        import ray

        return ray.get(self.actor.open_ticket.remote(group_size, validation))

    def add(self, ticket: str, items: list) -> None:
        import ray

        ray.get(self.actor.add.remote(ticket, list(items)))

    def close_ticket(self, ticket: str) -> None:
        import ray

        ray.get(self.actor.close_ticket.remote(ticket))

    def get(self, ticket: str, n: int | None = None, timeout: float | None = None) -> ScoredChunk:
        import ray

        return ray.get(self.actor.get.remote(ticket, n, timeout))  # the actor answers by the timeout

    def cancel(self, ticket: str) -> int:
        import ray

        return ray.get(self.actor.cancel.remote(ticket))

    def remaining(self, ticket: str) -> int:
        import ray

        return ray.get(self.actor.remaining.remote(ticket))

    def metrics(self) -> dict:
        import ray

        return ray.get(self.actor.metrics.remote())

    async def score_in_group(self, item: dict, uid: Hashable | None = None, group_size: int = 1,
                             group_wait: float | None = None, *, session: Hashable | None = None,
                             attempt: Hashable | None = None, validation: bool = False) -> tuple[float, dict]:
        member = next(self._members)
        answer = asyncio.get_running_loop().create_future()
        self._waiting[member] = answer
        try:
            await self.actor.join_group.remote(self._subscriber, member, item, uid, group_size, group_wait, session, attempt,
                                               validation)
            if self._receiver is None or self._receiver.done():
                self._receiver = asyncio.get_running_loop().create_task(self._receive())
            return await answer
        finally:
            self._waiting.pop(member, None)

    async def withdraw(self, uid: Hashable, session: Hashable, attempt: Hashable | None = None) -> None:
        """From an event loop (verl's agent-loop worker), like ``score_in_group``."""
        await self.actor.withdraw.remote(uid, session, attempt)

    async def _receive(self) -> None:
        """Collects answers for this process's waiting samples while any are waiting."""
        while self._waiting:
            try:
                answers = await self.actor.next_answers.remote(self._subscriber)
            except Exception as exc:  # noqa: BLE001 - the actor died or closed: every waiter hears it
                for future in list(self._waiting.values()):
                    if not future.done():
                        future.set_exception(AgentClosed(f"the reward agent actor is gone: {type(exc).__name__}: {exc}"))
                return
            for member, ok, value in answers:
                future = self._waiting.get(member)
                if future is not None and not future.done():
                    future.set_result(value) if ok else future.set_exception(value)

    def close(self) -> None:
        import ray

        ray.get(self.actor.close.remote())


def get_or_create_agent_actor(
    reward: RewardSpec | Any,
    config: Mapping | None = None,
    *,
    name: str = DEFAULT_ACTOR_NAME,
    namespace: str | None = None,
):
    """The named agent actor, created on first use. Every caller with the same name (and namespace)
    gets the same actor, so its limits and cache are global; a caller whose reward or settings
    differ from the actor's gets a ``ValueError`` instead. Needs ``ray.init`` done."""
    import ray

    actor = ray.remote(RewardAgentActor).options(
        name=name,
        namespace=namespace,
        get_if_exists=True,
        num_cpus=0,  # mostly waiting on I/O: must not take a CPU slot from the trainer
        max_concurrency=ACTOR_MAX_CONCURRENCY,
    ).remote(reward, dict(config or {}))
    theirs, mine = ray.get(actor.fingerprint.remote()), fingerprint(reward, config)
    if theirs != mine:
        changed = sorted(k for k in set(theirs["config"]) | set(mine["config"]) if theirs["config"].get(k) != mine["config"].get(k))
        raise ValueError(
            f"a reward agent actor named {name!r} already exists with another "
            f"{'reward' if theirs['reward'] != mine['reward'] else 'configuration'} "
            f"(theirs: {theirs['reward']}, yours: {mine['reward']}; differing settings: {changed}): use another "
            "actor name (reward.async_agent.actor_name), or the same reward and settings"
        )
    return actor
