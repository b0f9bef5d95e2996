"""Compile every Triton kernel to PTX/cubin for sm_80 and sm_90 without a GPU (a CI check).

The nine kernels that consume noise are built twice: reading noise tensors (``RNG=False``) and drawing the
Philox stream in the kernel (``RNG=True``, key ``...[rng]``). Their seed travels as two "i32" words (the
launchers always pass signed 32-bit halves, so this is the only signature they launch).

Run as ``python -m specdec_kernels.triton.compile_check`` in a process WITHOUT ``TRITON_INTERPRET=1`` (under the
interpreter the kernels are not JIT functions and cannot be compiled).
"""

from __future__ import annotations

import sys
import time

P32, P64, PI64, PI8, PI32 = "*fp32", "*fp64", "*i64", "*i8", "*i32"
SEED = ["i32", "i32"]  # seed_lo, seed_hi

# kernel name -> (argument types in order, constexpr values)
SIGNATURES: dict[str, tuple[list[str], dict[str, object]]] = {
    "_sample_categorical_kernel": ([P32, P64, PI64, "i32", *SEED], {"RNG": False, "BLOCK_V": 1024}),
    "_gumbel_topk_kernel": ([P32, P64, PI64, PI8, P64, "i32", "i32", *SEED], {"RNG": False, "BLOCK_V": 1024}),
    "_tree_positions_kernel": ([PI64, PI64, PI64, "i32"], {"BLOCK_N": 64}),
    "_tree_mask_kernel": ([PI64, PI8, PI8, PI8, "i32", "i32"], {"BLOCK": 1024}),
    "_verify_chain_kernel": (
        [PI64, P32, P32, PI64, P64, P64, PI64, "i32", PI64, PI64, P64, "i32", "i32", *SEED],
        {"GREEDY": False, "RNG": False, "BLOCK_V": 1024},
    ),
}
SIGNATURES["_emission_law_kernel"] = ([P32, P32, P32, P32, "i32"], {"TOL": 1e-6, "BLOCK_V": 1024})
SIGNATURES["_emission_law_kernel[fp64]"] = ([P64, P64, P64, P64, "i32"], {"TOL": 1e-12, "BLOCK_V": 1024})
SIGNATURES["_process_logits_kernel"] = ([P32, P32, "i32", "fp32", "i32", "fp64"], {"GREEDY": False, "BLOCK_V": 1024})
SIGNATURES["_process_logits_kernel[greedy]"] = (
    [P32, P32, "i32", "fp32", "i32", "fp64"],
    {"GREEDY": True, "BLOCK_V": 1024},
)
SIGNATURES["_spechub_sample_kernel"] = ([P32, P64, PI64, PI64, PI8, "i32", *SEED], {"RNG": False, "BLOCK_V": 1024})
SIGNATURES["_kseq_gamma_kernel"] = ([P32, P32, PI64, P64, P64, "i32"], {"BLOCK_V": 1024})
SIGNATURES["_filter_kv_kernel"] = ([P32, PI64, PI64, PI64, "i32", "i32", "i32", "i32"], {"BLOCK_D": 64})
SIGNATURES["_sbs_step_kernel"] = (
    [P32, P64, P64, PI8, P64, P64, PI64, P64, PI64, PI64, P64, P64, PI8, "i32", "i32", "i32", "i32", *SEED],
    {"RNG": False, "BLOCK_V": 1024, "BLOCK_C": 64},
)
SIGNATURES["_verify_chain_kernel[greedy]"] = (
    SIGNATURES["_verify_chain_kernel"][0],
    {"GREEDY": True, "RNG": False, "BLOCK_V": 1024},
)
for _m in range(5):  # the METHOD codes of triton/node.py
    SIGNATURES[f"_verify_node_kernel[{_m}]"] = (
        [PI64, PI8, P32, P32, P64, P64, PI64, P32, P32, P32, PI64, PI64, "i32", "i32", *SEED],
        {"METHOD": _m, "ANALYTIC": True, "RNG": False, "BLOCK_V": 1024},
    )
    SIGNATURES[f"_verify_tree_kernel[{_m}]"] = (
        [
            PI64,
            PI64,
            PI8,
            P32,
            P32,
            PI64,
            P64,
            P64,
            PI64,
            "i32",
            PI32,
            PI64,
            PI64,
            PI8,
            P32,
            P32,
            P32,
            PI64,
            PI64,
            PI64,
            PI64,
            "i32",
            "i32",
            "i32",
            "i32",
            "i32",
            *SEED,
        ],
        {"METHOD": _m, "KSEQ": _m == 2, "GREEDY": False, "RNG": False, "BLOCK_V": 1024},
    )
SIGNATURES["_verify_tree_kernel[greedy]"] = (
    SIGNATURES["_verify_tree_kernel[0]"][0],
    {"METHOD": 0, "KSEQ": False, "GREEDY": True, "RNG": False, "BLOCK_V": 1024},
)
SIGNATURES["_verify_block_kernel"] = (
    [PI64, PI64, PI8, P32, P32, P64, P64, PI64, "i32", PI64, PI64, PI64, PI64, PI64, "i32", "i32", "i32", "i32", "i32",
     *SEED],
    {"RNG": False, "BLOCK_V": 1024},
)  # fmt: skip
for _swor in (False, True):
    SIGNATURES[f"_verify_traversal_kernel[{'swor' if _swor else 'iid'}]"] = (
        [PI64, PI64, PI8, P32, P32, P64, P64, PI64, "i32", PI32, PI64, P64, P64, P64, PI64, PI64, PI64, PI64, "i32",
         "i32", "i32", "i32", *SEED],
        {"SWOR": _swor, "RNG": False, "BLOCK_V": 1024},
    )  # fmt: skip
# the in-kernel Philox variants of every noise-reading build (greedy verifiers draw no noise)
for _key in [k for k, (_, c) in SIGNATURES.items() if "RNG" in c and not c.get("GREEDY", False)]:
    _types, _consts = SIGNATURES[_key]
    _name = _key[:-1] + ",rng]" if _key.endswith("]") else _key + "[rng]"
    SIGNATURES[_name] = (_types, _consts | {"RNG": True})


def compile_all(capabilities: tuple[int, ...] = (80, 90)) -> dict[str, float]:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from . import kernels

    timings: dict[str, float] = {}
    for key, (types, constexprs) in SIGNATURES.items():
        fn = getattr(kernels, key.split("[")[0])
        names = [n for n in fn.arg_names if n not in constexprs]
        if len(names) != len(types):
            raise RuntimeError(f"{key}: {len(names)} runtime arguments but {len(types)} types in SIGNATURES")
        signature = dict(zip(names, types, strict=True)) | {n: "constexpr" for n in constexprs}
        for cc in capabilities:
            t0 = time.perf_counter()
            src = ASTSource(fn=fn, signature=signature, constexprs=dict(constexprs))
            compiled = triton.compile(src, target=GPUTarget("cuda", cc, 32))
            if "ptx" not in compiled.asm or "cubin" not in compiled.asm:
                raise RuntimeError(f"{key} sm_{cc}: no PTX/cubin produced")
            timings[f"{key} sm_{cc}"] = time.perf_counter() - t0
    return timings


def main() -> int:
    timings = compile_all()
    for name, sec in timings.items():
        print(f"{name}: compiled in {sec:.2f} s")
    print(f"{len(timings)} kernel builds OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
