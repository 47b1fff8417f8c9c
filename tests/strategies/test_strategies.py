"""The strategies on verl's real trainers (CPU backend; v0, and v1's async_reward mode), looking
where the seam's bugs live. Each run checks several properties at once (a run costs ~45 s of start-up).

Every run: GRPO on the toy task, 8 prompts x 4 samples per step, 4 PPO mini-batches per step, a
warm-up LR schedule (a scheduler stepped once per mini-batch would show), verl's rollout dump, rewards
through the async_agent manager with ``tests/helpers/seam_reward.py`` (the toy reward, reporting
whether it saw what verl's naive manager passes a reward). The baselines are verl's stock trainers
(strategies off: ``main_ppo`` hands the config to verl's own TaskRunner; rewards on the per-sample path).

| run | what it adds |
|---|---|
| v0 baseline | deterministic rollout; validation (before training and every 8 steps) of 15 prompts on 2 agent-loop workers, so verl pads it; checkpoints every 2 steps |
| v0 pipeline | 4 steps: the baseline's config, plus the pipeline in verl's own mini-batch order: equal parameters |
| v0 both | deterministic rollout and verl's mini-batch order (the run does not depend on timing, so the learning comparison with the baseline is reproducible); pipeline, two steps ahead, rollout correction (token IS), ppo_epochs=2 with shuffle, parameter and optimizer offload, injected reward failures (~10%) masked out of training (``failure_policy=mask``), the padded validation |
| v0 gae | 8 steps: pipeline (completion order) and one step ahead with a critic whose mini-batch (4 prompts) does not divide the actor's (2); KL in the reward with an adaptive controller; resumed from a checkpoint taken with a batch in flight |
| v0 baseline_e2 / pipeline_e2 | 2 steps, ppo_epochs=2: equal parameters |
| v1 baseline, pipeline | v1's mode; the baseline validates every 2 steps on the per-sample path; the pipeline with ~20% injected reward failures masked out of training (``failure_policy=mask``) (``off_policy_steps=1`` alone is verl's colocate_async: tests/helpers/verl_modes.py) |
| v1 both | pipeline + off-policy on an agent loop with two outputs per session, per-prompt ``__rollout_n__`` and failing sessions; validation before training |
| v1 pool_drop, pool_wait_auto, pool_auto_bound, pool_shapes, pool_shapes_submitted | the staleness pool (POOLS, below) |
| resumes | v0 gae from step 6, v1 both, pool_shapes and pool_auto_bound from step 2 (RESUMES) |

All of them run in one queue, two at a time (the ``trained`` fixture), each resume once its run has
ended, every one through the light driver (LIGHT_DRIVER).
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from tests.conftest import HELPERS, ROOT
from tests.helpers import multi_output_loop
from tests.helpers.trainer_queue import QueuedRun, run_queue
from tests.helpers.rollout_dump import dump_rows
from tests.helpers.seam_reward import fails
from verl_async_rm_rig.cpu_backend.launch import CPURunConfig, prepare_assets, start
from verl_async_rm_rig.cpu_backend.toy_task import score_text, write_dataset

# The first test's setup runs the module's shared fixture (trained): every run of the module, 19
# trainers (10 RUNS, 5 POOLS, 4 RESUMES: ORDER), two at a time (train_together; ~1 min each on 2 idle
# cores), more than the suite's 900 s per-test timeout allows.
pytestmark = [pytest.mark.trainer, pytest.mark.slow, pytest.mark.timeout(2400)]

STEPS = {"v0": 16, "v1": 4}
RUNS_AT_ONCE = 2  # trainers alive at a time in the shared fixture (train_together)
REWARD = str(HELPERS / "seam_reward.py")
TOY = str(Path(ROOT) / "rig" / "verl_async_rm_rig" / "cpu_backend" / "toy_task.py")
SHAPE = [
    "actor_rollout_ref.actor.ppo_mini_batch_size=2",  # 8 prompts / 2 = 4 mini-batches per step
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
    "actor_rollout_ref.actor.optim.lr_warmup_steps=3",
    f"reward.custom_reward_function.path={REWARD}",
    "+reward.async_agent.extra_keys=[saw_inputs]",
    "reward.async_agent.group_wait=30",  # a timer-based wait on the per-sample path would show in validation
]
NO_FAILURES = ["+reward.custom_reward_function.reward_kwargs={fail:false}"]
MASK = ["reward.async_agent.failure_policy=mask", "reward.async_agent.min_group_success=2"]
MASK_FAIL_SHARE = 0.2  # the v1 pipeline run: a fifth of the rewards raise, and are masked
PADDED_VALIDATION = ["actor_rollout_ref.rollout.agent.num_workers=2"]  # with the 15-prompt validation set
# The toy reward is instant and scored while generating, so every batch would be scored before its
# training starts and trained whole (nothing to overlap: the scheduler's shortcut, tested in
# tests/strategies/test_seam_scheduler.py); these runs test the pipeline itself, so it splits them anyway.
PIPELINE, INDEX_ORDER = ["mini_batch_pipeline=true", "+split_scored_batches=true"], ["+mini_batch_order=index"]
CRITIC = ["algorithm.adv_estimator=gae", "critic.strategy=fsdp2", "critic.model.use_remove_padding=false",
          "critic.model.enable_gradient_checkpointing=false", "+critic.model.override_config.attn_implementation=eager",
          "critic.fsdp.use_torch_compile=false", "critic.fsdp.model_dtype=fp32", "critic.fsdp.seed=0",
          "+critic.fsdp.mixed_precision={param_dtype:fp32,reduce_dtype:fp32,buffer_dtype:fp32}",
          "critic.optim.lr=1e-3", "critic.optim.lr_warmup_steps=3", "critic.ppo_micro_batch_size_per_gpu=8"]
ADAPTIVE_KL = {"kl_coef": 0.05, "target_kl": 0.001, "horizon": 100}
RUNS = {
    ("v0", "baseline"): dict(flags=[*NO_FAILURES, *PADDED_VALIDATION], deterministic=True, validate=True, save_freq=2),
    # 4 steps, not 16: its parameters equal the baseline's at step 4 (through the lr warm-up), which
    # proves more than a rise of the toy reward would (test_pipeline_in_verls_mini_batch_order...)
    ("v0", "pipeline"): dict(flags=[*NO_FAILURES, *PADDED_VALIDATION, *PIPELINE, *INDEX_ORDER], deterministic=True,
                             validate=True, steps=4, save_freq=2),
    ("v0", "both"): dict(flags=[*PADDED_VALIDATION, *PIPELINE, "off_policy_steps=2", "+algorithm.rollout_correction.rollout_is=token",
                                "actor_rollout_ref.actor.ppo_epochs=2", "actor_rollout_ref.actor.shuffle=true",
                                "actor_rollout_ref.actor.fsdp_config.param_offload=true",
                                "actor_rollout_ref.actor.fsdp_config.optimizer_offload=true", *MASK, *INDEX_ORDER],
                    # The learning test compares this one run with the baseline, so the run must not
                    # depend on timing. Sampled rollouts: the 16-step rise varied 0.03-0.10 between runs
                    # (baseline 0.135). Deterministic rollouts trained in completion order (which
                    # mini-batch is scored first) still diverged from step 5: 0.142, 0.133, 0.126,
                    # 0.044. Deterministic and in index order: 0.127 in each of 3 runs.
                    validate=True, deterministic=True),
    ("v0", "gae"): dict(flags=[*NO_FAILURES, *PIPELINE, "off_policy_steps=1", *CRITIC, "critic.ppo_mini_batch_size=4",
                               "algorithm.use_kl_in_reward=true", "algorithm.kl_ctrl.type=adaptive",
                               "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=8",
                               *[f"algorithm.kl_ctrl.{k}={v}" for k, v in ADAPTIVE_KL.items()]], critic=True,
                    # 8 steps, not 16: the critic's and the KL controller's checks hold from the third step on
                    # (after the lr warm-up), and the resume from step 6 has a batch in flight as from 14
                    steps=8, save_freq=6),
    ("v0", "baseline_e2"): dict(flags=[*NO_FAILURES, "actor_rollout_ref.actor.ppo_epochs=2"], deterministic=True, steps=2, save_freq=2),
    # The pipeline as users run it (no split_scored_batches): some responses answer 6 s late, so a
    # step starts with mini-batches scored and others not; those found scored share an update call.
    ("v0", "pipeline_merged"): dict(flags=["reward.custom_reward_function.name=slow_some", "mini_batch_pipeline=true",
                                           *INDEX_ORDER], deterministic=True, steps=2, save_freq=2),
    ("v0", "pipeline_e2"): dict(flags=[*NO_FAILURES, "actor_rollout_ref.actor.ppo_epochs=2", *PIPELINE, *INDEX_ORDER],
                                deterministic=True, steps=2, save_freq=2),
    ("v1", "baseline"): dict(flags=[*NO_FAILURES, "trainer.test_freq=2"], validate=True),
    ("v1", "pipeline"): dict(flags=[f"+reward.custom_reward_function.reward_kwargs={{fail_share:{MASK_FAIL_SHARE}}}", *MASK,
                                    *PIPELINE], fail_share=MASK_FAIL_SHARE),
    # (off_policy_steps=1 alone on v1 is verl's colocate_async with the agent: tests/helpers/verl_modes.py)
    ("v1", "both"): dict(flags=[*NO_FAILURES, *PIPELINE, "off_policy_steps=1",
                                "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8"], multi_output=True, validate=True),
}
STRATEGY_RUNS = [r for r in RUNS if not r[1].startswith("baseline")]
# The staleness pool's flags, which every pool run below starts from: one batch ahead, fed while generating;
# a wide latency spread (0-6 s per sample, a group's is its slowest) so that some group is still out when
# its step begins.
POOL = dict(flags=["off_policy_steps=1", "max_staleness=1", f"reward.custom_reward_function.path={TOY}",
                   "reward.custom_reward_function.name=compute_score_with_latency",
                   "+reward.custom_reward_function.reward_kwargs={latency_lo:0.0,latency_hi:6.0,fail:false}"])
# The same pool with max_staleness=0, on_stale=drop and auto lookahead: a group not scored by its own
# step is dropped whenever the step can be filled without it, so drops are the rule here, and the
# supply batches that refill the pool (staleness_pool.py, "Supply") run in a real trainer. The auto rule wants
# more than one batch ahead for 0-6 s latencies; the supply takes no more than the staleness bound
# can train in time (one batch ahead + 0; deeper supply: tests/strategies/test_pool.py).
POOL_DROP = dict(flags=[*[f for f in POOL["flags"] if not f.startswith(("max_staleness", "off_policy_steps"))],
                        "off_policy_steps=auto", "max_staleness=0", "on_stale=drop"])
# The waiting pool with auto lookahead: the supply keeps it as deep as the rule says within the
# bound (1 ahead + 1, staleness_pool.supply_lookahead) and no group is dropped (staleness_pool.py, "Deadlines").
POOL_WAIT_AUTO = dict(flags=[*[f for f in POOL["flags"] if not f.startswith("off_policy_steps")], "off_policy_steps=auto"])
# Both bounds automatic: max_staleness=auto raises the bound after each step to ceil(ticket_deadline /
# median step compute) (staleness_pool.auto_staleness_bound). The deadline counts from the ticket's opening (generation
# start; the first generation warms up for seconds), so 60 s outlasts every 0-6 s call, also for a resumed run's
# first batch beside another trainer on a loaded machine: 20 s, at load ~30, did not (19 of 32 calls missed it,
# and the pair trained alone); its first step took 24 s beside another trainer at load ~20. In the queue with
# the others the pair costs ~30 s less of CI; a longer deadline costs nothing while no call misses it (every
# assertion on the bound is relative to it).
POOL_AUTO_BOUND = dict(flags=[*[f for f in POOL_WAIT_AUTO["flags"] if not f.startswith("max_staleness")], "max_staleness=auto",
                              "reward.async_agent.request_timeout=60", "reward.async_agent.ticket_deadline=60"])
# The pool on every batch shape verl's v1 trainer trains on (issue 43): the multi-output loop (two
# outputs per session, per-prompt __rollout_n__ of 2 or 4, one failing session in every fourth prompt)
# on a data set where every session of another fourth of the prompts fails (verl's sampler keeps such
# a prompt, with no rows); max_staleness=1, one batch ahead, 0-6 s latency per sample.
POOL_SHAPES = dict(flags=[*POOL["flags"], "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8"],
                   multi_output=True, rowless=True)
# The same batches submitted when generation ends (one ticket per group size) instead of scored while generating.
POOL_SHAPES_SUBMITTED = dict(POOL_SHAPES, flags=[*POOL_SHAPES["flags"], "stream_rewards=false"])
POOLS = {"pool_drop": POOL_DROP, "pool_wait_auto": POOL_WAIT_AUTO, "pool_auto_bound": POOL_AUTO_BOUND,
         "pool_shapes": POOL_SHAPES, "pool_shapes_submitted": POOL_SHAPES_SUBMITTED}
MASKED_RUNS = [r for r in RUNS if set(MASK) <= set(RUNS[r]["flags"])]
# Every run through the light driver (cpu_backend/light_driver.py): verl's TaskRunner (the stock one
# for the baselines, ours for the strategies) in a host actor, with the ray.init, environment and
# runner class verl's driver would give it (tests/rig/test_light_driver.py), without importing verl in
# the driver process: ~6 CPU-s less a run, 19 runs on 2 cores. Our entry point's usual driver trains
# with the strategies in tests/seam/test_group_judge_training.py and bench/e2e.py --quick
# (tests/benchmarks/test_e2e_report.py); verl's own entry point in tests/seam and tests/rig.
LIGHT_DRIVER = True
# The checkpoints of a run (by trainer, unless the run has its own): save_freq's multiples and the last step
SAVED = {"v0": (14, 16), "v1": (2, 4), ("v0", "gae"): (6, 8), ("v0", "pipeline"): (2, 4)}
RESUME_FROM = {("v0", "gae"): 6, ("v1", "both"): 2}


def steps_of(run: tuple) -> int:
    return RUNS[run].get("steps", STEPS[run[0]])


def saved_of(run: tuple) -> tuple:
    return SAVED.get(run, SAVED[run[0]])


def run_config(out_dir: Path, assets: dict, trainer: str, mode: str, *overrides: str) -> CPURunConfig:
    spec = POOLS[mode] if trainer == "v1" and mode in POOLS else RUNS[trainer, mode]
    extra = [f"critic.model.path={assets['cfg'].model_dir}"] if spec.get("critic") else []
    train_file = assets["cfg"].train_file
    if spec.get("multi_output"):
        train_file = assets["multi_output_rowless_data" if spec.get("rowless") else "multi_output_data"]
        extra.append(f"actor_rollout_ref.rollout.agent.agent_loop_config_path={assets['loops']}")
    validate = spec.get("validate", False)
    if validate and trainer == "v0":
        extra.append("trainer.test_freq=8")
    return CPURunConfig(
        out_dir=str(out_dir), trainer=trainer, steps=spec.get("steps", STEPS[trainer]), entry_module="verl_async_rm.main_ppo",
        model_dir=assets["cfg"].model_dir, train_file=train_file, val_file=assets["val15"],
        reward_manager="async_agent", val_before_train=validate, light_driver=LIGHT_DRIVER,
        save_freq=spec.get("save_freq", 2 if trainer == "v1" else 14), deterministic=spec.get("deterministic", False),
        timeout_s=600, v1_poll_interval_s=0.05, extra_env={"PYTHONPATH": str(ROOT)},  # Ray workers import the test loop
        extra_overrides=[*SHAPE, f"trainer.rollout_data_dir={out_dir / 'rollouts'}", *spec["flags"], *extra, *overrides],
    )


def train_together(jobs: dict, assets: dict, at_once: int = RUNS_AT_ONCE) -> dict:
    """Run ``jobs`` (key -> (out_dir, trainer, mode, overrides, after, alone)) in one queue of trainers
    (tests/helpers/trainer_queue.py: ``at_once`` alive, a resume after its run, an ``alone`` one with no
    other alive); returns key -> its RunResult (None: not started, its ``after`` failed). A failed run
    does not stop the others: the tests that read it fail (:func:`finished`)."""
    return run_queue({key: QueuedRun(lambda out_dir=out_dir, trainer=trainer, mode=mode, overrides=overrides:
                                     run_config(out_dir, assets, trainer, mode, *overrides), after, alone)
                      for key, (out_dir, trainer, mode, overrides, after, alone) in jobs.items()},
                     lambda cfg: start(cfg, progress=False), at_once=at_once)


def finished(trained: dict, key) -> tuple[Path, Any]:
    """(out_dir, result) of a run of the module's :func:`trained` runs; fails unless it trained to its end."""
    directory, result = trained[key]
    assert result is not None, f"{key}: not started (the run it resumes failed)"
    assert result.ok, f"{key}: training failed (rc {result.returncode}); log in {directory}"
    return directory, result


def dumped(out_dir: Path) -> dict[int, list[dict]]:
    """The rollout dump per step, without v1's synthetic padding rows."""
    return {
        int(path.stem): [row for row in dump_rows(path) if not row.get("uid", "").startswith("pad")]
        for path in sorted((out_dir / "rollouts").glob("*.jsonl"))
    }


def optimizer_steps(out_dir: Path, step: int, role: str = "actor") -> set[int]:
    path = out_dir / "checkpoints" / f"global_step_{step}" / role / "optim_world_size_1_rank_0.pt"
    state = torch.load(path, weights_only=False)
    return {int(v["step"]) for v in state["state"].values()}


def parameters(out_dir: Path, step: int) -> dict[str, torch.Tensor]:
    state = torch.load(out_dir / "checkpoints" / f"global_step_{step}" / "actor" / "model_world_size_1_rank_0.pt",
                       weights_only=False)
    return {k: (v.full_tensor() if hasattr(v, "full_tensor") else v).float() for k, v in state.items()}


def values(result, key: str) -> list[float]:
    return [v for _, v in result.series(key)]


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    cfg = prepare_assets(CPURunConfig(out_dir=str(tmp_path_factory.mktemp("assets"))))
    data = Path(cfg.out_dir) / "data"
    _, val15 = write_dataset(str(data / "val15"), n_val=15)  # 15 x val n=1 on 2 workers: verl pads one row
    multi = multi_output_loop.write_dataset(cfg.train_file, str(data / "multi_output.parquet"))
    rowless = multi_output_loop.write_dataset(cfg.train_file, str(data / "multi_output_rowless.parquet"), rowless=True)
    loops = multi_output_loop.write_config(str(data / "loops.yaml"))
    return {"cfg": cfg, "val15": val15, "multi_output_data": multi, "multi_output_rowless_data": rowless, "loops": loops}


def resume_overrides(checkpoint: Path) -> tuple[str, ...]:
    return "trainer.resume_mode=resume_path", f"trainer.resume_from_path={checkpoint}"


# The resumes (each a short run from a checkpoint of another run of this module): key -> (the run
# resumed, the step of its checkpoint). Each starts as soon as its run has ended.
RESUMES = {
    ("v0", "gae", "resumed"): (("v0", "gae"), RESUME_FROM["v0", "gae"]),
    ("v1", "both", "resumed"): (("v1", "both"), RESUME_FROM["v1", "both"]),
    ("v1", "pool_shapes", "resumed"): (("v1", "pool_shapes"), 2),
    ("v1", "pool_auto_bound", "resumed"): (("v1", "pool_auto_bound"), 2),
}
# Trained with no other trainer alive (trainer_queue's ``alone``): none now (the auto bound's pair trained
# alone while its deadline was 20 s; POOL_AUTO_BOUND).
ALONE: set = set()
# Started in this order (two at a time): the longest runs and those resumed first,
# so that the resumes and the 2-step runs fill the slots at the end.
ORDER = [("v1", "pool_auto_bound"), ("v1", "pool_auto_bound", "resumed"), ("v0", "baseline"), ("v0", "both"),
         ("v0", "pipeline"), ("v0", "gae"), ("v1", "pool_shapes"), ("v1", "both"), ("v0", "gae", "resumed"),
         ("v1", "both", "resumed"), ("v1", "pool_shapes", "resumed"), ("v1", "pool_drop"), ("v1", "pool_wait_auto"),
         ("v1", "pool_shapes_submitted"), ("v1", "baseline"), ("v1", "pipeline"),
         ("v0", "pipeline_merged"), ("v0", "baseline_e2"), ("v0", "pipeline_e2")]


@pytest.fixture(scope="module")
def trained(tmp_path_factory, assets):
    """Every trainer run of this module, RUNS, POOLS and RESUMES, two at a time in one queue (the
    first test's setup; ALONE ones alone): key -> (out_dir, RunResult or None). One queue rather than
    a fixture per run: a run alone leaves a core idle for most of its start-up (the pool runs and the
    resumes, each on its own: ~360 s of the module's time)."""
    assert sorted(ORDER) == sorted([*RUNS, *[("v1", mode) for mode in POOLS], *RESUMES]) and ALONE <= set(ORDER)
    dirs = {key: tmp_path_factory.mktemp("_".join(key)) for key in ORDER}
    jobs = {}
    for key in ORDER:
        if key in RESUMES:
            (trainer, mode), step = RESUMES[key]
            checkpoint = dirs[trainer, mode] / "checkpoints" / f"global_step_{step}"
            jobs[key] = (dirs[key], trainer, mode, resume_overrides(checkpoint), (trainer, mode), key in ALONE)
        else:
            jobs[key] = (dirs[key], *key, (), None, key in ALONE)
    results = train_together(jobs, assets)
    return {key: (dirs[key], results[key]) for key in ORDER}


@pytest.fixture(scope="module")
def runs(trained):
    return {key: finished(trained, key) for key in RUNS}


def sessions(rows):
    """v1 dump rows by session ({uid}_{session}_{output} keys)."""
    out = defaultdict(list)
    for row in rows:
        uid, session, index = row["uid"].rsplit("_", 2)
        out[uid, session].append((int(index), row))
    return out


@pytest.mark.parametrize("run", list(RUNS), ids="-".join)
def test_every_sample_trained_once_with_its_own_reward(runs, run):
    """32 samples a step in 8 whole groups, each batch trained once; every sample's reward is its
    own response's (a failed sample: its group's mean, as neutral, also under mask); v1 multi-output
    sessions: every output gets the session's final output's score, as verl gives it."""
    trainer, mode = run
    directory, _ = runs[run]
    steps = dumped(directory)
    assert sorted(steps) == list(range(1, RUNS[run].get("steps", STEPS[trainer]) + 1))
    seen: set[str] = set()
    failed = 0
    for step, rows in steps.items():
        if RUNS[run].get("multi_output"):
            groups = Counter()
            for (uid, _), outputs in sessions(rows).items():
                final = max(outputs, key=lambda o: o[0])[1]
                assert [o[0] for o in sorted(outputs, key=lambda o: o[0])] == [0, 1]  # two outputs per session
                for _, row in outputs:
                    assert row["score"] == pytest.approx(score_text(final["output"], final["gts"]), abs=1e-6)
                groups[uid] += 1
            assert len(groups) == 8 and len(set(groups.values())) > 1  # groups of several sizes
            uids = set(groups)
        else:
            assert len(rows) == 32, f"step {step}: {len(rows)} samples trained"
            by_group = defaultdict(list)
            for row in rows:  # v1 dumps the TransferQueue key "{uid}_{session}_{output}"; stock v0 dumps no uid
                by_group[row["uid"].rsplit("_", 2)[0] if trainer == "v1" else row.get("uid", row["input"])].append(row)
            assert len(by_group) == 8 and {len(g) for g in by_group.values()} == {4}  # 8 whole groups of 4
            for group in by_group.values():
                ok = [score_text(r["output"], r["gts"]) for r in group if not r.get("reward_failed", injected(run, r))]
                for row in group:  # v1 dumps carry no reward keys (as verl): its failures are recomputed
                    broke = row.get("reward_failed", int(injected(run, row)))
                    expected = np.mean(ok) if broke and ok else 0.0 if broke else score_text(row["output"], row["gts"])
                    assert row["score"] == pytest.approx(expected, abs=1e-5)
                    if trainer == "v0":
                        assert broke == int(mode == "both" and fails(row["output"]))
                    failed += broke
            uids = set(by_group)
        if not mode.startswith("baseline"):
            assert not seen & uids  # no batch trained twice
        seen |= uids
    if mode == "both" and trainer == "v0" or RUNS[run].get("fail_share"):
        assert failed > 0


def injected(run, row) -> bool:
    """Whether the seam reward raised on this row in this run."""
    flags = RUNS[run]["flags"]
    if any("fail:false" in f for f in flags) or run[1].startswith("baseline"):
        return False
    return fails(row["output"], RUNS[run].get("fail_share", 0.1))


@pytest.mark.parametrize("run", [r for r in RUNS if r[0] == "v0" or RUNS[r].get("validate")], ids="-".join)
def test_the_reward_receives_what_verls_naive_manager_passes(runs, run):
    """F5: the dataset's extra_info, the agent loop's fields, num_turns and rollout_reward_scores,
    on the per-sample path (baselines) and the strategies' batched paths, training and validation."""
    trainer, _ = run
    directory, result = runs[run]
    if trainer == "v0":
        rows = [row for step in dumped(directory).values() for row in step if not row["reward_failed"]]
        assert rows and {row["saw_inputs"] for row in rows} == {1}
    seen = values(result, "val-aux/verl_async_rm/letter_case/saw_inputs/mean@1")  # v1 dumps no reward keys (as verl)
    assert (len(seen) > 0) == bool(RUNS[run].get("validate")) and set(seen) <= {1.0}


@pytest.mark.parametrize("run", STRATEGY_RUNS, ids="-".join)
def test_a_strategy_run_logs_verls_batch_balance_metrics_as_its_stock_baseline(runs, run):
    """Seam: verl's step logs its batch balancing (global_seqlen/*); the strategies balance a batch when it
    is generated, possibly steps before it trains, and the step that trains it logs them."""
    trainer, _ = run
    def names(result):
        return {key for m in result.metrics for key in m["data"] if not key.startswith(("val-", "timing_s/testing"))}
    missing = names(runs[trainer, "baseline"][1]) - names(runs[run][1])
    assert {key for key in missing if key.startswith("global_seqlen/")} == set()


@pytest.mark.parametrize("trainer", ["v0", "v1"])
def test_stock_baseline_scores_and_validates_through_the_agent_without_waiting(runs, trainer):
    """Strategies off: verl's stock trainer, with the async_agent manager scoring training and
    validation one sample at a time. Each sample carries its group's real size (stamped by our
    agent-loop manager), so validation groups (val n=1, padding rows included) close at once:
    validation takes well under group_wait (30 s), which a timer-based close would cost."""
    _, result = runs[trainer, "baseline"]
    assert [step for step, _ in result.series("critic/score/mean")] == list(range(1, STEPS[trainer] + 1))
    assert not result.series("async_reward/staleness")  # none of the strategies' code ran
    [(step, failed)] = result.series("val-aux/verl_async_rm/letter_case/reward_failed/mean@1")[:1]
    assert (step, failed) == (0, 0.0)
    testing = values(result, "timing_s/testing")
    assert len(testing) == 2 and max(testing) < 15, testing
    assert max(values(result, "training/rollout_probs_diff_max")) < 1e-4  # rollout weights synced each step


@pytest.mark.parametrize("epochs", [1, 2])
def test_pipeline_in_verls_mini_batch_order_ends_with_the_baselines_parameters(runs, epochs):
    """off_policy_steps=0 + the pipeline with mini_batch_order=index makes verl's own mini-batches
    (rows of the balanced batch, in order), scores them as they arrive and trains epoch 2 over the
    whole batch: at the pipeline run's last step (4 steps with one epoch, through the lr warm-up; 2
    with two) the actor's parameters equal the stock trainer's, to 1e-6 (measured: bit-identical on
    this CPU backend). The rollout is deterministic, so both runs generate the same samples; a
    negative control shows the comparison sees a real change."""
    suffix = "" if epochs == 1 else "_e2"
    base_dir, _ = runs["v0", f"baseline{suffix}"]
    pipe_dir, _ = runs["v0", f"pipeline{suffix}"]
    last = steps_of(("v0", f"pipeline{suffix}"))
    assert last == (4 if epochs == 1 else 2)
    base, pipe = parameters(base_dir, last), parameters(pipe_dir, last)
    assert max((base[k] - pipe[k]).abs().max().item() for k in base) <= 1e-6
    for step in range(1, last + 1):  # the same generations (after step 1: from equal weights)
        assert Counter(r["output"] for r in dumped(base_dir)[step]) == Counter(r["output"] for r in dumped(pipe_dir)[step])
    base_at_2 = base if last == 2 else parameters(base_dir, 2)
    other = parameters(runs["v0", "baseline_e2" if epochs == 1 else "baseline"][0], 2)
    assert max((base_at_2[k] - other[k]).abs().max().item() for k in base_at_2) > 1e-3  # one more epoch shows


def test_merged_update_calls_end_with_the_baselines_parameters(runs):
    """Mini-batches found scored already go to the worker as one update call (plan.merge_update_calls):
    verl splits it into the same mini-batches in the same order, so after 2 steps the parameters equal
    the stock trainer's (to 1e-6, as the per-mini-batch pipeline's), with fewer calls than mini-batches."""
    base_dir, _ = runs["v0", "baseline"]
    merged_dir, result = runs["v0", "pipeline_merged"]
    base, merged = parameters(base_dir, 2), parameters(merged_dir, 2)
    assert max((base[k] - merged[k]).abs().max().item() for k in base) <= 1e-6
    for step in (1, 2):  # the same generations, so the same batches met the two schedules
        assert Counter(r["output"] for r in dumped(base_dir)[step]) == Counter(r["output"] for r in dumped(merged_dir)[step])
    pipelined, calls = values(result, "async_reward/pipelined"), values(result, "async_reward/update_calls")
    merged_steps = [c for p, c in zip(pipelined, calls) if p == 1.0 and c < 4]
    assert merged_steps, (pipelined, calls)  # the pipeline ran, and merged some of its 4 mini-batch calls
    assert all(c == 1 for p, c in zip(pipelined, calls) if p == 0.0)  # batches scored whole: verl's one call


@pytest.mark.parametrize("run", STRATEGY_RUNS, ids="-".join)
def test_lr_steps_once_per_step_and_the_optimizer_once_per_mini_batch_and_epoch(runs, run):
    trainer, mode = run
    if RUNS[run].get("steps") and run not in SAVED:
        return  # the 2-step runs: covered by the equivalence test
    baseline_dir, baseline = runs[trainer, "baseline"]
    directory, result = runs[run]
    assert values(result, "actor/lr") == pytest.approx(values(baseline, "actor/lr")[:steps_of(run)])
    assert len(set(values(baseline, "actor/lr"))) > 1  # the schedule really moves
    epochs = 2 if "actor_rollout_ref.actor.ppo_epochs=2" in RUNS[run]["flags"] else 1
    steps = dumped(directory)
    for step in saved_of(run):
        # verl's count: one per mini-batch of 8 rows (v1 pads a batch of irregular groups to a multiple)
        mini_batches = sum(-(-len(steps[s]) // 8) for s in range(1, step + 1))
        assert optimizer_steps(directory, step) == {epochs * mini_batches}
    assert optimizer_steps(baseline_dir, SAVED[trainer][-1]) == {4 * SAVED[trainer][-1]}


def test_critic_with_a_mini_batch_that_does_not_divide_the_actors(runs):
    """F6: actor mini-batches of 2 prompts, critic of 4: the critic trains on whole critic
    mini-batches (2 optimizer steps a step, verl's count) and steps its LR once per step."""
    directory, result = runs["v0", "gae"]
    actor_lr, critic_lr = np.array(values(result, "actor/lr")), np.array(values(result, "critic/lr"))
    assert len(critic_lr) == steps_of(("v0", "gae"))
    assert critic_lr == pytest.approx(actor_lr * 0.1)  # same warm-up; 1e-3 vs 1e-2
    assert all(np.isfinite(values(result, "critic/vf_loss")))
    for step in saved_of(("v0", "gae")):
        assert optimizer_steps(directory, step, "critic") == {2 * step}
        assert optimizer_steps(directory, step) == {4 * step}


def test_the_adaptive_kl_controller_moves_once_per_step(runs):
    """S5: with KL in the reward, verl updates the controller once per batch with the batch's KL; the
    logged coefficients follow that recursion exactly (K updates per step would not)."""
    _, result = runs["v0", "gae"]
    kl, coef = values(result, "actor/reward_kl_penalty"), values(result, "actor/reward_kl_penalty_coeff")
    assert len(kl) == len(coef) == steps_of(("v0", "gae")) and coef[0] == ADAPTIVE_KL["kl_coef"]
    for t in range(1, len(coef)):
        error = np.clip(kl[t - 1] / ADAPTIVE_KL["target_kl"] - 1, -0.2, 0.2)
        assert coef[t] == pytest.approx(coef[t - 1] * (1 + error * 32 / ADAPTIVE_KL["horizon"]), rel=1e-9)
    assert len(set(coef)) > 2


@pytest.mark.parametrize("run", STRATEGY_RUNS, ids="-".join)
def test_staleness_and_reward_timing_metrics(runs, run):
    trainer, mode = run
    _, result = runs[run]
    steps = RUNS[run].get("steps", STEPS[trainer])
    lag = max([int(f.split("=")[1]) for f in RUNS[run]["flags"] if f.startswith("off_policy_steps=")] or [0])
    assert values(result, "async_rm/staleness/max") == [float(min(s, lag)) for s in range(steps)]  # per sample, alike
    assert values(result, "async_reward/staleness") == [min(s, lag) for s in range(steps)]
    failed = values(result, "async_reward/failed")
    assert (sum(failed) > 0) == (mode == "both" and trainer == "v0" or bool(RUNS[run].get("fail_share")))
    assert all(v >= 0 for v in values(result, "async_reward/blocked_s"))
    pipelined = values(result, "async_reward/pipelined")
    if RUNS[run].get("multi_output"):
        assert pipelined == [0.0] * steps  # groups of several sizes: trained whole, as verl
    elif "mini_batch_pipeline=true" in RUNS[run]["flags"]:
        assert pipelined == [1.0] * steps
        assert values(result, "async_reward/groups_per_mini_batch") == [2.0] * steps


@pytest.mark.parametrize("run", STRATEGY_RUNS, ids="-".join)
def test_the_trainer_and_its_workers_freeze_the_start_up_heap_before_step_one(runs, run):
    """strategies/heap.py: from step 1 on, the start-up heap (~0.6 M objects) is frozen in the trainer
    and in every actor (and critic) worker, so no full collection of it lands on a step."""
    trainer, _ = run
    _, result = runs[run]
    steps = RUNS[run].get("steps", STEPS[trainer])
    for side in ("trainer", "workers"):
        frozen = values(result, f"async_rm/frozen_heap_objects/{side}")
        assert len(frozen) == steps and len(set(frozen)) == 1 and frozen[0] > 100_000, (side, frozen)


@pytest.mark.parametrize("run", [r for r in RUNS if r[0] == "v1"], ids="-".join)
def test_v1_reports_the_whole_batch_rollout_correction_statistics_once_per_step(runs, run):
    """verl's whole-batch advantage call reports them (stock, and strategy steps trained whole);
    steps whose advantages came in pieces, or without their masked rows, compute the same
    statistics once over the batch's usable rows (strategies/v1.py, _correction_metrics)."""
    _, result = runs[run]
    steps = RUNS[run].get("steps", STEPS["v1"])
    for key in ("rollout_corr/kl", "rollout_corr/ppl_ratio", "rollout_corr/chi2_token"):
        series = values(result, key)
        assert len(series) == steps and all(np.isfinite(series)), (key, series)
    if "mini_batch_pipeline=true" in RUNS[run]["flags"] and not RUNS[run].get("multi_output"):
        assert values(result, "async_reward/pipelined") == [1.0] * steps  # the pieces branch ran


@pytest.mark.parametrize("run", list(RUNS), ids="-".join)
def test_replicas_sleep_once_per_step_including_the_last_off_policy_steps(runs, run):
    """F3: every training step's weight update finds the replicas put to sleep exactly once since
    the previous update; the last k off-policy steps generate nothing and must sleep all the same."""
    trainer, _ = run
    _, result = runs[run]
    events = result.replica_events()
    training = [e for e in events if e["event"] == "update_weights" and (e["requested"] or 0) >= 1]
    steps = RUNS[run].get("steps", STEPS[trainer])
    assert [e["requested"] for e in training] == list(range(1, steps + 1))
    assert [e["sleeps_since_update"] for e in training] == [1] * steps
    assert not [e for e in events if e["event"] == "generate_while_asleep"]


def test_everything_in_one_step_two_ahead(runs):
    """v0 both: validation padded by verl and failures in some mini-batches (F1, F2), two epochs
    with shuffle (S1), offload once per step, rollout correction seeing two steps of staleness (S6)."""
    directory, result = runs["v0", "both"]
    assert [s for s, _ in result.series("val-core/verl_async_rm/letter_case/acc/mean@1")] == [0, 8, 16]
    assert values(result, "async_reward/actor_loads") == [1] * STEPS["v0"]
    assert values(result, "async_reward/actor_offloads") == [1] * STEPS["v0"]
    kl = values(result, "rollout_corr/kl")
    assert len(kl) == STEPS["v0"] and abs(kl[0]) < 1e-4  # step 1: generated by the weights it trains
    assert min(abs(v) for v in kl[2:]) > 1e-3  # then two policy versions old: the correction sees it
    assert len(values(result, "rollout_corr/rollout_is_mean")) == STEPS["v0"]
    # some step had failures in some of its 4 mini-batches (2 groups each) and none in another
    failing_groups = [len({r["uid"] for r in rows if r["reward_failed"]}) for rows in dumped(directory).values()]
    assert any(0 < n <= 3 for n in failing_groups), failing_groups


@pytest.mark.parametrize("run", MASKED_RUNS, ids="-".join)
def test_masked_failures_reach_the_update_with_no_loss_tokens_and_the_rest_with_usable_only_group_statistics(runs, run):
    """failure_policy=mask on verl's real trainer: in what the updates trained on (the rollout dump
    reads the batch tensors after the step: response_mask, v1's loss_mask, advantages), a failed
    sample and every sample of a group left with fewer than 2 usable ones have no loss token and a
    zero advantage; every other sample keeps its tokens and has GRPO's advantage over its group's
    usable samples alone; the step's masked and dropped counts are in the metrics. (That zero loss
    tokens give the gradient of the batch without those samples, through verl's own ppo_loss:
    tests/seam/test_masking_verl.py.)"""
    trainer, _ = run
    directory, result = runs[run]
    masked_per_step, dropped_per_step, failed_total = [], [], 0
    for step, rows in sorted(dumped(directory).items()):
        by_group = defaultdict(list)
        for row in rows:
            by_group[row["uid"].rsplit("_", 2)[0] if trainer == "v1" else row["uid"]].append(row)
        masked = dropped = 0
        for group in by_group.values():
            broke = [bool(row.get("reward_failed", injected(run, row))) for row in group]
            assert broke == [injected(run, row) for row in group]
            usable = [row["score"] for row, bad in zip(group, broke) if not bad]
            dropped += len(usable) < 2
            for row, bad in zip(group, broke):
                tokens = [row["async_rm_loss_tokens"], row.get("async_rm_loss_mask_tokens", row["async_rm_loss_tokens"])]
                if bad or len(usable) < 2:
                    assert tokens == [0, 0] and row["async_rm_advantage"] == 0.0, row
                    masked += 1
                else:
                    assert min(tokens) > 0 and tokens[0] == tokens[1]
                    grpo = (row["score"] - np.mean(usable)) / (np.std(usable, ddof=1) + 1e-6)
                    assert row["async_rm_advantage"] == pytest.approx(grpo, rel=1e-3, abs=1e-4), row
            failed_total += sum(broke)
        masked_per_step.append(masked)
        dropped_per_step.append(dropped)
    assert values(result, "async_rm/masked_samples") == masked_per_step
    assert values(result, "async_rm/dropped_groups") == dropped_per_step
    assert failed_total > 0 and sum(masked_per_step) >= failed_total
    # what docs/guide/strategies.md says of verl's own data metrics: computed on the batch as generated, so a masked
    # sample is no aborted one there and critic/score/* averages its stand-in score (neutral's)
    assert set(values(result, "response/aborted_ratio")) == {0.0}
    scores = [np.mean([row["score"] for row in rows]) for _, rows in sorted(dumped(directory).items())]
    assert values(result, "critic/score/mean") == pytest.approx(scores, abs=1e-4)


def test_v1_validation_keeps_the_rewards_extra_info(runs):
    """S4: verl's v1 validation reads reward extra info from extra_fields; the headline metric is there."""
    for mode in ("both", "baseline"):
        _, result = runs["v1", mode]
        assert [s for s, _ in result.series("val-core/verl_async_rm/letter_case/acc/mean@1")][:1] == [0]


def test_a_v1_strategy_run_trains_through_the_light_driver(runs, assets):
    """The light driver (cpu_backend/light_driver.py) runs verl's v1 TaskRunner in its host actor
    (the demo's lanes are v0: tests/rig/test_demo.py): a v1 strategy run, pipeline, took it and
    trained every step (its other properties: the tests above, as for every run here)."""
    assert run_config(Path("unused"), assets, "v1", "pipeline").light_driver
    _, result = runs["v1", "pipeline"]
    assert [m["data"]["training/global_step"] for m in result.metrics if "training/global_step" in m["data"]] == \
        list(range(1, STEPS["v1"] + 1))
    assert "TaskRunnerHost" in Path(result.log_path).read_text()  # the host actor, not verl's TaskRunner, ran it


def rise(result) -> tuple[float, float]:
    """(first, last): the toy reward averaged over the first and the last 4 steps."""
    scores = values(result, "critic/score/mean")
    return float(np.mean(scores[:4])), float(np.mean(scores[-4:]))


def test_two_steps_ahead_with_failures_learns_like_the_baseline(runs):
    """16 steps, one seed, runs that do not depend on timing (deterministic rollouts, verl's
    mini-batch order), so the comparison is reproducible and not a coin toss between two sampling
    draws: the baseline's toy reward rises; ``both``'s (two steps ahead, with failures) rises at
    least half as much. (The on-policy pipeline ends with the baseline's very parameters: the test
    above.) Over seeds and latency regimes, bench/e2e.py measures the strategy - baseline gap of
    every strategy, off-policy alone included."""
    base_first, base_last = rise(runs["v0", "baseline"][1])
    first, last = rise(runs["v0", "both"][1])
    assert base_last - base_first > 0.05, (base_first, base_last)
    assert last - first > 0.5 * (base_last - base_first), (first, last, base_first, base_last)


@pytest.mark.parametrize("run", [("v0", "gae"), ("v1", "both")], ids="-".join)
def test_resume_from_a_checkpoint_taken_with_a_batch_in_flight(trained, runs, run):
    """The off-policy run saved while the next batch was already generated and scored; resuming
    there (RESUMES) must train exactly the uninterrupted run's remaining batches: none lost, none repeated."""
    trainer, mode = run
    uninterrupted, _ = runs[run]
    saved = RESUME_FROM[run]
    assert RESUMES[trainer, mode, "resumed"] == (run, saved)
    resumed_dir, _ = finished(trained, (trainer, mode, "resumed"))
    resumed, original = dumped(resumed_dir), dumped(uninterrupted)
    remaining = list(range(saved + 1, steps_of(run) + 1))
    assert sorted(resumed) == remaining
    for step in remaining:
        assert Counter(r["input"] for r in resumed[step]) == Counter(r["input"] for r in original[step])


@pytest.fixture(scope="module")
def pool_run(trained):
    """The staleness pool's run with a straggler carried and a resume: the one on every batch shape
    (POOL_SHAPES: the plain pool's flags on the multi-output, rowless data)."""
    return finished(trained, ("v1", "pool_shapes"))


def assert_whole_groups_each_once_with_their_own_rewards(directory: Path) -> None:
    """Every step of a pool run trains 8 whole groups of 4, none trained in two steps, each sample
    with its own response's reward."""
    steps = dumped(directory)
    assert sorted(steps) == [1, 2, 3, 4]
    seen: set = set()
    for rows in steps.values():
        by_group = defaultdict(list)
        for row in rows:
            by_group[row["uid"].rsplit("_", 2)[0]].append(row)
        assert len(rows) == 32 and len(by_group) == 8 and {len(g) for g in by_group.values()} == {4}
        for row in rows:
            assert row["score"] == pytest.approx(score_text(row["output"], row["gts"]), abs=1e-5)
        assert not seen & set(by_group)
        seen |= set(by_group)


def test_the_pool_carries_a_straggler_instead_of_waiting_within_the_staleness_bound(pool_run):
    """v1 pool: every step trains 8 prompts' whole groups (test_the_pool_trains_every_batch_shape...),
    a group still being scored is carried (counted), no sample is staler than off_policy_steps +
    max_staleness, and after each step the pool holds exactly the groups generated and not trained:
    8 (the batch ahead) until the last step, which empties it. That count is timing-free: a group
    lost or trained twice would change it."""
    _, result = pool_run
    assert values(result, "async_rm/pool_groups") == [8, 8, 8, 0]
    assert values(result, "async_rm/groups_dropped_stale") == [0] * 4
    carried = values(result, "async_rm/groups_carried")
    assert carried == sorted(carried) and carried[-1] > 0, carried  # 0-6 s latency against ~2 s steps
    # a carried group trains at least one step after its own, never past off_policy_steps + max_staleness;
    # which batch the straggler came from (2 if one made a step ahead) is up to timing
    assert 1 <= max(values(result, "async_rm/staleness/max")) <= 2
    # a group of the batch ahead may fill in for a straggler: staleness 0 (generated by this step's weights)
    assert all(0 <= mean <= high <= 2 for mean, high in zip(values(result, "async_rm/staleness/mean"),
                                                         values(result, "async_rm/staleness/max")))


@pytest.fixture(scope="module")
def pool_drop_run(trained):
    return finished(trained, ("v1", "pool_drop"))


def test_dropping_stale_groups_refills_the_pool_and_trains_each_kept_group_once(pool_drop_run):
    """on_stale=drop, max_staleness=0: groups unscored at their own step are dropped (counted) and
    never trained; the pool is refilled by supply batches so every step still trains 8 whole groups,
    each once, with its own reward, and no sample is staler than off_policy_steps + max_staleness."""
    directory, result = pool_drop_run
    assert_whole_groups_each_once_with_their_own_rewards(directory)
    dropped = values(result, "async_rm/groups_dropped_stale")
    assert dropped == sorted(dropped) and dropped[-1] > 0, dropped  # 0-6 s latency against ~2 s steps
    assert sum(values(result, "async_rm/supply_batches")) > 0
    assert values(result, "async_rm/supply_steps") == [1.0] * len(dropped)  # the rule capped: 1 ahead + 0
    assert max(values(result, "async_rm/staleness/max")) <= 1  # one batch ahead (v1) + max_staleness 0


@pytest.fixture(scope="module")
def pool_wait_auto_run(trained):
    return finished(trained, ("v1", "pool_wait_auto"))


def test_the_waiting_pool_is_supplied_as_deep_as_the_bound_allows_and_drops_nothing(pool_wait_auto_run):
    """on_stale=wait, max_staleness=1, off_policy_steps=auto against 0-6 s latencies (the rule wants
    more than one batch ahead): supply batches deepen the pool to 1 ahead + 1 (never deeper: its
    groups must be trained within the bound), every step trains 8 whole groups each once with its own
    reward, nothing is dropped, and no sample is staler than one batch ahead + max_staleness."""
    directory, result = pool_wait_auto_run
    assert_whole_groups_each_once_with_their_own_rewards(directory)
    assert values(result, "async_rm/groups_dropped_stale") == [0] * 4
    assert sum(values(result, "async_rm/supply_batches")) > 0
    assert max(values(result, "async_rm/supply_steps")) == 2.0  # the rule capped: 1 ahead + 1
    assert max(values(result, "async_rm/staleness/max")) <= 2
    assert all(0 <= due <= wait for due, wait in zip(values(result, "async_rm/pool_wait_due_s"),
                                                   values(result, "async_rm/pool_wait_s")))
    # after the last step the calls of the groups left in the pool are stopped (counted once)
    assert [step for step, _ in result.series("async_rm/pool_calls_cancelled_at_end")] == [4]


@pytest.fixture(scope="module")
def pool_auto_bound_run(trained):
    return finished(trained, ("v1", "pool_auto_bound"))


def test_the_auto_bound_grows_from_the_deadline_and_a_resume_keeps_it(trained, pool_auto_bound_run):
    """max_staleness=auto, on_stale=wait, a 60 s ticket deadline against 0-6 s calls and ~1-2 s steps:
    the bound is 1 for step 1 (nothing measured), raised after it and never lowered; no step from
    the second on waits for a due group (the bound outlasts the deadline, and the deadline every
    call); every step trains 8 whole groups once with their own rewards, none dropped, no sample
    staler than one batch ahead + the bound it ran under. The checkpoint at step 2 records the bound
    in force, and a run resumed from it starts under that bound (not 1)."""
    directory, result = pool_auto_bound_run
    assert_whole_groups_each_once_with_their_own_rewards(directory)
    bounds = values(result, "async_rm/max_staleness")
    assert bounds[0] == 1.0 and bounds == sorted(bounds) and bounds[1] >= 2, bounds
    assert values(result, "async_rm/groups_dropped_stale") == [0] * 4
    assert values(result, "async_rm/pool_wait_due_s")[1:] == [0.0] * 3
    assert all(stale <= 1 + bound for stale, bound in zip(values(result, "async_rm/staleness/max"), bounds))
    checkpoint = directory / "checkpoints" / "global_step_2"
    saved = json.loads((checkpoint / "async_rm_pool.json").read_text())["max_staleness"]
    assert saved == bounds[2]  # the bound step 3 ran under: raised after step 2, before the save
    assert RESUMES["v1", "pool_auto_bound", "resumed"] == (("v1", "pool_auto_bound"), 2)  # from that checkpoint
    resumed_dir, resumed_result = finished(trained, ("v1", "pool_auto_bound", "resumed"))
    assert values(resumed_result, "async_rm/max_staleness")[0] == saved
    resumed = dumped(resumed_dir)
    assert sorted(resumed) == [3, 4]
    for rows in resumed.values():  # whole groups (which ones is timing's choice with a supply: exactness of
        groups = Counter(row["uid"].rsplit("_", 2)[0] for row in rows)  # a resume is the pool test's below)
        assert len(rows) == 32 and len(groups) == 8 and set(groups.values()) == {4}


@pytest.fixture(params=["pool_shapes", "pool_shapes_submitted"])
def pool_shapes_run(request, trained):
    return finished(trained, ("v1", request.param))


def test_the_pool_trains_every_batch_shape_verl_does_each_group_once_and_whole(pool_shapes_run):
    """Issue 43 (before: ValueError "needs groups of one size" at the first such batch, after full
    start-up): groups of 2 and 4 sessions, some a failed session left short, two outputs per session,
    prompts every session of which failed; scored while generating (one ticket sized per uid) and
    submitted when generation ends (one ticket per group size). Each step trains 8 prompts as verl's sampler counts them
    (those without rows among them, async_rm/pool_prompts_without_rows), each group whole (no session
    missing but the failed one) and once, every output with its session's final output's reward;
    nothing dropped, nothing staler than one batch ahead + max_staleness; after each step the pool
    holds the batch ahead (8 prompts, counted alike), none after the last."""
    directory, result = pool_shapes_run
    steps = dumped(directory)
    assert sorted(steps) == [1, 2, 3, 4]
    rowless = values(result, "async_rm/pool_prompts_without_rows")
    assert len(rowless) == 4 and sum(rowless) > 0, rowless
    seen: set = set()
    sizes: set = set()
    for step, rows in steps.items():
        groups = defaultdict(set)
        for (uid, session), outputs in sessions(rows).items():
            final = max(outputs, key=lambda o: o[0])[1]
            assert sorted(o[0] for o in outputs) == [0, 1]  # two outputs per session
            for _, row in outputs:
                assert row["score"] == pytest.approx(score_text(final["output"], final["gts"]), abs=1e-5)
            groups[uid].add(int(session))
        for uid, present in groups.items():  # whole: no session missing but the one the loop fails
            assert set(range(max(present) + 1)) - present <= {multi_output_loop.FAILING_SESSION}, (step, uid, present)
        sizes |= {len(present) for present in groups.values()}
        assert len(groups) + rowless[step - 1] == 8, (step, len(groups), rowless)
        assert not seen & set(groups)
        seen |= set(groups)
    assert len(sizes) > 1, sizes  # groups of several sizes
    assert values(result, "async_rm/pool_groups") == [8, 8, 8, 0]
    assert values(result, "async_rm/groups_dropped_stale") == [0] * 4
    assert max(values(result, "async_rm/staleness/max")) <= 2


def test_resuming_the_pool_trains_every_prompt_exactly_once(trained, pool_run):
    """Saved at step 2 with groups carried and a batch ahead: the checkpoint records the loader
    state before the oldest batch still in the pool and which of its prompts were trained; the
    resumed run draws those batches again, leaves those prompts out, and ends with the pool empty.
    So the prompts trained before the checkpoint plus those after are the uninterrupted run's, each
    once (compared as multisets: every prompt's samples, as many as its sessions and outputs give it
    (multi_output_loop: fixed per prompt), in one step; a prompt none of whose sessions produced a
    sample is counted in the pool, not in the samples)."""
    uninterrupted, _ = pool_run
    checkpoint = uninterrupted / "checkpoints" / "global_step_2"
    assert json.loads((checkpoint / "async_rm_pool.json").read_text())["live"]
    assert RESUMES["v1", "pool_shapes", "resumed"] == (("v1", "pool_shapes"), 2)  # from that checkpoint
    resumed_dir, resumed_result = finished(trained, ("v1", "pool_shapes", "resumed"))
    resumed, original = dumped(resumed_dir), dumped(uninterrupted)
    assert sorted(resumed) == [3, 4]
    before = Counter(r["input"] for step in (1, 2) for r in original[step])
    after = Counter(r["input"] for step in (3, 4) for r in resumed[step])
    assert before + after == Counter(r["input"] for rows in original.values() for r in rows)
    assert values(resumed_result, "async_rm/pool_groups") == [8, 0]
