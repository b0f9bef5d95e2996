"""The CUDA kernels' in-kernel noise (csrc/cuda/common.cuh: NoiseRow, philox_pair) is host+device code: built here
with nvcc into a host program and compared bit for bit with the Philox stream of specdec_kernels._rng, so the draw
path of the kernels is checked on machines without a GPU (the kernels themselves only compile here)."""

import os
import shutil
import struct
import subprocess

import pytest
import torch

from specdec_kernels import _rng

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NVCC = shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc" if os.path.exists("/usr/local/cuda/bin/nvcc") else None)

# (seed, purpose, row, n): seeds and rows above 2**32 use both key / counter words; odd n has a half pair at the end
CASES = [
    (0, _rng.DRAFT, 0, 7),
    (1, _rng.ACCEPT, 3, 4),
    (123456789, _rng.FINAL, 2, 9),
    (2**40 + 17, _rng.DRAFT, 2**33 + 5, 5),
    (2**63 - 1, _rng.ACCEPT, 2**32 - 1, 3),
]

PROGRAM = r"""
#include <cstdio>
#include <cstring>

#include "common.cuh"

using specdec::cuda::NoiseRow;
using specdec::cuda::noise_row;

static unsigned long long bits(double x) {
  unsigned long long b;
  std::memcpy(&b, &x, sizeof b);
  return b;
}

int main() {
  unsigned long long seed, row;
  unsigned purpose;
  long long n;
  while (std::scanf("%llu %u %llu %lld", &seed, &purpose, &row, &n) == 4) {
    // drawn: element by element, and by pairs as the kernels' loops read them
    const NoiseRow nz = noise_row(nullptr, n, seed, purpose, static_cast<int64_t>(row));
    for (long long i = 0; i < n; ++i) std::printf("%016llx ", bits(nz.at(i)));
    std::printf("\n");
    for (long long j = 0; 2 * j < n; ++j) {
      double a, b;
      nz.pair(j, n, &a, &b);
      std::printf("%016llx ", bits(a));
      if (2 * j + 1 < n) std::printf("%016llx ", bits(b));
    }
    std::printf("\n");
  }
  // test mode: row 1 of a [2, 3] tensor is read, not drawn
  const double buf[6] = {0.1, 0.2, 0.3, 0.4, 0.5, 0.6};
  const NoiseRow t = noise_row(buf, 3, 7, 0, 1);
  double a, b;
  t.pair(1, 3, &a, &b);
  std::printf("%g %g %g %g %g\n", t.at(0), t.at(1), t.at(2), a, b);
  return 0;
}
"""


def _expected(seed: int, purpose: int, row: int, n: int) -> list[float]:
    if row < 8:  # the reference generator itself, rows 0..row
        return _rng.philox_uniform(seed, purpose, (row + 1, n))[row].tolist()
    # far rows: the documented layout on the reference Philox rounds (counter (i >> 1, r lo, r hi, purpose))
    j = torch.arange((n + 1) // 2, dtype=torch.long)
    c = (j, torch.full_like(j, row & 0xFFFFFFFF), torch.full_like(j, row >> 32), torch.full_like(j, purpose))
    o0, o1, o2, o3 = _rng.philox4x32_10(*c, seed & 0xFFFFFFFF, seed >> 32)
    a = torch.stack((o0, o2), -1).reshape(-1)[:n]
    b = torch.stack((o1, o3), -1).reshape(-1)[:n]
    return ((2 * (((a >> 12) << 32) | b) + 1).double() * 2.0**-53).tolist()


def _hex(x: float) -> str:
    return struct.pack(">d", x).hex()


@pytest.mark.skipif(NVCC is None, reason="nvcc not found on this machine")
def test_kernel_noise_rows_match_the_reference_stream(tmp_path):
    src = tmp_path / "noise_host.cu"
    src.write_text(PROGRAM)
    exe = tmp_path / "noise_host"
    cmd = [NVCC, "-std=c++17", "-O2", "-Werror", "all-warnings", "-I", os.path.join(ROOT, "csrc", "include")]
    cmd += ["-I", os.path.join(ROOT, "csrc", "cuda"), "-o", str(exe), str(src)]
    built = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr[-4000:]
    stdin = "".join(f"{s} {p} {r} {n}\n" for s, p, r, n in CASES)
    ran = subprocess.run([str(exe)], input=stdin, capture_output=True, text=True, timeout=60)
    assert ran.returncode == 0, ran.stderr[-4000:]
    lines = ran.stdout.splitlines()
    assert len(lines) == 2 * len(CASES) + 1
    for k, (seed, purpose, row, n) in enumerate(CASES):
        want = [_hex(x) for x in _expected(seed, purpose, row, n)]
        assert lines[2 * k].split() == want, f"NoiseRow::at, case {(seed, purpose, row, n)}"
        assert lines[2 * k + 1].split() == want, f"NoiseRow::pair, case {(seed, purpose, row, n)}"
    assert lines[-1].split() == ["0.4", "0.5", "0.6", "0.6", "0"]
