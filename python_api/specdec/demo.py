"""The demo: the decoders against plain decoding (our AR and transformers' own generate, prompt lookup and assisted
generation) on the same prompts, taking turns batch by batch; a table of tokens/s, block efficiency and acceptance,
the auto trees' shapes, and how far each bf16 path's logits are from an fp32 forward. ``python -m specdec demo``
runs it (:mod:`specdec.cli` checks the flags first); ``benchmarks/bench_demo.py`` records it."""

from __future__ import annotations

import argparse
import csv
import functools
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch

from . import methods as registry
from .baselines import hf_generate, logit_error, sampling_kwargs
from .decoder import SpeculativeDecoder
from .distributed import count_collectives, init_from_env
from .harness import HYBRID_SUFFIX, draft_label, head_plan, load_target, make_draft
from .metrics import GenerationStats
from .models import DECODE_ROWS

#: one-token steps whose logits the demo compares with an fp32 forward (the numerics line)
NUMERICS_TOKENS = 16

#: the method parameters the demo's shared tree flags set (--draft-length, --branching, --beam-width, --num-chains);
#: a parameter without a flag (parents) keeps the method's default
TREE_FLAGS = ("draft_length", "branching", "beam_width", "num_chains")


def method_kwargs(method: str, args: argparse.Namespace) -> dict[str, Any]:
    """Tree parameters from the command line that apply to ``method`` (its spec's ``cli_params``), and --verifier
    where the method takes it."""
    takes = registry.get(method).cli_params
    out: dict[str, Any] = {}
    for name in TREE_FLAGS:
        value = getattr(args, name)
        if name in takes and value:
            if name == "branching":
                # "auto" goes to the methods whose spec can choose trees per round; the others keep their default
                if value == "auto":
                    if registry.get(method).auto_builder is not None:
                        out[name] = "auto"
                    continue
                value = tuple(int(x) for x in value.split(","))
            out[name] = value
    verifier = getattr(args, "verifier", "token")
    if verifier != "token" and verifier in registry.get(method).verifiers:
        out["verifier"] = verifier
    return out


def default_methods() -> list[str]:
    """The demo's methods by default: every registered one but the cascade methods, which draft with their own
    cascade (--cascade), not with --draft, and run only when named."""
    return [m for m in registry.available() if not registry.get(m).cascade]


def shape_shares(used: dict[tuple[int, ...], int]) -> str:
    """Rounds by tree shape of an auto-tree decoder, most used first: ``2,1 60 %, 1,1 30 %, plain 10 %`` (plain: a
    round that drafted nothing)."""
    total = sum(used.values())
    if not total:
        return "no rounds"
    ranked = sorted(used.items(), key=lambda kv: (-kv[1], kv[0]))
    return ", ".join(f"{','.join(map(str, s)) or 'plain'} {100 * n / total:.0f} %" for s, n in ranked)


def _num(x: float) -> str:
    return "-" if math.isnan(x) else f"{x:.2f}"


def format_table(rows: list[dict[str, Any]]) -> str:
    """Plain-text table of the demo results."""
    head = [
        "method",
        "tokens",
        "time s",
        "tok/s",
        "vs AR",
        "block eff",
        "acc/step",
        "P(acc>=d) d=1..4",
        "calls",
        "= AR",
    ]
    lines = [head]
    for r in rows:
        depth = " ".join(f"{a:.2f}" for a in r["acceptance_by_depth"][:4]) or "-"
        lines.append(
            [
                r["label"],
                str(r["new_tokens"]),
                f"{r['wall_time']:.1f}",
                f"{r['tokens_per_second']:.1f}",
                f"{r['speed_ratio']:.2f}x",
                _num(r["block_efficiency"]),
                _num(r["acceptance_rate"]) if r["target_calls"] else "-",
                depth,
                str(r["target_calls"] or "-"),
                r["same_as_ar"],
            ]
        )
    widths = [max(len(row[i]) for row in lines) for i in range(len(head))]
    text = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in lines]
    text.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(text)


class _Run:
    """What one demo run holds: the models, the prompts, the generate settings of both sides, the decoders and
    transformers' own runs, and where output lines go (stderr with --json: stdout carries the JSON document)."""

    def __init__(self, args: argparse.Namespace, texts: list[str]) -> None:
        from .smollm2 import chat_prompt

        self.args = args
        # under torchrun the target is sharded over the ranks (specdec.distributed); rank 0 alone speaks
        self.ranks = init_from_env()
        self.leader = not self.ranks or torch.distributed.get_rank() == 0
        say = functools.partial(print, file=sys.stderr if args.json else sys.stdout)
        self.say = say if self.leader else lambda *a, **k: None
        if self.ranks:
            world = torch.distributed.get_world_size()
            self.say(f"tensor parallel: the target sharded over {world} ranks ({torch.distributed.get_backend()})")
        if hasattr(os, "getloadavg"):  # timings on a loaded machine are slower and noisier: say how loaded it is
            self.say(f"load average before the run: {os.getloadavg()[0]:.2f} (1 min), {os.cpu_count()} CPUs")
        torch.set_num_threads(args.threads)
        self.dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
        t0 = time.perf_counter()
        self.target, self.tokenizer, model_name = load_target(args.model, self.dtype, sharded=self.ranks)
        self.draft = make_draft(args.draft, self.target, self.dtype, int8=args.draft_int8)
        label = draft_label(args.draft, args.draft_int8)
        self.say(f"loaded {model_name} ({args.dtype}) and draft {label!r} in {time.perf_counter() - t0:.1f}s")
        for line in getattr(args, "left_out", []):
            self.say(line)
        self.prompts = [chat_prompt(self.tokenizer, t) for t in texts]
        eos = self.tokenizer.eos_token_id
        # our decoders get the generate arguments transformers' generate gets (hf_generate builds the same ones)
        self.gen = {**sampling_kwargs(args.temperature, args.top_k, args.top_p), "eos_token_id": eos}
        self.gen["max_new_tokens"] = args.max_new_tokens
        self.hf_settings = dict(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, eos_token_id=eos)
        self.hf_settings["pad_token_id"] = self.tokenizer.pad_token_id or 0
        self.methods = [m.strip() for m in args.methods.split(",") if m.strip()]
        self.decoders = self._decoders()
        self.hf = self._hf_runs()

    def _decoders(self) -> dict[str, SpeculativeDecoder]:
        """A decoder per method: --draft, or the head methods' draft and head, or the cascade methods' cascade."""
        args, methods = self.args, self.methods
        extra: dict[str, dict[str, Any]] = {m: {} for m in methods}
        drafts = {m: self.draft for m in methods}
        head_methods = [m for m in methods if registry.get(m).needs_head]
        if head_methods:
            pp_name, head_name = head_plan(args)
            if pp_name != args.draft:  # the head reads the hidden states of the draft it was trained on
                pp_draft = make_draft(pp_name, self.target, self.dtype, int8=args.draft_int8)
                drafts.update({m: pp_draft for m in head_methods})
        cascade_methods = [m for m in methods if registry.get(m).cascade]
        if cascade_methods:
            from .drafters.assets import load_cascade

            try:
                cascade = load_cascade(args.cascade, self.target, dtype=self.dtype)
            except ValueError as err:  # e.g. a --model the shipped drafts were not trained for
                raise SystemExit(f"--cascade {args.cascade!r}: {err}") from err
            drafts.update({m: cascade for m in cascade_methods})
            self.say(f"{', '.join(cascade_methods)} drafts with the cascade {args.cascade!r}")
        if head_methods:
            from .drafters.networks.head import load_head

            head, h = load_head(head_name)
            threshold = h if args.threshold is None else args.threshold
            extra.update({m: {"head": head, "threshold": threshold} for m in head_methods})
            methods_text = ", ".join(head_methods)
            self.say(f"{methods_text} drafts with {pp_name!r}, acceptance head {head_name!r}, h = {threshold:g}")
        return {
            m: SpeculativeDecoder(self.target, drafts[m], method=m, **method_kwargs(m, args), **extra[m])
            for m in methods
        }

    def _hf_runs(self) -> dict[str, dict[str, Any]]:
        """transformers' own decoding on the same prompts: plain generate, and assisted generation with the plain
        draft (a feature draft is not an HF assistant model: the plain --hf-draft then; the n-gram draft: prompt
        lookup)."""
        args, draft = self.args, self.draft
        hf: dict[str, dict[str, Any]] = {}
        if args.no_hf:
            return hf
        hf["hf generate"] = {}
        if args.draft == "ngram" or args.draft.endswith(HYBRID_SUFFIX):
            hf["hf prompt lookup"] = {"prompt_lookup_num_tokens": 4}
        if args.draft != "ngram":
            plain = args.draft
            helper = draft
            if not isinstance(draft, torch.nn.Module) or getattr(draft, "reads_target_features", False):
                plain = args.hf_draft  # None: no plain draft fits the target (check_args said so)
                helper = None if plain is None else make_draft(plain, self.target, self.dtype)
            if helper is not None:
                hf[f"hf assisted ({plain})"] = {"assistant_model": helper}
        return hf

    def label(self, m: str) -> str:
        return m if m in self.hf else self.decoders[m].config.describe()

    def warm_up(self) -> dict[str, dict]:
        """The first forwards of a fresh process are slow (allocator, kernels): run them outside the timings.
        Returns the auto trees' shape counts of these rounds, left out of what the demo reports."""
        warm = torch.tensor([self.prompts[0][:16]])
        for dec in self.decoders.values():
            dec.generate(warm, **{**self.gen, "max_new_tokens": 2}, seed=0)
        for kw in self.hf.values():
            hf_generate(self.target, warm, torch.ones_like(warm), max_new_tokens=2, **self.hf_settings, seed=0, **kw)
        return {m: dict(getattr(d.builder, "shapes_used", {})) for m, d in self.decoders.items()}

    def timed(self) -> tuple[dict[str, GenerationStats], dict[str, list]]:
        """Every run on every batch, the runs taking turns on each batch in a rotating order, so that a drifting
        machine load (shared CPUs) spreads over all of them instead of favouring whichever ran last."""
        from tqdm.auto import tqdm

        args, prompts = self.args, self.prompts
        batches = [prompts[i : i + args.batch_size] for i in range(0, len(prompts), args.batch_size)]
        results: dict[str, GenerationStats] = {}
        runs = self.methods + list(self.hf)
        outputs: dict[str, list] = {m: [[] for _ in prompts] for m in runs}
        bar = tqdm(total=len(runs) * len(batches), desc="demo", unit="run", file=sys.stderr, disable=not self.leader)
        for bi, batch in enumerate(batches):
            ids, mask = self._left_padded(batch)
            for m in runs[bi % len(runs) :] + runs[: bi % len(runs)]:
                bar.set_postfix_str(f"{self.label(m)} batch {bi + 1}/{len(batches)}")
                if m in self.hf:
                    new, stats = hf_generate(
                        self.target, ids, mask, max_new_tokens=args.max_new_tokens, **self.hf_settings,
                        seed=args.seed + bi, label=m, **self.hf[m],
                    )  # fmt: skip
                else:
                    out = self.decoders[m].generate(ids, mask, seed=args.seed + bi, **self.gen)
                    new, stats = out.new_tokens, out.stats
                start = bi * args.batch_size
                outputs[m][start : start + len(batch)] = new
                if m in results:
                    results[m].merge(stats)
                else:
                    results[m] = stats
                bar.update(1)
        bar.close()
        return results, outputs

    def communication(self) -> dict[str, dict[str, float]]:
        """Under tensor parallelism: what each rank sends into collectives per decoding round of each of our decoders
        (calls and bytes: the target's own all-reduces and gathers, the driver's few broadcasts), from two untimed
        runs on the first batch: the whole run less a run of one round, which holds the prompt's forward (counting
        puts every op through Python)."""
        if not self.ranks:
            return {}
        ids, mask = self._left_padded(self.prompts[: self.args.batch_size])
        out = {}
        for m, dec in self.decoders.items():
            counts = []
            for new in (1, self.args.max_new_tokens):
                with count_collectives() as counter:
                    res = dec.generate(ids, mask, seed=self.args.seed, **{**self.gen, "max_new_tokens": new})
                counts.append((counter.calls, counter.bytes, res.stats.target_calls))
            (c1, b1, r1), (c2, b2, r2) = counts
            rounds = max(r2 - r1, 1)
            out[m] = {"calls_per_round": (c2 - c1) / rounds, "bytes_per_round": (b2 - b1) / rounds}
        self.say("\ncollectives per decoding round, per rank (the target's all-reduces and gathers, the driver's "
                 "broadcasts; the prompt's forward left out):")  # fmt: skip
        for m, c in out.items():
            label = self.decoders[m].config.describe()
            self.say(f"  {label:24s} {c['calls_per_round']:.0f} calls, {c['bytes_per_round'] / 1024:.1f} KiB")
        return out

    def _left_padded(self, batch: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        width = max(len(p) for p in batch)
        ids = torch.full((len(batch), width), self.tokenizer.pad_token_id or 0, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for b, p in enumerate(batch):
            ids[b, width - len(p) :] = torch.tensor(p)
            mask[b, width - len(p) :] = 1
        return ids, mask

    def rows(self, results: dict[str, GenerationStats], outputs: dict[str, list]) -> list[dict[str, Any]]:
        """One row per run: its statistics, label, speed against our AR and (greedy) outputs equal to AR's."""
        ar_rate = results["ar"].tokens_per_second if "ar" in results else None
        greedy = self.args.temperature == 0
        rows = []
        for m in outputs:
            s = results[m]
            row = s.as_dict()
            row["label"] = self.label(m)
            if m in self.hf and ("assistant_model" in self.hf[m] or "prompt_lookup_num_tokens" in self.hf[m]):
                row["block_efficiency"] = float("nan")  # transformers does not report its target calls
            row["speed_ratio"] = s.tokens_per_second / ar_rate if ar_rate else float("nan")
            if greedy and "ar" in outputs:
                same = sum(a == b for a, b in zip(outputs[m], outputs["ar"], strict=True))
                row["same_as_ar"] = f"{same}/{len(self.prompts)}"
            else:
                row["same_as_ar"] = "n/a"
            rows.append(row)
        return rows

    def report(self, rows: list[dict[str, Any]], warm_shapes: dict[str, dict]) -> None:
        """The table, the legend and the auto trees' shapes."""
        args, say = self.args, self.say
        say()
        say(
            f"{len(self.prompts)} prompts ({'HumanEval' if args.prompts is None else args.prompts}), "
            f"{args.max_new_tokens} new tokens max, {args.dtype}, draft {draft_label(args.draft, args.draft_int8)}, "
            f"{'greedy' if args.temperature == 0 else f'T={args.temperature}'}, batch {args.batch_size}, "
            f"{args.threads} threads"
        )
        say(format_table(rows))
        say(
            "block eff = tokens per target call; acc/step = share of verification steps (nodes with drafts) that "
            "accepted a draft; P(acc>=d) = share of rounds accepting at least d draft tokens; calls = target calls; "
            "= AR = prompts whose output equals AR's"
        )
        for m, dec in self.decoders.items():
            used = getattr(dec.builder, "shapes_used", None)
            if used is not None:
                timed = {s: n - warm_shapes[m].get(s, 0) for s, n in used.items() if n > warm_shapes[m].get(s, 0)}
                say(f"{dec.config.describe()} trees (children per level, share of rounds): {shape_shares(timed)}")

    def numerics(self, outputs: dict[str, list]) -> dict | None:
        """How far each bf16 path's next-token logits are from an fp32 forward, on the first prompt's steps."""
        if self.args.dtype != "bf16" or self.args.no_numerics:
            return None
        if self.ranks:
            self.say("\nnumerics: not measured with a tensor-parallel target (the fp32 model would load on every rank)")
            return None
        ref_tokens = outputs["ar" if "ar" in outputs else next(iter(outputs))][0][:NUMERICS_TOKENS]
        if len(ref_tokens) < 2:
            return None
        reference = load_target(self.args.model, torch.float32)[0]
        numerics = logit_error(self.target, reference, self.prompts[0], ref_tokens)
        del reference
        say = self.say
        say(f"\nnumerics: next-token logits of the first prompt's {len(ref_tokens)} steps against an fp32 forward")
        for path, e in numerics.items():
            say(
                f"  {path:16s} max |err| {e['max_abs']:.3f}  mean |err| {e['mean_abs']:.4f}  "
                f"argmax = fp32's at {100 * e['argmax_equal']:.0f} % of steps"
            )
        say(
            "  (specdec's decoders all run the adapter path; transformers' generate runs its own bf16 forward, "
            "so greedy outputs of the two can part after a near-tie)"
        )
        return numerics

    def notes(self, rows: list[dict[str, Any]]) -> None:
        """Runs slower than AR, and greedy rows of ours that part from AR (bf16 near-ties)."""
        slower = [r["label"] for r in rows if r["label"] != "ar" and r["speed_ratio"] < 1.0]
        if slower:
            self.say(f"\nslower than AR on this machine: {', '.join(slower)}")
        # transformers' rows differ by their own bf16 forward (the numerics above); ours only where a tree pass
        # rounds differently from one-token steps
        ours = [r for r in rows if r["label"] not in self.hf]
        n = len(self.prompts)
        if self.args.temperature == 0 and any(r["same_as_ar"] not in ("n/a", f"{n}/{n}") for r in ours):
            self.say(
                "note: in bf16, greedy outputs can differ from AR at near-ties of the top-2 logits (checked: a gap "
                "of one bf16 step) where tree and single-token forwards round differently: the adapter's routed "
                f"kernels make them equal on CPU sdpa models for trees of up to {DECODE_ROWS} nodes "
                "(docs/kernels.md), HF's attention does not; use --dtype fp32 to compare token for token"
            )


def run_demo(args: argparse.Namespace, texts: list[str]) -> list[dict[str, Any]]:
    """The demo on the checked flags (:func:`specdec.cli.check_args`) and prompt texts; returns its rows."""
    run = _Run(args, texts)
    warm_shapes = run.warm_up()
    results, outputs = run.timed()
    rows = run.rows(results, outputs)
    run.report(rows, warm_shapes)
    comm = run.communication()
    for r, m in zip(rows, outputs, strict=True):
        r.update(comm.get(m, {}))
    numerics = run.numerics(outputs)
    run.notes(rows)
    if args.show:
        for text, toks in zip(texts, outputs[run.methods[0]], strict=True):
            run.say("\n--- prompt ---\n" + text[-300:] + "\n--- output ---\n" + run.tokenizer.decode(toks))
    if args.csv and run.leader:
        append_csv(args.csv, rows)
    if args.json and run.leader:
        print(json_report(args, rows, numerics))
    return rows


def json_report(args: argparse.Namespace, rows: list[dict[str, Any]], numerics: dict | None = None) -> str:
    """The demo's settings and rows as one JSON document (non-finite numbers as null)."""

    def clean(x: Any) -> Any:
        if isinstance(x, float) and not math.isfinite(x):
            return None
        if isinstance(x, dict):
            return {k: clean(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return [clean(v) for v in x]
        return x

    settings = {k: v for k, v in vars(args).items() if k not in ("check", "command")}
    return json.dumps(clean({"settings": settings, "rows": rows, "numerics": numerics}), allow_nan=False)


CSV_KEYS = ["label", "new_tokens", "wall_time", "tokens_per_second", "speed_ratio", "block_efficiency"]
CSV_KEYS += ["acceptance_rate", "target_calls", "mbsu"]


def append_csv(path: str, rows: list[dict[str, Any]]) -> None:
    """Append the demo's rows to ``path`` (a header first when the file is new), quoted by the csv module: labels
    such as ``rsd_c(b=2,1)`` hold commas."""
    new = not Path(path).exists()
    with open(path, "a", encoding="utf-8", newline="") as fh:
        writer = csv.writer(fh)
        if new:
            writer.writerow(CSV_KEYS)
        for r in rows:
            writer.writerow([r[k] for k in CSV_KEYS])
