#!/usr/bin/env bash
# The tests inside vLLM (tests/in_vllm), in the virtualenv scripts/install_vllm.sh builds (made here when missing).
# Usage: bash scripts/test_vllm.sh [pytest arguments]
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${SPECDEC_VLLM_VENV:-$HOME/.cache/specdec/vllm-venv}"
[ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c "import vllm" 2>/dev/null || bash scripts/install_vllm.sh "$VENV"
exec "$VENV/bin/python" -m pytest -q tests/in_vllm "$@"
