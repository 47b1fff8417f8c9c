"""The engine's side of the verdict log (format and crash safety in ``verl_async_rm/verdict_log.py``):
samples already settled in the log by this reward are answered from it instead of being sent
(resume), and every sample settled here is appended to it. A group judge's call is answered from
the log only when every member is (a member's verdict depends on its whole group)."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Callable

from verl_async_rm.config import AgentConfig
from verl_async_rm.cost import INPUT_KEY, OUTPUT_KEY, Prices
from verl_async_rm.engine.group_judge import GroupCall
from verl_async_rm.engine.pipeline import DONE
from verl_async_rm.loader import UserReward, source_file
from verl_async_rm.outcomes import Outcome, Scored
from verl_async_rm.verdict_log import (
    VERSION, RewardIdentity, VerdictWriter, group_request_keys, input_seen, inputs_path, load_resume_answers,
    logged_input_requests, request_key, reward_record, verdict_key, verdict_text,
)

_log = logging.getLogger(__name__)


def reward_identity(reward: UserReward, reward_version: str | None) -> RewardIdentity:
    if reward.kwargs is not None:
        return RewardIdentity.of(reward.label, source_file(reward), reward_version, reward.kwargs)
    # an instance the caller built: its constructor kwargs are unknown, its attributes stand in
    return RewardIdentity.of(reward.label, source_file(reward), reward_version, {}, instance=reward.instance)


@dataclass(frozen=True)
class VerdictLogStatistics:
    resumed: int  # samples answered from the log instead of being sent (a resumed run)
    verdicts_logged: int  # records written to the log


class VerdictBook:
    def __init__(self, reward: UserReward, config: AgentConfig, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self.identity = reward_identity(reward, config.reward_version)
        self.reward_id = self.identity.id
        self.prices = Prices.of(config.price_input_per_million, config.price_output_per_million)
        plan = load_resume_answers(config.verdict_log, self.identity, config.verdict_log_accept_reward_change) \
            if config.verdict_log_resume else None
        self.answers = plan.answers if plan is not None else {}
        if plan is not None and plan.accepts and config.verdict_log_accept_reward_change:
            _log.warning("verdict log %s: reusing the answers of other rewards (ids %s) for %s, as "
                         "verdict_log_accept_reward_change asks", config.verdict_log, sorted(plan.accepts),
                         self.identity.describe())
        if self.answers:
            _log.info("verdict log %s: %d settled requests will be answered from it, not sent",
                      config.verdict_log, len(self.answers))
        header = reward_record(self.identity, plan.accepts if plan is not None else ())
        # verdict_log_inputs: what was judged, kept once per request in a sidecar (verdict_log.py); the
        # requests it already holds (a resumed or appended-to log) are not kept again
        inputs = inputs_path(config.verdict_log) if config.verdict_log_inputs else None
        self.inputs_kept: set[int] | None = logged_input_requests(inputs) if inputs is not None else None
        self.writer = VerdictWriter(config.verdict_log, config.verdict_log_fsync_s, header=header, inputs=inputs)
        self.resumed = 0
        self.judge_names: list[str] | None = None  # a judge list's names: each record says whose verdict it is
        self.judge_prices: list[Prices] | None = None  # and each judge's prices (its own, else the agent's)

    def request(self, sample) -> str:
        """The sample's request key; a group judge's members get theirs within their group."""
        if sample.log_key is None:
            call = sample.group_call
            if call is not None:
                self._group_requests(call)
            else:
                item = sample.item
                sample.log_key = request_key(item.data_source, item.solution_str, item.ground_truth, item.extra_info)
        return sample.log_key

    @staticmethod
    def _group_requests(call: GroupCall) -> list[str]:
        own = [request_key(m.item.data_source, m.item.solution_str, m.item.ground_truth, m.item.extra_info)
               for m in call.members]
        keys = group_request_keys(own)
        for member, key in zip(call.members, keys):
            member.log_key = key
        return keys

    def answer_from_log(self, samples: list, settle: Callable[[object, Outcome], None]) -> list:
        """The samples still to send; the others are settled from the log (on the next loop turn,
        as the cache does: the caller is still inside ``submit``)."""
        if not self.answers:
            return samples
        to_send = []
        for sample in samples:
            if sample.__class__ is GroupCall:
                answers = [self.answers.get(key) for key in self._group_requests(sample)]
                if None in answers:  # the judge must see the whole group again
                    to_send.append(sample)
                    continue
                sample.state, sample.settled = DONE, True  # the call itself is never sent
                for member, answer in zip(sample.members, answers):
                    self._answer(member, answer, settle)
                continue
            answer = self.answers.get(self.request(sample))
            if answer is None:
                to_send.append(sample)
                continue
            self._answer(sample, answer, settle)
        return to_send

    def _answer(self, sample, answer, settle) -> None:
        if sample.settled:  # a group member the deadline settled already
            return
        self.resumed += 1
        sample.state = DONE  # never sent
        self.loop.call_soon(settle, sample, Scored(answer.score, dict(answer.extra), answer.attempts, cached=True))

    def statistics(self) -> VerdictLogStatistics:
        return VerdictLogStatistics(self.resumed, self.writer.written)

    def failed_writes(self) -> str | None:
        error = self.writer.error
        return None if error is None else f"the verdict log {self.writer.path} cannot be written: {error}"

    def record(self, sample, outcome: Outcome, latency: float, ticket: str | None, uid, now: float, sample_id: str,
               stage: str | None = None) -> None:
        """``stage="hook"``: the group hook failed ``sample`` after it was logged (``outcome`` is that failure)."""
        if self.inputs_kept is not None and sample.group_call is None:
            self._keep_input(sample)  # before the record: the writer writes it first
        if isinstance(outcome, Scored):
            if outcome.cached:  # answered from the log or the cache: nothing new to keep
                return
            extra = outcome.extra
            tokens_in, tokens_out = extra.get(INPUT_KEY), extra.get(OUTPUT_KEY)
            record = {"score": outcome.score, "extra": dict(extra), "verdict": verdict_text(extra), "failure": None,
                      "error": None}
        else:
            tokens_in = tokens_out = None
            record = {"score": None, "extra": {}, "verdict": None, "failure": outcome.kind, "error": outcome.message}
        prices = self.prices if self.judge_prices is None else self.judge_prices[getattr(sample, "judge", 0)]
        cost = None if tokens_in is None else prices.approx_cost(tokens_in, tokens_out or 0)
        request = self.request(sample)
        record.update({
            "v": VERSION, "key": verdict_key(self.reward_id, request), "reward": self.reward_id, "request": request,
            "sample": sample_id, "t": time.time(), "ticket": ticket, "index": sample.item.index,
            "uid": uid, "latency_s": latency, "attempts": outcome.attempts,
            # the last attempt's own time (sent -> answered), apart from time spent queued or retrying
            "request_s": None if stage is not None or sample.attempt is None else now - sample.attempt.sent_at,
            "input_tokens": tokens_in, "output_tokens": tokens_out, "cost": cost,
        })
        if stage is not None:
            record["stage"] = stage
        if self.judge_names is not None:
            record["judge"] = self.judge_names[getattr(sample, "judge", 0)]
        self.writer.append(record)

    def _keep_input(self, sample) -> None:
        """The sample's item, the first time its request is logged (also when answered from the log or
        the cache: a log resumed with the setting newly on gets the inputs of what it reuses). A group
        judge's members are not kept (their requests hash their whole group)."""
        request = self.request(sample)
        seen = input_seen(request)
        if seen in self.inputs_kept:
            return
        self.inputs_kept.add(seen)
        item = sample.item
        self.writer.append_input(request, item.data_source, item.solution_str, item.ground_truth, item.extra_info)

    def close(self) -> None:
        self.writer.close()
