"""The KV cache of a batch: which slots each row may attend (:class:`KVState`), cache layers with room to grow, and
cropping.

Cache layout (one common length S for the whole batch): every row owns the same slots ``[0, S)`` of a
``DynamicCache``; ``KVState.valid[b, s]`` says whether slot s holds one of row b's committed tokens. A forward appends
every row's new tokens at the common end, so during a round a row has stale slots (invalid, hidden by the mask)
between its committed tokens and the new ones. ``KVState.keep`` ends each round by moving every row's kept slots
right after its committed ones: between rounds row b holds exactly the slots ``[0, n_cached[b])`` and S is the
longest row's count, so memory and attention cost follow the longest sequence. Position ids come from the number of
committed tokens of the row, never from the slot index.
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass
from typing import Any

import torch

import specdec_kernels as sk


@dataclass
class KVState:
    """A model's KV cache for a batch plus which slots each row may attend.

    Shape: valid [B, S] bool (S = cache length), n_cached [B] int64 = committed tokens of the row whose KV is in
    the cache (they sit at positions 0 .. n_cached-1).
    """

    cache: Any
    valid: torch.Tensor
    n_cached: torch.Tensor

    @property
    def length(self) -> int:
        return int(self.valid.shape[1])

    @property
    def batch(self) -> int:
        return int(self.valid.shape[0])

    def select_rows(self, rows: torch.Tensor) -> None:
        """Keep only ``rows`` (int64 [B']) of the batch, e.g. after other rows finished."""
        if self.length:
            self.cache.batch_select_indices(rows)
        self.valid = self.valid[rows]
        self.n_cached = self.n_cached[rows]
        self._trim()

    def _trim(self) -> None:
        """Drop trailing slots that no remaining row uses (cheap: a view of every layer)."""
        if not self.length:
            return
        used = self.valid.any(dim=0).nonzero()
        new_len = int(used.max()) + 1 if used.numel() else 0
        if new_len < self.length:
            crop_cache(self.cache, self.length - new_len)
            self.valid = self.valid[:, :new_len]

    def keep(self, run_start: torch.Tensor, run_len: torch.Tensor, path: torch.Tensor, path_len: torch.Tensor) -> None:
        """End a round: row b keeps the run of slots ``run_start[b] .. run_start[b] + run_len[b] - 1``
        (the chain ``forward_chain`` appended this round, already counted in ``n_cached``) followed by the slots
        ``path[b, :path_len[b]]`` (e.g. the tree's root and accepted nodes, increasing, after the run); they move
        to the slots right after the row's earlier committed tokens, so row b holds exactly ``[0, n_cached[b])``
        afterwards, with ``n_cached`` grown by ``path_len``. Every other slot is dropped and the cache is cropped to
        the longest row.

        Shape: run_start, run_len [B] int64; path [B, M] int64 slot ids (entries past path_len are ignored);
        path_len [B] int64. Only the slots that change place are copied (specdec_kernels.filter_kv).
        """
        ends = self.n_cached + path_len
        kv = self.layer_tensors() if self.length else []
        dst0 = (self.n_cached - run_len).tolist()
        r_start, r_len, p_len = run_start.tolist(), run_len.tolist(), path_len.tolist()
        paths = path.tolist() if max(p_len, default=0) > 0 else [[] for _ in p_len]
        prefix: list[int] = []
        moves: list[list[int]] = []
        for b, dst in enumerate(dst0):
            src: list[int] = []
            if r_len[b] and r_start[b] != dst:  # a run either stays where it is or moves whole
                src = list(range(r_start[b], r_start[b] + r_len[b]))
            else:
                dst += r_len[b]
            rest = paths[b][: p_len[b]]
            if not src:  # nodes that already sit at their destination stay (batch 1: the whole path, for a chain)
                k = 0
                while k < len(rest) and rest[k] == dst + k:
                    k += 1
                dst, rest = dst + k, rest[k:]
            src += rest
            if src and dst == 0:  # filter_kv's prefix_len must be >= 1: a row with nothing cached gets slot 0 here
                for t in kv:
                    t[b, :, 0] = t[b, :, src[0]]
                dst, src = 1, src[1:]
            prefix.append(max(dst, 1))
            moves.append(src)
        width = max((len(m) for m in moves), default=0)
        if width:
            dev = self.n_cached.device
            # filter_kv moves slot P - 1 + node[j] to slot P + j
            nodes = [[s - p + 1 for s in m] + [-1] * (width - len(m)) for m, p in zip(moves, prefix, strict=True)]
            sk.filter_kv(
                kv,
                torch.tensor(prefix, dtype=torch.long, device=dev),
                torch.tensor(nodes, dtype=torch.long, device=dev),
                torch.tensor([len(m) for m in moves], dtype=torch.long, device=dev),
                validate=False,
            )
        self.n_cached = ends
        length = self.length
        top = min(int(ends.max()), length) if ends.numel() else 0
        self.valid = torch.arange(top, device=ends.device)[None, :] < ends[:, None]
        if top < length:
            crop_cache(self.cache, length - top)

    def layer_tensors(self) -> list[torch.Tensor]:
        """Every layer's keys and values, [B, H, S, D] each (the tensors filter_kv edits in place)."""
        out = []
        for layer in self.cache.layers:
            out.extend([layer.keys, layer.values])
        return out


def slot_layer_class() -> type:
    """:class:`transformers.DynamicLayer` whose keys and values are views of buffers with room to grow (built once,
    on first use, so that importing this module does not import transformers)."""
    global _SLOT_LAYER
    if _SLOT_LAYER is not None:
        return _SLOT_LAYER
    from transformers.cache_utils import DynamicLayer

    class SlotLayer(DynamicLayer):
        """A cache layer whose ``keys``/``values`` [B, H, S, D] are views of [B, H, capacity, D] buffers.

        DynamicLayer concatenates on every update, copying the whole cache once per layer and step; here an update
        writes the new slots after the last ones and widens the view, and only a full buffer is copied into a larger
        one. Slot moves (filter_kv) and crops (crop_slots, ``crop``) edit the views in place. A layer whose views no
        longer sit in its buffers (``batch_select_indices``, ``reorder_cache`` make new tensors) starts a new
        buffer at its next update."""

        def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
            super().lazy_initialization(key_states, value_states)
            self.buffers: tuple[torch.Tensor, torch.Tensor] | None = None
            self._views: tuple[torch.Tensor, torch.Tensor] | None = None  # the keys/values commit made

        def _room(self, new: torch.Tensor, length: int) -> bool:
            bufs = self.buffers
            if bufs is None or length == 0:
                return bufs is not None and bufs[0].shape[:2] == new.shape[:2] and bufs[0].shape[3] == new.shape[3]
            k = self.keys
            return (
                k.data_ptr() == bufs[0].data_ptr()
                and self.values.data_ptr() == bufs[1].data_ptr()
                and k.stride() == bufs[0].stride()
                and self.values.stride() == bufs[1].stride()
                and k.shape[:2] == new.shape[:2]
                and k.shape[3] == new.shape[3]
            )

        def _grow(self, key_states: torch.Tensor, value_states: torch.Tensor, length: int, end: int) -> None:
            # grow by a quarter (at least 128 slots): a copy of the cache every few hundred tokens, not per step
            cap = -(-(end + max(128, end // 4)) // 64) * 64
            b, h, _, d = key_states.shape
            kb = key_states.new_empty((b, h, cap, d))
            vb = value_states.new_empty((b, value_states.shape[1], cap, value_states.shape[3]))
            if length:
                kb[:, :, :length].copy_(self.keys)
                vb[:, :, :length].copy_(self.values)
            self.buffers = (kb, vb)

        def update(
            self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
        ) -> tuple[torch.Tensor, torch.Tensor]:
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            length = self.get_seq_length()
            end = length + key_states.shape[-2]
            if not self._room(key_states, length) or self.buffers[0].shape[2] < end:  # type: ignore[index]
                self._grow(key_states, value_states, length, end)
            kb, vb = self.buffers  # type: ignore[misc]
            kb[:, :, length:end].copy_(key_states)
            vb[:, :, length:end].copy_(value_states)
            self.commit(end)
            return self.keys, self.values

        def slots(self, n: int) -> tuple[torch.Tensor, torch.Tensor, int] | None:
            """(k buffer, v buffer, length) with room for ``n`` slots after the ``length`` cached ones, for a caller
            that writes them itself and then calls :meth:`commit`; None where the layer caches nothing yet or its
            views left its buffers (:meth:`update` then starts new ones)."""
            if not self.is_initialized:
                return None
            views = self._views  # still commit's views (crops narrow them in place): in the buffers, no check
            ours = views is not None and self.keys is views[0] and self.values is views[1]
            if not ours and self.keys.dim() != 4:
                return None
            length = self.get_seq_length()
            if length == 0 or not (ours or self._room(self.keys, length)):
                return None
            if self.buffers[0].shape[2] < length + n:  # type: ignore[index]
                self._grow(self.keys, self.values, length, length + n)
            kb, vb = self.buffers  # type: ignore[misc]
            return kb, vb, length

        def commit(self, end: int) -> None:
            """The cache holds the first ``end`` slots of its buffers."""
            kb, vb = self.buffers  # type: ignore[misc]
            self.keys, self.values = kb.narrow(2, 0, end), vb.narrow(2, 0, end)
            self._views = (self.keys, self.values)

    _SLOT_LAYER = SlotLayer
    return SlotLayer


_SLOT_LAYER: type | None = None


def new_cache() -> Any:
    """An empty :class:`transformers.DynamicCache` whose layers (created on first update) are slot layers
    (:func:`slot_layer_class`). No config: every layer is a plain full layer, sliding ones too (a config would make
    those drop keys past the window, while the adapter's masks index all S slots and KVState moves and crops every
    layer alike)."""
    from transformers import DynamicCache

    cache = DynamicCache()
    cache.layer_class_to_replicate = slot_layer_class()
    return cache


#: the keywords under which transformers passes a KV cache: ``cache`` in current releases, ``past_key_values`` in
#: older ones (5.17) and as a deprecated alias
CACHE_KEYWORDS = ("cache", "past_key_values")


def cache_argument(module: Any) -> str:
    """The keyword under which ``module.forward`` takes a KV cache: ``cache`` in current transformers, whose
    ``past_key_values`` is a deprecated alias; ``past_key_values`` for a forward that does not name ``cache``."""
    forward = module.__dict__.get("forward") or type(module).forward
    return cache_keyword(forward)


@functools.lru_cache(maxsize=256)
def cache_keyword(forward: Any) -> str:
    # per function, not per call: inspect.signature costs ~0.1 ms, a draft model's step a few
    return "cache" if "cache" in inspect.signature(forward).parameters else "past_key_values"


def crop_cache(cache: Any, remove: int) -> None:
    """Drop the last ``remove`` slots of every layer of a DynamicCache (``cache.crop(-remove)``); a cache of plain
    CPU layers is narrowed in one kernel call (specdec_kernels.crop_slots) instead of two slices per layer."""
    layers = cache.layers
    if remove <= 0 or not any(getattr(layer, "is_initialized", True) for layer in layers):
        return  # nothing cached yet (older transformers' crop fails on a layer that holds nothing)
    plain = getattr(cache, "_specdec_plain_layers", None)
    if plain is None and layers and all(layer.is_initialized for layer in layers):
        # layer types never change, so this is decided once per cache (after its first forward)
        from transformers.cache_utils import DynamicLayer

        plain = all(type(layer) in (DynamicLayer, slot_layer_class()) for layer in layers)
        cache._specdec_plain_layers = plain
    if plain:
        kv = [t for layer in layers for t in (layer.keys, layer.values)]
        if sk.crop_slots(kv, int(kv[0].shape[2]) - remove):
            return
    cache.crop(-remove)
