#!/usr/bin/env bash
# The main job: installs what is needed, then runs the demo (extra args go to the demo).
set -euo pipefail
cd "$(dirname "$0")/.."
bash ci/install.sh
export RAY_AUTH_MODE=disabled
python -m verl_async_rm demo "$@"
