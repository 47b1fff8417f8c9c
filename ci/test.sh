#!/usr/bin/env bash
# The test command: sets everything up (ci/install.sh), then runs the whole suite in that venv
# (extra args go to pytest, e.g. `bash ci/test.sh -m quick` for the inner loop).
set -uo pipefail
cd "$(dirname "$0")/.."
bash ci/install.sh || exit 1
VENV="${VERL_ASYNC_RM_VENV:-$PWD/.venv}"
export RAY_AUTH_MODE=disabled
"$VENV/bin/python" -m pytest "$@"
status=$?
if [ "$status" -eq 5 ]; then
  echo "ci/test.sh: pytest collected no tests: that is a failure" >&2
  exit 1
fi
exit "$status"
