"""Simulated judges: how long a remote reward call takes, whether it hangs, whether it fails.

Pure logic (no I/O, standard library only): the toy reward (:mod:`.toy_task`) sleeps and raises
according to a :class:`JudgeModel` built from its reward kwargs, so the demo and the benchmarks can
put the agent in front of judges that look like real ones:

- ``uniform`` (default): latency uniform in ``[latency_lo, latency_hi]``, the recipe's shape
  (its 1-40 s, scaled); ``latency_hi <= 0`` means no latency at all.
- ``lognormal``: a heavy tail fixed by two quantiles a user can read off a judge's dashboard,
  ``latency_p50`` and ``latency_p99`` seconds (median exp(mu) = p50, and sigma chosen so that the
  99th percentile is exactly p99).
- ``hang_prob``: this fraction of calls sleeps ``hang_s`` (default one hour), i.e. never answers in
  practice; the agent's deadline or request timeout has to settle them.
- ``fail_prob``: this fraction of calls raises :class:`SimulatedJudgeError` after its latency (a judge
  error), so the agent's failure policy applies. Hang and failure are exclusive outcomes of one draw,
  so the fractions are exactly the two probabilities.

Every draw is a hash of ``(solution_str, seed)``, not a random number: every run that produces the
same response waits the same time and gets the same outcome, so runs are reproducible and two modes
of one benchmark are paired sample by sample. Independent streams (latency, outcome) hash with
different prefixes. The uniform latency at seed 0 hashes the bare response text, exactly as the
toy task's ``simulated_latency`` always has, so existing figures stay comparable.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any, Literal

MODELS = ("uniform", "lognormal")
DEFAULT_HANG_S = 3600.0
_Z99 = NormalDist().inv_cdf(0.99)

# The reward kwargs this module reads (everything else in reward kwargs is left to the reward).
KWARGS = ("latency_model", "latency_lo", "latency_hi", "latency_p50", "latency_p99",
          "hang_prob", "hang_s", "fail_prob", "latency_seed")


class SimulatedJudgeError(RuntimeError):
    """A simulated judge error (``fail_prob``). Not retryable: the same response would fail again,
    since the outcome is a hash of it, so retrying would only spend the retry budget."""

    kind = "judge_error"


@dataclass(frozen=True)
class JudgeDraw:
    """What one call does: wait ``latency_s`` seconds, then answer, fail, or (hang) never answer."""

    latency_s: float
    outcome: Literal["ok", "hang", "fail"]


def hash64(solution_str: str, seed: int, stream: str) -> int:
    """64 bits of SHA-1 of (stream, seed, response text); the uniform latency stream at seed 0 hashes
    the bare text (today's draw, see the module doc)."""
    key = solution_str if (stream == "latency" and seed == 0) else f"{stream}|{seed}|{solution_str}"
    return int.from_bytes(hashlib.sha1(key.encode()).digest()[:8], "big")


def unit_from_hash(k: int) -> float:
    """A 64-bit hash as a number in the open interval (0, 1), away from 0 and 1 where the lognormal's
    inverse CDF is infinite: its top 52 bits plus a half step, so that even the largest value,
    (2**52 - 0.5) / 2**52, is exact in a float's 53-bit mantissa (with 53 bits it rounds to 1.0)."""
    return ((k >> 12) + 0.5) / 2**52


def unit_draw(solution_str: str, seed: int, stream: str) -> float:
    return unit_from_hash(hash64(solution_str, seed, stream))


def _number(name: str, value: Any) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a number, got {value!r}") from None
    if not math.isfinite(number):
        raise ValueError(f"{name} must be finite, got {value!r}")
    return number


@dataclass(frozen=True)
class JudgeModel:
    """A simulated judge; construction checks every parameter (ValueError naming the bad one)."""

    latency_model: str = "uniform"
    latency_lo: float = 0.0
    latency_hi: float = 0.0
    latency_p50: float = 0.0
    latency_p99: float = 0.0
    hang_prob: float = 0.0
    hang_s: float = DEFAULT_HANG_S
    fail_prob: float = 0.0
    latency_seed: int = 0

    def __post_init__(self) -> None:
        if self.latency_model not in MODELS:
            raise ValueError(f"latency_model must be one of {MODELS}, got {self.latency_model!r}")
        for name in ("latency_lo", "latency_hi", "latency_p50", "latency_p99", "hang_prob", "hang_s", "fail_prob"):
            number = _number(name, getattr(self, name))
            if number < 0:
                raise ValueError(f"{name} must be >= 0, got {number}")
            object.__setattr__(self, name, number)
        for name in ("hang_prob", "fail_prob"):
            if getattr(self, name) > 1:
                raise ValueError(f"{name} must be a probability in [0, 1], got {getattr(self, name)}")
        if self.hang_prob + self.fail_prob > 1:
            raise ValueError(f"hang_prob + fail_prob must be <= 1, got {self.hang_prob} + {self.fail_prob}")
        if self.latency_model == "uniform" and self.latency_hi > 0 and self.latency_lo > self.latency_hi:
            raise ValueError(f"need latency_lo <= latency_hi, got {self.latency_lo} > {self.latency_hi}")
        if self.latency_model == "lognormal":
            if self.latency_p99 < self.latency_p50:
                raise ValueError(f"need latency_p50 <= latency_p99, got {self.latency_p50} > {self.latency_p99}")
            if self.latency_p50 == 0 and self.latency_p99 > 0:
                raise ValueError("lognormal latency needs latency_p50 > 0 (or both quantiles 0 for no latency)")
        if isinstance(self.latency_seed, bool) or not isinstance(self.latency_seed, int):
            raise ValueError(f"latency_seed must be an int, got {self.latency_seed!r}")  # noqa: TRY004 (one error type for every bad parameter)

    @classmethod
    def from_kwargs(cls, kwargs: dict[str, Any]) -> JudgeModel:
        """The model named by reward kwargs (missing keys take the defaults; ``None`` counts as missing)."""
        return cls(**{k: kwargs[k] for k in KWARGS if kwargs.get(k) is not None})

    @property
    def sigma(self) -> float:
        """The lognormal's shape: ln(p99 / p50) / z_0.99, so that its 99th percentile is p99."""
        if self.latency_p50 <= 0:
            return 0.0
        return math.log(self.latency_p99 / self.latency_p50) / _Z99

    def latency(self, solution_str: str) -> float:
        if self.latency_model == "uniform":
            if self.latency_hi <= 0:
                return 0.0
            # Today's formula, bit for bit (the toy task's simulated_latency always drew this way).
            k = hash64(solution_str, self.latency_seed, "latency")
            return self.latency_lo + (self.latency_hi - self.latency_lo) * k / 2**64
        if self.latency_p50 <= 0:
            return 0.0
        u = unit_draw(solution_str, self.latency_seed, "latency")
        return self.latency_p50 * math.exp(self.sigma * NormalDist().inv_cdf(u))

    def draw(self, solution_str: str) -> JudgeDraw:
        outcome_u = unit_draw(solution_str, self.latency_seed, "outcome") if (self.hang_prob or self.fail_prob) else 1.0
        if outcome_u < self.hang_prob:
            return JudgeDraw(self.hang_s, "hang")
        outcome = "fail" if outcome_u < self.hang_prob + self.fail_prob else "ok"
        return JudgeDraw(self.latency(solution_str), outcome)
