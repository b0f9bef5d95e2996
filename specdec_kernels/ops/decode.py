"""Public ops of a model's decode step: a linear layer on a few rows, attention of a few rows over a KV cache, and
HF Llama's RMSNorm and rotary position embedding."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from .._registry import resolve
from ._checks import check_float, check_same_device, check_tensor


def skinny_linear(
    x: torch.Tensor, weight: torch.Tensor, *, backend: str | None = None, validate: bool = True
) -> torch.Tensor:
    """``x @ weight.T`` (no bias) for the few rows of a decode step, where reading ``weight`` is the whole cost.

    Shape: x [..., in], weight [out, in], one floating dtype -> [..., out] in that dtype, accumulated in fp32
    (fp64 for double). The ``cpu`` backend reads ``weight`` once for all rows at close to memory-copy speed (on
    one row PyTorch's bf16 linear reaches a fraction of it); its cost grows with the rows and, on a CPU with bf16
    dot products, PyTorch is faster from about 16 rows (benchmarks/bench_skinny_linear.py), so use ``F.linear`` for
    batches and prefill there. Where the kernel runs its AVX2 path (:func:`specdec_kernels.native.skinny_linear_isa`)
    it beats PyTorch's bf16 linear at every row count. No
    autograd: inference only. On GPU the ``torch`` backend (cuBLAS) serves it. ``validate=False`` skips the argument
    checks for a caller that guarantees them (a model's own layers: the checks cost about as much as a small layer).
    """
    if not validate:
        return resolve("skinny_linear", backend, x.device)(x, weight)
    check_tensor("x", x, min_ndim=1)
    check_tensor("weight", weight, ndim=2)
    check_float("x", x)
    if x.shape[-1] != weight.shape[1]:
        raise ValueError(f"x must be [..., in={weight.shape[1]}] to match weight [out, in], got {tuple(x.shape)}")
    if x.dtype != weight.dtype:
        raise TypeError(f"x and weight must share a dtype, got {x.dtype} and {weight.dtype}")
    check_same_device(x=x, weight=weight)
    return resolve("skinny_linear", backend, x.device)(x, weight)


def skinny_linear_int8(
    x: torch.Tensor,
    weight: torch.Tensor,
    scale: torch.Tensor,
    *,
    backend: str | None = None,
    validate: bool = True,
) -> torch.Tensor:
    """:func:`skinny_linear` with int8 weights and one scale per output: ``(x @ weight.T) * scale``.

    Shape: x [..., in] floating, weight int8 [out, in], scale float32 [out] (:func:`quantize_int8` makes both) ->
    [..., out] in x's dtype, each output's sum accumulated in fp32 (fp64 for double) and then scaled. A decode step
    reads ``weight`` whole and int8 is half the bytes of bf16, so where the weights stream from memory (a small
    draft model's step) the call takes less time; by how much, benchmarks/bench_skinny_linear.py --int8 measures
    (it saves less than half where the int8 tiles stream below copy speed). No autograd: inference only. On GPU the
    ``torch`` backend serves it. ``validate=False`` skips the argument checks for a caller that guarantees them.
    """
    if not validate:
        return resolve("skinny_linear_int8", backend, x.device)(x, weight, scale)
    check_tensor("x", x, min_ndim=1)
    check_tensor("weight", weight, ndim=2)
    check_tensor("scale", scale, ndim=1)
    check_float("x", x)
    if weight.dtype != torch.int8:
        raise TypeError(f"weight must be int8 (see quantize_int8), got {weight.dtype}")
    if scale.dtype != torch.float32:
        raise TypeError(f"scale must be float32, got {scale.dtype}")
    if x.shape[-1] != weight.shape[1]:
        raise ValueError(f"x must be [..., in={weight.shape[1]}] to match weight [out, in], got {tuple(x.shape)}")
    if scale.shape[0] != weight.shape[0]:
        raise ValueError(f"scale must be [out={weight.shape[0]}] to match weight [out, in], got {tuple(scale.shape)}")
    check_same_device(x=x, weight=weight, scale=scale)
    return resolve("skinny_linear_int8", backend, x.device)(x, weight, scale)


def quantize_int8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 quantization of each output row of ``weight`` [out, in] (floating, finite): the pair
    (q int8 [out, in], scale float32 [out]) with scale = max |row| / 127 and q = round(row / scale) in [-127, 127]
    (a zero row gets scale 0 and q 0), so ``q * scale`` is the row to within half a step, scale / 2, per entry.
    The inputs of :func:`skinny_linear_int8`."""
    check_tensor("weight", weight, ndim=2)
    check_float("weight", weight)
    w = weight.detach().to(torch.float32)
    if not bool(torch.isfinite(w).all()):
        raise ValueError("weight must be finite to be quantized")
    scale = w.abs().amax(dim=1) / 127 if w.shape[1] else w.new_zeros(w.shape[0])
    q = torch.round(w / torch.where(scale > 0, scale, 1)[:, None]).clamp_(-127, 127).to(torch.int8)
    return q, scale


def _check_number(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    return float(value)


def decode_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor,
    scale: float,
    *,
    backend: str | None = None,
    validate: bool = True,
) -> torch.Tensor:
    """Grouped-query attention of a few query rows over a KV cache: ``softmax(scale q k^T + mask) v``.

    Shape: q [B, H, n, D], k/v [B, Hkv, S, D] with H a multiple of Hkv (query head h reads KV head h // (H / Hkv),
    as HF's repeat_kv), mask additive, broadcastable to [B, 1, n, S] (a tree mask: 0 = attend, -inf or
    finfo.min = blocked) -> [B, H, n, D] in q's dtype. Scores, softmax and the weighted sum are fp32 (fp64 for
    double). A row blocked everywhere with -inf gives NaN, as softmax does. For a draft step's 1-8 queries the
    ``cpu`` backend is one pass per row instead of ~10 small torch ops; it computes every query row alone, and a
    blocked slot (finite keys and values) adds exact zeros wherever it sits, so a row's result is bitwise the same
    whichever rows share the call and whatever blocked slots lie between its keys. No autograd: inference only.
    ``validate=False`` skips the argument checks for a caller that guarantees them (a model's own attention layers).
    """
    if not validate:
        return resolve("decode_attention", backend, q.device)(q, k, v, mask, float(scale))
    check_tensor("q", q, ndim=4)
    check_tensor("k", k, ndim=4)
    check_tensor("v", v, ndim=4)
    check_tensor("mask", mask, ndim=4)
    check_float("q", q)
    check_float("mask", mask)
    b, h, n, d = q.shape
    if k.shape != v.shape or k.shape[0] != b or k.shape[3] != d:
        raise ValueError(
            f"k and v must be [B={b}, Hkv, S, D={d}] to match q {tuple(q.shape)}, got {tuple(k.shape)} and "
            f"{tuple(v.shape)}"
        )
    hkv, s = k.shape[1], k.shape[2]
    if hkv == 0 or h % hkv:
        raise ValueError(f"q's heads (H={h}) must be a multiple of k's heads (Hkv={hkv})")
    if s == 0 and q.numel():
        raise ValueError("k and v must hold at least one cache slot (S > 0)")
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise TypeError(f"q, k and v must share a dtype, got {q.dtype}, {k.dtype} and {v.dtype}")
    if any(m not in (1, want) for m, want in zip(mask.shape, (b, 1, n, s), strict=True)):
        raise ValueError(f"mask must broadcast to [B, 1, n, S] = {(b, 1, n, s)}, got {tuple(mask.shape)}")
    scale = _check_number("scale", scale)
    check_same_device(q=q, k=k, v=v, mask=mask)
    return resolve("decode_attention", backend, q.device)(q, k, v, mask, scale)


def _check_eps(eps: object, name: str = "eps") -> float:
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not math.isfinite(eps) or eps < 0:
        raise ValueError(f"{name} must be a finite number >= 0, got {eps!r}")
    return float(eps)


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, *, backend: str | None = None, validate: bool = True
) -> torch.Tensor:
    """HF's LlamaRMSNorm in one call: ``weight * (x / sqrt(mean(x^2, -1) + eps)).to(x.dtype)``.

    Shape: x [..., D], weight [D], one floating dtype -> [..., D] in that dtype. The normalisation is computed in
    fp32 (fp64 for double; HF's module would compute a double input in fp32), rounded to the dtype, then multiplied
    by ``weight`` (for bf16/fp16 a product computed in fp32 and rounded once), as ``LlamaRMSNorm.forward(x)`` with
    ``eps = norm.variance_epsilon``. The ``cpu`` backend is one pass per row instead of ~8 small torch ops; it sums
    the squares in another order than torch's mean, the only difference (in bf16 the normalised value is at most 1
    ulp apart, on about 1e-5 of the elements), computes every row alone (a row's result is bitwise the same whatever
    rows share the call) and gives the same bits on every CPU variant. It reads x with any strides whose last one is
    1 and returns a contiguous tensor. On GPU the ``torch`` backend serves it. No autograd: inference only.
    ``validate=False`` skips the argument checks for a caller that guarantees them (a model's own layers).
    """
    if not validate:
        return resolve("rms_norm", backend, x.device)(x, weight, float(eps))
    check_tensor("x", x, min_ndim=1)
    check_tensor("weight", weight, ndim=1)
    check_float("x", x)
    if weight.shape[0] != x.shape[-1]:
        raise ValueError(f"weight must be [D={x.shape[-1]}] to match x [..., D], got {tuple(weight.shape)}")
    if weight.dtype != x.dtype:
        raise TypeError(f"x and weight must share a dtype, got {x.dtype} and {weight.dtype}")
    check_same_device(x=x, weight=weight)
    return resolve("rms_norm", backend, x.device)(x, weight, _check_eps(eps))


def rotary_embedding(
    q: torch.Tensor,
    k: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    *,
    backend: str | None = None,
    validate: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """HF's ``apply_rotary_pos_emb(q, k, cos, sin)`` (unsqueeze_dim=1) in one call: ``x cos + rotate_half(x) sin``
    for x = q and k, with ``rotate_half(x) = cat(-x[..., D/2:], x[..., :D/2])``.

    Shape: q [B, H, n, D], k [B, Hkv, n, D], cos/sin [B, n, D] or [1, n, D] (shared by the batch), D even, one
    floating dtype -> (q_out [B, H, n, D], k_out [B, Hkv, n, D]) contiguous, in that dtype. Every product and sum is
    rounded to the dtype as torch's ops round them (bf16/fp16: computed in fp32, rounded once per op), so the ``cpu``
    backend is bitwise equal to the formula for every dtype. q and k may be the usual non-contiguous views
    (``linear_out.view(B, n, H, D).transpose(1, 2)``): the cpu kernel reads them in place (any strides whose last
    one is 1). On GPU the ``torch`` backend serves it. No autograd: inference only. ``validate=False`` skips the
    argument checks for a caller that guarantees them (a model's own attention layers).
    """
    if not validate:
        return resolve("rotary_embedding", backend, q.device)(q, k, cos, sin)
    check_tensor("q", q, ndim=4)
    check_tensor("k", k, ndim=4)
    check_tensor("cos", cos, ndim=3)
    check_tensor("sin", sin, ndim=3)
    check_float("q", q)
    b, _, n, d = q.shape
    if d % 2:
        raise ValueError(f"q's head dim D must be even (rotate_half splits it in two), got q {tuple(q.shape)}")
    if k.shape[0] != b or k.shape[2:] != (n, d):
        raise ValueError(f"k must be [B={b}, Hkv, n={n}, D={d}] to match q {tuple(q.shape)}, got {tuple(k.shape)}")
    for name, t in (("cos", cos), ("sin", sin)):
        if t.shape[0] not in (1, b) or t.shape[1:] != (n, d):
            raise ValueError(
                f"{name} must be [B={b}, n={n}, D={d}] or [1, n={n}, D={d}] to match q {tuple(q.shape)}, got "
                f"{tuple(t.shape)}"
            )
    if not k.dtype == cos.dtype == sin.dtype == q.dtype:
        raise TypeError(f"q, k, cos and sin must share a dtype, got {q.dtype}, {k.dtype}, {cos.dtype} and {sin.dtype}")
    check_same_device(q=q, k=k, cos=cos, sin=sin)
    return resolve("rotary_embedding", backend, q.device)(q, k, cos, sin)


def _check_layer_weights(
    h: torch.Tensor,
    weights: Sequence[torch.Tensor],
    scales: Sequence[torch.Tensor],
    hkv: int,
    d: int,
    wname: str = "weights",
    sname: str = "scales",
) -> None:
    """The projections of :func:`decoder_layer` against h [B, n, E] and a cache of Hkv heads of width D (named
    ``wname`` and ``sname`` in errors)."""
    if not isinstance(weights, (list, tuple)) or len(weights) not in (7, 4):
        raise ValueError(
            f"{wname} must be a list of 7 matrices (q, k, v, o, gate, up, down) or 4 (qkv, o, gate_up, down)"
        )
    names = ("q", "k", "v", "o", "gate", "up", "down") if len(weights) == 7 else ("qkv", "o", "gate_up", "down")
    for name, w in zip(names, weights, strict=True):
        check_tensor(f"{wname}[{name}]", w, ndim=2)
    if not isinstance(scales, (list, tuple)) or len(scales) not in (0, len(weights)):
        raise ValueError(f"{sname} must be empty (floating weights) or hold one per weight ({len(weights)})")
    for name, w, s in zip(names, weights, scales or [None] * len(weights), strict=True):
        if s is None:
            if w.dtype != h.dtype:
                raise TypeError(f"{wname}[{name}] must have h's dtype {h.dtype}, got {w.dtype}")
            continue
        check_tensor(f"{sname}[{name}]", s, ndim=1)
        if w.dtype != torch.int8 or s.dtype != torch.float32:
            raise TypeError(
                f"with scales, {wname}[{name}] must be int8 and its scale float32, got {w.dtype} and {s.dtype}"
            )
        if s.shape[0] != w.shape[0]:
            raise ValueError(f"{sname}[{name}] must be [out={w.shape[0]}], got {tuple(s.shape)}")
    e, nkv = h.shape[2], hkv * d
    shapes = dict(zip(names, (tuple(w.shape) for w in weights), strict=True))
    if len(weights) == 7:
        nq, inter = shapes["q"][0], shapes["gate"][0]
        want = {"q": (nq, e), "k": (nkv, e), "v": (nkv, e), "gate": (inter, e), "up": (inter, e)}
    else:
        nq, inter = shapes["qkv"][0] - 2 * nkv, shapes["gate_up"][0] // 2
        want = {"qkv": (nq + 2 * nkv, e), "gate_up": (2 * inter, e)}
    want |= {"o": (e, nq), "down": (e, inter)}
    if nq <= 0 or nq % d or (nq // d) % hkv:
        raise ValueError(
            f"the query projection ({wname}[{names[0]}]) must have a multiple of D={d} outputs, a multiple of the "
            f"cache's Hkv={hkv} heads, got {nq}"
        )
    for name, shape in want.items():
        if shapes[name] != shape or (name == "gate_up" and shapes[name][0] % 2):
            raise ValueError(f"{wname}[{name}] must be {list(shape)} for h [B, n, E={e}], got {list(shapes[name])}")


def decoder_layer(
    h: torch.Tensor,
    weights: Sequence[torch.Tensor],
    ln1: torch.Tensor,
    ln2: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    length: int,
    mask: torch.Tensor,
    *,
    scale: float,
    eps1: float,
    eps2: float,
    scales: Sequence[torch.Tensor] = (),
    backend: str | None = None,
    validate: bool = True,
) -> torch.Tensor:
    """One Llama decoder layer of a decode step (no biases, SiLU MLP), from its weights, in one call:
    ``x = rms_norm(h, ln1)``; q, k, v projections of x; :func:`rotary_embedding` of q and k; the new keys and values
    written to cache slots ``[length, length + n)``; :func:`decode_attention` of q over slots ``[0, length + n)``;
    ``h = h + o(attention)``; ``x = rms_norm(h, ln2)``; ``h + down(silu(gate(x)) * up(x))``.

    Shape: h [B, n, E]; ``weights`` (q, k, v, o, gate, up, down) as [out, in] matrices, or (qkv, o, gate_up, down)
    with [q; k; v] and [gate; up] stacked; with ``scales`` (one float32 [out] per weight) the weights are int8
    (:func:`quantize_int8`) and the projections :func:`skinny_linear_int8`, else :func:`skinny_linear` in h's dtype;
    ln1/ln2 [E]; cos/sin [B or 1, n, D] (HF's position embeddings); k_cache/v_cache [B, Hkv, capacity, D] with
    ``length + n <= capacity``, written in place; ``mask`` additive, broadcastable to [B, 1, n, length + n];
    ``scale`` the attention's score scale; ``eps1``/``eps2`` the two norms' epsilons -> [B, n, E] in h's dtype.
    The ``cpu`` backend calls the cpu kernels of those ops directly and ATen for the residual adds and the gated
    SiLU, so its result is bitwise what those ops give when called one by one: a step of a small model then pays
    one call per layer instead of ~15 Python-level calls. On GPU the ``torch`` backend (the ops composed) serves it.
    No autograd: inference only. ``validate=False`` skips the argument checks for a caller that guarantees them.
    """
    if validate:  # before the call's arguments are built: a bad argument gets its named error
        check_tensor("h", h, ndim=3)
        check_float("h", h)
        d = _check_layer(h, weights, scales, ln1, ln2, k_cache, v_cache, length, None)
        _check_shared(h, cos, sin, mask, length, d)
        eps1, eps2, scale = _check_eps(eps1, "eps1"), _check_eps(eps2, "eps2"), _check_number("scale", scale)
        check_same_device(h=h, k_cache=k_cache, v_cache=v_cache, mask=mask, cos=cos, ln1=ln1, weight=weights[0])
    return resolve("decoder_layer", backend, h.device)(
        h, list(weights), list(scales), ln1, ln2, cos, sin, k_cache, v_cache, int(length), mask, float(eps1),
        float(eps2), float(scale),
    )  # fmt: skip


def _check_layer(
    h: torch.Tensor,
    weights: Sequence[torch.Tensor],
    scales: Sequence[torch.Tensor],
    ln1: torch.Tensor,
    ln2: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    length: object,
    layer: int | None,
) -> int:
    """The arguments of one layer of :func:`decoder_layer` (``layer`` None) or of :func:`decoder_stack` (layer
    ``layer``, named ``ln1[i]``, ``k_caches[i]``, ``weights[i][q]``, ...) against h; returns the head dim D."""

    def named(name: str, plural: str = "") -> str:
        return name if layer is None else f"{plural or name}[{layer}]"

    for name, t in ((named("ln1"), ln1), (named("ln2"), ln2)):
        check_tensor(name, t, ndim=1)
        if t.shape[0] != h.shape[2] or t.dtype != h.dtype:
            raise ValueError(f"{name} must be [E={h.shape[2]}] in h's dtype {h.dtype}, got {tuple(t.shape)} {t.dtype}")
    kn, vn = named("k_cache", "k_caches"), named("v_cache", "v_caches")
    check_tensor(kn, k_cache, ndim=4)
    check_tensor(vn, v_cache, ndim=4)
    b, n, _ = h.shape
    if k_cache.shape != v_cache.shape or k_cache.shape[0] != b:
        raise ValueError(
            f"{kn} and {vn} must be one [B={b}, Hkv, capacity, D] shape, got {tuple(k_cache.shape)} and "
            f"{tuple(v_cache.shape)}"
        )
    if k_cache.dtype != h.dtype or v_cache.dtype != h.dtype:
        raise TypeError(f"{kn} and {vn} must have h's dtype {h.dtype}, got {k_cache.dtype} and {v_cache.dtype}")
    hkv, capacity, d = k_cache.shape[1], k_cache.shape[2], k_cache.shape[3]
    if n == 0 or hkv == 0 or d == 0 or d % 2:
        raise ValueError(f"h must hold at least one token and the cache an even head dim D > 0, got n={n}, D={d}")
    if isinstance(length, bool) or not isinstance(length, int) or not 0 <= length <= capacity - n:
        raise ValueError(f"length must be an int in [0, capacity - n = {capacity - n}], got {length!r}")
    _check_layer_weights(h, weights, scales, hkv, d, named("weights"), named("scales"))
    return d


def _check_shared(
    h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor, length: int, d: int
) -> None:
    """The arguments every layer of :func:`decoder_layer` / :func:`decoder_stack` shares."""
    b, n, _ = h.shape
    for name, t in (("cos", cos), ("sin", sin)):
        check_tensor(name, t, ndim=3)
        if t.shape[0] not in (1, b) or t.shape[1:] != (n, d) or t.dtype != h.dtype:
            raise ValueError(
                f"{name} must be [B={b} or 1, n={n}, D={d}] in h's dtype {h.dtype}, got {tuple(t.shape)} {t.dtype}"
            )
    check_tensor("mask", mask, ndim=4)
    check_float("mask", mask)
    if any(m not in (1, want) for m, want in zip(mask.shape, (b, 1, n, length + n), strict=True)):
        raise ValueError(
            f"mask must broadcast to [B, 1, n, length + n] = {(b, 1, n, length + n)}, got {tuple(mask.shape)}"
        )


def decoder_stack(
    h: torch.Tensor,
    weights: Sequence[Sequence[torch.Tensor]],
    ln1: Sequence[torch.Tensor],
    ln2: Sequence[torch.Tensor],
    cos: torch.Tensor,
    sin: torch.Tensor,
    k_caches: Sequence[torch.Tensor],
    v_caches: Sequence[torch.Tensor],
    length: int,
    mask: torch.Tensor,
    *,
    scale: float,
    eps1: float,
    eps2: float,
    scales: Sequence[Sequence[torch.Tensor]] = (),
    backend: str | None = None,
    validate: bool = True,
) -> torch.Tensor:
    """L Llama decoder layers of a decode step in one call: :func:`decoder_layer` for layer 0, its output into
    layer 1, and so on; what L calls of :func:`decoder_layer` give, bit for bit, without a Python-level call per
    layer (a small model's step spends a good part of its time between the layers' kernels).

    Shape: h [B, n, E]; ``weights[i]`` layer i's matrices as :func:`decoder_layer` takes them (7 or 4, the same
    form for every layer), ``scales`` empty or ``scales[i]`` layer i's int8 scales (then every layer's weights are
    int8); ``ln1[i]``/``ln2[i]`` [E], ``k_caches[i]``/``v_caches[i]`` [B, Hkv_i, capacity_i, D] written in place at
    slots ``[length, length + n)``; cos/sin, ``mask``, ``length``, ``scale``, ``eps1``/``eps2`` shared by every
    layer (as in a Llama model: one cache length, one mask, one rotary table, one epsilon) -> [B, n, E] in h's
    dtype. On GPU the ``torch`` backend (the ops composed) serves it. No autograd: inference only.
    ``validate=False`` skips the argument checks for a caller that guarantees them.
    """
    if validate:  # before the call's arguments are built: a bad argument gets its named error
        check_tensor("h", h, ndim=3)
        check_float("h", h)
        if not isinstance(k_caches, (list, tuple)) or not k_caches:
            raise ValueError("k_caches must be a non-empty list, one cache per layer")
        layers = len(k_caches)
        for name, seq in (("weights", weights), ("ln1", ln1), ("ln2", ln2), ("v_caches", v_caches)):
            if not isinstance(seq, (list, tuple)) or len(seq) != layers:
                raise ValueError(f"{name} must be a list of one entry per layer ({layers}, as k_caches)")
        if not isinstance(scales, (list, tuple)) or len(scales) not in (0, layers):
            raise ValueError(f"scales must be empty (floating weights) or a list of one entry per layer ({layers})")
        heads: set[int] = set()
        for i in range(layers):
            group = weights[i]
            if i and (not isinstance(group, (list, tuple)) or len(group) != len(weights[0])):
                raise ValueError(f"weights[{i}] must be a list of {len(weights[0])} matrices, as weights[0]")
            heads.add(_check_layer(h, group, scales[i] if scales else (), ln1[i], ln2[i], k_caches[i], v_caches[i],
                                   length, i))  # fmt: skip
            if scales and len(scales[i]) != len(group):  # every layer int8, or none: the kernel takes one flat list
                raise ValueError(f"scales[{i}] must hold one scale per matrix of weights[{i}] ({len(group)})")
        if len(heads) != 1:
            raise ValueError(
                f"every layer's cache must have one head dim D (cos and sin have one), got {sorted(heads)}"
            )
        _check_shared(h, cos, sin, mask, length, heads.pop())
        eps1, eps2, scale = _check_eps(eps1, "eps1"), _check_eps(eps2, "eps2"), _check_number("scale", scale)
        check_same_device(h=h, mask=mask, cos=cos, **{f"k_caches[{i}]": t for i, t in enumerate(k_caches)},
                          **{f"weights[{i}]": g[0] for i, g in enumerate(weights)})  # fmt: skip
    return resolve("decoder_stack", backend, h.device)(
        h, [w for group in weights for w in group], [s for group in scales for s in group], list(ln1), list(ln2),
        cos, sin, list(k_caches), list(v_caches), int(length), mask, float(eps1), float(eps2), float(scale),
    )  # fmt: skip
