#!/usr/bin/env bash
# The test command: installs what is needed, then runs the whole suite (extra args go to pytest,
# e.g. `bash ci/test.sh -m quick` for the inner loop).
set -uo pipefail
cd "$(dirname "$0")/.."
bash ci/install.sh || exit 1
export RAY_AUTH_MODE=disabled
python -m pytest "$@"
status=$?
if [ "$status" -eq 5 ]; then
  echo "ci/test.sh: pytest collected no tests: that is a failure" >&2
  exit 1
fi
exit "$status"
