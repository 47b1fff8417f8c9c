"""The agent's settings, validated when the agent is built (not an hour into training)."""

from __future__ import annotations

import os
from typing import Any, Literal, Mapping

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from verl_async_rm.failure_policy import FailurePolicy, PolicyName, failure_policy
from verl_async_rm.verdict_log import inputs_path


class SharedLimitsConfig(BaseModel):
    """Share this job's endpoint limits (``max_concurrency``, ``requests_per_minute``,
    ``tokens_per_minute``) and its 429 back-off with every job on the Ray cluster that names the same
    ``endpoint``: a detached named actor ``async_rm_limiter:<endpoint>`` leases them out
    (see ``verl_async_rm/lease_table.py`` for the design). Needs Ray (``ray.init`` on the cluster)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    endpoint: str = Field(..., min_length=1, description="the shared endpoint's name: jobs naming it share its limits")
    namespace: str = Field("verl_async_rm", min_length=1, description="Ray namespace of the limiter actor")
    lease_ttl: float = Field(10.0, gt=0, description="a job silent this long (crashed) loses its lease")
    heartbeat_s: float = Field(0.2, gt=0, description="seconds between a job's lease renewals")
    permit_ttl: float = Field(2.0, gt=0, description="seconds a batch of rate permits stays usable")

    @model_validator(mode="after")
    def _consistent(self) -> SharedLimitsConfig:
        if self.heartbeat_s * 4 > self.lease_ttl:
            raise ValueError(f"heartbeat_s ({self.heartbeat_s}) must be at most lease_ttl/4 ({self.lease_ttl / 4:g}): "
                             "a job stops sending when it has not renewed its lease for lease_ttl/2")
        return self


class JudgeConfig(BaseModel):
    """One judge of an ordered fallback list (``AgentConfig.judges``, engine/fallback.py): the reward
    is called with ``kwargs`` merged over its own (e.g. another ``base_url``/``model``/``api_key``), under
    this judge's own limits. A limit left None is the agent's."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(..., pattern=r"^[A-Za-z0-9_.-]+$", description="unique; names the judge in logs, metrics, the verdict log")
    kwargs: dict[str, Any] = Field(default_factory=dict, description="merged over the reward's kwargs for calls to this judge")
    max_concurrency: int | None = Field(None, ge=1)
    requests_per_minute: float | None = Field(None, gt=0)
    tokens_per_minute: float | None = Field(None, gt=0)
    token_budget: int | None = Field(None, gt=0, description="this judge's budget: once spent, samples move to the next judge")
    money_budget: float | None = Field(None, gt=0)
    price_input_per_million: float | None = Field(None, ge=0)
    price_output_per_million: float | None = Field(None, ge=0)
    switch_after_throttled_s: float = Field(
        60.0, gt=0, description="a judge answering only 429/503 this long counts as down (the last judge: max_throttled_s)")
    max_failure_rate: float = Field(0.5, gt=0, le=1, description="down once more than this share of its last "
                                    "failure_window attempts there failed (429/503 are not failures)")
    failure_window: int = Field(20, ge=1, description="attempts in the failure-rate window of this judge")
    retry_after_s: float = Field(30.0, gt=0, description="a down judge is probed again (one request) this long after")


class AgentConfig(BaseModel):
    """Every field has a default; unknown keys are errors (a typo must not be silently ignored)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_concurrency: int = Field(256, ge=1, description="requests in flight at most, for all callers together")
    request_timeout: float | None = Field(120.0, gt=0, description="seconds per attempt; None = no timeout")
    ticket_deadline: float | None = Field(
        None, gt=0, description="seconds after submit; then whatever is pending is settled by the failure policy"
    )
    executor: Literal["thread", "process"] = Field(
        "thread", description="where sync reward functions run; 'process' for CPU-heavy scorers"
    )
    max_workers: int | None = Field(
        None, ge=1, description="threads/processes for sync functions; default max_concurrency (threads), cores (processes)"
    )
    failure_policy: PolicyName = "neutral"
    fill_value: float = Field(0.0, description="score given to a failed sample under failure_policy='fill'")
    neutral_value: float = Field(0.0, description="score of every sample of an all-failed group under 'neutral' (and 'mask')")
    min_group_success: int = Field(
        2, ge=1, description="failure_policy='mask', trainer strategies: a group with fewer usable (scored) samples "
        "is dropped from training whole"
    )
    max_attempts: int = Field(3, ge=1, description="attempts per request that end in an error, the first included (429/503 are not counted)")
    backoff_initial: float = Field(0.5, gt=0, description="seconds; exponential backoff with full jitter")
    backoff_max: float = Field(30.0, gt=0, description="no wait is longer, whatever Retry-After says (the deadline still wins)")
    requests_per_minute: float | None = Field(None, gt=0)
    tokens_per_minute: float | None = Field(
        None, gt=0, description="per 60 s; a request's tokens: the caller's token_estimator, else ~4 characters a token"
    )
    adaptive_concurrency: bool = Field(
        True, description="on 429/503: pause for Retry-After, probe, ramp back up, and pace at the service's measured rate"
    )
    hook_timeout: float | None = Field(300.0, gt=0, description="seconds for one post_process_scores call; None = bounded by the deadline only")
    max_failure_rate: float = Field(
        0.5, gt=0, le=1, description="fail loudly once more than this share of a ticket's samples (or of the agent's "
        "last max(200, 2 x max_concurrency) samples) failed; 1.0: never"
    )
    max_hung_calls: int = Field(
        1000, ge=1, description="calls still running long after they were given up; past this the agent fails loudly"
    )
    max_throttled_s: float | None = Field(
        600.0, gt=0, description="fail loudly when every answer has been a 429/503 for this long; None = wait forever"
    )
    admission_order: Literal["fifo", "deadline"] = Field(
        "fifo", description="which queued request starts first when the judge's throughput binds: 'fifo', or "
        "'deadline': what the trainer needs first (validation, which the trainer waits for, before training; the older ticket, the caller's rank, "
        "the group closest to completion; engine/admission_order.py)"
    )
    max_passover_s: float = Field(
        30.0, gt=0, allow_inf_nan=False, description="admission_order='deadline': a request queued this long is "
        "promoted, so none is passed over for longer (its wait is then FIFO's)"
    )
    cache: bool = Field(False, description="score identical requests once per run (judges are stochastic: off by default)")
    cache_size: int = Field(100_000, ge=1)
    shared_limits: SharedLimitsConfig | None = Field(
        None, description="share the limits above with other jobs on the Ray cluster naming the same endpoint"
    )
    # Judge operations (cost.py, verdict_log.py).
    price_input_per_million: float | None = Field(None, ge=0, description="money per 1M input tokens (cost figures, money_budget)")
    price_output_per_million: float | None = Field(None, ge=0, description="money per 1M output tokens")
    token_budget: int | None = Field(
        None, gt=0, description="input + output tokens; scoring stops (BudgetExceeded) before a request could cross it"
    )
    money_budget: float | None = Field(None, gt=0, description="the same, in money, with the prices above")
    reserve_output_tokens: int = Field(
        1024, ge=0, description="output tokens reserved per request in flight against a budget (the judge's max_tokens)"
    )
    verdict_log: str | None = Field(None, description="append every settled sample here (JSON lines); resume cache")
    verdict_log_resume: bool = Field(True, description="answer requests already scored in verdict_log from it, not the judge")
    verdict_log_fsync_s: float = Field(1.0, ge=0, description="fsync the verdict log at most this often (and on close)")
    reward_version: str | None = Field(
        None, min_length=1, description="names the reward's version in the verdict log instead of a hash of its source "
        "file: change it when the reward changes what it scores (needed when the code has no source file)"
    )
    verdict_log_accept_reward_change: bool = Field(
        False, description="resume from a verdict log written by another reward (or another version of it), reusing "
        "its answers; without it such a resume is refused at start"
    )
    verdict_log_inputs: bool = Field(
        False, description="also keep what was judged (data source, response, ground truth, extra info; one line per "
        "request) in a sidecar beside verdict_log (RUN.verdicts.jsonl -> RUN.verdicts.inputs.jsonl), so that "
        "`verl-async-rm replay --log` needs no --input"
    )

    judges: tuple[JudgeConfig, ...] | None = Field(
        None, description="an ordered fallback list of judges (engine/fallback.py); None or empty: one judge, the reward as given"
    )
    calibration_share: float = Field(
        0.0, ge=0, le=1, allow_inf_nan=False, description="with judges: this share of the samples the first judge "
        "scores is also scored by the second (never settling them), their agreement reported per step"
    )

    @model_validator(mode="after")
    def _consistent(self) -> AgentConfig:
        if self.judges:
            _check_judges(self)
        if self.calibration_share > 0 and len(self.judges or ()) < 2:
            raise ValueError("calibration_share needs judges: at least two (the second scores a share of the first's samples)")
        if self.ticket_deadline is not None and self.request_timeout is not None:
            if self.ticket_deadline < self.request_timeout:
                raise ValueError(
                    f"ticket_deadline ({self.ticket_deadline}s) is shorter than request_timeout "
                    f"({self.request_timeout}s): no request could ever time out on its own"
                )
        if self.backoff_max < self.backoff_initial:
            raise ValueError(f"backoff_max ({self.backoff_max}) < backoff_initial ({self.backoff_initial})")
        if self.money_budget is not None and not (self.price_input_per_million or self.price_output_per_million):
            raise ValueError("money_budget needs price_input_per_million and/or price_output_per_million (per 1M tokens): "
                             "without prices nothing costs money and the budget would never hold")
        if self.verdict_log is not None:
            _check_log_path(self.verdict_log)
        if self.verdict_log_inputs:
            if self.verdict_log is None:
                raise ValueError("verdict_log_inputs keeps what was judged beside the verdict log: set verdict_log too")
            sidecar = str(inputs_path(self.verdict_log))
            if os.path.isdir(sidecar) or (os.path.exists(sidecar) and not os.access(sidecar, os.R_OK | os.W_OK)):
                raise ValueError(f"verdict_log_inputs: the inputs file {sidecar!r} beside the verdict log exists but "
                                 "cannot be read and written")
        return self

    @property
    def failure(self) -> FailurePolicy:
        """The failure policy as an object: what a failed sample scores, and whether it leaves the loss."""
        return failure_policy(self.failure_policy, fill_value=self.fill_value, neutral_value=self.neutral_value)

    @property
    def budgeted(self) -> bool:
        return self.token_budget is not None or self.money_budget is not None

    @property
    def sync_workers(self) -> int:
        if self.max_workers is not None:
            return self.max_workers
        return self.max_concurrency if self.executor == "thread" else (os.cpu_count() or 1)

    @classmethod
    def from_mapping(cls, values: Mapping | None) -> AgentConfig:
        """Build from a plain or OmegaConf mapping, with one readable error listing every problem."""
        values = dict(values or {})
        try:
            return cls(**values)
        except ValidationError as exc:
            problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'config'}: {e['msg']}" for e in exc.errors())
            raise ValueError(f"invalid async reward agent config: {problems}") from None


def _check_judges(config: AgentConfig) -> None:
    """What a judge list cannot be combined with, refused with the reason (engine/fallback.py)."""
    names = [judge.name for judge in config.judges]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise ValueError(f"judges: duplicate names {duplicates}: each judge needs its own name (logs, metrics, verdict log)")
    if config.cache:
        raise ValueError("judges: cache is not supported with a judge list (a cached answer would hide which judge gave it)")
    if config.shared_limits is not None:
        raise ValueError("judges: shared_limits is not supported with a judge list (each judge has its own limits)")
    if config.budgeted:
        raise ValueError("judges: give each judge its own token_budget/money_budget, not the agent: a spent judge "
                         "moves its samples to the next one")
    for judge in config.judges:
        if judge.money_budget is not None and not (
            (judge.price_input_per_million if judge.price_input_per_million is not None else config.price_input_per_million)
            or (judge.price_output_per_million if judge.price_output_per_million is not None else config.price_output_per_million)
        ):
            raise ValueError(f"judges: {judge.name}: money_budget needs prices (its own or the agent's)")


def _check_log_path(path: str) -> None:
    """A verdict log must be a writable file in an existing folder: found now, not after an hour of judging."""
    if not path.strip():
        raise ValueError("verdict_log is an empty path (null turns the log off)")
    if os.path.isdir(path):
        raise ValueError(f"verdict_log {path!r} is a directory; name a file, e.g. {os.path.join(path, 'verdicts.jsonl')!r}")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise ValueError(f"verdict_log {path!r}: the folder {folder!r} does not exist")
    if os.path.exists(path) and not os.access(path, os.R_OK | os.W_OK):
        raise ValueError(f"verdict_log {path!r} exists but cannot be read and written")
    if not os.path.exists(path) and not os.access(folder, os.W_OK):
        raise ValueError(f"verdict_log {path!r}: the folder {folder!r} is not writable")
