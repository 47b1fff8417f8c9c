"""Judge replay: re-judge what a past run judged with another reward, and say how far they agree.

``verl-async-rm replay`` (cli.py) and the drift check during training (``DriftCheck``) share this code:

1. ``judged_samples``: one entry per request of the old verdict log (verdict_log.py), its outcome the
   last success (else the last failure), as a resume would read it; numbered by step as
   ``verl-async-rm log`` numbers them (tickets in order of first appearance).
2. ``select``: all, some steps, or a seeded sample of whole GRPO groups (a group is (step, uid)).
3. ``join_inputs``: a verdict record holds no response text, reference, data source or extra info,
   only ``request``, a hash of the four (``request_key``). So the replay takes the file the old run
   scored (``--input``) and finds each record's row by that hash: exact, and a wrong file cannot
   match by accident. Group judges' requests hash the whole group and cannot be joined (refused).
   Without ``--input``, ``join_logged_inputs`` takes them from the sidecar the run kept beside its
   log (``verdict_log_inputs``; verdict_log.py), by the same hash, each line re-hashed on reading.
4. ``rejudge``: the selected samples through a ``RewardAgent`` of the new reward, one ticket per old
   step (its groups as they were), with the user's limits and budget. It writes its own verdict
   log, so a replay killed half-way resumes without paying twice (the log's resume mechanism), and
   the new scores are read back from that log: the reward's own scores (before the failure policy
   and the group hook, as the old log holds them), the same whether or not the replay was resumed.
5. ``replay_report``: agreement (replay_agreement.py) overall and per step, failures, cost.
"""

from __future__ import annotations

import json
import logging
import math
import random
import re
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Hashable, Mapping, Sequence

from tqdm import tqdm

from verl_async_rm.agent import RewardAgent, as_item
from verl_async_rm.errors import RewardError
from verl_async_rm.replay_agreement import ScorePair, agreement, agreement_by_step
from verl_async_rm.score_file import REFERENCE_KEY, read_items
from verl_async_rm.verdict_log import (
    ReadResult, describe_reward, dumps, inputs_path, read_log, read_logged_inputs, request_key,
)
from verl_async_rm.verdict_report import record_problem, sample_outcomes

_log = logging.getLogger(__name__)

DRIFT_PREFIX = "async_rm/drift/"
# settings the replay owns: its verdict log is what makes it resumable
OWN_SETTINGS = ("verdict_log", "verdict_log_resume", "verdict_log_accept_reward_change")


@dataclass(frozen=True, slots=True)
class JudgedSample:
    """One request of a verdict log, as it ended."""

    step: int  # 1-based: the ticket's place among the log's tickets (records without one: one step)
    ticket: str | None
    uid: Hashable | None
    request: str
    score: float | None  # None: failed
    failure: str | None
    input_tokens: int
    output_tokens: int
    cost: float | None

    @property
    def group(self) -> Hashable:
        """Its GRPO group: the uid within its step; a sample without a uid is a group of its own."""
        return (self.step, self.uid) if self.uid is not None else (self.step, "sample", self.request)


def _hashable_uid(uid):
    # JSON gives a tuple uid back as a list: the same uid, made hashable again
    return uid if uid is None or isinstance(uid, (str, int, float)) else dumps(uid)


def log_rewards(log: ReadResult) -> dict[str, str]:
    """The rewards that answered in ``log``: id -> a line naming it."""
    described = {r.get("reward"): describe_reward(r["reward_identity"], r.get("reward")) for r in log.rewards}
    return {reward: described.get(reward, f"reward id {reward}") for reward in
            dict.fromkeys(r.get("reward") for r in log.records if r.get("stage") is None)}


def judged_samples(log: ReadResult, reward: str | None = None, path: object = "the verdict log") -> list[JudgedSample]:
    """The samples ``reward`` judged in ``log`` (by default its only reward: a log answered by
    several is refused, naming them). One per request: the last success, else the last failure."""
    for number, record in enumerate(log.records, 1):
        problem = record_problem(record)
        if problem is not None:
            raise ValueError(f"{path}: record {number}: {problem}")
    rewards = log_rewards(log)
    if reward is None:
        if None in rewards:
            raise ValueError(f"{path} was written before reward identities were recorded (no 'reward' in its "
                             "records): which reward judged it cannot be told")
        if len(rewards) > 1:
            raise ValueError(f"{path} holds the answers of {len(rewards)} rewards: "
                             + "; ".join(rewards.values()) + ". Name the one to replay with --old-reward ID")
    elif reward not in rewards:
        raise ValueError(f"--old-reward {reward}: no answers of it in {path} (it holds "
                         + ("; ".join(rewards.values()) or "no answers") + ")")
    steps: dict[str | None, int] = {}
    chosen: dict[str, JudgedSample] = {}
    for record in sample_outcomes(log.records):
        if record.get("stage") is not None or (reward is not None and record.get("reward") != reward):
            continue
        step = steps.setdefault(record.get("ticket"), len(steps) + 1)
        failed = record.get("failure") is not None or record.get("score") is None
        request = record.get("request")
        if not isinstance(request, str):
            raise ValueError(f"{path}: a record without a 'request' (key {str(record.get('key'))[:16]}): not a verdict log")
        sample = JudgedSample(step, record.get("ticket"), _hashable_uid(record.get("uid")), request,
                              None if failed else float(record["score"]), record.get("failure") if failed else None,
                              int(record.get("input_tokens") or 0), int(record.get("output_tokens") or 0), record.get("cost"))
        kept = chosen.get(request)
        if kept is None or kept.score is None or sample.score is not None:  # the last success wins
            chosen.pop(request, None)  # re-inserted: the order is that of the outcome kept
            chosen[request] = sample
    return list(chosen.values())


_STEPS = re.compile(r"^\s*(\d+)\s*(?:-\s*(\d+)\s*)?$")


def parse_steps(text: str) -> frozenset[int]:
    """``"3-5,7"`` -> {3, 4, 5, 7}."""
    steps: set[int] = set()
    for part in str(text).split(","):
        match = _STEPS.match(part)
        if match is None:
            raise ValueError(f"expects steps like 3-5,7 (1-based, as `verl-async-rm log` numbers them), got {text!r}")
        first, last = int(match[1]), int(match[2] or match[1])
        if first < 1 or last < first:
            raise ValueError(f"expects steps like 3-5,7 (1-based, ranges low-high), got {text!r}")
        steps.update(range(first, last + 1))
    return frozenset(steps)


@dataclass(frozen=True)
class Selection:
    """Which samples to re-judge: ``steps`` (None: all), then ``groups`` whole groups or a
    ``sample_frac`` share of them, drawn with ``seed``. Validated here, once."""

    steps: frozenset[int] | None = None
    groups: int | None = None
    sample_frac: float | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        if self.groups is not None and self.sample_frac is not None:
            raise ValueError("--groups and --sample-frac both draw groups: give one")
        if self.groups is not None and (isinstance(self.groups, bool) or not isinstance(self.groups, int) or self.groups < 1):
            raise ValueError(f"--groups expects a positive integer, got {self.groups!r}")
        if self.sample_frac is not None and not (0 < self.sample_frac <= 1):
            raise ValueError(f"--sample-frac expects a share in (0, 1], got {self.sample_frac!r}")

    def as_record(self) -> dict:
        return {"steps": sorted(self.steps) if self.steps is not None else None, "groups": self.groups,
                "sample_frac": self.sample_frac, "seed": self.seed}


def select(samples: Sequence[JudgedSample], selection: Selection) -> list[JudgedSample]:
    """The samples to re-judge, in log order: the old successes only (a failure has no score to
    compare with). Steps that are not in the log are an error, naming them."""
    if selection.steps is not None:
        present = {s.step for s in samples}
        absent = sorted(selection.steps - present)
        if absent:
            raise ValueError(f"--steps: the log has no step {', '.join(map(str, absent[:10]))} "
                             f"(it has steps 1-{max(present, default=0)})")
    chosen = [s for s in samples if s.score is not None and (selection.steps is None or s.step in selection.steps)]
    if selection.groups is None and selection.sample_frac is None:
        return chosen
    groups = list(dict.fromkeys(s.group for s in chosen))
    count = selection.groups if selection.groups is not None else max(1, round(selection.sample_frac * len(groups)))
    # sorted by a stable text of the group, so the draw depends on the seed and the log only
    drawn = set(random.Random(selection.seed).sample(sorted(groups, key=dumps), min(count, len(groups))))
    return [s for s in chosen if s.group in drawn]


def join_inputs(samples: Sequence[JudgedSample], input_path: Path, response_key: str = "solution_str",
                ground_truth_key: str = REFERENCE_KEY) -> dict[str, dict]:
    """Each sample's item (what the reward is called with), found in the input file by its request
    key. Refuses (naming the first) samples the file does not hold."""
    _, items = read_items(Path(input_path), response_key, ground_truth_key)
    by_request: dict[str, dict] = {}
    for item in items:
        normal = as_item(item, item["index"])  # the request key hashes the item as the agent sees it
        key = request_key(normal.data_source, normal.solution_str, normal.ground_truth, normal.extra_info)
        by_request.setdefault(key, {k: v for k, v in item.items() if k not in ("index", "uid")})
    missing = [s for s in samples if s.request not in by_request]
    if missing:
        first = missing[0]
        raise ValueError(
            f"--input {input_path}: {len(missing)} of the {len(samples)} selected samples are not in it (the first: "
            f"step {first.step}, uid {first.uid!r}, request {first.request[:16]}). A verdict record keeps only a hash "
            "of what was judged: --input must be the file the old run scored, read with the same --response-key and "
            "--ground-truth-key (a group judge's log cannot be joined: its requests hash whole groups)")
    return by_request


NO_INPUTS = ("keeps no inputs: give --input, the JSON-lines file that run scored, or have the run keep them "
             "(setting verdict_log_inputs=true; in verl reward.async_agent.verdict_log_inputs=true; "
             "`score --set verdict_log_inputs=true`)")


def logged_inputs_of(log_path: Path) -> Path:
    """The sidecar of kept inputs beside ``log_path``; a ValueError saying how to get one if absent."""
    sidecar = inputs_path(log_path)
    if not sidecar.is_file():
        raise ValueError(f"--log {log_path} {NO_INPUTS} (no {sidecar.name} beside it)")
    return sidecar


def join_logged_inputs(samples: Sequence[JudgedSample], log_path: Path) -> dict[str, dict]:
    """Each sample's item from the inputs the run kept beside its log (``verdict_log_inputs``).
    Refuses (naming the first) samples it does not hold, or holds under another hash."""
    sidecar = logged_inputs_of(log_path)
    try:
        kept = read_logged_inputs(sidecar, {s.request for s in samples})
    except ValueError as exc:
        raise ValueError(f"--log {log_path}: its kept inputs: {exc}") from None
    missing = [s for s in samples if s.request not in kept.items]
    if missing:
        first = missing[0]
        changed = sum(s.request in kept.mismatched for s in missing)
        raise ValueError(
            f"--log {log_path}: {len(missing)} of the {len(samples)} selected samples have no kept input in {sidecar} "
            f"(the first: step {first.step}, uid {first.uid!r}, request {first.request[:16]})"
            + (f"; {changed} of them were kept in a form that no longer hashes to their request (a value JSON cannot "
               "hold as it was, e.g. a dict with integer keys)" if changed else "")
            + ". Inputs are kept from when verdict_log_inputs was on, not for a group judge's members; "
            "give --input, the file the run scored, if you have it")
    return kept.items


def step_batches(samples: Sequence[JudgedSample], items: Mapping[str, dict]) -> list[tuple[int, list[dict], dict]]:
    """One batch per old step: (step, items indexed from 0, group sizes by uid). Members keep their
    old uid, so a group judge or a group hook sees the group it saw."""
    steps: dict[int, list[JudgedSample]] = {}
    for sample in samples:
        steps.setdefault(sample.step, []).append(sample)
    batches = []
    for step, members in sorted(steps.items()):
        batch = [{**items[s.request], "uid": s.uid, "index": i} for i, s in enumerate(members)]
        sizes = Counter(s.uid for s in members if s.uid is not None)
        batches.append((step, batch, dict(sizes)))
    return batches


@dataclass
class RejudgeRun:
    error: str | None = None  # why scoring stopped early (the budget, loud failures), else None
    interrupted: bool = False


def rejudge(agent: RewardAgent, batches: Sequence[tuple[int, list[dict], dict]], progress: bool = True) -> RejudgeRun:
    """Score every batch (one ticket each, all submitted at once: the agent's limits span them).
    The scores themselves are read back from the verdict log (see the module docstring)."""
    run = RejudgeRun()
    total = sum(len(batch) for _, batch, _ in batches)
    tickets = [agent.submit(batch, sizes or 1) for _, batch, sizes in batches]
    with tqdm(total=total, unit="sample", desc="re-judging", disable=not progress) as bar:
        try:
            for ticket in tickets:
                while chunk := agent.get(ticket, 64):
                    bar.update(len(chunk))
        except RewardError as exc:
            run.error = f"{type(exc).__name__}: {exc}"
        except KeyboardInterrupt:  # what settled is in the verdict log: a rerun resumes from it
            run.interrupted = True
    return run


def _cost(samples: Sequence[JudgedSample]) -> dict:
    costs = [s.cost for s in samples if s.cost is not None]
    return {"input_tokens": sum(s.input_tokens for s in samples), "output_tokens": sum(s.output_tokens for s in samples),
            "cost": float(math.fsum(costs)) if costs else None}


def replay_report(old: Sequence[JudgedSample], new: Mapping[str, JudgedSample], points: bool = True) -> dict:
    """The agreement of the new judge's answers (by request) with the old samples. ``points``:
    every (step, old, new) for the plot."""
    pairs = [ScorePair(s.step, s.group, s.score, new[s.request].score if s.request in new else None) for s in old]
    answered = [new[s.request] for s in old if s.request in new]
    report = {
        "agreement": agreement(pairs),
        "not_judged": sum(s.request not in new for s in old),
        "failures_by_kind": dict(Counter(n.failure for n in answered if n.score is None).most_common()),
        "steps": agreement_by_step(pairs),
        "cost": {"old": _cost(old), "new": _cost(answered)},
    }
    if points:
        report["points"] = [[p.step, p.old, p.new] for p in pairs]
    return report


@dataclass(frozen=True)
class Selected:
    """What a replay re-judges: the old log's samples, the chosen ones and their items."""

    old_reward: str  # the id of the reward that judged them
    old_reward_described: str
    samples: list[JudgedSample]  # every request of the old reward in the log
    chosen: list[JudgedSample]
    items: dict[str, dict]  # by request

    @property
    def groups(self) -> int:
        return len({s.group for s in self.chosen})


def load_selected(log_path: Path, input_path: Path | None = None, selection: Selection = Selection(),
                  old_reward: str | None = None, response_key: str = "solution_str",
                  ground_truth_key: str = REFERENCE_KEY) -> Selected:
    """Read, select and join (steps 1-3 of the module docstring); every bad input is a ValueError
    naming the argument, raised before anything is sent. ``input_path`` None: the inputs the run
    kept beside its log (``verdict_log_inputs``)."""
    log_path = Path(log_path)
    if not log_path.is_file():
        raise ValueError(f"--log {log_path}: " + ("is a directory; name a verdict log file" if log_path.is_dir() else "no such file"))
    if input_path is None:
        logged_inputs_of(log_path)  # said first: without inputs nothing else about the log matters
    try:
        log = read_log(log_path)
    except ValueError as exc:
        raise ValueError(f"--log {exc}") from None
    if not log.records:
        raise ValueError(f"--log {log_path} holds no verdicts: nothing to replay")
    samples = judged_samples(log, old_reward, f"--log {log_path}")
    chosen = select(samples, selection)
    if not chosen:
        raise ValueError(f"--log {log_path}: no sample selected (of {len(samples)}: "
                         f"{sum(s.score is None for s in samples)} failed; selection {selection.as_record()})")
    rewards = log_rewards(log)
    reward = old_reward if old_reward is not None else next(iter(rewards))
    items = join_logged_inputs(chosen, log_path) if input_path is None else \
        join_inputs(chosen, input_path, response_key, ground_truth_key)
    return Selected(reward, rewards[reward], samples, chosen, items)


@dataclass(frozen=True)
class Rejudged:
    new: dict[str, JudgedSample]  # the new reward's outcome by request (absent: not judged)
    new_reward_described: str
    run: RejudgeRun
    resumed: int  # answered from the replay's verdict log, not sent


def rejudge_into_log(make_agent: Callable[[dict], RewardAgent], config: Mapping, batches, replay_log: Path,
                     resume: bool = True, progress: bool = True) -> Rejudged:
    """``rejudge`` through an agent writing ``replay_log``, then the new outcomes read back from it
    (the reward's own scores, as the old log holds them). ``resume``: answer from it what it holds."""
    given = [key for key in OWN_SETTINGS if key in config]
    if given:
        raise ValueError(f"--set {given[0]}: the replay keeps its own verdict log (--verdict-log) and resumes it")
    agent = make_agent({**config, "verdict_log": str(replay_log), "verdict_log_resume": resume})
    try:
        run = rejudge(agent, batches, progress)
        resumed = agent.metrics().get("resumed", 0)
    finally:
        agent.close()
    log = read_log(replay_log)
    reward = log.rewards[-1]["reward"]  # the agent wrote its reward record last when it opened the log
    answered = log_rewards(log)
    new = {s.request: s for s in judged_samples(log, reward, replay_log)} if reward in answered else {}
    return Rejudged(new, describe_reward(log.rewards[-1]["reward_identity"], reward), run, resumed)


def replay(
    log_path: Path,
    input_path: Path | None,
    reward_path: str,
    reward_name: str,
    replay_log: Path,
    *,
    selection: Selection = Selection(),
    old_reward: str | None = None,
    config: Mapping | None = None,
    reward_kwargs: Mapping | None = None,
    response_key: str = "solution_str",
    ground_truth_key: str = REFERENCE_KEY,
    progress: bool = True,
    on_selected: Callable[[Selected], None] | None = None,
) -> dict:
    """Re-judge the selected samples of the verdict log at ``log_path`` with the reward in
    ``reward_path``; returns the report. ``input_path`` None: the inputs kept beside the log. Bad input is refused before the agent is built (nothing
    paid for). ``replay_log``: the new reward's verdict log; an existing one is resumed (it must be
    this reward's, as any resume: ``RewardChanged`` otherwise). ``on_selected``: told the selection
    before the first request. The report's ``run`` holds what differs between two runs of the same
    replay (paths, what was resumed); the rest is the same whether it was interrupted or not."""
    selected = load_selected(log_path, input_path, selection, old_reward, response_key, ground_truth_key)
    if on_selected is not None:
        on_selected(selected)
    batches = step_batches(selected.chosen, selected.items)
    rejudged = rejudge_into_log(
        lambda settings: RewardAgent.from_file(reward_path, reward_name, settings, reward_kwargs=reward_kwargs),
        dict(config or {}), batches, Path(replay_log), progress=progress)
    return {
        "old_reward": selected.old_reward_described,
        "new_reward": rejudged.new_reward_described,
        "selection": {**selection.as_record(), "samples_selected": len(selected.chosen), "groups_selected": selected.groups,
                      "old_failed_skipped": sum(s.score is None for s in selected.samples
                                                if selection.steps is None or s.step in selection.steps)},
        **replay_report(selected.chosen, rejudged.new),
        "run": {"log": str(log_path), "input": str(input_path if input_path is not None else inputs_path(log_path)),
                "replay_log": str(replay_log),
                "resumed": rejudged.resumed, "error": rejudged.run.error, "interrupted": rejudged.run.interrupted},
    }


class DriftCheck:
    """The replay during training: a fixed calibration set (samples and their old scores, e.g.
    ``load_selected(...)`` of a past run's log) re-judged every ``every_n_steps`` steps, its agreement
    returned as verl metrics (``async_rm/drift/spearman``, ...). A drifting judge (a hosted model
    updated under the same name, a changed prompt) shows as falling agreement long before it shows
    in the reward curve. Each check asks the judge afresh (its own agent and a fresh verdict log, no
    cache): an answer from a log or cache would hide exactly the drift it looks for.

    >>> check = DriftCheck(load_selected(log, inputs, Selection(groups=16)), make_agent, every_n_steps=50)
    >>> metrics.update(check(step))          # {} on the steps between checks
    """

    METRICS = ("pearson", "spearman", "mean_abs_diff", "ranking_agreement", "sign_agreement")

    def __init__(self, calibration: Selected, make_agent: Callable[[dict], RewardAgent], every_n_steps: int,
                 config: Mapping | None = None, workdir: Path | None = None):
        """``make_agent(settings)``: a RewardAgent of the judge with these settings (``config`` plus the
        check's own verdict log), e.g. ``lambda s: RewardAgent.from_file(path, name, s)``."""
        if isinstance(every_n_steps, bool) or not isinstance(every_n_steps, int) or every_n_steps < 1:
            raise ValueError(f"every_n_steps must be a positive integer, got {every_n_steps!r}")
        config = dict(config or {})
        if config.get("cache"):
            raise ValueError("a drift check must ask the judge afresh: cache=true would answer from the first check")
        self.calibration = calibration
        self.batches = step_batches(calibration.chosen, calibration.items)
        self.make_agent = make_agent
        self.every_n_steps = every_n_steps
        self.config = config
        self.workdir = workdir
        self.checks = 0

    def due(self, step: int) -> bool:
        return step % self.every_n_steps == 0

    def __call__(self, step: int) -> dict[str, float]:
        """The metrics at ``step`` if a check is due, else {}. An undefined figure is NaN (verl's
        metrics are floats)."""
        if not self.due(step):
            return {}
        with tempfile.TemporaryDirectory(dir=self.workdir, prefix="drift-check-") as folder:
            rejudged = rejudge_into_log(self.make_agent, self.config, self.batches, Path(folder) / "verdicts.jsonl",
                                        resume=False, progress=False)
        self.checks += 1
        figures = replay_report(self.calibration.chosen, rejudged.new, points=False)["agreement"]
        metrics = {DRIFT_PREFIX + name: math.nan if figures[name] is None else float(figures[name]) for name in self.METRICS}
        metrics[DRIFT_PREFIX + "not_compared"] = float(figures["not_compared"])
        if rejudged.run.error is not None:  # a check must not stop training: the failures are in not_compared
            _log.warning("drift check at step %d stopped early: %s", step, rejudged.run.error)
        return metrics


def write_report(report: dict, path: Path) -> None:
    """JSON with NaN written as null (strict JSON readers refuse NaN)."""
    def plain(value):
        if isinstance(value, float) and not math.isfinite(value):
            return None
        if isinstance(value, dict):
            return {k: plain(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [plain(v) for v in value]
        return value

    Path(path).write_text(json.dumps(plain(report), indent=1) + "\n")


def _fmt(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return "nan" if math.isnan(value) else f"{value:.3f}"
    return str(value)


STEP_COLUMNS = ("step", "compared", "not_compared", "pearson", "spearman", "mean_abs_diff", "ranking_agreement",
                "sign_agreement", "mean_old", "mean_new")


def render_replay(report: dict) -> str:
    """The summary table printed on stdout: the totals, then one row per step."""
    total = report["agreement"]
    lines = [f"replay: {report['selection']['samples_selected']} samples in {report['selection']['groups_selected']} groups",
             f"  old: {report['old_reward']}", f"  new: {report['new_reward']}"]
    for name in ("compared", "not_compared", "pearson", "spearman", "mean_abs_diff", "exact_agreement",
                 "ranking_agreement", "sign_agreement", "groups_ranked", "mean_old", "mean_new"):
        lines.append(f"  {name:<18} {_fmt(total[name])}")
    for side in ("old", "new"):
        cost = report["cost"][side]
        lines.append(f"  {side + ' cost':<18} {cost['input_tokens']} input + {cost['output_tokens']} output tokens"
                     + ("" if cost["cost"] is None else f", {cost['cost']:.4g}"))
    if report["failures_by_kind"]:
        lines.append("  new failures       " + ", ".join(f"{k}: {v}" for k, v in report["failures_by_kind"].items()))
    if report["not_judged"]:
        lines.append(f"  not judged         {report['not_judged']} (the replay stopped first)")
    lines.append("per step:")
    rows = [[_fmt(step[c]) for c in STEP_COLUMNS] for step in report["steps"]]
    widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(STEP_COLUMNS)]
    lines.append("  " + "  ".join(c.rjust(w) for c, w in zip(STEP_COLUMNS, widths)))
    lines += ["  " + "  ".join(v.rjust(w) for v, w in zip(row, widths)) for row in rows]
    return "\n".join(lines)
