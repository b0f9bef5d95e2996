"""Max-Gram: prompt lookup (the longest earlier match of the sequence's tail) with a bigram table's fallback, and
the tables themselves (docs/methods.md, Drafts).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..tree import DraftTree
from .base import Drafter, DraftLogits
from .store import resolve_asset


def max_gram_proposal(seq: list[int] | np.ndarray, n: int, bigram: np.ndarray | None = None) -> list[int]:
    """Max-Gram proposal of up to ``n`` tokens after ``seq`` (decoder-only form).

    The search text is ``seq`` without its last token (the prompt is part of ``seq``): find the longest suffix of
    ``seq`` that occurs in it, take its earliest occurrence and propose the tokens that follow; if fewer than ``n``
    came out, search once more from the extended sequence; then fill with the greedy ``bigram`` table, if any.
    """
    out = longest_match(seq, n)[1]
    if 0 < len(out) < n:
        ext = np.concatenate([np.asarray(seq, dtype=np.int64), np.asarray(out, dtype=np.int64)])
        out += longest_match(ext, n - len(out))[1]
    if bigram is not None and len(seq) and len(out) < n:
        last = out[-1] if out else int(seq[-1])
        while len(out) < n:
            last = int(bigram[last])
            out.append(last)
    return out


def bigram_array(bigram: Any) -> np.ndarray:
    """A bigram table as given (array, list, tensor) as int64, refusing anything but integer token ids (a float
    table would be truncated silently). Shape: -> [V]; the caller checks V and the id range."""
    table = bigram.detach().cpu().numpy() if isinstance(bigram, torch.Tensor) else np.asarray(bigram)
    if table.ndim != 1 or not (np.issubdtype(table.dtype, np.integer) and table.dtype != np.bool_):
        raise ValueError(f"bigram must be a 1-D table of integer token ids, got {table.dtype} of shape {table.shape}")
    return table.astype(np.int64)


def bigram_table(corpus: Iterable[Sequence[int]], vocab_size: int, default: int | None = None) -> np.ndarray:
    """Max-Gram's greedy bigram table from token sequences: ``table[a] = argmax_b count(a, b)``, ties to the lowest
    id; a token never followed by another maps to ``default`` (None: the corpus's most frequent token, lowest id on
    ties; 0 for an empty corpus). Shape: -> [vocab_size] int64. Raises ValueError for ids outside [0, vocab_size)."""
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < 1:
        raise ValueError(f"vocab_size must be an int >= 1, got {vocab_size!r}")
    if default is not None and (
        isinstance(default, bool) or not isinstance(default, int) or not 0 <= default < vocab_size
    ):
        raise ValueError(f"default must be a token id in [0, {vocab_size}) or None, got {default!r}")
    keys, freq = [], np.zeros(vocab_size, dtype=np.int64)
    for i, seq in enumerate(corpus):
        arr = np.asarray(seq, dtype=np.int64).reshape(-1)
        if arr.size and (arr.min() < 0 or arr.max() >= vocab_size):
            raise ValueError(f"corpus sequence {i} holds token ids outside [0, {vocab_size})")
        keys.append(arr[:-1] * vocab_size + arr[1:])
        freq += np.bincount(arr, minlength=vocab_size)
    fill = (int(np.argmax(freq)) if freq.any() else 0) if default is None else default
    table = np.full(vocab_size, fill, dtype=np.int64)
    pairs, counts = np.unique(np.concatenate(keys) if keys else np.zeros(0, dtype=np.int64), return_counts=True)
    first, second = pairs // vocab_size, pairs % vocab_size
    order = np.lexsort((second, -counts, first))  # per first token: the largest count, then the lowest id
    head = np.ones(order.size, dtype=bool)
    head[1:] = first[order][1:] != first[order][:-1]
    table[first[order][head]] = second[order][head]
    return table


def longest_match(seq: list[int] | np.ndarray, n: int) -> tuple[int, list[int]]:
    """Max-Gram's search, once: (m, up to ``n`` tokens) where m is the length of the longest suffix of ``seq`` that
    occurs earlier in ``seq`` (0: none) and the tokens follow its earliest occurrence."""
    arr = np.asarray(seq, dtype=np.int64)
    t = len(arr)
    if t < 2 or n < 1:
        return 0, []
    text = arr[:-1]
    ends = np.nonzero(text == arr[-1])[0] + 1  # end (exclusive) of every occurrence of the 1-token suffix
    if ends.size == 0:
        return 0, []
    m = 1
    while m < t - 1:
        start = ends - (m + 1)
        ok = start >= 0
        nxt = ends[ok][text[start[ok]] == arr[t - 1 - m]]
        if nxt.size == 0:
            break
        ends = nxt
        m += 1
    end = int(ends.min())  # earliest occurrence of the longest suffix
    return m, [int(x) for x in text[end : end + n]]


def save_bigram(table: Any, path: str | Path, default: int) -> Path:
    """Write a bigram table compactly: only the entries that differ from ``default`` (a .npz file of a few kB to
    a few hundred kB for a real vocabulary). Returns the path."""
    table = np.asarray(table, dtype=np.int64)
    if table.ndim != 1 or table.size == 0 or table.min() < 0 or table.max() >= table.size:
        raise ValueError(f"table must be a non-empty 1-D array of token ids in [0, len(table)), got {table!r}")
    if not 0 <= default < table.size:
        raise ValueError(f"default must be a token id in [0, {table.size}), got {default!r}")
    keys = np.nonzero(table != default)[0]
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as fh:  # a file object: np.savez would append .npz to a name without it
        np.savez_compressed(
            fh, vocab_size=np.int64(table.size), default=np.int64(default), keys=keys.astype(np.int32),
            values=table[keys].astype(np.int32),
        )  # fmt: skip
    return path


def load_bigram(name_or_path: str | Path) -> np.ndarray:
    """A bigram table saved by :func:`save_bigram`: a shipped asset name (``smollm2-bigram``) or a .npz file.
    Shape: -> [V] int64."""
    with np.load(resolve_asset(name_or_path, ".npz"), allow_pickle=False) as data:
        table = np.full(int(data["vocab_size"]), int(data["default"]), dtype=np.int64)
        table[data["keys"].astype(np.int64)] = data["values"]
    return table


class NGramDrafter(Drafter):
    """Max-Gram prompt-lookup drafter (Chen et al. 2024, docs/methods.md [8]): proposes the continuation of the
    longest earlier match of the sequence's suffix. Deterministic, so its proposal law is one-hot and verification
    stays exact; costs no model forward (MBSU r = 0).

    ``max_tokens``: proposal length per round (the tree depth also caps it); ``bigram``: optional length-V greedy
    bigram table used to fill short proposals.
    """

    def __init__(self, vocab_size: int, *, max_tokens: int = 10, bigram: np.ndarray | None = None) -> None:
        if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < 1:
            raise ValueError(f"vocab_size must be an int >= 1, got {vocab_size!r}")
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise ValueError(f"max_tokens must be an int >= 1, got {max_tokens!r}")
        if bigram is not None:
            bigram = bigram_array(bigram)
            if bigram.shape != (vocab_size,) or bigram.min() < 0 or bigram.max() >= vocab_size:
                raise ValueError(f"bigram must be a length-{vocab_size} table of token ids in [0, {vocab_size})")
        self.name = "ngram"
        self.vocab_size = vocab_size
        self.max_tokens = max_tokens
        self.bigram = bigram
        self.num_parameters = 0
        self.calls = 0
        self._proposals: list[list[int]] = []

    @staticmethod
    def bigram_table(corpus: list[list[int]], vocab_size: int, default: int | None = None) -> np.ndarray:
        """Greedy bigram table from token sequences (:func:`bigram_table`)."""
        return bigram_table(corpus, vocab_size, default)

    def start(self, prompts: list[list[int]]) -> None:
        self._proposals = [[] for _ in prompts]

    def _one_hot(self, tokens: list[list[int | None]]) -> DraftLogits:
        batch, width = len(tokens), max((len(r) for r in tokens), default=0)
        logits = torch.full((batch, width, self.vocab_size), float("-inf"))
        ok = torch.zeros((batch, width), dtype=torch.bool)
        for b, row in enumerate(tokens):
            for j, tok in enumerate(row):
                if tok is not None:
                    logits[b, j, tok] = 0.0
                    ok[b, j] = True
        return DraftLogits(logits, ok)

    def propose_root(self, committed: list[list[int]]) -> DraftLogits:
        self.calls += 1
        self._proposals = [max_gram_proposal(c, self.max_tokens, self.bigram) for c in committed]
        return self._one_hot([[p[0] if p else None] for p in self._proposals])

    def propose_level(self, tree: DraftTree, lo: int, hi: int) -> DraftLogits:
        self.calls += 1
        rows: list[list[int | None]] = []
        for b, prop in enumerate(self._proposals):
            row: list[int | None] = []
            for node in range(lo, hi):
                path = tree.path_tokens(b, node) if bool(tree.valid[b, node]) else None
                # The point mass is a function of the path: the proposal continues only along its own prefix.
                on_track = path is not None and len(path) < len(prop) and path == prop[: len(path)]
                row.append(prop[len(path)] if on_track and path is not None else None)
            rows.append(row)
        return self._one_hot(rows)

    def accept(self, tree: DraftTree, accepted_nodes: torch.Tensor, n_accepted: torch.Tensor) -> None:
        return None

    def select_rows(self, rows: torch.Tensor) -> None:
        self._proposals = [self._proposals[int(r)] for r in rows.tolist()] if self._proposals else []
