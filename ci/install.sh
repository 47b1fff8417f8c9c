#!/usr/bin/env bash
# Installs everything the project needs on a fresh machine. Idempotent: fast when already done.
set -euo pipefail
cd "$(dirname "$0")/.."
# torch first, pinned: an unpinned torch (pulled in by verl) would download a multi-GB CUDA build.
python -m pip install --quiet --disable-pip-version-check "torch==2.13.0"
python -m pip install --quiet --disable-pip-version-check -e ".[dev]"
python -c "import torch, verl, ray; print(f'installed: torch {torch.__version__}, verl {verl.__version__}, ray {ray.__version__}')"
