#!/usr/bin/env bash
# All six lanes of one model/backend, one after the other (each a full training run), e.g.
#   bash run_lanes.sh run_qwen2_7b_megatron.sh trainer.total_training_steps=100
# Compare the lanes' wall time and timing_s/step in tensorboard (project $PROJECT).
set -euo pipefail
script="$(dirname "$0")/${1:?usage: $0 run_<model>_<backend>.sh [hydra overrides...]}"
shift
for lane in baseline pipeline off_policy both colocate_async colocate_async_agent; do
  echo "=== $lane: $script"
  bash "$script" "$lane" "$@"
done
