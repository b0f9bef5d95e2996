"""Decode-step linears: up to a CPU-dependent number of rows a linear runs :func:`specdec_kernels.skinny_linear`
(each weight read once for all rows), and the decode ops' implementations resolved once per forward."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F

import specdec_kernels as sk

from .int8 import INT8_ATTR, int8_pair


def decode_rows(isa: str, torch_amx: bool) -> int:
    """The most rows of a bf16 decode call (a tree pass, a batch of them) that our kernels take, for the bf16 path
    ``isa`` of :func:`specdec_kernels.skinny_linear_isa` and whether the CPU gives PyTorch AMX (``torch_amx``)."""
    return 16 if isa == "amx" or (isa == "avx512bf16" and not torch_amx) else 8


# Up to this many rows, inference linears run specdec_kernels.skinny_linear, which reads each weight once for all
# rows: a decode step reads its weights from DRAM, and BLAS's small-batch paths read them at a fraction of copy
# speed, so a verification pass of a few tree nodes would cost several one-token steps (benchmarks/
# bench_skinny_linear.py, bench_target_step.py). Where PyTorch's bf16 linear has AMX (the CPU has it, whichever
# variant of ours is loaded) it wins beyond about 8 rows; our AMX tiles multiply up to 16 rows in the time of one.
# With AVX-512-BF16 but no AMX in the CPU (AMD Zen 4), PyTorch's small-batch bf16 linear is slower than ours at every
# row count up to about 24, so decode calls go up to 16 rows there too (a pass of 16 nodes then costs about two
# one-token steps instead of four).
DECODE_ROWS = decode_rows(sk.skinny_linear_isa(), bool(torch.cpu._is_amx_tile_supported()))


# fp32 calls: without AMX our fp32 tiles lose to PyTorch's fp32 linear from about 8 rows on
FP32_ROWS = 16 if sk.skinny_linear_isa() == "amx" else 8


# bf16 calls: where skinny_linear runs its AVX2 or AVX-512F tiles, the CPU has no bf16 dot products and PyTorch's
# bf16 linear is several times slower than its fp32 one; the tiles then win at every row count (prefill included), so
# all rows go to skinny_linear.
BF16_ROWS = 1 << 40 if sk.skinny_linear_isa() in ("avx2", "avx512") else DECODE_ROWS


_skinny = threading.local()


def decode_row_limit(dtype: torch.dtype) -> int:
    """The most rows of a ``dtype`` pass that runs in one native call per layer (:func:`native_ready`); fp32 calls
    beyond :data:`FP32_ROWS` go to PyTorch's linear. Read at call time, so a caller that sets DECODE_ROWS = 0 turns
    both off."""
    return DECODE_ROWS if dtype == torch.bfloat16 else min(DECODE_ROWS, FP32_ROWS)


def decode_linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``F.linear(x, weight)`` (no bias); calls on at most :data:`BF16_ROWS` rows (bf16) or
    :func:`decode_row_limit` rows (other dtypes) without autograd go to :func:`specdec_kernels.skinny_linear`
    (0: never)."""
    rows = x.numel() // max(x.shape[-1], 1)
    limit = BF16_ROWS if x.dtype == torch.bfloat16 else decode_row_limit(x.dtype)
    if (
        rows > limit
        or x.dtype != weight.dtype
        or torch.is_autocast_enabled(x.device.type)  # F.linear casts to the autocast dtype; keep its numerics
        or (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad))
    ):
        return F.linear(x, weight)
    packed = getattr(weight, INT8_ATTR, None)
    if packed is not None:
        return decode_op("skinny_linear_int8", x.device)(x, *int8_pair(weight, packed))
    # the op's own checks cost 2x the kernel call on a small layer; the kernels check what they rely on
    return decode_op("skinny_linear", x.device)(x, weight)


#: the ops of a decode step, called straight through their implementation (:func:`decode_op`)
DECODE_OPS = (
    "skinny_linear",
    "skinny_linear_int8",
    "rms_norm",
    "rotary_embedding",
    "decode_attention",
    "decoder_layer",
    "decoder_stack",
)


def decode_op(op: str, device: torch.device) -> Callable[..., Any]:
    """The implementation of the decode op ``op`` on ``device`` (no argument checks: callers pass what the kernels
    take). Inside :func:`skinny_linears` on CPU it is the one resolved on entry: a step makes hundreds of these
    calls and resolving each costs about as much as a small kernel."""
    table = getattr(_skinny, "ops", None)
    if table is not None and device.type == "cpu":
        return table[op]
    return sk.implementation(op, None, device)


@contextmanager
def skinny_linears() -> Iterator[None]:
    """While active (in this thread), the linears of a model inside its adapter's forwards (:class:`Routing`) run
    `decode_linear` and its attention layers `specdec_kernels.decode_attention` (for the calls they take); the
    decode ops' CPU implementations are resolved once, on entry (``$SPECDEC_BACKEND`` as the ops read it)."""
    before = decode_ops_on(), getattr(_skinny, "ops", None)
    _skinny.on = True
    _skinny.ops = sk.implementations(DECODE_OPS, "cpu")
    try:
        yield
    finally:
        _skinny.on, _skinny.ops = before


def routed_linear(module: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    return thread_linear(x, module.weight)


def thread_linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """:func:`decode_linear` inside :func:`skinny_linears` in this thread, else ``F.linear`` (the model's own)."""
    return decode_linear(x, weight) if decode_ops_on() else F.linear(x, weight)


def decode_ops_on() -> bool:
    """Whether this thread is inside :func:`skinny_linears` (another thread calling the same model meanwhile keeps the
    model's own modules)."""
    return getattr(_skinny, "on", False)
