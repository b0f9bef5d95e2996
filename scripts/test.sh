#!/usr/bin/env bash
# Install everything, then run lint and the default test suite (what CI runs; about 25 min of tests on 2 cores).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
ruff check . && ruff format --check .
python -m pytest -m "not slow" -q "$@"
