"""verl's own ``colocate_async`` trainer (``python -m verl.trainer.main_ppo``, v1,
``trainer.v1.trainer_mode=colocate_async``) on the CPU backend, for real: partial rollouts aborted at
each sample and resumed after the weight update, verl's async replay buffer (polling fast) deciding
what trains and what is dropped as stale.

Two short runs, two at a time with the rig's other trainers (tests/helpers/rig_runs.py; each ~1 min
on 2 cores, most of it start-up):

* ``partial``: 5 steps with a simulated GPU decode time, so that the next batch is still generating
  when a step samples, and a simulated GPU weight-sync time, so that the aborted requests are re-sent
  before the next batch: they are resumed and reach training spanning two weight versions (verl's
  ``trajectory_spans``);
* ``stale``: ``max_off_policy_threshold=1`` with ``drop``: every group finished under an earlier step is
  dropped (and refilled) instead of trained.

In both: every trained prompt (its uid, from the rollout dump) trains exactly once, as a whole group,
and no rollout fails (before the server's partial rollouts, requests re-submitted after the sleep hit
a sleeping engine and whole groups were evicted as failures)."""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from tests.helpers.rig_runs import ASYNC_STEPS as STEPS
from tests.helpers.rig_runs import BATCH, RESPONSE, N
from tests.helpers.rollout_dump import dump_rows

pytestmark = [pytest.mark.trainer, pytest.mark.slow, pytest.mark.timeout(1200)]


@pytest.fixture(scope="module")
def runs(rig_runs):
    """The two runs (tests/helpers/rig_runs.py: their settings, and the rig's one queue of trainers)."""
    results = {}
    for name in STEPS:
        cfg, result = rig_runs[name]
        assert result.ok, f"{name}: training failed (rc {result.returncode}); log in {cfg.out_dir}"
        results[name] = (Path(cfg.out_dir), result)
    return results


def trained_groups(out: Path) -> dict[int, Counter]:
    """Per step, the prompts trained (uid -> rows), from verl's rollout dump ({uid}_{session}_{output})."""
    steps = {}
    for path in sorted((out / "rollouts").glob("*.jsonl")):
        rows = [row for row in dump_rows(path) if not row["uid"].startswith("pad")]
        assert {row["step"] for row in rows} == {int(path.stem)}
        steps[int(path.stem)] = Counter(row["uid"].rsplit("_", 2)[0] for row in rows)
    return steps


def per_step(result, key: str) -> list[float]:
    return [m["data"].get(key, 0.0) for m in result.metrics if "training/global_step" in m["data"]]


@pytest.mark.parametrize("name", list(STEPS))
def test_every_prompt_trains_once_as_a_whole_group_and_no_rollout_fails(runs, name):
    out, result = runs[name]
    groups = trained_groups(out)
    assert sorted(groups) == list(range(1, STEPS[name] + 1))
    seen: dict[str, int] = {}
    for step, uids in groups.items():
        assert len(uids) == BATCH and set(uids.values()) == {N}, (step, uids)  # whole groups, a batch of them
        for uid in uids:
            assert uid not in seen, f"prompt {uid} trained at steps {seen[uid]} and {step}"
            seen[uid] = step
    assert sum(per_step(result, "training/rollout_failure/evicted_samples")) == 0
    assert not [e for e in result.replica_events() if e["event"] == "generate_while_asleep"]
    assert max(per_step(result, "response_length/max")) <= RESPONSE  # resumed responses keep the length bound


def test_requests_running_at_a_sample_are_aborted_resumed_and_trained_across_two_versions(runs):
    _, result = runs["partial"]
    events = result.replica_events()
    aborts = [e for e in events if e["event"] == "abort"]
    resumed = [e for e in events if e["event"] == "resumed"]
    assert len(aborts) == STEPS["partial"]  # verl aborts at every sample
    aborted = [e["aborted"] for e in aborts]
    assert sum(aborted) > 0 and any(n > 0 for e in aborts for n in e["partial_tokens"])
    # each aborted request is resumed once, after the weight update; the last sample's may be cut by the run's end
    assert sum(aborted) - aborted[-1] <= len(resumed) <= sum(aborted)
    updates = [e["time"] for e in events if e["event"] == "update_weights"]
    assert all(any(u < e["time"] for u in updates[1:]) for e in resumed)
    # verl's own account: trajectories generated across two weight versions reached training
    spans = per_step(result, "training/off_policy/trajectory_spans/max")
    timeline = [(e["event"], e.get("global_steps"), e.get("aborted")) for e in events if e["event"] != "resumed"]
    assert max(spans) == 2, f"spans per step {spans}; replica timeline {timeline}"
    assert sum(per_step(result, "training/off_policy/evicted_samples")) == 0  # threshold 8: nothing stale


def test_groups_older_than_the_threshold_are_dropped_not_trained(runs):
    """``max_off_policy_threshold=1``, ``drop``: a step trains only prompts submitted at that step,
    generated on the weights it started with (verl's staleness: 0), and drops the others."""
    _, result = runs["stale"]
    assert sum(per_step(result, "training/off_policy/evicted_samples")) > 0
    assert max(per_step(result, "training/off_policy/trajectory_staleness_worst/max")) == 0
    _, partial = runs["partial"]
    assert max(per_step(partial, "training/off_policy/trajectory_staleness_worst/max")) >= 1  # where nothing is dropped


def test_the_replica_log_and_metrics_are_readable_after_the_runs(runs):
    """Each run leaves its metrics (one row per step) and its replica log beside its dump."""
    for name, (out, result) in runs.items():
        assert len(per_step(result, "timing_s/step")) == STEPS[name]
        log = Path(result.replica_log_path)
        assert log.exists() and all(json.loads(line)["event"] for line in log.read_text().splitlines())
        assert defaultdict(int, Counter(e["event"] for e in result.replica_events()))["resume_generation"] == STEPS[name]
