"""The decoding loop shared by every method: draft a tree, run the target once over it, verify, commit, filter
the KV caches, repeat (docs/methods.md). Batch rows keep their own lengths and finish independently.

One round for the active rows:
1. catch up the target on committed tokens it has not seen yet, except each row's last one (the root);
2. the tree builder drafts the round's trees (nothing for ``ar``);
3. one target forward over [root, draft nodes] per row;
4. target logits -> q with the same processing as the draft; verify_tree walks the trees;
5. append accepted tokens + the correction/bonus token (none after an accepted EOS), truncate at
   ``max_new_tokens``; keep only the accepted path in both KV caches (filter_kv); drop finished rows.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

import specdec_kernels as sk

from .config import MethodConfig, SamplingConfig, make_method, resolve_sampling
from .decoders import make_builder
from .decoders.adaptive import DEFAULT_THRESHOLD, AdaptiveStop
from .decoders.base import op_seed, seed_block
from .drafting import Drafter, as_drafter
from .metrics import GenerationStats
from .models import HFCausalLM
from .tree import DraftTree, LawBuffer

DEFAULT_MAX_NEW_TOKENS = 32


@dataclass
class GenerationOutput:
    """Result of ``generate``.

    Shape: sequences [B, P + T]: the input ids as given (left padding kept) followed by each row's new tokens,
    right-padded with ``pad_token_id`` to the longest row (T). ``new_tokens[b]``: row b's generated ids.
    """

    sequences: torch.Tensor
    new_tokens: list[list[int]]
    stats: GenerationStats


def _as_drafter(draft: Any, target: HFCausalLM, config: MethodConfig, *, hidden: bool = False) -> Drafter | None:
    if not config.spec.drafts:
        return None
    if draft is None:
        raise ValueError(f"draft is required for method {config.method!r}: pass a draft model, a Drafter or 'ngram'")
    return as_drafter(draft, target, hidden=hidden)


def _eos_list(eos: int | Sequence[int] | torch.Tensor | None, vocab: int) -> list[int]:
    if eos is None:
        return []
    if isinstance(eos, torch.Tensor):
        ids = eos.flatten().tolist()
    elif isinstance(eos, int) and not isinstance(eos, bool):
        ids = [eos]
    elif isinstance(eos, Sequence) and not isinstance(eos, (str, bytes)):
        ids = list(eos)
    else:
        raise ValueError(f"eos_token_id must be an int or a list of ints, got {eos!r}")
    for i in ids:
        if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < vocab:
            raise ValueError(f"eos_token_id must hold token ids in [0, {vocab}), got {eos!r}")
    return ids


def _prompts(input_ids: Any, attention_mask: Any, vocab: int) -> list[list[int]]:
    if not isinstance(input_ids, torch.Tensor):
        raise TypeError(f"input_ids must be a torch.Tensor [B, P] of token ids, got {type(input_ids).__name__}")
    if input_ids.dim() == 1:
        input_ids = input_ids[None]
    if input_ids.dim() != 2:
        raise ValueError(f"input_ids must have shape [B, P], got {tuple(input_ids.shape)}")
    if input_ids.is_floating_point() or input_ids.dtype == torch.bool:
        raise TypeError(f"input_ids must be an integer tensor, got dtype {input_ids.dtype}")
    if input_ids.shape[0] == 0 or input_ids.shape[1] == 0:
        raise ValueError(
            f"input_ids must hold at least one prompt token per row (empty prompt), got {tuple(input_ids.shape)}"
        )
    if attention_mask is None:
        mask = torch.ones(input_ids.shape, dtype=torch.bool)
    else:
        if not isinstance(attention_mask, torch.Tensor):
            raise TypeError(
                f"attention_mask must be a torch.Tensor like input_ids, got {type(attention_mask).__name__}"
            )
        if attention_mask.dim() == 1:
            attention_mask = attention_mask[None]
        if tuple(attention_mask.shape) != tuple(input_ids.shape):
            raise ValueError(
                f"attention_mask must have the shape of input_ids {tuple(input_ids.shape)}, "
                f"got {tuple(attention_mask.shape)}"
            )
        if bool(((attention_mask != 0) & (attention_mask != 1)).any()):
            raise ValueError("attention_mask must hold only 0 (padding) and 1 (token)")
        mask = attention_mask.bool().cpu()
    ids = input_ids.cpu()
    prompts = []
    for b in range(ids.shape[0]):
        row = ids[b][mask[b]].tolist()
        if not row:
            raise ValueError(f"attention_mask row {b} selects no token (empty prompt); every row needs >= 1 token")
        prompts.append(row)
    flat = [t for p in prompts for t in p]
    if min(flat) < 0 or max(flat) >= vocab:
        raise ValueError(f"input_ids must hold token ids in [0, {vocab}) where attention_mask is 1")
    return prompts


class SpeculativeDecoder:
    """A target model, a drafter and a decoding method, reusable across ``generate`` calls.

    ``target``: HF causal LM of a family in ``specdec.models.SUPPORTED_MODEL_TYPES`` (sdpa or eager attention) or an
    ``HFCausalLM``.
    ``draft``: an HF model of the same vocabulary, any :class:`~specdec.drafting.Drafter`, the string
    ``"ngram"`` (Max-Gram prompt lookup), or None for ``method="ar"``. ``method`` defaults to ``"rsd_c"``, whose
    default ``branching="auto"`` chooses each round's tree for the machine (docs/methods.md). Method parameters: see
    :func:`specdec.config.make_method` (``draft_length``, ``branching``, ``parents``, ``beam_width``,
    ``num_chains``). ``head``/``threshold``: an acceptance head and its threshold h (default 0.7) make the draft
    depth adaptive per row (required by ``method="specdec_pp"``, SpecDec++; with a tree method it stops
    growing the tree once the best path's predicted rejection risk exceeds h). ``last_stats`` holds the statistics
    of the latest call.
    """

    def __init__(
        self,
        target: Any,
        draft: Any = None,
        *,
        method: str = "rsd_c",
        draft_length: int | None = None,
        branching: Sequence[int] | str | None = None,
        parents: Sequence[int] | None = None,
        beam_width: int | None = None,
        num_chains: int | None = None,
        head: Any = None,
        threshold: float | None = None,
    ) -> None:
        self.config: MethodConfig = make_method(
            method,
            draft_length=draft_length,
            branching=branching,
            parents=parents,
            beam_width=beam_width,
            num_chains=num_chains,
        )
        spec = self.config.spec
        if spec.needs_head and head is None:
            raise ValueError(
                f"method {method!r} needs head= (an acceptance head, e.g. specdec.train.load_head("
                "'smollm2-distill-head')[0], or any callable hidden [..., H] -> Phat)"
            )
        if head is not None and not spec.drafts:
            raise ValueError(f"head= (adaptive draft depth) needs a drafting method, got method {method!r}")
        if threshold is not None and head is None:
            raise ValueError("threshold= is the acceptance head's stopping threshold h: pass head= too")
        self.target = target if isinstance(target, HFCausalLM) else HFCausalLM(target, name="target")
        self.drafter = _as_drafter(draft, self.target, self.config, hidden=head is not None)
        self.builder = make_builder(self.config)
        if self.config.auto:
            assert self.builder is not None and self.drafter is not None
            self.builder.calibrate(self.target)
        self._laws = LawBuffer()  # reused by every round's verification (DraftTree.p_rows)
        if head is not None:
            assert self.builder is not None
            self.builder.stop_rule = AdaptiveStop(head, DEFAULT_THRESHOLD if threshold is None else threshold)
        self.last_stats: GenerationStats | None = None

    def generate(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        *,
        max_new_tokens: int | None = None,
        temperature: float | None = None,
        top_k: int | None = None,
        top_p: float | None = None,
        do_sample: bool | None = None,
        eos_token_id: int | Sequence[int] | None = None,
        pad_token_id: int | None = None,
        generation_config: Any | None = None,
        seed: int | None = None,
        generator: torch.Generator | None = None,
    ) -> GenerationOutput:
        """Generate up to ``max_new_tokens`` tokens per row; exact in law (sampling) or equal to the target's
        greedy decoding (``do_sample=False`` or ``temperature=0``).

        Shape: input_ids [B, P] (or [P]), attention_mask [B, P] with 0 = padding (left padding as produced by HF
        tokenizers; any 0/1 mask works) -> GenerationOutput (sequences [B, P + T]).
        Explicit arguments override ``generation_config`` (an HF GenerationConfig: do_sample, temperature, top_k,
        top_p, max_new_tokens, eos_token_id, pad_token_id), which overrides the defaults (temperature 1, no top-k,
        no top-p, sampling when temperature > 0, 32 new tokens, no EOS). ``seed`` (an int in [0, 2**63)) or
        ``generator`` make the run reproducible. ``pad_token_id`` must be a token id of the target's vocabulary.
        Rows stop at any token of ``eos_token_id`` (no bonus token after an accepted EOS).
        """
        sampling = resolve_sampling(
            generation_config, temperature=temperature, top_k=top_k, top_p=top_p, do_sample=do_sample
        )
        gc = generation_config
        if max_new_tokens is None:
            max_new_tokens = getattr(gc, "max_new_tokens", None) if gc is not None else None
            max_new_tokens = DEFAULT_MAX_NEW_TOKENS if max_new_tokens is None else max_new_tokens
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be an int >= 1, got {max_new_tokens!r}")
        if eos_token_id is None and gc is not None:
            eos_token_id = getattr(gc, "eos_token_id", None)
        vocab = self.target.vocab_size
        eos = _eos_list(eos_token_id, vocab)
        if pad_token_id is None and gc is not None:
            pad_token_id = getattr(gc, "pad_token_id", None)
        if pad_token_id is None:
            pad_token_id = eos[0] if eos else 0
        if isinstance(pad_token_id, bool) or not isinstance(pad_token_id, int) or not 0 <= pad_token_id < vocab:
            raise ValueError(
                f"pad_token_id must be a token id in [0, {vocab}) (it fills the output's right padding), "
                f"got {pad_token_id!r}"
            )
        if generator is not None and seed is not None:
            raise ValueError("pass either seed= or generator=, not both")
        if seed is not None:
            # the range the ops take for their seeds; manual_seed would silently wrap a negative one modulo 2**64
            if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**63:
                raise ValueError(f"seed must be an int in [0, 2**63), got {seed!r}")
            # the run's generator only draws the ops' integer seeds (host side, whatever the model's device); each op
            # draws its noise from its own Philox stream on the tensors' device
            generator = torch.Generator()
            generator.manual_seed(seed)
        prompts = _prompts(input_ids, attention_mask, vocab)
        with torch.inference_mode(), seed_block(generator):
            new_tokens, stats = self._run(prompts, sampling, max_new_tokens, eos, generator)
        self.last_stats = stats
        width = max(len(t) for t in new_tokens)
        ids = input_ids if input_ids.dim() == 2 else input_ids[None]
        tail = torch.full((ids.shape[0], width), pad_token_id, dtype=ids.dtype, device=ids.device)
        for b, toks in enumerate(new_tokens):
            tail[b, : len(toks)] = torch.tensor(toks, dtype=ids.dtype)
        return GenerationOutput(torch.cat([ids, tail], dim=1), new_tokens, stats)

    def _run(
        self,
        prompts: list[list[int]],
        sampling: SamplingConfig,
        max_new: int,
        eos: list[int],
        generator: torch.Generator | None,
    ) -> tuple[list[list[int]], GenerationStats]:
        target, drafter, builder = self.target, self.drafter, self.builder
        dev = target.device
        batch = len(prompts)
        stats = GenerationStats(
            method=self.config.describe(),
            batch_size=batch,
            draft_depth=self.config.depth,
            target_params=target.num_parameters,
            draft_params=drafter.num_parameters if drafter is not None else 0,
        )
        t_start = time.perf_counter()
        eos_set = set(eos)
        committed = [list(p) for p in prompts]
        new_tokens: list[list[int]] = [[] for _ in prompts]
        active = list(range(batch))  # original row id of every row still in the batch
        state = target.new_state(batch)
        if drafter is not None:
            drafter.start(prompts)
        # the target keeps the extra hidden states the drafter reads (Drafter.feature_layers) only for this run
        target.feature_layers = tuple(drafter.feature_layers) if drafter is not None else ()
        calls_before = drafter.calls if drafter is not None else 0
        while active:
            rows = [committed[r] for r in active]
            with stats.timer("prefill"):
                done = state.n_cached.tolist()
                pending = [c[n:-1] for c, n in zip(rows, done, strict=True)]
                # the chain appended here (slots chain_at ..) is kept with the round's path (KVState.keep)
                chain_at, chain_len = state.length, torch.zeros((len(active),), dtype=torch.long, device=dev)
                if any(pending):
                    target.forward_chain(state, pending, last_logits=False)
                    stats.prefill_calls += 1
                    chain_len = torch.tensor([len(p) for p in pending], dtype=torch.long, device=dev)
                    if drafter is not None:
                        drafter.after_target(target, None, chain_len)
            roots = torch.tensor([c[-1] for c in rows], dtype=torch.long, device=dev)
            room = max(max_new - len(new_tokens[r]) for r in active)
            with stats.timer("draft"):
                if builder is None or drafter is None:
                    tree = DraftTree.from_roots(roots)
                else:
                    # A deeper tree than the largest remaining budget could never be used.
                    tree = builder.build(drafter, roots, rows, sampling, generator, room - 1)
            with stats.timer("target"):
                q_logits = target.forward_tree(state, tree.tokens, tree.parent, tree.valid, tree.depth)
                stats.target_calls += 1
            root_slot = state.length - tree.size
            with stats.timer("verify"):
                verdict = self._verify(tree, q_logits, sampling, eos, generator)
                if builder is not None:
                    builder.observe(verdict[3], verdict[1], tree)
            with stats.timer("other"):
                acc_nodes, n_acc, next_tok, acc_rank = verdict
                finished = self._commit(
                    tree, acc_nodes, n_acc, next_tok, acc_rank, active, committed, new_tokens, max_new, eos_set, stats
                )
                # tree ids of [root, accepted nodes] (a padded tail past 1 + n_acc); F.pad also gives [B, 1] when
                # nothing was drafted (acc_nodes [B, 0])
                idx = F.pad(acc_nodes.clamp_min(0), (1, 0))
                # each row keeps them right after its committed tokens
                state.keep(torch.full_like(chain_len, chain_at), chain_len, root_slot + idx, 1 + n_acc)
                if drafter is not None:
                    # the root and the accepted nodes: the newly committed positions but the last
                    drafter.after_target(target, idx, n_acc + 1)
                    drafter.accept(tree, acc_nodes, n_acc)
                if any(finished):
                    keep = torch.tensor([i for i, f in enumerate(finished) if not f], dtype=torch.long, device=dev)
                    active = [r for r, f in zip(active, finished, strict=True) if not f]
                    if active:
                        state.select_rows(keep)
                        if drafter is not None:
                            drafter.select_rows(keep)
        stats.draft_calls = (drafter.calls if drafter is not None else 0) - calls_before
        stats.new_tokens = sum(len(t) for t in new_tokens)
        stats.wall_time = time.perf_counter() - t_start
        return new_tokens, stats

    def _verify(
        self,
        tree: DraftTree,
        q_logits: torch.Tensor,
        sampling: SamplingConfig,
        eos: list[int],
        generator: torch.Generator | None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Target laws with the shared processing, then the tree walk. Shape: q_logits [B, N, V]."""
        batch = tree.batch
        # padding nodes already hold zero logits (HFCausalLM computes rows of valid nodes only)
        if tree.size > 1 and not sampling.greedy:  # the verifier reads the target's law: get it in one call
            q_probs = sampling.process(q_logits, "target", log=False)
            return self._verify_tree(tree, q_logits, q_probs, eos, generator)
        q_logp = sampling.process(q_logits, "target")
        if tree.size == 1:  # nothing drafted: a plain autoregressive step
            if sampling.greedy:
                nxt = q_logp[:, 0].argmax(dim=-1)
            else:
                nxt = sk.sample_categorical(q_logp[:, 0], seed=op_seed(generator), validate=False)
            empty = torch.zeros((batch, 0), dtype=torch.long, device=tree.device)
            return empty, torch.zeros((batch,), dtype=torch.long, device=tree.device), nxt, empty
        verifier = self.config.verifier
        assert verifier is not None
        out = sk.verify_tree(
            tree.tokens,
            tree.parent,
            None,
            q_logp,
            method=verifier,
            valid=tree.valid,
            greedy=True,
            eos_token_id=eos or None,
            validate=False,
            depth=tree.depth,
        )
        return out.accepted_nodes, out.n_accepted, out.next_token, out.accepted_rank

    def _verify_tree(
        self,
        tree: DraftTree,
        q_logits: torch.Tensor,
        q_probs: torch.Tensor,
        eos: list[int],
        generator: torch.Generator | None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Sampling mode: the tree walk against the target's law ``q_probs`` [B, N, V]."""
        verifier = self.config.verifier
        assert verifier is not None
        out = sk.verify_tree(
            tree.tokens,
            tree.parent,
            tree.p_rows(q_logits.shape[-1], self._laws),
            q_probs,
            method=verifier,
            valid=tree.valid,
            hub=tree.hub() if verifier == "spechub" else None,
            eos_token_id=eos or None,
            seed=op_seed(generator),
            validate=False,  # the tree and both laws come from the validated processing above
            depth=tree.depth,
        )
        return out.accepted_nodes, out.n_accepted, out.next_token, out.accepted_rank

    @staticmethod
    def _commit(
        tree: DraftTree,
        acc_nodes: torch.Tensor,
        n_acc: torch.Tensor,
        next_tok: torch.Tensor,
        acc_rank: torch.Tensor,
        active: list[int],
        committed: list[list[int]],
        new_tokens: list[list[int]],
        max_new: int,
        eos_set: set[int],
        stats: GenerationStats,
    ) -> list[bool]:
        """Append each row's emitted tokens; return which rows finished (EOS or max_new_tokens)."""
        has_kids = tree.has_children() if tree.size > 1 else [[False]] * tree.batch
        tokens = tree.tokens.tolist()
        nodes, counts, nxt, ranks = acc_nodes.tolist(), n_acc.tolist(), next_tok.tolist(), acc_rank.tolist()
        finished = []
        for i, r in enumerate(active):
            m = counts[i]
            path = nodes[i][:m]
            emitted = [tokens[i][n] for n in path] + ([nxt[i]] if nxt[i] >= 0 else [])
            ended_on_eos = nxt[i] < 0
            room = max_new - len(new_tokens[r])
            emitted = emitted[:room]
            new_tokens[r].extend(emitted)
            committed[r].extend(emitted)
            visited = [0, *path] if not ended_on_eos else [0, *path[:-1]]
            steps = sum(1 for n in visited if has_kids[i][n])
            stats.record_round(m, len(emitted), ranks[i][:m], steps)
            done = len(new_tokens[r]) >= max_new or any(t in eos_set for t in emitted)
            finished.append(done)
        return finished


class SpecDecPPDecoder(SpeculativeDecoder):
    """``method="specdec_pp"``: SD with per-row adaptive draft length (SpecDec++, docs/methods.md).

    ``draft``: HF draft model (same vocabulary as the target). ``head``: acceptance head (e.g.
    :func:`specdec.train.load_head`) or any callable hidden [..., H] -> Phat. ``threshold``: h (stop once the
    predicted probability of at least one rejection exceeds h; default 0.7). ``max_draft_length``: hard cap (20).
    """

    def __init__(
        self, target: Any, draft: Any, head: Any, *, threshold: float = DEFAULT_THRESHOLD, max_draft_length: int = 20
    ) -> None:
        super().__init__(
            target, draft, method="specdec_pp", draft_length=max_draft_length, head=head, threshold=threshold
        )


def generate(
    target: Any,
    draft: Any,
    input_ids: torch.Tensor,
    *,
    method: str,
    attention_mask: torch.Tensor | None = None,
    draft_length: int | None = None,
    branching: Sequence[int] | None = None,
    parents: Sequence[int] | None = None,
    beam_width: int | None = None,
    num_chains: int | None = None,
    head: Any = None,
    threshold: float | None = None,
    **kwargs: Any,
) -> GenerationOutput:
    """One-shot speculative generation: ``SpeculativeDecoder(target, draft, method=..., ...).generate(...)``.

    Shape: input_ids [B, P], attention_mask [B, P] -> GenerationOutput (sequences [B, P + T], new_tokens,
    stats). ``kwargs``: max_new_tokens, temperature, top_k, top_p, do_sample, eos_token_id, pad_token_id,
    generation_config, seed, generator (see :meth:`SpeculativeDecoder.generate`).
    """
    decoder = SpeculativeDecoder(
        target,
        draft,
        method=method,
        draft_length=draft_length,
        branching=branching,
        parents=parents,
        beam_width=beam_width,
        num_chains=num_chains,
        head=head,
        threshold=threshold,
    )
    return decoder.generate(input_ids, attention_mask, **kwargs)
