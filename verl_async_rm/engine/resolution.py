"""Group resolution: what a settled group becomes. The failure policy first (``failure_policy.py``:
the score a failed member gets, or the ``RewardError`` that ends the group's waiter), then the
user's group hook (``post_process_scores``) on the group's complete scores, bounded by
``hook_timeout`` and by the deadline of whoever waits for the group.

A hook that fails, times out or meets the deadline fails the group's scored members (kind
``hook_error``, ``hook_timeout`` or ``deadline``); the engine charges them like any failure
(``on_hook_failure``: the counters, the verdict log, the failure budgets) and the group is resolved
again by the policy without the hook. Whatever comes of it goes to ``deliver``: a ``GroupResult``
for a ticket's ready queue or a streamed group's members, or the exception that ends them.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

from verl_async_rm.engine.ledger import GroupResult, SettledGroup
from verl_async_rm.errors import RewardError
from verl_async_rm.failure_policy import FailurePolicy, resolve_group
from verl_async_rm.loader import UserReward
from verl_async_rm.outcomes import Failed
from verl_async_rm.reward_returns import normalize_group_scores

Deliver = Callable[[GroupResult | BaseException], None]
# (failure, the indices it newly fails, their ticket or None, their samples by index or None) -> True
# when charging them stopped the ticket or everything (then nothing is delivered)
HookFailure = Callable[[Failed, list, Any, Any], bool]


class GroupResolution:
    def __init__(self, reward: UserReward, policy: FailurePolicy, hook_timeout: float | None,
                 loop: asyncio.AbstractEventLoop, metrics, on_hook_failure: HookFailure):
        self.reward = reward
        self.policy = policy
        self.hook_timeout = hook_timeout
        self.loop = loop
        self.metrics = metrics
        self.on_hook_failure = on_hook_failure
        self._hook_threads: ThreadPoolExecutor | None = None

    def resolve(
        self, group: SettledGroup, deliver: Deliver, deadline: float, where: str, hooks: set, run: Any = None,
        sample_of: Callable[[int], Any] | None = None,
    ) -> None:
        """Failure policy, then the group hook (bounded by ``hook_timeout`` and the deadline), its
        task kept in ``hooks`` while it runs. ``run``: the group's ticket (None on the stream);
        ``sample_of(index)``: the group's samples, for the verdict log when the hook fails them."""
        try:
            result = resolve_group(group, self.policy)
        except RewardError as error:
            deliver(error)
            return
        if self.reward.group_hook is None:
            deliver(result)
            return
        task = self.loop.create_task(self._post_process(result, deliver, deadline, where, run, sample_of))
        hooks.add(task)
        task.add_done_callback(hooks.discard)

    async def _post_process(self, result: GroupResult, deliver: Deliver, deadline: float, where: str, run: Any,
                            sample_of: Callable[[int], Any] | None) -> None:
        reward = self.reward
        budget = deadline - self.loop.time()
        hook_bound = self.hook_timeout is not None and self.hook_timeout < budget
        if hook_bound:
            budget = self.hook_timeout
        if budget <= 0:  # resolved at (or after) the deadline: no time for the hook
            error_text, kind = "resolved without it at the deadline", "deadline"
        else:
            try:
                async with asyncio.timeout(None if budget == float("inf") else budget):
                    if reward.hook_is_async:
                        values = await reward.group_hook(list(result.scores))
                    else:  # once per group, not per sample: the standard pool fits (see thread_bridge for why not there)
                        if self._hook_threads is None:
                            self._hook_threads = ThreadPoolExecutor(8, thread_name_prefix="reward-hook")
                        values = await self.loop.run_in_executor(self._hook_threads, reward.group_hook, list(result.scores))
                    if inspect.isawaitable(values):
                        values = await values
                scores = normalize_group_scores(values, len(result.indices), where)
                deliver(dataclasses.replace(result, scores=scores))
                return
            except asyncio.CancelledError:
                # Only two things cancel a hook: its ticket's deadline (the ticket has no error then),
                # or the end of whoever waits for the group (its ticket failed or was cancelled,
                # every stream member answered with an error, the agent closed). Then its group goes
                # to nobody: its samples stay as they settled, no failure is counted.
                if run is None or run.error is not None:
                    return
                error_text, kind = "resolved without it at the deadline", "deadline"
            except TimeoutError:
                if hook_bound:
                    error_text, kind = f"timed out (hook_timeout {self.hook_timeout}s)", "hook_timeout"
                else:
                    error_text, kind = "resolved without it at the deadline", "deadline"
            except Exception as exc:  # noqa: BLE001 - a broken hook fails its group by the policy
                error_text, kind = f"failed: {type(exc).__name__}: {exc}", "hook_error"
        self.metrics.hook_failures += 1
        failure = Failed(kind, f"{where} {error_text}")
        # A failed hook fails its group's scored samples (the failed ones are counted already): they
        # move from completed to failed, are charged to the budgets like any failure, and the verdict
        # log says so (their judge verdicts stay resumable: the hook runs again on resume).
        newly_failed = [i for i, extra in zip(result.indices, result.extras) if not extra.get("reward_failed")]
        if newly_failed and self.on_hook_failure(failure, newly_failed, run, sample_of):
            return
        outcomes = [Failed(extra["reward_failure"], extra["reward_error"]) if extra.get("reward_failed") else failure
                    for extra in result.extras]  # a sample that failed on its own keeps its own kind
        try:
            failed = resolve_group(SettledGroup(result.key, result.indices, outcomes), self.policy)
        except RewardError as error:
            deliver(error)
            return
        deliver(failed)

    def close(self) -> None:
        if self._hook_threads is not None:
            self._hook_threads.shutdown(wait=False, cancel_futures=True)  # a hung hook's thread cannot be joined
