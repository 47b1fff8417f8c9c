"""The engine's side of cost accounting (rules in ``verl_async_rm/cost.py``): a reservation per
attempt before it is sent, released with what the judge reported when the attempt ends."""

from __future__ import annotations

import math
from typing import Callable

from verl_async_rm.config import AgentConfig
from verl_async_rm.cost import CostLedger, Prices, Usage
from verl_async_rm.outcome import RewardItem


class Spending:
    def __init__(self, config: AgentConfig, token_estimator: Callable[[RewardItem], float]):
        self.ledger = CostLedger(
            Prices.of(config.price_input_per_million, config.price_output_per_million),
            config.token_budget, config.money_budget,
        )
        self.limited = config.token_budget is not None or config.money_budget is not None
        self.estimate = token_estimator
        self.reserve_output = config.reserve_output_tokens

    def reservation(self, item: RewardItem) -> Usage:
        return Usage(math.ceil(float(self.estimate(item))), self.reserve_output)

    def admit(self, sample) -> bool | None:
        """Before sending ``sample``: True (reserved), False (wait for requests in flight), None
        (the budget is spent)."""
        reservation = self.reservation(sample.item)
        admitted = self.ledger.admit(reservation)
        if admitted:
            sample.reservation = reservation
        return admitted

    def release(self, sample, reported: Usage | None, *, charge: bool = True) -> None:
        """The attempt of ``sample`` ended (``charge`` False: a throttle, which judges do not bill).
        Idempotent: only the first call after ``admit`` counts. Without a budget nothing was reserved:
        the usage is only recorded."""
        if not self.limited:
            if charge:
                self.ledger.record(reported)
            return
        reservation, sample.reservation = sample.reservation, None
        if reservation is not None:
            self.ledger.release(reservation, reported, charge=charge)

    def stop_message(self, sample) -> str:
        return (f"the judge budget is spent ({self.ledger.describe_budget()}); the next request "
                f"({sample.where()}) would reserve {self.reservation(sample.item).total} tokens and could cross it")
