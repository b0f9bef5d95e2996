#!/usr/bin/env bash
# Install everything, then run the main job: speculative decoding vs plain decoding on SmolLM2-135M-Instruct.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
python -m specdec demo "$@"
