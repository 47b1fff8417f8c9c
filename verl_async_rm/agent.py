"""The agent's faces, one per execution context, all with the same verbs (``client.RewardClient``):

- ``AsyncRewardAgent``: the engine on the caller's own event loop (an asyncio program, the Ray
  actor). No thread, no hop.
- ``RewardAgent``: the engine on a private event loop in one daemon thread, for callers in any
  thread (a verl trainer, a script, a test): ``submit`` returns a ticket at once; ``get`` blocks
  until the engine answers, which it does by the caller's ``timeout`` at the latest.

Verbs: ``submit(items, group_size) -> ticket``, ``get(ticket, n, timeout)`` (whole groups, in
completion order), ``cancel``, ``remaining``, ``metrics``, ``score_in_group`` (one sample at a
time, answered with its group), ``close``. ``submit`` and ``open_ticket`` take two hints for
``admission_order: deadline`` (which queued request starts first when the judge's throughput
binds; ignored under the default ``fifo``): ``validation=True`` ranks the ticket after training
tickets, and ``ranks`` (``submit`` only, one integer per item) orders samples within the ticket,
smaller first, e.g. by the mini-batch that needs them first (``engine/admission_order.py``).

Nothing is lost between the engine and a caller: a ``get`` that times out, is cancelled or is
interrupted consumes nothing; groups handed over at that very moment are put back, in order.
"""

from __future__ import annotations

import asyncio
import functools
import pickle
import threading
import warnings
from typing import Any, Callable, Hashable, Iterable, Mapping, Sequence

from verl_async_rm import log_redaction
from verl_async_rm.config import AgentConfig
from verl_async_rm.engine.core import ScoringEngine
from verl_async_rm.engine.ledger import assemble_chunk
from verl_async_rm.errors import AgentClosed
from verl_async_rm.items import RewardItem
from verl_async_rm.loader import UserReward, load_reward, wrap_reward
from verl_async_rm.outcomes import ScoredChunk

_ITEM_FIELDS = ("solution_str", "ground_truth", "data_source", "extra_info", "uid", "index")
_ITEM_KEYS = frozenset(_ITEM_FIELDS)


_PLAIN_UIDS = (str, int, type(None))


def check_uid(uid: Any, where: str) -> None:
    """A uid names its group (a dict key): a list, dict or set cannot, and would fail deep in the
    engine as a bare ``unhashable type``."""
    try:
        hash(uid)
    except TypeError:
        raise ValueError(f"{where} has a uid of type {type(uid).__name__} ({uid!r:.80}): a uid names its group "
                         "and must be hashable (a string or a number)") from None


def as_item(raw: RewardItem | Mapping, position: int) -> RewardItem:
    if type(raw) is dict and raw.keys() <= _ITEM_KEYS:  # the common case, checked without ABCs
        text, index, extra, uid = raw.get("solution_str"), raw.get("index", position), raw.get("extra_info"), raw.get("uid")
        if type(text) is str and type(index) is int and (extra is None or type(extra) is dict) and type(uid) in _PLAIN_UIDS:
            return RewardItem(index, text, raw.get("ground_truth"), raw.get("data_source") or "",
                              dict(extra) if extra is not None else None, uid)
    if isinstance(raw, RewardItem):
        check_uid(raw.uid, f"batch item {position}")
        return raw
    if not isinstance(raw, Mapping):
        raise TypeError(f"batch item {position} is a {type(raw).__name__}; expected a RewardItem or a mapping")
    unknown = set(raw) - set(_ITEM_FIELDS)
    if unknown:
        raise ValueError(f"batch item {position} has unknown keys {sorted(unknown)}; allowed: {list(_ITEM_FIELDS)}")
    if not isinstance(raw.get("solution_str"), str):
        raise ValueError(f"batch item {position} needs a string 'solution_str'")
    index = raw.get("index", position)
    if isinstance(index, bool) or not isinstance(index, int):
        raise ValueError(f"batch item {position} has a non-integer index {index!r}")
    extra = raw.get("extra_info")
    if extra is not None and not isinstance(extra, Mapping):
        raise ValueError(f"batch item {position} has extra_info of type {type(extra).__name__}; expected a dict")
    check_uid(raw.get("uid"), f"batch item {position}")
    return RewardItem(
        index=index,
        solution_str=raw["solution_str"],
        ground_truth=raw.get("ground_truth"),
        data_source=raw.get("data_source") or "",
        extra_info=dict(extra) if extra is not None else None,
        uid=raw.get("uid"),
    )


def as_batch(items: Iterable[RewardItem | Mapping]) -> list[RewardItem]:
    return [as_item(raw, position) for position, raw in enumerate(items)]


def _check_group_size(group_size: Any) -> None:
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1:
        raise ValueError(f"group_size must be a positive integer, got {group_size!r}")


def _prepare(reward: Any, config: AgentConfig | Mapping | None, reward_kwargs: Mapping | None,
             token_estimator: Callable | None) -> tuple[UserReward, AgentConfig]:
    config = config if isinstance(config, AgentConfig) else AgentConfig.from_mapping(config)
    reward = reward if isinstance(reward, UserReward) else wrap_reward(reward, dict(reward_kwargs or {}))
    if config.executor == "process" and reward.score_is_async:
        raise ValueError(f"executor='process' is for sync reward functions; {reward.label} is async")
    if config.executor == "process" and not reward.is_group_judge:
        _check_picklable(reward)
    return reward, config


def _check_picklable(reward: UserReward) -> None:
    """With ``executor='process'`` an in-memory reward is pickled into every call (a reward loaded
    from a file is loaded again by each worker: ``process_worker``). A lambda, a nested function or
    an instance holding a client cannot be; found here, not as a ``PicklingError`` on every sample."""
    if reward.spec is not None:
        return
    try:
        pickle.dumps((reward.score_fn, reward.call_kwargs))
    except Exception as exc:  # noqa: BLE001 - pickle raises PicklingError, TypeError, AttributeError, ...
        raise ValueError(
            f"executor='process' sends the reward to worker processes, and {reward.label} cannot be pickled "
            f"({type(exc).__name__}: {exc}): define it at module level (or load it by path: RewardAgent.from_file), "
            "or use executor='thread'"
        ) from None


class AsyncRewardAgent:
    """The engine on the running event loop. Build it inside a coroutine (or an async actor)."""

    def __init__(
        self, reward: UserReward | Callable | type | Any, config: AgentConfig | Mapping | None = None, *,
        reward_kwargs: Mapping | None = None, token_estimator: Callable[[RewardItem], float] | None = None,
    ):
        self.reward, self.config = _prepare(reward, config, reward_kwargs, token_estimator)
        self.engine = ScoringEngine(self.reward, self.config, loop=asyncio.get_running_loop(), token_estimator=token_estimator)
        log_redaction.acquire()  # credentials in a judge's base_url stay out of httpx's logs while it runs
        self._redacting = True

    def submit(self, items: Iterable[RewardItem | Mapping], group_size: int | Mapping[Hashable, int] = 1, *,
               validation: bool = False, ranks: Sequence[int] | None = None) -> str:
        return self.engine.submit(as_batch(items), group_size, validation=validation, ranks=ranks)

    def open_ticket(self, group_size: int | Mapping[Hashable, int] = 1, *, validation: bool = False) -> str:
        return self.engine.open_ticket(group_size, validation=validation)

    def add(self, ticket: str, items: Iterable[RewardItem | Mapping]) -> None:
        self.engine.add(ticket, as_batch(items))

    def close_ticket(self, ticket: str) -> None:
        self.engine.close(ticket)

    async def get(self, ticket: str, n: int | None = None, timeout: float | None = None) -> ScoredChunk:
        return assemble_chunk(await self.engine.take(ticket, n, timeout))

    async def get_all(self, ticket: str, timeout: float | None = None) -> ScoredChunk:
        return await self.get(ticket, None, timeout)

    async def score_in_group(self, item: RewardItem | Mapping, uid: Hashable | None = None, group_size: int = 1,
                             group_wait: float | None = None, *, session: Hashable | None = None,
                             attempt: Hashable | None = None, validation: bool = False) -> tuple[float, dict]:
        _check_group_size(group_size)
        check_uid(uid, "score_in_group")
        return await self.engine.score_in_group(as_item(item, 0), uid, group_size, group_wait, session, attempt, validation)

    async def withdraw(self, uid: Hashable, session: Hashable, attempt: Hashable | None = None) -> None:
        self.engine.withdraw_from_group(uid, session, attempt)

    def cancel(self, ticket: str) -> int:
        return self.engine.cancel(ticket)

    def remaining(self, ticket: str) -> int:
        return self.engine.remaining(ticket)

    def metrics(self) -> dict:
        return self.engine.snapshot()

    async def aclose(self, timeout: float = 10.0) -> None:
        if self._redacting:
            self._redacting = False
            log_redaction.release()
        stuck = await self.engine.aclose(timeout)
        if stuck:
            warnings.warn(f"{stuck} reward calls ignored their cancellation and were left running", RuntimeWarning, stacklevel=2)

    async def __aenter__(self) -> AsyncRewardAgent:
        return self

    async def __aexit__(self, *exc_info) -> None:
        await self.aclose()


class _HandOver:
    """One ``get`` in flight between the engine's loop and a caller elsewhere. The engine's answer
    and the caller giving up race; the lock decides, and groups that lost the race go back."""

    def __init__(self, notify: Callable[[], None]):
        self._lock = threading.Lock()
        self._notify = notify
        self.task: asyncio.Task | None = None  # the engine-side take, on the engine's loop
        self.abandoned = False
        self.done = False
        self.result: list | None = None
        self.error: BaseException | None = None

    def deliver(self, result: list | None, error: BaseException | None) -> bool:
        """From the engine's loop; False when the caller has left (the caller must put them back)."""
        with self._lock:
            if self.abandoned:
                return False
            self.result, self.error, self.done = result, error, True
        self._notify()
        return True

    def abandon(self) -> bool:
        """From the caller; False when the answer had already arrived (use or return it)."""
        with self._lock:
            if self.done:
                return False
            self.abandoned = True
            return True


class RewardAgent:
    """Score whole batches concurrently with a per-response reward; hand back finished GRPO groups.

    >>> with RewardAgent.from_file("verl_async_rm/user_rewards/gsm8k.py", "compute_score") as agent:
    ...     ticket = agent.submit(items, group_size=8)      # returns at once
    ...     chunk = agent.get(ticket, 64)                   # 8 whole groups, as soon as they are done
    """

    def __init__(
        self,
        reward: UserReward | Callable | type | Any,
        config: AgentConfig | Mapping | None = None,
        *,
        reward_kwargs: Mapping | None = None,
        token_estimator: Callable[[RewardItem], float] | None = None,
        loop_factory: Callable[[], asyncio.AbstractEventLoop] = asyncio.new_event_loop,
    ):
        self.reward, self.config = _prepare(reward, config, reward_kwargs, token_estimator)
        self._loop = loop_factory()  # injectable: tests run the engine on a virtual-time loop
        self._engine = ScoringEngine(self.reward, self.config, loop=self._loop, token_estimator=token_estimator)
        self._thread = threading.Thread(target=self._loop.run_forever, name="reward-agent-loop", daemon=True)
        self._thread.start()
        self._lock = threading.Lock()
        self._closed = False
        log_redaction.acquire()  # credentials in a judge's base_url stay out of httpx's logs while it runs

    @classmethod
    def from_file(
        cls, path: str, name: str, config: AgentConfig | Mapping | None = None, *, reward_kwargs: Mapping | None = None,
        token_estimator: Callable[[RewardItem], float] | None = None,
    ) -> RewardAgent:
        return cls(load_reward(path, name, dict(reward_kwargs or {})), config, token_estimator=token_estimator)

    # -- the API ----------------------------------------------------------------------------------
    def submit(self, items: Iterable[RewardItem | Mapping], group_size: int | Mapping[Hashable, int] = 1, *,
               validation: bool = False, ranks: Sequence[int] | None = None) -> str:
        """Start scoring a batch; returns a ticket at once. Bad input raises here, not later.
        ``group_size``: one size for every uid, or a mapping uid -> size. Under ``admission_order:
        deadline``, ``validation=True`` ranks the batch after training batches, and ``ranks`` (one
        integer per item) orders its samples, smaller first."""
        return self._call(functools.partial(self._engine.submit, validation=validation, ranks=ranks), as_batch(items),
                          group_size)

    def open_ticket(self, group_size: int | Mapping[Hashable, int] = 1, *, validation: bool = False) -> str:
        """A ticket whose samples come later (``add``, e.g. each rollout as it finishes) until
        ``close_ticket``. Its groups are handed out by ``get`` as they complete. ``validation``: as
        for ``submit``; its age in the admission order counts from now."""
        return self._call(functools.partial(self._engine.open_ticket, validation=validation), group_size)

    def add(self, ticket: str, items: Iterable[RewardItem | Mapping]) -> None:
        """More samples of an open ticket (indices unique within the ticket); they start at once."""
        self._call(self._engine.add, ticket, as_batch(items))

    def close_ticket(self, ticket: str) -> None:
        """No more samples for ``ticket``: a group short of its size is resolved as it is."""
        self._call(self._engine.close, ticket)

    def get(self, ticket: str, n: int | None = None, timeout: float | None = None) -> ScoredChunk:
        """Block until whole groups of ``ticket`` totalling ``n`` samples are ready (all that remain if
        fewer; all of them if ``n`` is None). A drained ticket gives an empty chunk. ``timeout``:
        ``TimeoutError`` after that many seconds, with nothing consumed."""
        self._check_caller("get")
        event = threading.Event()
        hand_over = _HandOver(event.set)
        self._start_take(ticket, n, timeout, hand_over)
        try:
            self._wait(event)
        except BaseException:  # interrupted (KeyboardInterrupt): nothing may be lost
            self._give_up(ticket, hand_over)
            raise
        return self._received(ticket, hand_over)

    def get_all(self, ticket: str, timeout: float | None = None) -> ScoredChunk:
        return self.get(ticket, None, timeout)

    async def aget(self, ticket: str, n: int | None = None, timeout: float | None = None) -> ScoredChunk:
        """``get`` for callers on another event loop; cancelling it consumes nothing."""
        caller_loop = asyncio.get_running_loop()
        arrived = caller_loop.create_future()

        def notify() -> None:
            caller_loop.call_soon_threadsafe(lambda: arrived.done() or arrived.set_result(None))

        hand_over = _HandOver(notify)
        self._start_take(ticket, n, timeout, hand_over)
        try:
            await arrived
        except BaseException:  # cancelled: nothing may be lost
            self._give_up(ticket, hand_over)
            raise
        return self._received(ticket, hand_over)

    async def ascore_in_group(
        self, item: RewardItem | Mapping, uid: Hashable | None = None, group_size: int = 1, group_wait: float | None = None,
        *, session: Hashable | None = None, attempt: Hashable | None = None, validation: bool = False,
    ) -> tuple[float, dict]:
        """Score one sample as a member of group ``uid`` (expected size ``group_size``); returns its
        ``(score, extra_info)`` once the whole group is resolved (policy, then the group hook). For
        callers that see one sample at a time, such as verl's ``run_single``. A group that stops
        growing for ``group_wait`` seconds is resolved with the members it has. ``session`` and
        ``attempt``: see ``withdraw``. ``validation``: the sample belongs to a validation pass (the
        trainer waits for it: ``admission_order: deadline`` serves it first)."""
        _check_group_size(group_size)
        check_uid(uid, "score_in_group")
        item = as_item(item, 0)
        caller_loop = asyncio.get_running_loop()
        answer = caller_loop.create_future()

        def deliver(value: object) -> None:
            def settle() -> None:
                if not answer.done():
                    answer.set_exception(value) if isinstance(value, BaseException) else answer.set_result(value)

            caller_loop.call_soon_threadsafe(settle)

        self._call(self._engine.join_group, item, uid, group_size, group_wait, deliver, session, attempt, validation)
        return await answer

    score_in_group = ascore_in_group  # the client protocol's name

    async def awithdraw(self, uid: Hashable, session: Hashable, attempt: Hashable | None = None) -> None:
        """Session ``session`` of group ``uid`` (dispatch ``attempt`` of its prompt) will never
        send a sample (its rollout failed): the group is resolved without waiting for it."""
        self._call(self._engine.withdraw_from_group, uid, session, attempt)

    withdraw = awithdraw  # the client protocol's name

    def cancel(self, ticket: str) -> int:
        """Stop scoring ``ticket`` (e.g. a batch that will never be trained on): no further calls
        are made for it, and its pending and later gets raise ``TicketCancelled``. Returns how many
        of its samples were still unsettled (0 for a ticket already drained or cancelled)."""
        return self._call(self._engine.cancel, ticket)

    def remaining(self, ticket: str) -> int:
        """Samples of ``ticket`` not yet handed out."""
        return self._call(self._engine.remaining, ticket)

    def metrics(self) -> dict:
        return self._call(self._engine.snapshot)

    # -- life cycle -------------------------------------------------------------------------------
    def close(self, timeout: float = 30.0) -> None:
        """Fail pending gets (``AgentClosed``), stop every call, stop the loop and join its thread.
        Calls that ignore their cancellation, and a loop blocked by a reward, are reported (a
        warning), not waited for beyond ``timeout``."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        log_redaction.release()
        problems = []
        if self._loop.is_running():
            future = asyncio.run_coroutine_threadsafe(self._engine.aclose(min(10.0, timeout)), self._loop)
            try:
                stuck = future.result(timeout)
                if stuck:
                    problems.append(f"{stuck} reward calls ignored their cancellation and were left running")
            except Exception as exc:  # noqa: BLE001 - a close must finish; say what happened instead
                problems.append(f"closing the engine did not finish in {timeout}s ({type(exc).__name__})")
            self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout)
        if self._thread.is_alive():
            problems.append("the agent's loop thread is blocked (a blocking call inside an async reward?) and was left behind")
        else:
            self._loop.close()
        if problems:
            warnings.warn("RewardAgent.close: " + "; ".join(problems), RuntimeWarning, stacklevel=2)

    def __enter__(self) -> RewardAgent:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    # -- helpers ----------------------------------------------------------------------------------
    def _start_take(self, ticket: str, n: int | None, timeout: float | None, hand_over: _HandOver) -> None:
        def start() -> None:
            if hand_over.abandoned:
                return
            task = hand_over.task = self._loop.create_task(self._engine.take(ticket, n, timeout, confirm=True))

            def done(task: asyncio.Task) -> None:  # on the engine's loop
                if task.cancelled():
                    hand_over.deliver(None, AgentClosed("the reward agent was closed"))
                elif task.exception() is not None:
                    hand_over.deliver(None, task.exception())
                elif not hand_over.deliver(task.result(), None):
                    self._engine.put_back(ticket, task.result())  # the caller had left already
                # else: the caller confirms once it holds them (_received), or puts them back

            task.add_done_callback(done)

        self._submit_to_loop(start)

    def _give_up(self, ticket: str, hand_over: _HandOver) -> None:
        """The caller leaves (interrupted, cancelled). If the groups had already arrived they go back;
        otherwise the engine-side take is cancelled (it puts back anything it was handed meanwhile)."""
        try:
            if hand_over.abandon():
                self._loop.call_soon_threadsafe(lambda: hand_over.task is not None and hand_over.task.cancel())
            elif hand_over.result:
                self._loop.call_soon_threadsafe(self._engine.put_back, ticket, hand_over.result)
        except RuntimeError:  # the loop is closed: nobody can take them any more
            pass

    def _received(self, ticket: str, hand_over: _HandOver) -> ScoredChunk:
        """The caller holds the engine's answer: confirm the hand-over (the ticket may retire)."""
        if hand_over.error is not None:
            raise hand_over.error
        try:
            self._loop.call_soon_threadsafe(self._engine.confirm_taken, ticket)
        except RuntimeError:  # the loop is closed: nothing to confirm to
            pass
        return assemble_chunk(hand_over.result)

    def _check_caller(self, verb: str) -> None:
        if threading.current_thread() is self._thread:
            raise RuntimeError(f"{verb}() called from the agent's own loop (inside an async reward or group hook): it would "
                               "wait for the loop it blocks; use aget()")

    def _wait(self, event: threading.Event) -> None:
        """Wait for the engine's answer. The engine always answers (by the caller's timeout at the
        latest); the periodic check only notices a loop thread that died under us."""
        while not event.wait(1.0):
            if not self._thread.is_alive():
                raise AgentClosed("the reward agent's loop has stopped")

    def _submit_to_loop(self, fn: Callable[[], None]) -> None:
        if self._closed or self._loop.is_closed():
            raise AgentClosed("the reward agent is closed")
        try:
            self._loop.call_soon_threadsafe(fn)
        except RuntimeError:
            raise AgentClosed("the reward agent is closed") from None

    def _call(self, fn: Callable, *args):
        """Run ``fn(*args)`` on the engine's loop and return its result (or raise its error). Called
        from that loop itself (an async reward calling ``metrics()``), it runs at once: these engine
        methods do not wait, so there is nothing to hop for, and hopping would wait for ever."""
        if threading.current_thread() is self._thread:
            if self._closed or self._loop.is_closed():
                raise AgentClosed("the reward agent is closed")
            return fn(*args)
        done = threading.Event()
        box: list = []

        def run() -> None:
            try:
                box.append((True, fn(*args)))
            except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
                box.append((False, exc))
            done.set()

        self._submit_to_loop(run)
        self._wait(done)
        ok, value = box[0]
        if not ok:
            raise value
        return value
