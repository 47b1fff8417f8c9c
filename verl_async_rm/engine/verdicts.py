"""The engine's side of the verdict log (format and crash safety in ``verl_async_rm/verdict_log.py``):
samples already settled in the log are answered from it instead of being sent (resume), and every
sample settled here is appended to it."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Callable

from verl_async_rm.config import AgentConfig
from verl_async_rm.engine.pipeline import DONE
from verl_async_rm.cost import INPUT_KEY, OUTPUT_KEY, Prices
from verl_async_rm.loader import UserReward
from verl_async_rm.outcome import Failed, Outcome, Scored
from verl_async_rm.verdict_log import VERSION, VerdictWriter, load_resume_answers, request_key, verdict_text

_log = logging.getLogger(__name__)


class VerdictBook:
    def __init__(self, reward: UserReward, config: AgentConfig, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self.label = reward.label
        self.kwargs = dict(reward.spec.kwargs) if reward.spec is not None else dict(reward.call_kwargs)
        self.prices = Prices.of(config.price_input_per_million, config.price_output_per_million)
        self.answers = load_resume_answers(config.verdict_log) if config.verdict_log_resume else {}
        if self.answers:
            _log.info("verdict log %s: %d settled requests will be answered from it, not sent",
                      config.verdict_log, len(self.answers))
        self.writer = VerdictWriter(config.verdict_log, config.verdict_log_fsync_s)
        self.resumed = 0

    def key(self, sample) -> str:
        if sample.log_key is None:
            item = sample.item
            sample.log_key = request_key(self.label, self.kwargs, item.data_source, item.solution_str,
                                         item.ground_truth, item.extra_info)
        return sample.log_key

    def answer_from_log(self, samples: list, settle: Callable[[object, Outcome], None]) -> list:
        """The samples still to send; the others are settled from the log (on the next loop turn,
        as the cache does: the caller is still inside ``submit``)."""
        if not self.answers:
            return samples
        to_send = []
        for sample in samples:
            answer = self.answers.get(self.key(sample))
            if answer is None:
                to_send.append(sample)
                continue
            self.resumed += 1
            sample.state = DONE  # never sent
            self.loop.call_soon(settle, sample, Scored(answer.score, dict(answer.extra), answer.attempts, cached=True))
        return to_send

    def failed_writes(self) -> str | None:
        error = self.writer.error
        return None if error is None else f"the verdict log {self.writer.path} cannot be written: {error}"

    def record(self, sample, outcome: Outcome, latency: float, ticket: str | None, uid, now: float) -> None:
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
        cost = None if tokens_in is None else self.prices.approx_cost(tokens_in, tokens_out or 0)
        record.update({
            "v": VERSION, "key": self.key(sample), "t": time.time(), "ticket": ticket, "index": sample.item.index,
            "uid": uid, "latency_s": latency, "attempts": outcome.attempts,
            # the last attempt's own time (sent -> answered), apart from time spent queued or retrying
            "request_s": None if sample.attempt is None else now - sample.attempt.sent_at,
            "input_tokens": tokens_in, "output_tokens": tokens_out, "cost": cost,
        })
        self.writer.append(record)

    def close(self) -> None:
        self.writer.close()
