#!/usr/bin/env bash
# Qwen2.5-3B-Instruct, Megatron actor/ref (TP 2), vLLM rollout. Usage: bash run_qwen2_5_3b_megatron.sh LANE [overrides...]
set -euo pipefail
source "$(dirname "$0")/common.sh"
: "${MODEL:=Qwen/Qwen2.5-3B-Instruct}"
export CUDA_DEVICE_MAX_CONNECTIONS=1  # Megatron overlaps communication with computation
lane="${1:?usage: $0 baseline|pipeline|off_policy|both [hydra overrides...]}"
shift
CONFIG_NAME=async_ppo_megatron_trainer run_lane "$lane" qwen2_5_3b_megatron \
  "actor_rollout_ref.model.path=$MODEL" \
  actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8 \
  actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2 \
  actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=1 \
  actor_rollout_ref.ref.megatron.tensor_model_parallel_size=2 \
  actor_rollout_ref.ref.megatron.pipeline_model_parallel_size=1 \
  actor_rollout_ref.rollout.tensor_model_parallel_size=1 \
  actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16 \
  actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=16 \
  "$@"
