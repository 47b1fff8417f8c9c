#!/usr/bin/env bash
# The test command: sets everything up (ci/install.sh), then runs the whole suite in that venv
# (extra args go to pytest, e.g. `bash ci/test.sh -m quick` for the inner loop).
#
#   VERL_ASYNC_RM_TEST_WORKERS  (no extra args only; default 2) N > 1: the suite in two runs, every test
#       but the trainers' on N processes (pytest-xdist; each module whole on one of them, every module with
#       a Ray test on one: tests/conftest.py), then the trainer tier in one process, alone on the machine
#       as in a one-process run (on 2 cores ~400 s less than one process). 1: the whole suite in one process.
set -uo pipefail
cd "$(dirname "$0")/.."
bash ci/install.sh || exit 1
VENV="${VERL_ASYNC_RM_VENV:-$PWD/.venv}"
WORKERS="${VERL_ASYNC_RM_TEST_WORKERS:-2}"
export RAY_AUTH_MODE=disabled

pytest_run() {
  "$VENV/bin/python" -m pytest "$@"
  local status=$?
  if [ "$status" -eq 5 ]; then
    echo "ci/test.sh: pytest collected no tests: that is a failure" >&2
    return 1
  fi
  return "$status"
}

if [ "$#" -eq 0 ] && [ "$WORKERS" -gt 1 ]; then
  pytest_run -m "not trainer" -n "$WORKERS" --dist loadgroup
  first=$?
  pytest_run -m trainer
  second=$?
  [ "$first" -ne 0 ] && exit "$first"
  exit "$second"
fi
pytest_run "$@"
