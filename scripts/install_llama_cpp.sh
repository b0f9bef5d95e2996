#!/usr/bin/env bash
# The llama.cpp baseline of benchmarks/bench_llama_cpp.py: llama-cpp-python built from PyPI's source distribution
# for this machine's CPU (llama.cpp's default native build), and llama.cpp's own HF-to-GGUF converter from the same
# source, unpacked under the cache directory. Not a dependency of specdec_kernels; nothing else uses it.
#   bash scripts/install_llama_cpp.sh [CACHE_DIR]   (default: ~/.cache/specdec/llama_cpp)
# Building takes several minutes on 2 cores. The benchmark finds the converter at CACHE_DIR/src/convert_hf_to_gguf.py.
set -euo pipefail
VERSION="0.3.36"
DEST="${1:-${HOME}/.cache/specdec/llama_cpp}"
mkdir -p "${DEST}"
python -m pip download -q --no-deps --no-binary :all: "llama-cpp-python==${VERSION}" -d "${DEST}"
SDIST="${DEST}/llama_cpp_python-${VERSION}.tar.gz"
# the binding's own dependencies (small, pure Python) and llama.cpp's converter's (sentencepiece, protobuf)
python -m pip install -q "numpy" "typing-extensions" "diskcache" "jinja2" "sentencepiece" "protobuf"
python -m pip install -q --no-deps --no-binary llama-cpp-python "${SDIST}"
rm -rf "${DEST}/src" "${DEST}/unpack"
mkdir -p "${DEST}/unpack"
tar -xzf "${SDIST}" -C "${DEST}/unpack"
mv "${DEST}/unpack/llama_cpp_python-${VERSION}/vendor/llama.cpp" "${DEST}/src"
rm -rf "${DEST}/unpack"
python -c "import llama_cpp; print('llama-cpp-python', llama_cpp.__version__, 'converter', '${DEST}/src/convert_hf_to_gguf.py')"
