"""What judge calls cost: token usage per request, prices, and a budget that is never crossed.
Pure book-keeping, no I/O (the engine's glue is ``engine/spend.py``).

**How a reward reports usage.** Return a dict with ``"score"`` and ``"usage"``; ``usage`` may be
- the OpenAI client's ``usage`` object (``response.usage``: chat completions' ``prompt_tokens`` /
  ``completion_tokens``, or the Responses API's ``input_tokens`` / ``output_tokens``),
- the whole OpenAI response (anything with a ``.usage``),
- a mapping with either pair of keys.
``with_usage(score, response, **extra)`` builds that dict. The agent takes ``usage`` out of the extra
info and puts two integers in its place, ``usage_input_tokens`` and ``usage_output_tokens`` (what the
verdict log, the strategies' metrics and ``verl-async-rm score`` read). A request whose reward reports
nothing (or that failed) is charged its *reservation* (below) as an estimate, counted apart.

**The budget rule** (``token_budget`` and/or ``money_budget``). Before an attempt is sent it
*reserves* its worst case: its input estimate (the caller's ``token_estimator``, else the reward's
own ``estimate_input_tokens``, which must cover the whole prompt it builds; a budget with neither is
refused when the agent is built: ``engine/spend.py``) plus ``reserve_output_tokens``. It is sent only if everything already charged, plus every
reservation in flight, plus its own fits the budget. When it ends, its reservation is released and
it is charged what the judge reported (or the reservation, if nothing was reported). So the charged
total never passes the budget as long as no request uses more than its reservation (set
``reserve_output_tokens`` to the judge's ``max_tokens``); a request that does is charged in full and
logged as an overrun. A request that cannot fit while others are in flight waits for them (they
may use less than reserved); one that cannot fit with nothing in flight stops scoring: the
budget is spent.

Money is computed from token counts with exact decimal arithmetic (``Fraction`` of the configured
prices), so a money budget is the same linear limit on tokens and never suffers float drift.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Mapping

USAGE_KEY = "usage"
INPUT_KEY = "usage_input_tokens"
OUTPUT_KEY = "usage_output_tokens"
MILLION = 1_000_000


@dataclass(frozen=True, slots=True)
class Usage:
    input_tokens: int = 0
    output_tokens: int = 0

    def __add__(self, other: Usage) -> Usage:
        return Usage(self.input_tokens + other.input_tokens, self.output_tokens + other.output_tokens)

    def __sub__(self, other: Usage) -> Usage:
        return Usage(self.input_tokens - other.input_tokens, self.output_tokens - other.output_tokens)

    @property
    def total(self) -> int:
        return self.input_tokens + self.output_tokens

    def fits_in(self, other: Usage) -> bool:
        return self.input_tokens <= other.input_tokens and self.output_tokens <= other.output_tokens


ZERO = Usage()


# No request uses this many tokens; a count past it is a reporting bug. Bounded so that every sum and
# cost stays an exact, finite float: 10**400 reported once made every later cost figure (float of
# the total) raise OverflowError.
MAX_TOKENS = 2**53


def _count(value: Any, what: str) -> int:
    if value.__class__ is int and 0 <= value <= MAX_TOKENS:  # the common case, without the checks below
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= MAX_TOKENS \
            or value != int(value):  # (NaN and infinities fail the range check)
        raise ValueError(f"usage {what} must be an integer from 0 to {MAX_TOKENS}, got {value!r:.80}")
    return int(value)


def usage_from(value: Any) -> Usage:
    """``Usage`` from what a reward reported (see the module docstring); ValueError if unusable."""
    if isinstance(value, Usage):
        return value
    if value.__class__ is not dict and not isinstance(value, Mapping) and not hasattr(value, "prompt_tokens") and not hasattr(value, "input_tokens"):
        inner = getattr(value, "usage", None)  # a whole response
        if inner is None:
            raise ValueError(f"usage must be an OpenAI usage object, a response with .usage or a mapping; got {type(value).__name__}")
        value = inner

    mapping = value.__class__ is dict or isinstance(value, Mapping)

    def get(name: str) -> Any:
        return value.get(name) if mapping else getattr(value, name, None)

    for input_name, output_name in (("prompt_tokens", "completion_tokens"), ("input_tokens", "output_tokens")):
        tokens_in, tokens_out = get(input_name), get(output_name)
        if tokens_in is not None or tokens_out is not None:
            return Usage(_count(tokens_in or 0, input_name), _count(tokens_out or 0, output_name))
    raise ValueError("usage has neither prompt_tokens/completion_tokens nor input_tokens/output_tokens")


def with_usage(score: float, response: Any, **extra: Any) -> dict:
    """What an OpenAI-client reward returns to report its usage: ``with_usage(s, response, judge_reply=text)``."""
    return {"score": score, USAGE_KEY: response, **extra}


def take_usage(extra: dict) -> Usage | None:
    """Replace a reported ``usage`` in a sample's extra info by two integer keys; the usage, or None.
    Raises ValueError (the sample fails as ``invalid``) when the usage cannot be read."""
    if USAGE_KEY not in extra:
        return None
    value = extra.pop(USAGE_KEY)
    if value is None:  # e.g. ``response.usage`` of a server that reports none: not reported
        return None
    usage = usage_from(value)
    extra[INPUT_KEY] = usage.input_tokens
    extra[OUTPUT_KEY] = usage.output_tokens
    return usage


@dataclass(frozen=True)
class Prices:
    """Per 1M tokens. Kept as ``Fraction`` of their decimal text: 0.15 means exactly 15/100."""

    input_per_million: Fraction = Fraction(0)
    output_per_million: Fraction = Fraction(0)

    @classmethod
    def of(cls, input_per_million: float | None, output_per_million: float | None) -> Prices:
        return cls(Fraction(str(input_per_million or 0)), Fraction(str(output_per_million or 0)))

    def cost(self, usage: Usage) -> Fraction:
        return (usage.input_tokens * self.input_per_million + usage.output_tokens * self.output_per_million) / MILLION

    def approx_cost(self, input_tokens: int, output_tokens: int) -> float:
        """In floats, for one request's figure in the verdict log (totals use ``cost``, exact)."""
        return (input_tokens * float(self.input_per_million) + output_tokens * float(self.output_per_million)) / MILLION


@dataclass(frozen=True)
class CostStatistics:
    input_tokens: int  # reported by the judge
    output_tokens: int
    cost: float  # of the reported usage, at the configured prices
    estimated_input_tokens: int  # charged from reservations: requests that reported no usage
    estimated_output_tokens: int
    estimated_cost: float
    usage_reported_requests: int
    usage_estimated_requests: int
    reserved_tokens: int  # held by requests in flight
    budget_overruns: int  # requests that reported more than their reservation


class CostLedger:
    """Charged and reserved tokens against an optional token and money budget."""

    def __init__(self, prices: Prices, token_budget: int | None = None, money_budget: float | None = None):
        self.prices = prices
        self.token_budget = token_budget
        self.money_budget = Fraction(str(money_budget)) if money_budget is not None else None
        self.reported = ZERO  # what judges reported
        self.estimated = ZERO  # reservations charged for requests that reported nothing
        self.reserved = ZERO  # reservations of requests in flight
        self.in_flight = 0
        self.reported_requests = 0
        self.estimated_requests = 0
        self.overruns = 0  # requests that used more than they reserved

    @property
    def charged(self) -> Usage:
        return self.reported + self.estimated

    def fits(self, usage: Usage) -> bool:
        if self.token_budget is not None and usage.total > self.token_budget:
            return False
        return self.money_budget is None or self.prices.cost(usage) <= self.money_budget

    def room(self, reservation: Usage) -> bool | None:
        """True: it fits now. False: wait (reservations in flight may free room). None: it can never
        fit (nothing in flight): the budget is spent."""
        if self.fits(self.charged + self.reserved + reservation):
            return True
        return False if self.in_flight else None

    def reserve(self, reservation: Usage) -> None:
        """A request that fits (``room``) is sent: hold its reservation until it ends (``release``)."""
        self.reserved += reservation
        self.in_flight += 1

    def admit(self, reservation: Usage) -> bool | None:
        """``room``, and the reservation held when it fits."""
        room = self.room(reservation)
        if room:
            self.reserve(reservation)
        return room

    def release(self, reservation: Usage, reported: Usage | None, *, charge: bool = True) -> None:
        """An admitted request ended: charge what it reported, else its reservation (``charge``
        False: a throttle, which judges do not bill)."""
        self.reserved -= reservation
        self.in_flight -= 1
        if not charge:
            return
        if reported is None:
            self.estimated += reservation
            self.estimated_requests += 1
            return
        self.record(reported)
        if not reported.fits_in(reservation):
            self.overruns += 1

    def record(self, reported: Usage | None) -> None:
        """A request sent without a reservation (no budget configured) reported its usage."""
        if reported is None:
            return  # nothing reserved, so nothing to charge
        self.reported += reported
        self.reported_requests += 1

    def money(self, usage: Usage) -> float:
        return float(self.prices.cost(usage))

    def describe_budget(self) -> str:
        parts = []
        if self.token_budget is not None:
            parts.append(f"token_budget {self.token_budget}")
        if self.money_budget is not None:
            parts.append(f"money_budget {float(self.money_budget):g}")
        charged = self.charged
        return (f"{' and '.join(parts)}: {charged.total} tokens charged ({self.money(charged):.6g} money), "
                f"{self.reserved.total} reserved in flight")

    def statistics(self) -> CostStatistics:
        return CostStatistics(
            input_tokens=self.reported.input_tokens,
            output_tokens=self.reported.output_tokens,
            cost=self.money(self.reported),
            estimated_input_tokens=self.estimated.input_tokens,
            estimated_output_tokens=self.estimated.output_tokens,
            estimated_cost=self.money(self.estimated),
            usage_reported_requests=self.reported_requests,
            usage_estimated_requests=self.estimated_requests,
            reserved_tokens=self.reserved.total,
            budget_overruns=self.overruns,
        )


def chunk_usage(extra_info: Mapping[str, list]) -> Usage:
    """The reported usage of a chunk's samples (their ``usage_*`` extra-info columns)."""
    tokens_in = extra_info.get(INPUT_KEY) or ()
    tokens_out = extra_info.get(OUTPUT_KEY) or ()
    return Usage(sum(int(x) for x in tokens_in if x is not None), sum(int(x) for x in tokens_out if x is not None))


def usage_metrics(step: Usage, total: Usage, prices: Prices, prefix: str = "async_reward/") -> dict[str, float]:
    """Per-step and cumulative judge tokens and cost, for verl's logger."""
    return {
        f"{prefix}judge_input_tokens": float(step.input_tokens),
        f"{prefix}judge_output_tokens": float(step.output_tokens),
        f"{prefix}judge_cost": float(prices.cost(step)),
        f"{prefix}judge_input_tokens_total": float(total.input_tokens),
        f"{prefix}judge_output_tokens_total": float(total.output_tokens),
        f"{prefix}judge_cost_total": float(prices.cost(total)),
    }
