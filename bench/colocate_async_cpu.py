"""What verl's ``colocate_async`` does on the CPU backend, measured: step times with and without
partial rollouts, and how many requests each step aborted and resumed.

    python bench/colocate_async_cpu.py                       # bench/results/colocate_async_cpu.json
    python bench/colocate_async_cpu.py --steps 6 --decode-s 0.05 --seeds 0,1

Contestants, each verl's own ``verl.trainer.main_ppo`` (v1, fast-polling sampler, the toy reward, no
judge) at the same simulated decode time per token:

* ``sync``: verl's synchronous v1 trainer;
* ``colocate_async_no_partial``: ``colocate_async`` with ``num_warmup_batches=0``: each step submits
  its batch and samples it whole, so nothing is left running at the sample (no partial rollout);
* ``colocate_async``: verl's default (one warm-up batch): each step's sample aborts the next batch
  mid-generation, and the server resumes it after the weight update.

Per run: each step's ``timing_s/step`` and ``timing_s/gen`` (verl's), the requests aborted at that
step's sample and resumed after its weight update (the replica log), trajectories spanning two
weight versions, staleness. Step 1 carries the first generation's warm-up: the summary's means are
over steps 2..N. Runs one at a time (on 2 cores a second run would take the first one's CPU).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

from verl_async_rm_rig.cpu_backend.launch import CPURunConfig, prepare_assets, run

ROOT = Path(__file__).resolve().parents[1]
CONTESTANTS = {
    "sync": ["trainer.v1.trainer_mode=sync"],
    "colocate_async_no_partial": ["trainer.v1.trainer_mode=colocate_async",
                                  "trainer.v1.colocate_async.num_warmup_batches=0"],
    "colocate_async": ["trainer.v1.trainer_mode=colocate_async"],
}


def step_rows(result) -> list[dict]:
    """One row per trained step: verl's timings and staleness, and the server's aborts and resumes."""
    events = result.replica_events()
    aborts = [e for e in events if e["event"] == "abort"]  # one per sample, in step order
    resumed_at: dict[int, int] = {}
    for e in events:
        if e["event"] == "resumed":  # after step s's weight update the server holds version s
            resumed_at[e["global_steps"]] = resumed_at.get(e["global_steps"], 0) + 1
    rows = []
    for m in result.metrics:
        data = m["data"]
        if "training/global_step" not in data:
            continue
        step = int(data["training/global_step"])
        abort = aborts[step - 1] if step - 1 < len(aborts) else None
        rows.append({
            "step": step,
            "step_s": data.get("timing_s/step"),
            "gen_s": data.get("timing_s/gen"),
            "update_weights_s": data.get("timing_s/update_weights"),
            "aborted": abort["aborted"] if abort else 0,
            "aborted_partial_tokens_mean": (statistics.fmean(abort["partial_tokens"])
                                            if abort and abort["partial_tokens"] else 0.0),
            "resumed_after_update": resumed_at.get(step, 0),
            "trajectory_spans_max": data.get("training/off_policy/trajectory_spans/max"),
            "staleness_mean": data.get("training/off_policy/trajectory_staleness/mean"),
            "evicted_stale": data.get("training/off_policy/evicted_samples", 0),
            "evicted_failed": data.get("training/rollout_failure/evicted_samples", 0),
            "score_mean": data.get("critic/score/mean"),
        })
    return rows


def summary(rows: list[dict]) -> dict:
    later = [r for r in rows if r["step"] >= 2] or rows
    return {
        "step_s_mean_from_2": statistics.fmean(r["step_s"] for r in later),
        "gen_s_mean_from_2": statistics.fmean(r["gen_s"] for r in later),
        "aborted_per_step_mean": statistics.fmean(r["aborted"] for r in rows),
        "aborted_total": sum(r["aborted"] for r in rows),
        "resumed_total": sum(r["resumed_after_update"] for r in rows),
        "steps_training_two_versions": sum((r["trajectory_spans_max"] or 1) > 1 for r in rows),
        "evicted_failed_total": sum(r["evicted_failed"] for r in rows),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--decode-s", type=float, default=0.05, help="simulated decode seconds per token")
    p.add_argument("--seeds", default="0", help="comma-separated")
    p.add_argument("--contestants", default=",".join(CONTESTANTS))
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "colocate_async_cpu.json"))
    args = p.parse_args(argv)
    names = args.contestants.split(",")
    unknown = sorted(set(names) - set(CONTESTANTS))
    if unknown:
        p.error(f"--contestants: unknown {unknown}; known: {sorted(CONTESTANTS)}")
    seeds = [int(s) for s in args.seeds.split(",")]
    work = Path(tempfile.mkdtemp(prefix="colocate_async_cpu_"))
    runs = []
    for seed in seeds:
        assets = prepare_assets(CPURunConfig(out_dir=str(work / f"assets{seed}"), seed=seed))
        for name in names:
            out = work / f"{name}_{seed}"
            cfg = CPURunConfig(out_dir=str(out), trainer="v1", steps=args.steps, seed=seed,
                               model_dir=assets.model_dir, train_file=assets.train_file, val_file=assets.val_file,
                               val_before_train=False, v1_poll_interval_s=0.05, decode_s=args.decode_s,
                               timeout_s=900, extra_overrides=list(CONTESTANTS[name]))
            started = time.time()
            result = run(cfg, progress=False)
            rows = step_rows(result)
            runs.append({"contestant": name, "seed": seed, "ok": result.ok, "wall_s": time.time() - started,
                         "overrides": CONTESTANTS[name], "steps": rows, "summary": summary(rows) if rows else {}})
            print(f"{name} seed {seed}: rc {result.returncode}, {runs[-1]['summary']}", file=sys.stderr)
    report = {
        "what": __doc__.splitlines()[0],
        "command": "python bench/colocate_async_cpu.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "machine": {"cpus": __import__("os").cpu_count(), "platform": platform.platform()},
        "settings": {"steps": args.steps, "decode_s_per_token": args.decode_s, "train_batch_size": 8, "rollout_n": 4,
                     "response_length": 16, "v1_poll_interval_s": 0.05},
        "runs": runs,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out}", file=sys.stderr)
    return 0 if all(r["ok"] for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
