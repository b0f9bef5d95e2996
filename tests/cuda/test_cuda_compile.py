"""Compile check of every CUDA source: the raw-pointer kernels in csrc/cuda/*.cu must build with nvcc for sm_80
and sm_90 (nothing built for CUDA can run on the CPU-only CI machines)."""

import glob
import os
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SOURCES = sorted(glob.glob(os.path.join(ROOT, "csrc", "cuda", "*.cu")))
NVCC = shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc" if os.path.exists("/usr/local/cuda/bin/nvcc") else None)


def test_there_are_cuda_sources():
    names = {os.path.basename(s) for s in SOURCES}
    assert {"sampling.cu", "tree.cu", "verify.cu", "beam.cu"} <= names


@pytest.mark.skipif(NVCC is None, reason="nvcc not found on this machine")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("source", SOURCES, ids=[os.path.basename(s) for s in SOURCES])
def test_cuda_source_compiles(source, arch, tmp_path):
    cmd = [
        NVCC,
        "-c",
        "-std=c++17",
        "-O3",
        "-Werror",
        "all-warnings",
        f"-arch={arch}",
        "-I",
        os.path.join(ROOT, "csrc", "include"),
        "-I",
        os.path.join(ROOT, "csrc", "cuda"),
        "-o",
        str(tmp_path / "k.o"),
        source,
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-4000:]
    assert (tmp_path / "k.o").stat().st_size > 0
