"""A neural draft with Max-Gram's proposal mixed in (``--draft <asset>+ngram``)."""

from __future__ import annotations

import math

import torch

from ..models import HFCausalLM
from ..tree import DraftTree
from .base import Drafter, DraftLogits
from .ngram import NGramDrafter, longest_match


def _insert_columns(
    logits: torch.Tensor, support: torch.Tensor, new: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Reduced logits over the sorted union of ``support`` [S] and a few ``new`` ids (sorted, distinct, none in
    ``support``), the new columns at -inf. Placed by position arithmetic: re-sorting the S ids (torch.unique) or
    looking each of them up again (searchsorted) costs hundreds of microseconds at S = 6144.
    Shape: logits [..., S] -> [..., S + k], support -> [S + k]."""
    width, k = support.numel(), new.numel()
    at = torch.searchsorted(support, new)  # new id j goes before old column at[j]
    # old column i moves right by the number of new ids placed before it
    shift = torch.zeros(width + 1, dtype=torch.long, device=support.device).index_add_(0, at, torch.ones_like(at))
    old_to_new = torch.arange(width, device=support.device) + shift.cumsum(0)[:width]
    wider = support.new_empty(width + k)
    wider[old_to_new] = support
    wider[at + torch.arange(k, device=support.device)] = new
    grown = logits.new_full((*logits.shape[:-1], width + k), float("-inf"))
    return grown.index_copy_(-1, old_to_new, logits), wider


class HybridDrafter(Drafter):
    """A neural drafter whose law at every node on the Max-Gram track puts mass ``weight`` on Max-Gram's proposal.

    The track is every path of the tree that spells Max-Gram's proposal after the committed sequence (more than one
    where i.i.d. draws repeat a token, as SpecTr's chains and SpecInfer's siblings do): up to ``max_tokens`` tokens
    after the earliest occurrence of the longest suffix that occurred before (:func:`longest_match`), when that suffix
    is at least ``min_match`` tokens long. At a node on the track the draft law is the mixture ``weight * point mass on
    the proposal's next token + (1 - weight) * the neural law without that token`` (on raw logits, before temperature
    and truncation; ``weight >= 0.5`` makes the token the top-1 as well, so greedy trees take it as the first child).
    Off the track the law is the neural draft's. Below the tree's own depth (:meth:`set_tree_depth`; auto trees add
    ``track_levels`` such levels) only the track continues, as a point mass, without running the neural draft: code and
    other text that repeats itself get long drafts at no draft cost.

    The law at each node is a deterministic function of the committed tokens and the path to it, so every
    verifier stays exact with it (docs/methods.md, Drafts).
    """

    def __init__(
        self, neural: Drafter, *, weight: float = 0.9, min_match: int = 1, track_levels: int = 4, max_tokens: int = 16
    ) -> None:
        if isinstance(neural, (NGramDrafter, HybridDrafter)):
            raise ValueError(f"neural must be a neural drafter, got {type(neural).__name__}")
        if not isinstance(neural, Drafter):
            raise TypeError(
                "neural must be a Drafter: wrap a draft model as specdec.FeatureDrafter(model) (a feature draft) or "
                f"specdec.ModelDrafter(model), got {type(neural).__name__}"
            )
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not 0.5 <= float(weight) < 1.0:
            raise ValueError(f"weight must be a float in [0.5, 1), got {weight!r}")
        if isinstance(min_match, bool) or not isinstance(min_match, int) or min_match < 1:
            raise ValueError(f"min_match must be an int >= 1, got {min_match!r}")
        if isinstance(track_levels, bool) or not isinstance(track_levels, int) or track_levels < 0:
            raise ValueError(f"track_levels must be an int >= 0, got {track_levels!r}")
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise ValueError(f"max_tokens must be an int >= 1, got {max_tokens!r}")
        self.neural = neural
        self.name = f"{neural.name}+ngram"
        self.vocab_size = neural.vocab_size
        self.num_parameters = neural.num_parameters
        self.reads_target_features = neural.reads_target_features
        self.feature_layers = neural.feature_layers
        self.weight = float(weight)
        self.min_match = min_match
        self.track_levels = track_levels
        self.max_tokens = max_tokens
        self._log_odds = math.log(self.weight / (1.0 - self.weight))
        self._tree_depth: int | None = None
        self._proposals: list[list[int]] = []
        # per row: the nodes of the newest level whose path spells the proposal so far (several where i.i.d. draws
        # repeat a token: each of them gets the mixture law, so that a node's law is a function of its path)
        self._track: list[list[int]] = []

    @property
    def calls(self) -> int:  # type: ignore[override]  # the neural forwards; track-only levels cost no forward
        return self.neural.calls

    def set_tree_depth(self, depth: int | None) -> None:
        self._tree_depth = depth

    def refresh(self) -> None:
        self.neural.refresh()
        self.num_parameters = self.neural.num_parameters

    def start(self, prompts: list[list[int]]) -> None:
        self.neural.start(prompts)
        self._tree_depth = None
        self._proposals = [[] for _ in prompts]
        self._track = [[] for _ in prompts]

    def after_target(self, target: HFCausalLM, positions: torch.Tensor | None, count: torch.Tensor) -> None:
        self.neural.after_target(target, positions, count)

    def propose_root(self, committed: list[list[int]]) -> DraftLogits:
        found = [longest_match(c, self.max_tokens) for c in committed]
        self._proposals = [prop if m >= self.min_match else [] for m, prop in found]
        self._track = [[0] if p else [] for p in self._proposals]
        out = self.neural.propose_root(committed)
        return self._mix(out, [[(0, p[0])] if p else [] for p in self._proposals])

    def propose_level(self, tree: DraftTree, lo: int, hi: int) -> DraftLogits:
        depth = len(tree.levels) - 1  # of nodes lo..hi-1
        parents, tokens, valid = (
            tree.parent[:, lo:hi].tolist(),
            tree.tokens[:, lo:hi].tolist(),
            tree.valid[:, lo:hi].tolist(),
        )
        picks: list[list[tuple[int, int]]] = []
        for b, prop in enumerate(self._proposals):
            at, track = self._track[b], []
            row: list[tuple[int, int]] = []
            if at and depth <= len(prop):
                for j in range(hi - lo):
                    if valid[b][j] and parents[b][j] in at and tokens[b][j] == prop[depth - 1]:
                        track.append(lo + j)
                        if depth < len(prop):
                            row.append((j, prop[depth]))
            self._track[b] = track
            picks.append(row)
        if self._tree_depth is None or depth < self._tree_depth:
            return self._mix(self.neural.propose_level(tree, lo, hi), picks)
        # below the tree proper: the track alone, a point mass over the few proposed tokens
        dev = tree.device
        width = hi - lo
        support = sorted({t for row in picks for _, t in row}) or [0]
        col = {t: i for i, t in enumerate(support)}
        logits = torch.full((tree.batch, width, len(support)), float("-inf"))
        ok = torch.zeros((tree.batch, width), dtype=torch.bool)
        for b, row in enumerate(picks):
            for j, t in row:
                logits[b, j, col[t]] = 0.0
                ok[b, j] = True
        return DraftLogits(logits.to(dev), ok.to(dev), torch.tensor(support, dtype=torch.long, device=dev))

    def _mix(self, out: DraftLogits, picks: list[list[tuple[int, int]]]) -> DraftLogits:
        """``out`` with the mixture law at the listed (node column, proposed token) of each row."""
        flat = [(b, j, t) for b, row in enumerate(picks) for j, t in row]
        if not flat:
            return out
        logits, ok, support = out.logits.to(torch.float32, copy=True), out.ok.clone(), out.support
        if support is not None:  # a reduced head: the proposed token may lie outside its columns
            toks = torch.tensor([t for _, _, t in flat], dtype=torch.long, device=logits.device)
            col = torch.searchsorted(support, toks).clamp_max(support.numel() - 1)
            missing = support[col] != toks
            if bool(missing.any()):
                logits, support = _insert_columns(logits, support, torch.unique(toks[missing]))
                col = torch.searchsorted(support, toks)
            cols = col.tolist()
        else:
            cols = [t for _, _, t in flat]
        dev = logits.device
        bi = torch.tensor([b for b, _, _ in flat], dtype=torch.long, device=dev)
        ji = torch.tensor([j for _, j, _ in flat], dtype=torch.long, device=dev)
        ci = torch.tensor(cols, dtype=torch.long, device=dev)
        pick = torch.arange(len(flat), device=dev)
        # a node without a neural proposal (nothing to pair yet) gets the track's point mass
        rows = torch.where(ok[bi, ji, None], logits[bi, ji], float("-inf"))
        rows[pick, ci] = float("-inf")
        rest = torch.logsumexp(rows, -1)
        rows[pick, ci] = torch.where(torch.isfinite(rest), rest + self._log_odds, torch.zeros_like(rest))
        logits[bi, ji] = rows
        ok[bi, ji] = True
        return DraftLogits(logits, ok, support)

    def accept(self, tree: DraftTree, accepted_nodes: torch.Tensor, n_accepted: torch.Tensor) -> None:
        self.neural.accept(tree, accepted_nodes, n_accepted)  # it keeps only the nodes it processed

    def select_rows(self, rows: torch.Tensor) -> None:
        self.neural.select_rows(rows)
        keep = rows.tolist()
        self._proposals = [self._proposals[i] for i in keep] if self._proposals else []
        self._track = [self._track[i] for i in keep] if self._track else []
