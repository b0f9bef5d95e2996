"""Backends "cpu"/"cuda": thin wrappers over ``torch.ops.specdec.*`` from the compiled extension.

The extension is optional: when it is missing, the backends are recorded as unavailable with the reason, and
``backend="auto"`` falls back to ``torch``. Each wrapper takes exactly the arguments of the reference function of
the same name (``specdec_kernels.reference``) and only adapts dtypes/layout; the schemas live in
``csrc/torch_bindings.cpp``. Fake (meta) implementations make the ops traceable (``torch.compile``, opcheck).
"""

from __future__ import annotations

import importlib
import os
import platform
import warnings
from collections.abc import Sequence

import torch

from ._registry import mark_missing, register

#: instruction-set variants of the CPU extension, worst to best, and the module each one is built as (setup.py)
CPU_ISAS = ("baseline", "avx2", "avx512", "avx512bf16", "amx")
_MODULES = {
    "baseline": "_C",
    "avx2": "_C_avx2",
    "avx512": "_C_avx512",
    "avx512bf16": "_C_avx512bf16",
    "amx": "_C_amx",
}
_AVX2 = {"avx2", "fma", "f16c"}
_AVX512 = _AVX2 | {"avx512f", "avx512bw", "avx512dq", "avx512vl"}
_AVX512BF16 = _AVX512 | {"avx512_bf16"}
_NEEDS = {
    "baseline": set(),
    "avx2": _AVX2,
    "avx512": _AVX512,
    "avx512bf16": _AVX512BF16,
    "amx": _AVX512BF16 | {"amx_tile", "amx_bf16"},
}


def _cpuinfo(field: str) -> str | None:
    """The value of the first ``field`` line of Linux /proc/cpuinfo, or None where it cannot be read."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith(field):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def cpu_flags() -> set[str] | None:
    """The CPU feature flags the kernel reports (Linux /proc/cpuinfo), or None where they cannot be read."""
    flags = _cpuinfo("flags")
    return None if flags is None else set(flags.split())


def cpu_model() -> str:
    """The CPU's model name (Linux /proc/cpuinfo), else platform.processor() (possibly empty)."""
    name = _cpuinfo("model name")
    return platform.processor() if name is None else name


def runnable_isas() -> list[str]:
    """The variants this CPU can run, worst to best. Without readable flags, torch's own CPU capability decides
    (it does not report bf16 dot products, so the avx512bf16 variant is then not chosen)."""
    flags = cpu_flags()
    if flags is None:
        cap = torch.backends.cpu.get_cpu_capability()
        return ["baseline", "avx2", "avx512"][: {"AVX2": 2, "AVX512": 3}.get(cap, 1)]
    return [isa for isa in CPU_ISAS if _NEEDS[isa] <= flags]


def _load_cpu() -> str | None:
    """Import the best variant of the CPU extension (or the one SPECDEC_CPU_ISA names); its ISA, or None."""
    forced = os.environ.get("SPECDEC_CPU_ISA", "auto").strip() or "auto"
    if forced != "auto":
        if forced not in CPU_ISAS:
            raise ValueError(f"SPECDEC_CPU_ISA must be 'auto' or one of {CPU_ISAS}, got {forced!r}")
        if forced not in runnable_isas():
            missing = sorted(_NEEDS[forced] - (cpu_flags() or set()))
            raise RuntimeError(f"SPECDEC_CPU_ISA={forced}: this CPU cannot run that variant (lacks {missing})")
        importlib.import_module(f".{_MODULES[forced]}", __package__)  # an error here names the missing module
        if forced == "amx" and str(torch.ops.specdec.skinny_linear_isa()) != "amx":
            raise RuntimeError("SPECDEC_CPU_ISA=amx: the operating system refused this process the AMX tile state")
        return forced
    errors = []
    for isa in reversed(runnable_isas()):
        try:
            importlib.import_module(f".{_MODULES[isa]}", __package__)
            return isa
        except ImportError as exc:  # a variant not built on this platform: try the next one
            errors.append(f"{_MODULES[isa]}: {exc}")
    mark_missing("cpu", f"C++ extension not built ({'; '.join(errors)}); run `pip install --no-build-isolation -e .`")
    # once per process (a module body runs once): without the extension every op runs on the torch reference
    warnings.warn(
        f"specdec_kernels: the C++ extension is not available ({errors[-1] if errors else 'no variant'}); every op "
        "falls back to the torch reference backend, tens to hundreds of times slower. Reinstall with torch present: "
        "`pip install --no-build-isolation .`",
        RuntimeWarning,
        stacklevel=3,
    )
    return None


CPU_ISA = _load_cpu()  # loads TORCH_LIBRARY(specdec) registrations; must follow `import torch`
HAVE_CPU = CPU_ISA is not None


def cpu_isa() -> str:
    """The instruction-set variant of the CPU extension this process runs: one of CPU_ISAS, or "none"."""
    return CPU_ISA or "none"


try:
    # TORCH_LIBRARY_IMPL(specdec, CUDA): built only with a CUDA torch; loaded by name as the CPU variants are
    importlib.import_module("._C_cuda", __package__)

    HAVE_CUDA = HAVE_CPU
except ImportError as exc:  # pragma: no cover - depends on the build
    HAVE_CUDA = False
    mark_missing("cuda", f"CUDA extension not built ({exc}); it is built only when torch has CUDA and nvcc exists")


def skinny_linear_isa() -> str:
    """The bf16 path of the loaded CPU variant's skinny_linear (see :func:`cpu_isa`): ``"amx"`` (AMX-BF16 tiles;
    the amx variant takes ``"avx512bf16"`` where the operating system refuses the tile state), ``"avx512bf16"``
    (bf16 dot-product instructions), ``"avx512"`` (AVX-512F FMA tiles), ``"avx2"`` (AVX2 + FMA tiles),
    ``"portable"``; ``"none"`` without the extension."""
    return str(torch.ops.specdec.skinny_linear_isa()) if HAVE_CPU else "none"


def crop_slots(kv: Sequence[torch.Tensor], length: int) -> bool:
    """Narrow every [B, H, S, D] tensor of ``kv`` to its first ``length`` slots, in place (metadata only), in one
    C++ call: the driver's KV-cache crop (slicing 60 tensors from Python costs ~0.1 ms right after a forward).

    Returns False and changes nothing when the extension is missing or a tensor is not a CPU tensor (the dispatcher
    finds no kernel; the caller then crops by slicing); raises ValueError for a tensor that is not 4-D or a length
    outside [0, S] (checked for every tensor before any is changed)."""
    if isinstance(length, bool) or not isinstance(length, int):
        raise ValueError(f"length must be an int, got {length!r}")
    if not HAVE_CPU:
        return False
    try:
        torch.ops.specdec.crop_slots_(list(kv), length)
    except NotImplementedError:  # a CUDA (or other non-CPU) tensor in the list: no kernel registered for it
        return False
    return True


def _on_cpu(device: torch.device) -> bool:
    return device.type == "cpu"


if HAVE_CPU:
    ops = torch.ops.specdec

    # ---- tree layout ----

    @register("tree_positions", "cpu", supports=_on_cpu)
    def tree_positions(depth: torch.Tensor, prefix_len: torch.Tensor) -> torch.Tensor:
        return ops.tree_positions(depth, prefix_len)

    @register("tree_mask", "cpu", supports=_on_cpu)
    def tree_mask(
        parent: torch.Tensor, valid: torch.Tensor, past_valid: torch.Tensor, dtype: torch.dtype
    ) -> torch.Tensor:
        return ops.tree_mask(parent, valid, past_valid, dtype)

    @register("filter_kv", "cpu", supports=_on_cpu)
    def filter_kv(
        kv: Sequence[torch.Tensor], prefix_len: torch.Tensor, accepted_nodes: torch.Tensor, n_accepted: torch.Tensor
    ) -> torch.Tensor:
        return ops.filter_kv(list(kv), prefix_len, accepted_nodes, n_accepted)

    # the C++ kernel checks every tensor's rank, batch and slot count and the node ids (ValueError), so
    # filter_kv(validate=False) skips its own host-side bound checks for this backend
    filter_kv.checks_bounds = True  # type: ignore[attr-defined]

    @torch.library.register_fake("specdec::tree_positions")
    def _tree_positions_fake(depth: torch.Tensor, prefix_len: torch.Tensor) -> torch.Tensor:
        return depth.new_empty(depth.shape, dtype=torch.long)

    @torch.library.register_fake("specdec::tree_mask")
    def _tree_mask_fake(
        parent: torch.Tensor, valid: torch.Tensor, past_valid: torch.Tensor, dtype: torch.dtype
    ) -> torch.Tensor:
        batch, n = parent.shape
        return parent.new_empty((batch, 1, n, past_valid.shape[1] + n), dtype=dtype)

    @torch.library.register_fake("specdec::filter_kv")
    def _filter_kv_fake(
        kv: list[torch.Tensor], prefix_len: torch.Tensor, accepted_nodes: torch.Tensor, n_accepted: torch.Tensor
    ) -> torch.Tensor:
        return prefix_len.new_empty(prefix_len.shape, dtype=torch.long)

    # ---- a decode step's projections, attention, RMSNorm and rotary embedding ----

    @register("skinny_linear", "cpu", supports=_on_cpu)
    def skinny_linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return ops.skinny_linear(x, weight)

    @torch.library.register_fake("specdec::skinny_linear")
    def _skinny_linear_fake(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return x.new_empty((*x.shape[:-1], weight.shape[0]))

    @register("skinny_linear_int8", "cpu", supports=_on_cpu)
    def skinny_linear_int8(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        return ops.skinny_linear_int8(x, weight, scale)

    @torch.library.register_fake("specdec::skinny_linear_int8")
    def _skinny_linear_int8_fake(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        return x.new_empty((*x.shape[:-1], weight.shape[0]))

    @register("decode_attention", "cpu", supports=_on_cpu)
    def decode_attention(
        q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float
    ) -> torch.Tensor:
        return ops.decode_attention(q, k, v, mask, scale)

    @torch.library.register_fake("specdec::decode_attention")
    def _decode_attention_fake(
        q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float
    ) -> torch.Tensor:
        return q.new_empty(q.shape)

    @register("rms_norm", "cpu", supports=_on_cpu)
    def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        return ops.rms_norm(x, weight, eps)

    @torch.library.register_fake("specdec::rms_norm")
    def _rms_norm_fake(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        return x.new_empty(x.shape)

    @register("rotary_embedding", "cpu", supports=_on_cpu)
    def rotary_embedding(
        q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return ops.rotary_embedding(q, k, cos, sin)

    @torch.library.register_fake("specdec::rotary_embedding")
    def _rotary_embedding_fake(
        q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return q.new_empty(q.shape), k.new_empty(k.shape)

    # the op takes 14 arguments: registered as is (no Python wrapper that would repeat them)
    register("decoder_layer", "cpu", supports=_on_cpu)(ops.decoder_layer)

    @torch.library.register_fake("specdec::decoder_layer")
    def _decoder_layer_fake(h: torch.Tensor, *args: object) -> torch.Tensor:
        return h.new_empty(h.shape)

    register("decoder_stack", "cpu", supports=_on_cpu)(ops.decoder_stack)

    @torch.library.register_fake("specdec::decoder_stack")
    def _decoder_stack_fake(h: torch.Tensor, *args: object) -> torch.Tensor:
        return h.new_empty(h.shape)

    # ---- sampling ----

    @register("process_logits", "cpu", supports=_on_cpu)
    def process_logits(
        logits: torch.Tensor, temperature: float, top_k: int, top_p: float, log: bool = True
    ) -> torch.Tensor:
        return ops.process_logits(logits, temperature, top_k, top_p, log)

    # the C++ kernel makes the NaN / +inf / all -inf row checks in its first pass over the logits (ValueError, the
    # public op's messages), so process_logits skips its own widening copy and reduction for this backend
    process_logits.checks_values = True  # type: ignore[attr-defined]

    @register("sample_categorical", "cpu", supports=_on_cpu)
    def sample_categorical(logp: torch.Tensor, noise: torch.Tensor | None, seed: int = 0) -> torch.Tensor:
        return ops.sample_categorical(logp, noise, seed)

    @register("gumbel_topk", "cpu", supports=_on_cpu)
    def gumbel_topk(
        logp: torch.Tensor, k: int, noise: torch.Tensor | None, seed: int = 0
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return ops.gumbel_topk(logp, k, noise, seed)

    @torch.library.register_fake("specdec::process_logits")
    def _process_logits_fake(
        logits: torch.Tensor, temperature: float, top_k: int, top_p: float, log: bool = True
    ) -> torch.Tensor:
        return logits.new_empty(logits.shape, dtype=torch.float32)

    @torch.library.register_fake("specdec::sample_categorical")
    def _sample_categorical_fake(logp: torch.Tensor, noise: torch.Tensor | None, seed: int = 0) -> torch.Tensor:
        return logp.new_empty(logp.shape[:-1], dtype=torch.long)

    @torch.library.register_fake("specdec::gumbel_topk")
    def _gumbel_topk_fake(
        logp: torch.Tensor, k: int, noise: torch.Tensor | None, seed: int = 0
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        shape = (*logp.shape[:-1], k)
        return (
            logp.new_empty(shape, dtype=torch.long),
            logp.new_empty(shape, dtype=torch.bool),
            logp.new_empty(shape, dtype=torch.float64),
        )

    # ---- tree drafting (stochastic beam search, SpecHub, K-SEQ gamma) ----

    @register("sbs_step", "cpu", supports=_on_cpu)
    def sbs_step(
        logp: torch.Tensor,
        sigma: torch.Tensor,
        gamma: torch.Tensor,
        beam_valid: torch.Tensor,
        w_out: int,
        noise: torch.Tensor | None,
        seed: int = 0,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        return ops.sbs_step(logp, sigma, gamma, beam_valid, w_out, noise, seed)

    @register("spechub_sample", "cpu", supports=_on_cpu)
    def spechub_sample(
        logp: torch.Tensor, noise: torch.Tensor | None, seed: int = 0
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return ops.spechub_sample(logp, noise, seed)

    @register("kseq_gamma", "cpu", supports=_on_cpu)
    def kseq_gamma(p: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return ops.kseq_gamma(p, q, k)

    @torch.library.register_fake("specdec::sbs_step")
    def _sbs_step_fake(
        logp: torch.Tensor,
        sigma: torch.Tensor,
        gamma: torch.Tensor,
        beam_valid: torch.Tensor,
        w_out: int,
        noise: torch.Tensor | None,
        seed: int = 0,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        shape = (logp.shape[0], w_out)
        return (
            logp.new_empty(shape, dtype=torch.long),
            logp.new_empty(shape, dtype=torch.long),
            logp.new_empty(shape, dtype=torch.float64),
            logp.new_empty(shape, dtype=torch.float64),
            logp.new_empty(shape, dtype=torch.bool),
        )

    @torch.library.register_fake("specdec::spechub_sample")
    def _spechub_sample_fake(
        logp: torch.Tensor, noise: torch.Tensor | None, seed: int = 0
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        lead = logp.shape[:-1]
        return (
            logp.new_empty((*lead, 2), dtype=torch.long),
            logp.new_empty(lead, dtype=torch.long),
            logp.new_empty((*lead, 2), dtype=torch.bool),
        )

    @torch.library.register_fake("specdec::kseq_gamma")
    def _kseq_gamma_fake(p: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        batch = p.shape[0]
        return p.new_empty((batch,), dtype=torch.float64), p.new_empty((batch,), dtype=torch.float64)

    # ---- verification (chain SD, greedy included; CS Drafting's lenient review and emission law) ----

    def _compute_dtype(p: torch.Tensor | None, q: torch.Tensor) -> torch.dtype:
        return torch.float64 if torch.float64 in (q.dtype, None if p is None else p.dtype) else torch.float32

    @register("verify_chain", "cpu", supports=_on_cpu)
    def verify_chain(
        draft: torch.Tensor,
        p: torch.Tensor | None,
        q: torch.Tensor,
        lengths: torch.Tensor,
        accept_u: torch.Tensor | None,
        final_noise: torch.Tensor | None,
        greedy: bool,
        eos: torch.Tensor | None,
        seed: int = 0,
        leniency: float = 1.0,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        p = None if greedy and leniency == 1.0 else p  # only the lenient greedy rule reads p in greedy mode
        return ops.verify_chain(draft, p, q, lengths, accept_u, final_noise, greedy, eos, seed, leniency)

    @torch.library.register_fake("specdec::verify_chain")
    def _verify_chain_fake(
        draft: torch.Tensor,
        p: torch.Tensor | None,
        q: torch.Tensor,
        lengths: torch.Tensor,
        accept_u: torch.Tensor | None,
        final_noise: torch.Tensor | None,
        greedy: bool,
        eos: torch.Tensor | None,
        seed: int = 0,
        leniency: float = 1.0,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        batch = draft.shape[0]
        return draft.new_empty((batch,), dtype=torch.long), draft.new_empty((batch,), dtype=torch.long)

    @register("emission_law", "cpu", supports=_on_cpu)
    def emission_law(p: torch.Tensor, q: torch.Tensor, leniency: float) -> torch.Tensor:
        return ops.emission_law(p, q, leniency)

    @torch.library.register_fake("specdec::emission_law")
    def _emission_law_fake(p: torch.Tensor, q: torch.Tensor, leniency: float = 1.0) -> torch.Tensor:
        return p.new_empty(p.shape, dtype=_compute_dtype(p, q))

    # ---- node and tree verifiers ----

    @register("verify_node", "cpu", supports=_on_cpu)
    def verify_node(
        method: str,
        cand: torch.Tensor,
        cand_valid: torch.Tensor,
        p: torch.Tensor,
        q: torch.Tensor,
        accept_u: torch.Tensor | None,
        final_noise: torch.Tensor | None,
        hub: torch.Tensor | None,
        analytic: bool,
        seed: int = 0,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        slot, token, accept_prob, final = ops.verify_node(
            method, cand, cand_valid, p, q, accept_u, final_noise, hub, seed
        )
        return slot, token, (accept_prob if analytic else None), (final if analytic else None)

    @register("verify_tree", "cpu", supports=_on_cpu)
    def verify_tree(
        tokens: torch.Tensor,
        parent: torch.Tensor,
        valid: torch.Tensor,
        p_rows: torch.Tensor | None,
        q_rows: torch.Tensor,
        method: str,
        hub: torch.Tensor | None,
        accept_u: torch.Tensor | None,
        final_noise: torch.Tensor | None,
        greedy: bool,
        eos: torch.Tensor | None,
        max_depth: int,
        seed: int = 0,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        return ops.verify_tree(
            tokens,
            parent,
            valid,
            None if greedy else p_rows,
            q_rows,
            method,
            hub,
            accept_u,
            final_noise,
            greedy,
            eos,
            max_depth,
            seed,
        )

    @torch.library.register_fake("specdec::verify_node")
    def _verify_node_fake(
        method: str,
        cand: torch.Tensor,
        cand_valid: torch.Tensor,
        p: torch.Tensor,
        q: torch.Tensor,
        accept_u: torch.Tensor | None,
        final_noise: torch.Tensor | None,
        hub: torch.Tensor | None,
        seed: int = 0,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        batch, k = cand.shape
        cd = _compute_dtype(p, q)
        return (
            cand.new_empty((batch,), dtype=torch.long),
            cand.new_empty((batch,), dtype=torch.long),
            p.new_empty((batch, k), dtype=cd),
            p.new_empty(p.shape, dtype=cd),
        )

    @torch.library.register_fake("specdec::verify_tree")
    def _verify_tree_fake(
        tokens: torch.Tensor,
        parent: torch.Tensor,
        valid: torch.Tensor,
        p_rows: torch.Tensor | None,
        q_rows: torch.Tensor,
        method: str,
        hub: torch.Tensor | None,
        accept_u: torch.Tensor | None,
        final_noise: torch.Tensor | None,
        greedy: bool,
        eos: torch.Tensor | None,
        max_depth: int,
        seed: int = 0,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        batch = tokens.shape[0]
        return (
            tokens.new_empty((batch, max_depth), dtype=torch.long),
            tokens.new_empty((batch,), dtype=torch.long),
            tokens.new_empty((batch,), dtype=torch.long),
            tokens.new_empty((batch, max_depth), dtype=torch.long),
        )


#: ops with a CUDA implementation (csrc/cuda/cuda_bindings.cpp); the wrappers above dispatch by device
CUDA_OPS = (
    "tree_positions",
    "tree_mask",
    "filter_kv",
    "sample_categorical",
    "gumbel_topk",
    "process_logits",
    "sbs_step",
    "spechub_sample",
    "kseq_gamma",
    "verify_chain",
    "emission_law",
    "verify_node",
    "verify_tree",
)


def _on_cuda(device: torch.device) -> bool:
    return device.type == "cuda"


if HAVE_CUDA:  # pragma: no cover - needs a CUDA build
    for _op in CUDA_OPS:
        register(_op, "cuda", supports=_on_cuda)(globals()[_op])
