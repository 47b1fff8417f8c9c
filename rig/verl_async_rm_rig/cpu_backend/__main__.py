"""CLI: ``python -m verl_async_rm_rig.cpu_backend --trainer v1 --steps 4 --out /tmp/run [hydra overrides...]``.

Anything after the known options (or after ``--``) is passed to verl as hydra overrides, e.g.
``reward.reward_manager.name=naive trainer.test_freq=2``.
"""

from __future__ import annotations

import argparse
import json
import sys

from .launch import DEFAULT_ENTRY, REWARD_KEY, SEPARATE_ASYNC_REFUSAL, CPURunConfig, run, v1_trainer_mode


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m verl_async_rm_rig.cpu_backend", description=__doc__.splitlines()[0])
    p.add_argument("--trainer", choices=["v0", "v1"], default="v1")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--out", required=True, help="output dir: model, data, checkpoints, metrics-N.jsonl, train-N.log")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch-size", type=int, default=8, help="prompts per step")
    p.add_argument("--n", type=int, default=4, help="samples per prompt (GRPO group)")
    p.add_argument("--lr", type=float, default=1e-2)
    p.add_argument("--test-freq", type=int, default=-1)
    p.add_argument("--save-freq", type=int, default=-1)
    p.add_argument("--no-val-before-train", action="store_true")
    p.add_argument("--no-resume", action="store_true")
    p.add_argument("--no-weight-sync", action="store_true", help="negative control: rollout keeps initial weights")
    p.add_argument("--reward-path", help="reward.custom_reward_function.path (default: the toy task)")
    p.add_argument("--reward-name", default="compute_score")
    p.add_argument("--reward-kwargs", type=json.loads, default={}, help='JSON, e.g. \'{"min_chars": 4}\'')
    p.add_argument("--reward-manager", help="reward.reward_manager.name")
    p.add_argument("--model-dir", help="HF model dir (default: build the tiny Qwen2 under --out)")
    p.add_argument("--entry", default=DEFAULT_ENTRY, help="module run with -m (verl's main_ppo by default)")
    p.add_argument("--timeout", type=float, default=1800.0)
    p.add_argument("--num-cpus", type=int, default=8)
    p.add_argument("--v1-poll-interval", type=float, help="v1: poll rollouts every N s, not verl's 2 s")
    p.add_argument("--decode-s", type=float, default=0.0,
                   help="simulated decode seconds per token (a GPU's), e.g. 0.02: colocate_async then aborts "
                        "and resumes the rollouts still running at each step's sample")
    p.add_argument("-v", "--verbose", action="store_true", help="echo the trainer's output")
    args, overrides = p.parse_known_args(argv)
    overrides = [o for o in overrides if o != "--"]
    bad = [o for o in overrides if o.startswith("-")]
    if bad:
        p.error(f"unknown options {bad}")

    cfg = CPURunConfig(
        out_dir=args.out,
        trainer=args.trainer,
        steps=args.steps,
        seed=args.seed,
        model_dir=args.model_dir,
        train_batch_size=args.batch_size,
        rollout_n=args.n,
        lr=args.lr,
        val_before_train=not args.no_val_before_train,
        test_freq=args.test_freq,
        save_freq=args.save_freq,
        resume=not args.no_resume,
        reward_path=args.reward_path,
        reward_name=args.reward_name,
        reward_kwargs=args.reward_kwargs,
        reward_manager=args.reward_manager,
        weight_sync=not args.no_weight_sync,
        extra_overrides=overrides,
        entry_module=args.entry,
        num_cpus=args.num_cpus,
        timeout_s=args.timeout,
        verbose=args.verbose,
        v1_poll_interval_s=args.v1_poll_interval,
        decode_s=args.decode_s,
    )
    if args.trainer == "v1" and v1_trainer_mode(overrides) == "separate_async":
        p.error(SEPARATE_ASYNC_REFUSAL)  # before any model, data or Ray is built
    try:
        result = run(cfg)
    except ValueError as exc:  # a setting the launcher refuses: named in the message, exit 2
        p.error(str(exc))
    rewards = result.series(REWARD_KEY)
    if rewards:
        first, last = rewards[0][1], rewards[-1][1]
        print(f"reward (critic/score/mean) first={first:.4f} last={last:.4f} over {len(rewards)} steps")
    return result.returncode


if __name__ == "__main__":
    sys.exit(main())
