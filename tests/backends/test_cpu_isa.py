"""The CPU extension's instruction-set variants (baseline, AVX2, AVX-512, AVX-512-BF16, AMX-BF16), compiled side
by side and picked at import from the CPU's features: every variant this CPU can run is forced in turn
(SPECDEC_CPU_ISA, one subprocess each: a process loads one variant) and passes the cpu backend's parity suites
against the torch reference, and the kernels whose fast paths differ by variant (skinny_linear, decode_attention)
agree across them; rms_norm and rotary_embedding give the same bits on every variant.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

import specdec_kernels.native as native

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ISAS = native.runnable_isas() if native.HAVE_CPU else []
PARITY = [
    "tests/backends",
    "tests/ops/test_skinny_linear.py",
    "tests/ops/test_skinny_linear_int8.py",
    "tests/ops/test_decode_attention.py",
    "tests/ops/test_rms_norm.py",
    "tests/ops/test_rotary_embedding.py",
]

# bf16 outputs of skinny_linear and decode_attention on fixed inputs, printed as integers (bit patterns)
PROBE = """
import torch, specdec_kernels as sk, specdec_kernels.native as n
g = torch.Generator().manual_seed(0)
x = torch.randn(5, 96, generator=g).bfloat16(); w = torch.randn(40, 96, generator=g).bfloat16()
y = sk.skinny_linear(x, w, backend="cpu")
ref = torch.nn.functional.linear(x.float(), w.float())
err = float((y.float() - ref).abs().max() / ref.abs().max())
print(n.cpu_isa(), n.skinny_linear_isa(), err)
"""


def run_with(isa: str, args: list[str]) -> subprocess.CompletedProcess:
    env = {**os.environ, "SPECDEC_CPU_ISA": isa, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200)


def test_best_runnable_variant_is_loaded():
    assert native.HAVE_CPU, "the C++ extension is not built"
    if os.environ.get("SPECDEC_CPU_ISA", "auto") == "auto":
        assert native.cpu_isa() == ISAS[-1]
    assert ISAS[0] == "baseline"


@pytest.mark.parametrize("isa", ISAS)
def test_forced_variant_loads_and_matches_torch(isa):
    res = run_with(isa, ["-c", PROBE])
    assert res.returncode == 0, res.stderr[-2000:]
    loaded, path, err = res.stdout.split()
    assert loaded == isa
    paths = {"baseline": "portable", "avx2": "avx2", "avx512": "avx512", "avx512bf16": "avx512bf16", "amx": "amx"}
    assert path == paths[isa]
    assert float(err) < 1e-2  # bf16 output rounding; the parity suites check the exact budgets


@pytest.mark.parametrize("isa", ISAS)
def test_forced_variant_passes_the_cpu_parity_suites(isa):
    args = ["-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not slow", "-k", "not triton"]
    res = run_with(isa, [*args, f"--ignore={os.path.relpath(__file__, ROOT)}", *PARITY])  # not this module again
    assert res.returncode == 0, res.stdout[-3000:]
    assert " passed" in res.stdout


def test_unknown_or_unrunnable_variant_is_refused():
    res = run_with("sse9", ["-c", "import specdec_kernels"])
    assert res.returncode != 0 and "SPECDEC_CPU_ISA must be 'auto' or one of" in res.stderr
    flags = native.cpu_flags()
    missing = [isa for isa in native.CPU_ISAS if isa not in ISAS]
    if flags is not None and missing:
        res = run_with(missing[-1], ["-c", "import specdec_kernels"])
        assert res.returncode != 0 and "this CPU cannot run that variant" in res.stderr


def test_skinny_linear_agrees_across_variants():
    """The paths sum in different orders and round to bf16 once per output: they agree to a few bf16 ulps of the
    output's scale."""
    outs = {}
    for isa in ISAS:
        code = PROBE.replace("print(n.cpu_isa(), n.skinny_linear_isa(), err)", "print(json.dumps(y.float().tolist()))")
        res = run_with(isa, ["-c", "import json\n" + code])
        assert res.returncode == 0, res.stderr[-2000:]
        outs[isa] = torch.tensor(json.loads(res.stdout))
    base = outs[ISAS[0]]
    scale = float(base.abs().max())
    for isa, y in outs.items():
        assert float((y - base).abs().max()) <= 4 * 2**-8 * scale, f"{isa} vs {ISAS[0]}"


# bf16 outputs of rms_norm and rotary_embedding on fixed inputs (vector bodies and scalar tails), as bit patterns
NORM_PROBE = """
import json, torch, specdec_kernels as sk
g = torch.Generator().manual_seed(0)
x = torch.randn(5, 1000, generator=g).bfloat16(); w = torch.randn(1000, generator=g).bfloat16()
q = torch.randn(2, 3, 9, 40, generator=g).bfloat16(); k = torch.randn(2, 1, 9, 40, generator=g).bfloat16()
cos = torch.randn(1, 9, 40, generator=g).bfloat16(); sin = torch.randn(1, 9, 40, generator=g).bfloat16()
outs = [sk.rms_norm(x, w, 1e-5, backend="cpu"), *sk.rotary_embedding(q, k, cos, sin, backend="cpu")]
outs += [sk.rms_norm(x.float(), w.float(), 1e-5, backend="cpu"), sk.rms_norm(x.half(), w.half(), 1e-5, backend="cpu")]
print(json.dumps([t.flatten().view(torch.int16 if t.element_size() == 2 else torch.int32).tolist() for t in outs]))
"""


def test_norm_and_rotary_give_the_same_bits_on_every_variant():
    """rms_norm sums its squares in the same lanes and order on the scalar and vector paths, rotary_embedding
    rounds every op as torch does: the variants agree bit for bit (bf16, fp32, fp16)."""
    outs = {}
    for isa in ISAS:
        res = run_with(isa, ["-c", NORM_PROBE])
        assert res.returncode == 0, res.stderr[-2000:]
        outs[isa] = json.loads(res.stdout)
    for isa, bits in outs.items():
        assert bits == outs[ISAS[0]], f"{isa} vs {ISAS[0]}"
