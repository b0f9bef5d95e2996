"""A batch of draft trees grown level by level in the flattened level-order layout of docs/kernels.md (Ops).

Each level is appended as one block of columns; rows with fewer nodes than the widest row at that level get
padding nodes (``valid = False``) at the end of the block, so a row's valid nodes stay in level order and grouped
by parent, with siblings in draft order. ``levels[l] = (lo, hi)`` are the node ids of level l (level 0 = root).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

import specdec_kernels as sk


@dataclass
class DraftTree:
    """Shape: tokens/parent/depth [B, N] int64, valid [B, N] bool, p_rows [B, N, V] fp32 draft laws of internal
    nodes (None in greedy mode), hub [B, N] int64 (SpecHub only), template [B, N] int64 id of the node in the
    method's static tree (-1 for padding or dynamic trees)."""

    tokens: torch.Tensor
    parent: torch.Tensor
    valid: torch.Tensor
    depth: torch.Tensor
    template: torch.Tensor
    levels: list[tuple[int, int]] = field(default_factory=list)
    p_levels: list[torch.Tensor] = field(default_factory=list)
    hub_levels: list[torch.Tensor] = field(default_factory=list)
    # per level: the token ids of the law's columns when it was stored reduced (DraftLogits.support), else None
    p_support: list[torch.Tensor | None] = field(default_factory=list)

    @classmethod
    def from_roots(cls, roots: torch.Tensor) -> DraftTree:
        """Trees holding only their root. Shape: roots [B] int64."""
        batch = roots.shape[0]
        dev = roots.device
        return cls(
            tokens=roots.reshape(batch, 1).clone(),
            parent=torch.full((batch, 1), -1, dtype=torch.long, device=dev),
            valid=torch.ones((batch, 1), dtype=torch.bool, device=dev),
            depth=torch.zeros((batch, 1), dtype=torch.long, device=dev),
            template=torch.zeros((batch, 1), dtype=torch.long, device=dev),
            levels=[(0, 1)],
        )

    @property
    def batch(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def size(self) -> int:
        """N, the number of node columns (padding included)."""
        return int(self.tokens.shape[1])

    @property
    def num_levels(self) -> int:
        return len(self.levels)

    def append_level(
        self,
        tokens: torch.Tensor,
        parent: torch.Tensor,
        valid: torch.Tensor,
        template: torch.Tensor | None = None,
        *,
        dense: bool = False,
    ) -> tuple[int, int]:
        """Append one level. Shape: tokens/parent/template [B, w], valid [B, w] (valid nodes first in each row).
        ``dense``: the caller knows that every node is valid (no padding to normalise, no sync to find out)."""
        lo = self.size
        width = tokens.shape[1]
        if template is None:
            template = torch.full_like(tokens, -1)
        if not dense and not bool(valid.all()):  # padding: parent 0, token 0, template -1 (full levels skip these)
            pad = ~valid
            parent, tokens, template = (
                parent.masked_fill(pad, 0),
                tokens.masked_fill(pad, 0),
                template.masked_fill(pad, -1),
            )
        depth = torch.gather(self.depth, 1, parent) + 1
        self.tokens = torch.cat([self.tokens, tokens], dim=1)
        self.parent = torch.cat([self.parent, parent], dim=1)
        self.valid = torch.cat([self.valid, valid], dim=1)
        self.depth = torch.cat([self.depth, depth], dim=1)
        self.template = torch.cat([self.template, template], dim=1)
        self.levels.append((lo, lo + width))
        return lo, lo + width

    def set_level_laws(
        self, probs: torch.Tensor, hub: torch.Tensor | None = None, support: torch.Tensor | None = None
    ) -> None:
        """Store the draft laws (and SpecHub hubs) of the newest level, in level order of calls.

        Shape: probs [B, w, V] fp32 (w = width of that level), or [B, w, S] over the token ids ``support`` [S]
        (a reduced-vocabulary draft: zero mass elsewhere), hub [B, w] int64.
        """
        self.p_levels.append(probs)
        self.p_support.append(support)
        if hub is not None:
            self.hub_levels.append(hub)

    def p_rows(self, vocab: int, buffer: LawBuffer | None = None) -> torch.Tensor:
        """Draft laws of every node, [B, N, V] fp32; zero rows for leaves and padding (never read).

        ``buffer``: reused storage for reduced laws (see :class:`LawBuffer`); the result is then only valid until
        the next call with the same buffer."""
        supports = self.p_support  # aligned with p_levels by set_level_laws
        if not any(s is not None for s in supports):
            rows = list(self.p_levels)
            have = sum(int(r.shape[1]) for r in rows)
            if have < self.size:
                rows.append(torch.zeros((self.batch, self.size - have, vocab), dtype=torch.float32, device=self.device))
            return torch.cat(rows, dim=1)
        first = supports[0]
        if all(s is first for s in supports):  # one drafter, one support: a single scatter for every level
            probs = torch.cat(self.p_levels, dim=1) if len(self.p_levels) > 1 else self.p_levels[0]
            rows = int(probs.shape[1])
            if buffer is not None:
                out = buffer.take((self.batch, self.size, vocab), first, rows)
            else:
                out = torch.zeros((self.batch, self.size, vocab), dtype=torch.float32, device=self.device)
            out[:, :rows].index_copy_(-1, first, probs)
            return out
        # reduced laws: one zero-filled buffer, each level's columns written into its slice
        out = torch.zeros((self.batch, self.size, vocab), dtype=torch.float32, device=self.device)
        lo = 0
        for probs, support in zip(self.p_levels, supports, strict=True):
            hi = lo + int(probs.shape[1])
            if support is None:
                out[:, lo:hi] = probs
            else:
                out[:, lo:hi].index_copy_(-1, support, probs)
            lo = hi
        return out

    def hub(self) -> torch.Tensor:
        """SpecHub hub token of every node, [B, N] int64 (0 where unused)."""
        rows = list(self.hub_levels)
        have = sum(int(r.shape[1]) for r in rows)
        if have < self.size:
            rows.append(torch.zeros((self.batch, self.size - have), dtype=torch.long, device=self.device))
        return torch.cat(rows, dim=1)

    @property
    def device(self) -> torch.device:
        return self.tokens.device

    def has_children(self) -> list[list[bool]]:
        """[B][N]: the node has at least one valid child (host lists: the driver reads it once per round)."""
        return [[c > 0 for c in row] for row in sk.child_counts(self.parent, self.valid)]

    def path_tokens(self, b: int, node: int) -> list[int]:
        """Tokens on the path root -> node (root excluded) of row ``b``."""
        out = []
        while node > 0:
            out.append(int(self.tokens[b, node]))
            node = int(self.parent[b, node])
        return out[::-1]


def compact(
    tokens: torch.Tensor, parent: torch.Tensor, valid: torch.Tensor, *extra: torch.Tensor
) -> tuple[torch.Tensor, ...]:
    """Move each row's valid candidates to the front, keeping their order, and cut the common padding.

    Shape: all inputs [B, M]; returns the same tensors [B, w] with w = max valid count (at least 0).
    """
    if valid.numel() and bool(valid.all()):  # nothing to move (chains, full trees): skip the sort and gathers
        return (tokens, parent, valid, *extra)
    order = torch.argsort((~valid).to(torch.int8), dim=1, stable=True)
    width = int(valid.sum(dim=1).max()) if valid.numel() else 0
    idx = order[:, :width]
    out = [torch.gather(t, 1, idx) for t in (tokens, parent, valid, *extra)]
    return tuple(out)


class LawBuffer:
    """Storage for the widened draft laws of reduced-vocabulary drafts, reused across rounds.

    A round's laws are [B, N, S] over one support; the verifier reads them as [B, N, V] rows that are zero outside
    the support. Rounds with the same shape and the same support tensor rewrite only the support's columns of
    the rows they use (plus a zero fill of rows the previous round used and this one does not), instead of
    zero-filling a fresh [B, N, V] buffer (1 MB per round for 5 nodes at V = 49152)."""

    def __init__(self) -> None:
        self._out: torch.Tensor | None = None
        self._support: torch.Tensor | None = None
        self._rows = 0  # leading rows whose support columns hold the previous round's laws

    def take(self, shape: tuple[int, int, int], support: torch.Tensor, rows: int) -> torch.Tensor:
        """A [B, N, V] fp32 buffer that is zero outside ``support``'s columns and, in those columns, in every row
        from ``rows`` on; rows below ``rows`` hold stale values that the caller overwrites."""
        out = self._out
        if out is None or tuple(out.shape) != shape or self._support is not support:  # same support: same device
            out = torch.zeros(shape, dtype=torch.float32, device=support.device)
            self._out, self._support = out, support
        elif self._rows > rows:
            out[:, rows : self._rows].zero_()
        self._rows = rows
        return out
