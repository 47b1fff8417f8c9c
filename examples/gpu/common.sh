#!/usr/bin/env bash
# Shared settings of the GPU experiment scripts (sourced by run_*.sh). Every setting can be
# overridden from the environment; any extra hydra override given to a run script goes last, so it wins.
#
# The experiment (the recipe's): GRPO on GSM8K, rewards behind a simulated remote call of uniform
# LATENCY_LO..LATENCY_HI seconds per sample (1-40 s), one node of 8 GPUs, vLLM rollout, six lanes:
#   baseline    verl's trainer, rewards scored through the async_agent manager inside verl's agent loop
#   pipeline    + mini_batch_pipeline=true (update on each PPO mini-batch of scored groups)
#   off_policy  + off_policy_steps=1 (generate the next batch while this one's rewards are in flight; on v1 that is verl's colocate_async with the agent)
#   both        + both
#   colocate_async        verl's trainer_mode=colocate_async with verl's own reward loop (rate_limited)
#   colocate_async_agent  verl's trainer_mode=colocate_async with the async_agent manager
# The training settings follow verl 0.9's GSM8K GRPO examples (examples/grpo_trainer/run_qwen2-7b*.sh).

: "${DATA_DIR:=$HOME/data/gsm8k}"          # train.parquet / test.parquet (prepare_gsm8k.py)
: "${N_GPUS:=8}"
: "${NNODES:=1}"
: "${LATENCY_LO:=1}"
: "${LATENCY_HI:=40}"
: "${AGENT_CONCURRENCY:=8192}"             # >= samples per step (1024 x 5): every reward in flight at once
: "${PYTHON:=python3}"
: "${PROJECT:=verl_async_rm_gsm8k}"

lane_flags() {
  case "$1" in
    baseline) ;;
    pipeline) echo "mini_batch_pipeline=true" ;;
    off_policy) echo "off_policy_steps=1" ;;
    both) echo "mini_batch_pipeline=true off_policy_steps=1" ;;
    # verl's own asynchronous mode (rewards scored in the background while the GPUs train, partial
    # rollouts), with verl's reward loop at its best for a rate-limited judge: its rate_limited
    # manager (limits per reward-loop worker process), verl's default reward.num_workers
    colocate_async) echo "trainer.v1.trainer_mode=colocate_async reward.reward_manager.name=rate_limited +reward.max_concurrent=$AGENT_CONCURRENCY" ;;
    # ... and with the async_agent manager (the common overrides' manager): one agent for every worker
    colocate_async_agent) echo "trainer.v1.trainer_mode=colocate_async" ;;
    *) echo "unknown lane '$1': use baseline, pipeline, off_policy, both, colocate_async or colocate_async_agent" >&2; return 2 ;;
  esac
}

COMMON_OVERRIDES=(
  algorithm.adv_estimator=grpo
  algorithm.use_kl_in_reward=false
  "data.train_files=$DATA_DIR/train.parquet"
  "data.val_files=$DATA_DIR/test.parquet"
  data.train_batch_size=1024
  data.max_prompt_length=512
  data.max_response_length=1024
  data.filter_overlong_prompts=true
  data.truncation=error
  actor_rollout_ref.model.use_remove_padding=true
  actor_rollout_ref.model.enable_gradient_checkpointing=true
  actor_rollout_ref.actor.optim.lr=1e-6
  actor_rollout_ref.actor.ppo_mini_batch_size=256
  actor_rollout_ref.actor.use_kl_loss=true
  actor_rollout_ref.actor.kl_loss_coef=0.001
  actor_rollout_ref.actor.kl_loss_type=low_var_kl
  actor_rollout_ref.actor.entropy_coeff=0
  actor_rollout_ref.rollout.name=vllm
  actor_rollout_ref.rollout.gpu_memory_utilization=0.6
  actor_rollout_ref.rollout.n=5
  # the reward: GSM8K answer check behind the simulated latency, scored by the agent
  reward.reward_manager.name=async_agent
  reward.custom_reward_function.path=pkg://verl_async_rm.user_rewards.gsm8k
  reward.custom_reward_function.name=compute_score_async
  "+reward.custom_reward_function.reward_kwargs.latency_lo=$LATENCY_LO"
  "+reward.custom_reward_function.reward_kwargs.latency_hi=$LATENCY_HI"
  "reward.async_agent.max_concurrency=$AGENT_CONCURRENCY"
  "trainer.logger=[console,tensorboard]"
  "trainer.project_name=$PROJECT"
  "trainer.n_gpus_per_node=$N_GPUS"
  "trainer.nnodes=$NNODES"
  trainer.save_freq=20
  trainer.test_freq=5
  trainer.total_epochs=15
)

# [CONFIG_NAME=...] run_lane LANE NAME [overrides...]: one lane of one model/backend, through this
# package's entry point (CONFIG_NAME: async_ppo_trainer by default, async_ppo_megatron_trainer for Megatron).
run_lane() {
  local lane="$1" name="$2" flags
  shift 2
  flags="$(lane_flags "$lane")" || exit 2
  # hydra's options (--config-name, --cfg job, ...) must come before the overrides: move them there
  local options=() overrides=()
  [ -n "${CONFIG_NAME:-}" ] && options+=("--config-name=$CONFIG_NAME")
  while [ $# -gt 0 ]; do
    if [[ "$1" == --* ]]; then
      options+=("$1")
      if [[ "$1" != *=* ]] && [ $# -gt 1 ] && [[ "$2" != *=* && "$2" != --* ]]; then options+=("$2"); shift; fi
    else
      overrides+=("$1")
    fi
    shift
  done
  # shellcheck disable=SC2086  # flags: zero to two words
  exec "$PYTHON" -m verl_async_rm.main_ppo "${options[@]}" "${COMMON_OVERRIDES[@]}" $flags \
    "trainer.experiment_name=${name}_${lane}" "${overrides[@]}"
}
