"""The engine's side of cost accounting (rules in ``verl_async_rm/cost.py``): a reservation per
attempt before it is sent, released with what the judge reported when the attempt ends.

A reservation must cover what the request really sends, and that is the judge prompt the reward
builds (a rubric, a system prompt, the response and the reference inside it), which only the reward
knows. So a budget's input estimate comes from the caller's ``token_estimator``, else from the
reward's own ``estimate_input_tokens`` (``ESTIMATE_METHOD``: a method of a class reward, an attribute
of a function reward; called like ``compute_score``, or with the group for a group judge), and a
budget with neither is refused when the agent is built: the default ~4 characters a token of the
response leaves the prompt out (a 60,000-token budget was charged 207,669 under 2,000 requests).

With a budget, ``Spending`` is one of admission's meters (``engine/meters.py``): a request starts
only once its reservation fits, and a reservation that can never fit (nothing in flight to free
room) stops everything (``on_spent``)."""

from __future__ import annotations

import logging
import math
from typing import Any, Callable

from verl_async_rm.config import AgentConfig
from verl_async_rm.cost import CostLedger, Prices, Usage
from verl_async_rm.limits import checked_estimate

_log = logging.getLogger(__name__)
ESTIMATE_METHOD = "estimate_input_tokens"


def reward_input_estimator(reward) -> Callable[[Any], Any] | None:
    """The reward's own estimate of the input tokens one request sends, if it has one."""
    owner = reward.instance if reward.instance is not None else reward.score_fn
    method = getattr(owner, ESTIMATE_METHOD, None)
    if not callable(method):
        return None
    if reward.is_group_judge:  # its requests are groups (engine/group_judge.py's GroupRequest)
        return lambda request: method(list(request.items))
    return lambda item: method(item.data_source, item.solution_str, item.ground_truth, item.extra_info)


def budget_estimator(reward, token_estimator: Callable | None, config: AgentConfig) -> Callable[[Any], float] | None:
    """What a budget reserves per request for input: checked (``limits.checked_estimate``). None
    without a budget; a budget without a usable estimate is refused here, at build."""
    if not config.budgeted:
        return None
    if token_estimator is not None:
        return checked_estimate(token_estimator, "token_estimator")
    own = reward_input_estimator(reward)
    if own is None:
        raise ValueError(
            f"token_budget/money_budget: nothing estimates the input tokens {reward.label} sends per request, so the "
            f"budget cannot be held (the default ~4 characters a token of the response leaves out the judge prompt "
            f"the reward builds: budgets were crossed 3x). Give the reward an {ESTIMATE_METHOD}(data_source, "
            f"solution_str, ground_truth, extra_info=None) method (a function reward: an attribute "
            f"compute_score.{ESTIMATE_METHOD} = ...; a group judge: {ESTIMATE_METHOD}(group)) returning an upper bound "
            f"of the prompt's tokens, or pass token_estimator=... to the agent"
        )
    return checked_estimate(own, f"{reward.label}.{ESTIMATE_METHOD}")


class Spending:
    reserves = True  # a meter asked last, only for a request that may start now

    def __init__(self, config: AgentConfig, input_estimator: Callable[[Any], float] | None,
                 on_spent: Callable[[Any], None] | None = None):
        """``on_spent(sample)``: the budget is spent (``sample``'s reservation can never fit)."""
        self.on_spent = on_spent
        self.ledger = CostLedger(
            Prices.of(config.price_input_per_million, config.price_output_per_million),
            config.token_budget, config.money_budget,
        )
        self.limited = config.token_budget is not None or config.money_budget is not None
        self.estimate = input_estimator  # checked; None without a budget (nothing is reserved)
        self.reserve_output = config.reserve_output_tokens
        self._warned_overrun = False

    def reservation(self, sample) -> Usage:
        """Estimated once per sample (a head-of-line sample waiting for room is asked again and again).
        Raises ``errors.EstimateRefused`` for an estimate that is not a finite number >= 0."""
        if sample.input_estimate is None:
            sample.input_estimate = math.ceil(self.estimate(sample.item))
        return Usage(sample.input_estimate, self.reserve_output)

    def wait(self, sample, now: float) -> float | None:
        """The meter: 0.0 when ``sample``'s reservation fits; None while requests in flight may free
        room, or once the budget is spent (``on_spent`` stops everything)."""
        room = self.ledger.room(self.reservation(sample))
        if room:
            return 0.0
        if room is None:  # nothing in flight can free room
            self.on_spent(sample)
        return None

    def take(self, sample, now: float) -> None:
        """``sample`` is sent: its reservation is held until its attempt ends (``release``)."""
        reservation = sample.reservation = self.reservation(sample)
        self.ledger.reserve(reservation)

    def release(self, sample, reported: Usage | None, *, charge: bool = True) -> None:
        """The attempt of ``sample`` ended (``charge`` False: a throttle, which judges do not bill).
        Idempotent: only the first call after ``take`` counts. Without a budget nothing was reserved:
        the usage is only recorded."""
        if not self.limited:
            if charge:
                self.ledger.record(reported)
            return
        reservation, sample.reservation = sample.reservation, None
        if reservation is not None:
            overruns = self.ledger.overruns
            self.ledger.release(reservation, reported, charge=charge)
            if self.ledger.overruns > overruns and not self._warned_overrun:
                self._warned_overrun = True  # once: the count is in the metrics (budget_overruns)
                _log.error("a request reported %s input + %s output tokens against a reservation of %s + %s: the "
                           "estimate (token_estimator or the reward's %s, reserve_output_tokens) is too low, and the "
                           "budget can be crossed by such overruns", reported.input_tokens, reported.output_tokens,
                           reservation.input_tokens, reservation.output_tokens, ESTIMATE_METHOD)

    def stop_message(self, sample) -> str:
        return (f"the judge budget is spent ({self.ledger.describe_budget()}); the next request "
                f"({sample.where()}) would reserve {self.reservation(sample).total} tokens and could cross it")
