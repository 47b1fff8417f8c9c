#!/usr/bin/env bash
# The main job: sets everything up (ci/install.sh), then runs the training demo in that venv
# (extra args go to the demo; `bash ci/demo.sh --help` lists them).
set -euo pipefail
cd "$(dirname "$0")/.."
bash ci/install.sh
VENV="${VERL_ASYNC_RM_VENV:-$PWD/.venv}"
export RAY_AUTH_MODE=disabled
exec "$VENV/bin/python" -m verl_async_rm_rig demo "$@"
