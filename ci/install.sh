#!/usr/bin/env bash
# Sets everything up on a fresh machine: a virtual environment (created if missing), the CPU build of
# torch FIRST, then this package and its test and demo rig (rig/) with the tests' extras. Idempotent: a second run that finds
# the same pyproject.toml and this script already installed returns at once.
#
#   VERL_ASYNC_RM_VENV  where the venv lives (default: .venv in the repository)
#   PYTHON              the interpreter that creates it (default: python3; Python >= 3.10)
#   TORCH_VERSION       the torch release installed (default: the one this project is tested with)
#   TORCH_INDEX_URL     where the CPU build comes from (default: pip's configured indexes if they
#                       have it, else PyTorch's CPU wheel index)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${VERL_ASYNC_RM_VENV:-$PWD/.venv}"
PYTHON="${PYTHON:-python3}"
TORCH_VERSION="${TORCH_VERSION:-2.13.0}"
PYTORCH_CPU_INDEX="https://download.pytorch.org/whl/cpu"

if [ ! -x "$VENV/bin/python" ]; then
  echo "ci/install.sh: creating the virtual environment $VENV"
  "$PYTHON" -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)

stamp="$VENV/.verl_async_rm_installed"
wanted="$(cat pyproject.toml rig/pyproject.toml ci/install.sh | sha256sum | cut -d' ' -f1) $TORCH_VERSION"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$wanted" ]; then
  exit 0
fi

# torch first, the CPU build: an unpinned torch resolved by pip alone (verl asks for one) would be a
# multi-GB CUDA build. On Linux PyTorch labels its CPU wheels "+cpu"; elsewhere the plain release is.
torch_spec="torch==$TORCH_VERSION"
[ "$(uname -s)" = "Linux" ] && torch_spec="torch==$TORCH_VERSION+cpu"
if [ -n "${TORCH_INDEX_URL:-}" ]; then
  "${PIP[@]}" install --quiet "$torch_spec" --index-url "$TORCH_INDEX_URL"
elif ! "${PIP[@]}" install --quiet "$torch_spec" 2>/dev/null; then
  # public PyPI has no "+cpu" builds: take it from PyTorch's CPU index (as its install guide does)
  echo "ci/install.sh: $torch_spec is not on pip's configured indexes; using $PYTORCH_CPU_INDEX"
  "${PIP[@]}" install --quiet "$torch_spec" --index-url "$PYTORCH_CPU_INDEX"
fi
"${PIP[@]}" install --quiet -e . -e "./rig[dev]"  # the product, and the test and demo rig beside it
"$VENV/bin/python" -c "import torch, verl, ray; print(f'installed in $VENV: torch {torch.__version__}, verl {verl.__version__}, ray {ray.__version__}')"
echo "$wanted" > "$stamp"
