"""Public tree-layout ops: attention mask, position ids, KV-cache filtering."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .._registry import resolve
from ._checks import check_bool, check_int, check_same_device, check_shape, check_tensor
from .verify import _check_tree


def _lengths(
    name: str, value: int | torch.Tensor, batch: int, device: torch.device, *, check_values: bool = True
) -> torch.Tensor:
    """``value`` (int or [B] ints) as an int64 [B] tensor on ``device``. ``check_values=False`` (trusted callers)
    skips the P >= 1 check of a tensor, which costs a reduction and a host sync; an int is always checked."""
    if isinstance(value, bool):
        raise TypeError(f"{name} must be an int or an int64 tensor [B], got bool")
    if isinstance(value, int):
        out = torch.full((batch,), value, dtype=torch.long, device=device)
        check_values = True
    else:
        check_tensor(name, value, ndim=1)
        check_int(name, value)
        check_shape(name, value, (batch,))
        out = value.to(device=device, dtype=torch.long)
    if check_values and out.numel() and int(out.min()) < 1:
        raise ValueError(f"{name} must be >= 1 (the root is a committed token), got {out.tolist()}")
    return out


def tree_mask(
    parent: torch.Tensor,
    valid: torch.Tensor | None = None,
    past_len: int = 0,
    *,
    past_valid: torch.Tensor | None = None,
    dtype: torch.dtype = torch.float32,
    backend: str | None = None,
    validate: bool = True,
) -> torch.Tensor:
    """4-D additive attention mask of a tree forward for HF models.

    Shape: parent [B, N] (level order, node 0 = root), valid [B, N] bool, past_valid [B, past_len] bool
    (cache slots a row may attend; default all) -> mask [B, 1, N, past_len + N] in ``dtype``: 0 = attend,
    finfo(dtype).min = blocked. Node i sees the allowed past, its ancestors and itself; padding nodes see
    only themselves. ``validate=False`` skips the tree-structure checks (level order, valid parents) for trees a
    caller built itself; shapes and types are still checked and the kernels still bounds-check.
    """
    check_tensor("parent", parent, ndim=2)
    check_int("parent", parent)
    batch, n = parent.shape
    if valid is None:
        valid = torch.ones_like(parent, dtype=torch.bool)
    check_tensor("valid", valid, ndim=2)
    check_bool("valid", valid)
    check_shape("valid", valid, parent.shape)
    if isinstance(past_len, bool) or not isinstance(past_len, int) or past_len < 0:
        raise ValueError(f"past_len must be an int >= 0, got {past_len!r}")
    if past_valid is None:
        past_valid = torch.ones((batch, past_len), dtype=torch.bool, device=parent.device)
    check_tensor("past_valid", past_valid, ndim=2)
    check_bool("past_valid", past_valid)
    check_shape("past_valid", past_valid, (batch, past_len))
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating torch.dtype (the model's), got {dtype!r}")
    check_same_device(parent=parent, valid=valid, past_valid=past_valid)
    if validate:
        _check_tree(parent, valid)
    return resolve("tree_mask", backend, parent.device)(parent.long(), valid, past_valid, dtype)


def tree_positions(
    depth: torch.Tensor,
    prefix_len: int | torch.Tensor,
    *,
    backend: str | None = None,
    validate: bool = True,
) -> torch.Tensor:
    """Position ids of tree nodes: P - 1 + depth; siblings share a position.

    Shape: depth [B, N] ints >= 0 (root depth 0), prefix_len int or [B] = P committed tokens incl. the root
    -> position_ids [B, N] int64. ``validate=False`` skips the value checks (depth >= 0, P >= 1) for a caller
    that derives both from its own trees and caches (the driver); types and shapes are still checked.
    """
    check_tensor("depth", depth, ndim=2)
    check_int("depth", depth)
    if validate and depth.numel() and int(depth.min()) < 0:
        raise ValueError("depth must be >= 0")
    p = _lengths("prefix_len", prefix_len, depth.shape[0], depth.device, check_values=validate)
    return resolve("tree_positions", backend, depth.device)(depth, p)


def filter_kv(
    kv: Sequence[torch.Tensor],
    prefix_len: int | torch.Tensor,
    accepted_nodes: torch.Tensor,
    n_accepted: torch.Tensor,
    *,
    backend: str | None = None,
    validate: bool = True,
) -> torch.Tensor:
    """Keep the accepted path in per-layer K/V tensors, in place.

    Shape: kv = tensors [B, H, S, D] (sequence on dim -2) holding the committed prefix at [0, P) (root at P-1)
    and draft node n at slot P-1+n; prefix_len int or [B] = P; accepted_nodes [B, L] node ids (-1 padded),
    n_accepted [B]. Slot P-1+accepted_nodes[b, j] is moved to P+j. Returns the new valid lengths P + n_accepted
    [B]; slots beyond a row's length are stale (truncate or mask them). ``validate=False`` skips the value checks
    (node ids, counts, every tensor's slot count) for callers that hold a verifier's output and their own cache
    (the driver); argument types and shapes are still checked, and so is that every move stays inside every tensor.
    """
    if isinstance(kv, torch.Tensor) or not isinstance(kv, Sequence):
        raise TypeError("kv must be a sequence of [B, H, S, D] tensors (e.g. every layer's keys and values)")
    check_tensor("accepted_nodes", accepted_nodes, ndim=2)
    check_int("accepted_nodes", accepted_nodes)
    check_tensor("n_accepted", n_accepted, ndim=1)
    check_int("n_accepted", n_accepted)
    batch, max_len = accepted_nodes.shape
    check_shape("n_accepted", n_accepted, (batch,))
    if not validate:  # the driver's call: host-side checks on the small index tensors (tiny torch ops cost more)
        return _filter_kv_trusted(kv, prefix_len, accepted_nodes, n_accepted, backend)
    if n_accepted.numel() and (int(n_accepted.min()) < 0 or int(n_accepted.max()) > max_len):
        raise ValueError(f"n_accepted must be in [0, L={max_len}], got {n_accepted.tolist()}")
    p = _lengths("prefix_len", prefix_len, batch, accepted_nodes.device)
    used = torch.arange(max_len, device=accepted_nodes.device)[None, :] < n_accepted[:, None]
    nodes = accepted_nodes[used]
    if nodes.numel() and int(nodes.min()) < 1:
        raise ValueError("accepted_nodes must hold draft node ids >= 1 for the first n_accepted entries of a row")
    if used.any():
        j = torch.arange(max_len, device=accepted_nodes.device)[None, :].expand(batch, -1)[used]
        if bool((nodes <= j).any()):
            raise ValueError("accepted_nodes[b, j] must be a node of depth j+1 (node id > j); got an impossible id")
    need = int((p - 1 + accepted_nodes.clamp_min(0).masked_fill(~used, 0).max(dim=1).values).max()) + 1
    need = max(need, int((p + n_accepted).max()))
    dev = accepted_nodes.device
    for i, t in enumerate(kv):  # one cheap test per tensor (a model has tens of them); details only on failure
        if not (isinstance(t, torch.Tensor) and t.dim() == 4 and t.shape[0] == batch and t.shape[2] >= need):
            check_tensor(f"kv[{i}]", t, ndim=4)
            if t.shape[0] != batch:
                raise ValueError(f"kv[{i}] must have batch size {batch}, got shape {tuple(t.shape)}")
            raise ValueError(f"kv[{i}] has {t.shape[2]} slots but the accepted nodes need {need}")
        if t.device != dev:
            raise ValueError(f"kv[{i}] must be on {dev}, got {t.device}")
    return resolve("filter_kv", backend, accepted_nodes.device)(list(kv), p, accepted_nodes, n_accepted)


def _filter_kv_trusted(
    kv: Sequence[torch.Tensor],
    prefix_len: int | torch.Tensor,
    accepted_nodes: torch.Tensor,
    n_accepted: torch.Tensor,
    backend: str | None,
) -> torch.Tensor:
    """filter_kv(validate=False): only what keeps every move inside every tensor (slots P-1+node with node >= 1,
    and P+j with j < n_accepted <= L), computed on host lists, or by the kernel itself where it checks them
    (``checks_bounds``: the cpu backend)."""
    batch, max_len = accepted_nodes.shape
    p = _lengths("prefix_len", prefix_len, batch, accepted_nodes.device, check_values=False)
    if not all(isinstance(t, torch.Tensor) for t in kv):
        raise TypeError("kv must be a sequence of [B, H, S, D] tensors")
    impl = resolve("filter_kv", backend, accepted_nodes.device)
    if getattr(impl, "checks_bounds", False):
        return impl(list(kv), p, accepted_nodes, n_accepted)
    plen, nodes, counts = p.tolist(), accepted_nodes.tolist(), n_accepted.tolist()
    need, low = 0, 1
    for b in range(batch):
        m = counts[b]
        if not 0 <= m <= max_len:
            raise ValueError(f"n_accepted must be in [0, L={max_len}], got {counts}")
        if m:
            path = nodes[b][:m]
            low = min(low, min(path))
            need = max(need, plen[b] + max(path), plen[b] + m)
    # a tensor of another rank or batch counts as having no slot
    slots = min((t.shape[2] if t.dim() == 4 and t.shape[0] == batch else -1 for t in kv), default=need)
    if low < 1 or slots < need:
        raise ValueError(
            f"filter_kv: the accepted nodes (min id {low}, must be >= 1) need {need} slots in every kv tensor "
            f"[B={batch}, H, S, D]; the smallest has {max(slots, 0)} (or another rank or batch size)"
        )
    return impl(list(kv), p, accepted_nodes, n_accepted)
