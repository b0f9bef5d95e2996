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

import contextlib
import copy
import dataclasses
import functools
import gc
import time
from collections.abc import Iterator, Sequence
from typing import Any

import torch
import torch.nn.functional as F

from .distributed import agree_call, check_replicated, check_round
from .drafters import Drafter, HiddenStateDrafter, as_drafter
from .edge import (
    GenerationOutput,
    RoundOutputs,
    check_model_kwargs,
    eos_list,
    generate_call,
    hidden_stop_strings,
    output_sequences,
    pad_id,
    prompt_rows,
    run_generator,
)
from .errors import UnsupportedSettingError
from .generation import (
    check_config,
    check_processors,
    repetition_skip,
    sampling_from_hf,
    split_criteria,
)
from .methods import MethodConfig, make_method
from .methods.builders import make_builder
from .methods.builders.adaptive import DEFAULT_THRESHOLD, AdaptiveStop
from .methods.builders.base import seed_block
from .methods.builders.cascade import check_cascade
from .metrics import GenerationStats
from .models import HFCausalLM, KVState
from .rounds import Verdict, commit_round, verify_round, verify_sampled
from .sampling import RunContext, SamplingConfig
from .tree import DraftTree, LawBuffer


@contextlib.contextmanager
def _heap_frozen() -> Iterator[None]:
    """The objects that exist before a call kept out of the cyclic collector's walks for the call (``gc.freeze``):
    its rounds create many short-lived objects, and each full collection would walk the whole object graph of the
    loaded models and libraries (hundreds of thousands of objects, ~2 % of a step on the real model). Garbage the
    call makes is collected as usual, the rest afterwards. Nothing is frozen where the collector is off or the
    caller froze objects already (unfreezing would release theirs too)."""
    if not gc.isenabled() or gc.get_freeze_count():
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def _as_drafter(
    draft: Any, target: HFCausalLM, config: MethodConfig, *, hidden: bool = False, fast_path: str | bool = "auto"
) -> Drafter | None:
    if not config.spec.drafts:
        return None
    if config.spec.cascade:
        check_cascade(draft)  # here, not at the first round: "ngram" or a model would pass as_drafter
    if draft is None:
        raise ValueError(f"draft is required for method {config.method!r}: pass a draft model, a Drafter or 'ngram'")
    return as_drafter(draft, target, hidden=hidden, fast_path=fast_path)


class SpeculativeDecoder:
    """A target model, a drafter and a decoding method, reusable across ``generate`` calls.

    ``target``: HF causal LM of a family in ``specdec.models.SUPPORTED_MODEL_TYPES`` (sdpa or eager attention) or an
    ``HFCausalLM``.
    ``draft``: an HF model with the target's tokenizer (an output layer of another size drafts over the ids both
    have), any :class:`~specdec.drafters.Drafter`, the string
    ``"ngram"`` (Max-Gram prompt lookup), or None for ``method="ar"``. ``method`` defaults to ``"rsd_c"``, whose
    default ``branching="auto"`` chooses each round's tree for the machine (docs/methods.md). Method parameters: see
    :func:`specdec.methods.make_method` (``draft_length``, ``branching``, ``parents``, ``beam_width``,
    ``num_chains``, ``verifier``: "block" for block verification of ``sd``/``specdec_pp``/``csd`` chains,
    "traversal" for traversal verification of ``rrs``/``rrsw``/``rsd_c`` trees; each keeps at least as many tokens
    as token-level verification in expectation). ``head``/``threshold``: an acceptance head and its
    threshold h (default: the head's own ``threshold`` attribute, which :func:`specdec.drafters.load_head` sets to
    the tuned h; else 0.7) make the draft depth adaptive per row (required by ``method="specdec_pp"``, SpecDec++;
    with a tree method it stops growing the tree once the best path's predicted rejection risk exceeds h).
    ``fast_path``: ``"auto"`` runs the CPU fast path for the calls it takes, ``False`` leaves every module of the
    target and of a draft model passed here alone (:class:`~specdec.models.HFCausalLM`; an adapter or a Drafter
    passed in keeps its own). ``last_stats`` holds the statistics of the latest call.
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
        fast_path: str | bool = "auto",
        verifier: str | None = None,
    ) -> None:
        self.config: MethodConfig = make_method(
            method,
            draft_length=draft_length,
            branching=branching,
            parents=parents,
            beam_width=beam_width,
            num_chains=num_chains,
            verifier=verifier,
        )
        spec = self.config.spec
        if spec.needs_head and head is None:
            raise ValueError(
                f"method {method!r} needs head= (an acceptance head, e.g. specdec.train.load_head("
                "'smollm2-distill-head')[0], or any callable hidden [..., H] -> Phat)"
            )
        if head is not None and not spec.drafts:
            raise ValueError(f"head= (adaptive draft depth) needs a drafting method, got method {method!r}")
        if head is not None and self.config.verification == "traversal":
            raise ValueError(
                "verifier='traversal' needs a tree whose shape is fixed before drafting; head= grows it adaptively "
                "(use verifier='token' with head=)"
            )
        if threshold is not None and head is None:
            raise ValueError("threshold= is the acceptance head's stopping threshold h: pass head= too")
        if not isinstance(target, HFCausalLM):
            target = HFCausalLM(target, name="target", fast_path=fast_path)
        self.target = target
        if target.ranks is not None:
            check_replicated(draft)  # every rank runs the whole draft
        self.drafter = _as_drafter(draft, self.target, self.config, hidden=head is not None, fast_path=fast_path)
        self.builder = make_builder(self.config)
        if self.config.auto:
            assert self.builder is not None and self.drafter is not None
            self.builder.calibrate(self.target)
        self._laws = LawBuffer()  # reused by every round's verification (DraftTree.p_rows)
        if head is not None:
            assert self.builder is not None and isinstance(self.drafter, HiddenStateDrafter)
            reads = getattr(head, "hidden_size", None)
            width = int(getattr(self.drafter.lm.model.config, "hidden_size", -1))
            if reads is not None and int(reads) != width:
                raise ValueError(
                    f"head= reads hidden states of width {reads}, but the draft's are {width}: an acceptance head "
                    "only works with the draft it was trained on"
                )
            if threshold is None:
                threshold = getattr(head, "threshold", None)
            self.builder.stop_rule = AdaptiveStop(head, DEFAULT_THRESHOLD if threshold is None else threshold)
        self.last_stats: GenerationStats | None = None

    def generate(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        *,
        generation_config: Any | None = None,
        stopping_criteria: Any | None = None,
        streamer: Any | None = None,
        tokenizer: Any | None = None,
        seed: int | None = None,
        generator: torch.Generator | None = None,
        **kwargs: Any,
    ) -> GenerationOutput:
        """Generate as the target's ``generate`` would: exact in law when sampling, equal to the target's greedy
        decoding of the processed logits otherwise.

        Shape: input_ids [B, P] (or [P]), attention_mask [B, P] with 0 = padding (left padding as produced by HF
        tokenizers) -> GenerationOutput (sequences [B, P + T]).
        The settings are resolved by transformers exactly as ``model.generate`` resolves them: the model's
        ``generation_config``, then ``generation_config``, then ``kwargs`` (max_new_tokens, max_length,
        min_new_tokens, min_length, do_sample, temperature, top_k, top_p, min_p, repetition_penalty, eos_token_id,
        pad_token_id, stop_strings, max_time, ...), then transformers' defaults (greedy, 20 new tokens, top_k=50
        when sampling). A setting the driver does not implement raises ValueError naming it
        (:mod:`specdec.generation`). ``stop_strings`` needs ``tokenizer``; ``stopping_criteria`` (a list of
        transformers StoppingCriteria) are called after every new token with one row at a time; ``streamer``
        (TextStreamer, TextIteratorStreamer; batch size 1) receives the prompt, then each round's new tokens.
        ``seed`` (an int in [0, 2**63)) or ``generator`` make the run reproducible; with ``branching="auto"`` the
        trees follow the machine's timings, so a seeded sampled run reproduces its law, not its tokens.
        """
        model = self.target.model
        if not hasattr(model, "generate"):
            raise TypeError(f"the target ({type(model).__name__}) has no generate method to resolve settings with")
        prompt_rows(input_ids, attention_mask, self.target.vocab_size)  # clear errors before transformers sees them
        from transformers import StoppingCriteriaList, StopStringCriteria

        procs = kwargs.get("logits_processor")
        if procs:
            names = ", ".join(type(p).__name__ for p in procs)
            raise UnsupportedSettingError(
                f"logits_processor=[{names}] is not supported by speculative generation: the driver cannot know the "
                "law it gives each draft node (set the generation settings instead)"
            )
        criteria = list(stopping_criteria or [])
        # transformers drops the tokenizer before it calls a custom_generate callable, so it cannot build the
        # stop-string criterion itself: the criterion is built here, and transformers sees no stop strings (those of
        # the model's own generation_config are hidden for the call)
        stops = kwargs.pop("stop_strings", None)
        if generation_config is not None and getattr(generation_config, "stop_strings", None) is not None:
            generation_config = copy.deepcopy(generation_config)
            stops = stops if stops is not None else generation_config.stop_strings
            generation_config.stop_strings = None
        model_stops = getattr(model.generation_config, "stop_strings", None)
        stops = stops if stops is not None else model_stops
        if stops is not None:
            if tokenizer is None:
                raise ValueError("stop_strings needs tokenizer= (the target's tokenizer)")
            criteria.append(StopStringCriteria(tokenizer=tokenizer, stop_strings=stops))
        if input_ids.dim() == 1:
            input_ids = input_ids[None]
            attention_mask = None if attention_mask is None else attention_mask.reshape(1, -1)
        run = functools.partial(
            self._generate_prepared, seed=seed, generator=generator, streamer=streamer, put_prompt=True, as_dict=True
        )
        with hidden_stop_strings(model.generation_config if model_stops is not None else None):
            return model.generate(
                input_ids,
                attention_mask=attention_mask,
                generation_config=generation_config,
                stopping_criteria=StoppingCriteriaList(criteria) if criteria else None,
                custom_generate=run,
                **kwargs,
            )

    def custom_generate(
        self,
        model: Any,
        input_ids: torch.Tensor,
        logits_processor: Any = None,
        stopping_criteria: Any = None,
        generation_config: Any = None,
        *,
        seed: int | None = None,
        generator: torch.Generator | None = None,
        **model_kwargs: Any,
    ) -> Any:
        """transformers' ``custom_generate`` hook: ``target.generate(**inputs, custom_generate=decoder.custom_generate,
        ...)`` runs this decoder with the settings, processors and stopping criteria transformers prepared.
        Returns the sequences [B, P + T], or a :class:`GenerationOutput` with ``return_dict_in_generate=True``."""
        call = generate_call()
        if call.get("assistant_model") is not None:
            raise ValueError(
                "assistant_model= is not read by SpeculativeDecoder.custom_generate: the decoder has its draft "
                "(specdec.custom_generate takes the draft per call)"
            )
        return self._generate_prepared(
            model,
            input_ids,
            logits_processor,
            stopping_criteria,
            generation_config,
            seed=seed,
            generator=generator,
            streamer=call.get("streamer"),
            **model_kwargs,
        )

    def _generate_prepared(
        self,
        model: Any,
        input_ids: torch.Tensor,
        logits_processor: Any,
        stopping_criteria: Any,
        generation_config: Any,
        *,
        seed: int | None,
        generator: torch.Generator | None,
        streamer: Any,
        put_prompt: bool = False,
        as_dict: bool = False,
        **model_kwargs: Any,
    ) -> Any:
        """One run with what transformers' generate prepared. ``put_prompt``: the streamer has not seen the prompt
        (transformers sends it to the streamers it is given); ``as_dict``: always return a GenerationOutput."""
        if model is not self.target.model:
            raise ValueError("custom_generate: the model generate was called on is not this decoder's target")
        # the models as they are now: a hook, a replaced module, a cast or another attention since the decoder was
        # built changes what the adapter may run
        if self.target.refresh() and self.config.auto:
            assert self.builder is not None
            self.builder.calibrate(self.target)
        self.target.check_target()
        if self.drafter is not None:
            self.drafter.refresh()
        gc = generation_config
        if gc is None:
            raise ValueError("custom_generate needs the generation_config transformers prepares")
        check_config(gc, type(gc)()._get_default_generation_params())
        check_model_kwargs(model_kwargs)
        vocab = self.target.vocab_size
        eos = eos_list(gc.eos_token_id, vocab)
        width = int(input_ids.shape[1])
        check_processors(logits_processor, gc, eos, width)
        sampling = sampling_from_hf(gc, eos)
        max_new = int(gc.max_length) - width
        if max_new < 1:
            raise ValueError(f"max_length={gc.max_length} leaves no room after the prompt ({width} tokens)")
        pad = pad_id(gc, eos, vocab)
        if streamer is not None and input_ids.shape[0] != 1:
            raise ValueError(f"streamer= needs batch size 1, got {input_ids.shape[0]} rows")
        ranks = self.target.ranks
        if ranks is not None:
            if gc.max_time is not None:
                raise UnsupportedSettingError(
                    "max_time is not supported with a tensor-parallel target: each rank's clock would stop it at "
                    "another token (use max_new_tokens)"
                )
            seed = agree_call(ranks, input_ids, seed, generator, sampling.greedy)
        generator = run_generator(seed, generator, greedy=sampling.greedy)
        mask = model_kwargs.get("attention_mask")
        prompts = prompt_rows(input_ids, mask, vocab)
        # the last new token is never fed back: the longest sequence a forward sees is one shorter
        self.target.check_length(max(len(p) for p in prompts) + max_new - 1)
        rows = input_ids.cpu().tolist()
        out = RoundOutputs(rows, split_criteria(stopping_criteria, gc, eos), streamer, hold=not eos)
        if streamer is not None and put_prompt:
            streamer.put(input_ids.cpu())
        if sampling.needs_context:
            # transformers' repetition penalty skips each row's leading padding
            first = repetition_skip(logits_processor, len(rows))
            seen = [r[f:] for r, f in zip(rows, first, strict=True)] if sampling.repetition_penalty != 1.0 else None
            ctx = RunContext([width] * len(rows), seen, vocab, self.target.device)
            sampling = dataclasses.replace(sampling, context=ctx)
        with torch.inference_mode(), seed_block(generator), _heap_frozen():
            new_tokens, stats = self._run(prompts, sampling, max_new, eos, generator, out)
        out.end()
        self.last_stats = stats
        result = GenerationOutput(output_sequences(input_ids, new_tokens, pad), new_tokens, stats)
        return result if as_dict or gc.return_dict_in_generate else result.sequences

    def _run(
        self,
        prompts: list[list[int]],
        sampling: SamplingConfig,
        max_new: int,
        eos: list[int],
        generator: torch.Generator | None,
        out: RoundOutputs,
    ) -> tuple[list[list[int]], GenerationStats]:
        """The rounds of one call: catch the target's cache up, draft a tree, one target pass over it, verify, commit;
        rows leave the batch as they finish. Returns each row's new tokens and the call's statistics."""
        target, drafter, builder = self.target, self.drafter, self.builder
        stats = self._start_run(prompts)
        t_start = time.perf_counter()
        calls_before = drafter.calls if drafter is not None else 0
        eos_set = set(eos)
        committed = [list(p) for p in prompts]
        new_tokens: list[list[int]] = [[] for _ in prompts]
        active = list(range(len(prompts)))  # original row id of every row still in the batch
        state = target.new_state(len(prompts))
        check = target.ranks if target.ranks is not None and target.ranks.check else None
        while active:
            rows = [committed[r] for r in active]
            with stats.timer("prefill"):
                # the chain appended here (slots chain_at ..) is kept with the round's path (KVState.keep)
                chain_at, chain_len = state.length, self._catch_up(state, rows, stats)
            with stats.timer("draft"):
                tree = self._draft(rows, [out.cap(max_new) - len(new_tokens[r]) for r in active], sampling, generator)
            t_pass = time.perf_counter()
            with stats.timer("target"):
                q_logits = target.forward_tree(state, tree.tokens, tree.parent, tree.valid, tree.depth)
                stats.target_calls += 1
            root_slot = state.length - tree.size
            with stats.timer("verify"):
                verdict = verify_round(self.config, tree, q_logits, sampling, eos, generator, self._verify_tree)
                if builder is not None:
                    builder.observe(verdict[3], verdict[1], tree)
            with stats.timer("other"):
                acc_nodes, n_acc, _, _ = verdict
                finished = commit_round(
                    tree, verdict, q_logits, active, committed, new_tokens, max_new, eos_set, stats, out,
                    sampling.context,
                )  # fmt: skip
                if check is not None:
                    check_round(check, stats.target_calls, [new_tokens[r] for r in active], finished)
                # tree ids of [root, accepted nodes] (a padded tail past 1 + n_acc); F.pad also gives [B, 1] when
                # nothing was drafted (acc_nodes [B, 0])
                idx = F.pad(acc_nodes.clamp_min(0), (1, 0))
                # each row keeps them right after its committed tokens
                state.keep(torch.full_like(chain_len, chain_at), chain_len, root_slot + idx, 1 + n_acc)
                if drafter is not None:
                    # the root and the accepted nodes: the newly committed positions but the last
                    drafter.after_target(target, idx, n_acc + 1)
                    drafter.accept(tree, acc_nodes, n_acc)
                if builder is not None:
                    builder.observe_pass(tree.size * len(rows), time.perf_counter() - t_pass)
                active = self._drop_finished(active, finished, state, sampling.context)
        stats.draft_calls = (drafter.calls if drafter is not None else 0) - calls_before
        stats.new_tokens = sum(len(t) for t in new_tokens)
        stats.wall_time = time.perf_counter() - t_start
        return new_tokens, stats

    def _verify_tree(
        self,
        tree: DraftTree,
        q_logits: torch.Tensor,
        q_probs: torch.Tensor,
        eos: list[int],
        generator: torch.Generator | None,
    ) -> Verdict:
        """Sampling mode: the tree walk against the target's law ``q_probs`` [B, N, V] (a subclass may read the
        round's laws first, as specdec.train's labelling decoder does)."""
        return verify_sampled(self.config, self._laws, tree, q_logits, q_probs, eos, generator)

    def _start_run(self, prompts: list[list[int]]) -> GenerationStats:
        """Start the drafter and the builder on a new call; the call's empty statistics."""
        target, drafter, builder = self.target, self.drafter, self.builder
        if drafter is not None:
            drafter.start(prompts)
        if builder is not None:
            builder.start_call()
            if builder.stop_rule is not None:
                builder.stop_rule.round_lengths = []  # the diagnostics of this call's rounds only
        # the target keeps the extra hidden states the drafter reads (Drafter.feature_layers) only for this run
        target.feature_layers = tuple(drafter.feature_layers) if drafter is not None else ()
        return GenerationStats(
            method=self.config.describe(),
            batch_size=len(prompts),
            draft_depth=self.config.depth,
            target_params=target.num_parameters,
            draft_params=drafter.num_parameters if drafter is not None else 0,
        )

    def _catch_up(self, state: KVState, rows: list[list[int]], stats: GenerationStats) -> torch.Tensor:
        """Append to the target's cache each row's committed tokens it lacks but the last (the next root); returns
        how many each row appended, [B] int64."""
        target, drafter = self.target, self.drafter
        pending = [c[n:-1] for c, n in zip(rows, state.n_cached.tolist(), strict=True)]
        if not any(pending):
            return torch.zeros((len(rows),), dtype=torch.long, device=target.device)
        target.forward_chain(state, pending, last_logits=False)
        stats.prefill_calls += 1
        chain_len = torch.tensor([len(p) for p in pending], dtype=torch.long, device=target.device)
        if drafter is not None:
            drafter.after_target(target, None, chain_len)
        return chain_len

    def _draft(
        self, rows: list[list[int]], left: list[int], sampling: SamplingConfig, generator: torch.Generator | None
    ) -> DraftTree:
        """This round's tree below each row's last committed token; ``left``: each row's remaining budget."""
        roots = torch.tensor([c[-1] for c in rows], dtype=torch.long, device=self.target.device)
        if self.builder is None or self.drafter is None:
            return DraftTree.from_roots(roots)
        # a target whose rotary frequencies change past a length (check_length) must never see a node past a row's
        # own budget: the whole batch's tree then stops at the row closest to its end; a deeper tree than the
        # largest remaining budget could never be used
        room = min(left) if self.target.rope_limit is not None else max(left)
        return self.builder.build(self.drafter, roots, rows, sampling, generator, room - 1)

    def _drop_finished(
        self, active: list[int], finished: list[bool], state: KVState, context: RunContext | None
    ) -> list[int]:
        """The rows still running; the finished ones leave the cache, the drafter and the sampling context."""
        if not any(finished):
            return active
        keep = torch.tensor([i for i, f in enumerate(finished) if not f], dtype=torch.long, device=self.target.device)
        active = [r for r, f in zip(active, finished, strict=True) if not f]
        if active:
            state.select_rows(keep)
            if self.drafter is not None:
                self.drafter.select_rows(keep)
            if context is not None:
                context.select_rows(keep)
        return active
