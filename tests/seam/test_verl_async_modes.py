"""``async_agent`` on verl's own v1 trainer modes, through verl's STOCK entry point (``python -m
verl.trainer.main_ppo``, the stock command plus ``async_agent``), on the CPU backend, with rollout
sessions that fail (issue 43 item 2, issue 45 item 16).

The runs (tests/helpers/verl_modes.py; the session fixture ``verl_modes_runs``, shared with
tests/seam/test_legacy_training.py, whose legacy spelling the ``sync`` run uses):

- ``sync``: verl trains a group without its failed session;
- ``colocate_async`` (verl's 2 s-poll sampler): verl evicts a group with a failed session and
  replaces it with a fresh prompt;
- ``off_policy``: ``python -m verl_async_rm.main_ppo ... off_policy_steps=1``, the recipe's flag alone,
  which runs as verl's colocate_async with the agent: every test here holds for it as for the stock run;
- ``budget``: a colocate_async run whose token budget is spent mid-run.

Checked from what verl trained (its rollout dump), what the reward saw (its call log), the groups
its hook saw, the verdict log and the judge's own counts.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from pathlib import Path

import pytest

from tests.helpers import session_probe
from tests.helpers.verl_modes import (
    BUDGET_STEPS,
    BUDGET_TOKENS,
    CAP,
    OFF_POLICY,
    N,
    PROMPTS,
    RPM,
    RUNS,
    read_jsonl,
    trained,
    training_calls,
)
from verl_async_rm.limits import rate_bound
from verl_async_rm.ray_agent import DEFAULT_ACTOR_NAME

pytestmark = [pytest.mark.trainer, pytest.mark.slow, pytest.mark.timeout(2400)]

# The agent's bucket admits at most rate_bound(RPM, w) requests in any w s of its own clock; the judge
# sees each arrive after the agent sent it, later by however long the loaded machine takes to run the
# reward's HTTP call (20 in 1.0 s at the judge against a bound of 19.8, seen at a load of 57 on 2
# cores). A second of slack; limits per reward-loop worker (three) would exceed it threefold.
ARRIVAL_JITTER_S = 1.0


@pytest.fixture(scope="module")
def runs(verl_modes_runs):
    return verl_modes_runs


@pytest.mark.parametrize("mode", list(RUNS))
def test_every_sample_is_answered_once_with_its_own_score_in_groups_of_their_real_size(runs, mode):
    out, result, _ = runs[mode]
    assert result.ok, f"training failed or timed out (rc {result.returncode}); log in {out}"
    calls = training_calls(out)
    probes = Counter(call["probe"] for call in calls)
    assert probes and max(probes.values()) == 1  # every sample reached the reward (and the judge) once
    failed = {call["probe"] for call in calls if call["failed"]}
    scored_sessions = Counter(probe.rsplit("_", 1)[0] for probe in probes)  # uid -> sessions that reached it

    # Groups as the agent formed them: the group hook's scores name their samples (a failed one has the
    # mean of its group's others); each group is one uid's, whole: every session of it that was scored;
    # a validation prompt's (val n=1), one sample. (colocate_async: prompts still in flight when the run
    # ends have no group yet.)
    every_call = read_jsonl(out / "calls.jsonl")
    named_by = {round(session_probe.identity(c["probe"]), 12): c["probe"] for c in every_call if not c["failed"]}
    hooked: Counter = Counter()
    for scores in read_jsonl(out / "hooks.jsonl"):
        named = [named_by[round(s, 12)] for s in scores if round(s, 12) in named_by]
        if not named:
            continue  # every member failed: nothing names the group
        groups = {p if p.startswith(session_probe.VALIDATION) else p.rsplit("_", 1)[0] for p in named}
        assert len(groups) == 1, f"a group mixed prompts: {named}"
        group = groups.pop()
        assert len(scores) == (1 if group.startswith(session_probe.VALIDATION) else scored_sessions[group])
        hooked[group] += 1
    assert hooked and max(hooked.values()) == 1  # no prompt's samples split over two groups
    assert (mode == "sync") == any(g.startswith(session_probe.VALIDATION) for g in hooked)

    steps = trained(out)
    assert sorted(steps) == list(range(1, RUNS[mode] + 1))
    seen_uids: set = set()
    sizes: Counter = Counter()
    for rows in steps.values():
        rows_of = defaultdict(list)
        for row in rows:
            probe, index = row["uid"].rsplit("_", 1)  # verl's key {uid}_{session}_{output}
            assert index == "0" and probe in probes
            rows_of[probe.rsplit("_", 1)[0]].append((probe, row))
        assert len(rows_of) == PROMPTS and not seen_uids & set(rows_of)  # each prompt trained once
        seen_uids |= set(rows_of)
        for uid, members in rows_of.items():
            assert len(members) == scored_sessions[uid]  # every session the reward answered
            assert hooked[uid] == 1 or all(p in failed for p, _ in members)
            sizes[len(members)] += 1
            ok = [session_probe.identity(p) for p, _ in members if p not in failed]
            for probe, row in members:  # its own answer: nobody else's, a failed one the group's mean
                expected = sum(ok) / len(ok) if probe in failed and ok else 0.0 if probe in failed else session_probe.identity(probe)
                assert row["score"] == pytest.approx(expected, abs=1e-6)
    if mode == "sync":  # verl trains a group without its failed session: both sizes occur
        assert set(sizes) == {N - 1, N}
    else:  # verl evicted every group with a failed session and trained fresh prompts instead
        assert set(sizes) == {N}
        evicted = [v for _, v in result.series("training/rollout_failure/evicted_samples")]
        assert sum(evicted) > 0
    assert failed, "no injected reward failure reached training"


@pytest.mark.parametrize("mode", list(RUNS))
def test_every_settled_sample_is_in_the_verdict_log_once_under_verls_uid(runs, mode):
    out, result, _ = runs[mode]
    assert result.ok
    calls = training_calls(out)
    verdicts = [r for r in read_jsonl(out / "verdicts.jsonl") if "key" in r]  # not the reward's identity records
    assert len({v["key"] for v in verdicts}) == len(verdicts) <= len(read_jsonl(out / "calls.jsonl"))  # once each
    logged = Counter(v["uid"] for v in verdicts)
    failures = Counter(v["uid"] for v in verdicts if v["failure"])
    for rows in trained(out).values():  # every trained sample's verdict, under verl's uid, failures as such
        for uid in {row["uid"].rsplit("_", 2)[0] for row in rows}:
            mine = [c for c in calls if c["probe"].rsplit("_", 1)[0] == uid]
            assert logged[uid] == len(mine) and failures[uid] == sum(c["failed"] for c in mine)


@pytest.mark.parametrize("mode", list(RUNS))
def test_the_cap_and_rate_limit_hold_for_verls_reward_loop_workers_together(runs, mode):
    """Three reward-loop worker processes share the one agent actor: the judge never sees more than
    the cap in flight (and does see it: the demand is there), nor more than the limit in any window."""
    out, result, stats = runs[mode]
    assert result.ok
    calls = read_jsonl(out / "calls.jsonl")
    assert stats.peak_in_flight == CAP
    # one answered judge request per sample (the reward logs each answer: a sample judged twice shows as a
    # duplicate in its log, asserted above); colocate_async ends with up to the cap's answers in flight,
    # answered by the judge after the trainer's processes stopped
    assert len(calls) <= stats.outcomes["ok"] <= len(calls) + CAP
    for window in (1.0, 5.0, 20.0):  # the agent admits by its clock; requests reach the judge a little later
        assert stats.max_requests_in_window(window) <= rate_bound(RPM, window + ARRIVAL_JITTER_S)


def test_a_spent_budget_ends_a_colocate_async_run_with_the_agents_reason(runs):
    """The budget is spent mid-run: every later reward is refused, which on verl's per-sample path only
    fails its rollout session, and colocate_async answers a failed session by evicting its group and
    dispatching a fresh prompt, whose reward is refused in turn. The run must end, loudly, with the
    agent's reason (at the trainer's next dispatch), not regenerate until its timeout."""
    out, result, _ = runs["budget"]
    log = Path(result.log_path).read_text()
    assert result.returncode not in (0, -9), f"rc {result.returncode} (-9: timed out); log in {out}"
    assert "async_agent stopped scoring (BudgetExceeded: " in log and f"token_budget {BUDGET_TOKENS}" in log
    assert len(trained(out)) < BUDGET_STEPS


@pytest.mark.parametrize("mode", list(RUNS))
def test_every_reward_call_ran_in_the_agents_actor(runs, mode):
    """verl's reward-loop workers hand every sample to the one agent actor (with verl's own manager,
    or with the legacy selector ignored, they would score in their own processes, or not call this reward)."""
    out, result, _ = runs[mode]
    assert result.ok
    calls = read_jsonl(out / "calls.jsonl")
    assert calls and {call["actor"] for call in calls} == {DEFAULT_ACTOR_NAME}


def test_off_policy_steps_alone_on_v1_trains_as_verls_colocate_async_at_most_one_step_stale(runs):
    """The recipe's ``off_policy_steps=1`` on v1 is verl's colocate_async with the agent (said at start),
    not this package's trainer (which logs ``async_reward/*``): verl's own account of every trained
    sample's worst staleness is at most the one step the flag allows, and some sample is that stale."""
    out, result, _ = runs[OFF_POLICY]
    assert result.ok
    assert "runs as verl's own colocate_async mode with the agent" in Path(result.log_path).read_text()
    worst = [v for _, v in result.series("training/off_policy/trajectory_staleness_worst/max")]
    assert len(worst) == RUNS[OFF_POLICY] and max(worst) == 1, worst
    assert not [key for m in result.metrics for key in m["data"] if key.startswith("async_reward/")]
