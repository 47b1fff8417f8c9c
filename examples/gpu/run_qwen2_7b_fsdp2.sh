#!/usr/bin/env bash
# Qwen2-7B-Instruct, FSDP2 actor/ref, vLLM rollout. Usage: bash run_qwen2_7b_fsdp2.sh LANE [overrides...]
set -euo pipefail
source "$(dirname "$0")/common.sh"
: "${MODEL:=Qwen/Qwen2-7B-Instruct}"
lane="${1:?usage: $0 baseline|pipeline|off_policy|both [hydra overrides...]}"
shift
run_lane "$lane" qwen2_7b_fsdp2 \
  "actor_rollout_ref.model.path=$MODEL" \
  actor_rollout_ref.actor.strategy=fsdp2 \
  actor_rollout_ref.ref.strategy=fsdp2 \
  actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8 \
  actor_rollout_ref.actor.fsdp_config.param_offload=false \
  actor_rollout_ref.actor.fsdp_config.optimizer_offload=false \
  actor_rollout_ref.rollout.tensor_model_parallel_size=2 \
  actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16 \
  actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=16 \
  actor_rollout_ref.ref.fsdp_config.param_offload=true \
  "$@"
