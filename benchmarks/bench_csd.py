"""Cascade Speculative Drafting on SmolLM2-135M-Instruct: the table of the CS Drafting paper (Chen et al., arXiv
2312.11462), measured on this machine, with zero-shot chain-of-thought GSM8K test questions and HumanEval problems.

Rows, per prompt set (neural drafters given by ``--drafters``, largest first):

* ``AR``: the target alone (method ``ar``);
* ``SD <drafter>``: speculative decoding with one neural drafter drafting k tokens (method ``sd``);
* ``SD MaG``: speculative decoding with the Max-Gram drafter alone (``NGramDrafter`` with the bigram table);
* ``CSD <drafter>+MaG``: a two-level cascade (method ``csd``): the drafter reviews one Max-Gram proposal per
  forward, the target reviews blocks of at least k11 tokens, K = [[k11, 0], [0, 1]], leniency lm of the drafter's
  reviews from ``--mag-leniency-grid``;
* ``CSD full``: every neural drafter and Max-Gram, with the paper's hyper-parameters (k11, k21, k12, l): the target's
  block takes the largest drafter's sub-cascade up to k11 tokens, then the next sub-cascade's output up to k12
  (K[0][0] = k11, K[0][1] = k12 - k11); every middle drafter reviews k21 tokens of the one below it; the smallest
  reviews one Max-Gram proposal; leniency l at every inner review except the smallest drafter's, which has its own,
  lm (default 1). Max-Gram proposes point masses (p(x) = 1), so a greedy review of them with leniency lm keeps x iff
  x is the reviewer's argmax or q(x) > 1 / lm: the same as lm = 1 up to lm = 2, more tokens beyond. With one neural
  drafter this is its cascade with a horizontal Max-Gram tail up to k12 (k21 and l have no place).

Every cascade row cuts the target's block at ``--csd-cap`` tokens: a sub-cascade returns its accepted tokens plus one
of its own, so blocks overshoot their quota, and on a CPU a verification pass costs more with every row.

Search: each row's setting (k, k11 and lm, or the (k11, k21, k12, l[, lm]) tuples of ``--cascade-grid``) is chosen on
the first ``--tune-prompts`` prompts of the set, which are not measured: every candidate runs on each of them, taking
turns in an order rotated per prompt, and the best by ``--select`` wins (ties to the earlier candidate). The table then
measures AR and the chosen settings on the next ``--prompts`` prompts, again taking turns in a rotated order so that
a drifting machine load hits every row alike. ``--temperature T`` adds rows sampled at T for AR, the fastest SD row
and the full cascade, at the settings chosen greedily.

Columns:

* tokens/s: generated tokens over the time of the ``generate`` calls (``--clock wall``, or ``cpu`` = process CPU
  time, which leaves out waiting for a core on a loaded machine; use it with one thread), and its ratio to AR in the
  same pass;
* block efficiency: tokens emitted per target forward (accepted drafts + 1 per round; AR = 1);
* SWI, the standardized walltime improvement of the paper: n / (F_t + sum_i c_i F_i), where n counts generated
  tokens, F_t the target's decoding forwards (the forward that reads the prompt is not counted, so AR scores exactly
  1), F_i every forward of neural drafter i (its reviews and the forwards that catch it up on tokens it has not
  seen, its prompt included), and c_i the drafter's cost relative to one target forward; Max-Gram costs 0. Every
  forward is charged alike whatever the number of tokens it processes, so on a CPU, where a review of ten tokens
  costs more than a one-token step, SWI flatters long reviews; tokens/s is the measured truth.
  - SWI-MS (model size): c_i = parameters of drafter i / parameters of the target (as counted for MBSU's r);
  - SWI-PW (the paper's "previous work" walltime setting): c_i = measured time of a one-token cached forward of
    drafter i over the same for the target, both through the decoders' adapter, interleaved, median of
    ``--cost-reps``; measured in the run, once, on the context of the first search prompt;
* = AR (greedy rows): prompts whose output equals AR's token for token (every method decodes the target's greedy
  path, so anything but all of them is a bug or a bf16 near-tie).

Output: rows appended to ``benchmarks/results/csd.csv`` (with machine, CPU flags, torch, commit, threads, clock and
the load average before and after the run), the Markdown table ``csd.md`` and the plot ``csd.png`` next to it,
rendered from the CSV by ``benchmarks/report.py`` (block ``csd`` of docs/benchmarks.md).

    python benchmarks/bench_csd.py --prompts 10 --tune-prompts 3 --tokens 128 --temperature 0.7 \\
        --drafters smollm2-distill --gsm8k $SPECDEC_DATA_DIR/gsm8k_test.jsonl
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import specdec
import torch
from _timing import append_csv, run_meta
from specdec.baselines import sampling_kwargs
from specdec.drafters import CascadeDrafter, NGramDrafter, load_bigram
from specdec.harness import load_prompts
from specdec.models import HFCausalLM, int8_weights
from specdec.smollm2 import chat_prompt, load_smollm2
from tqdm import tqdm

RESULTS = Path(__file__).resolve().parent / "results"
CSV = RESULTS / "csd.csv"
#: the zero-shot chain-of-thought cue after each GSM8K question
COT = "Let's think step by step."
SELECT = ("tok_s", "swi_pw", "swi_ms")
FIELDS = [
    "time", "machine", "cpu_flags", "cpu_isa", "torch", "git", "threads", "clock", "dtype", "load_before",
    "load_after", "dataset", "prompts", "tune_prompts", "tokens", "temperature", "select", "row", "method",
    "setting", "steps", "leniency", "drafters", "tok_s", "ratio_vs_ar", "block_eff", "swi_ms", "swi_pw",
    "new_tokens", "target_forwards", "drafter_forwards", "c_ms", "c_pw", "equal_ar", "draft_weights",
]  # fmt: skip


# --------------------------------------------------------------------------------------------------- configurations


@dataclass(frozen=True)
class Config:
    """One decoder of the table: ``row`` names its family (the table's row), ``setting`` its searched parameters."""

    row: str
    setting: str
    method: str
    drafters: tuple[str, ...] = ()  # neural drafters, largest first (SD: the one drafter)
    k: int = 0  # SD draft length; csd: the cap on the target's block (0: the method's default, 24)
    steps: tuple[tuple[int, ...], ...] = ()  # csd: the step-limit matrix K
    leniency: tuple[float, ...] = ()  # csd: one per neural drafter


AR = Config("AR", "", "ar")


def cascade_steps(n_neural: int, k11: int, k21: int = 1, k12: int | None = None) -> list[list[int]]:
    """The step-limit matrix K of a cascade of ``n_neural`` >= 1 neural drafters above Max-Gram, from the paper's
    hyper-parameters: K[0][0] = k11, K[0][1] = k12 - k11 (none when k12 is None or <= k11), K[r][r] = k21 for the
    middle drafters r = 1 .. n_neural - 1, and one Max-Gram proposal (K[n][n] = 1) per review of the smallest."""
    if n_neural < 1 or min(k11, k21) < 1:
        raise ValueError(f"need n_neural >= 1, k11 >= 1 and k21 >= 1, got {n_neural}, {k11}, {k21}")
    size = n_neural + 1
    steps = [[0] * size for _ in range(size)]
    steps[0][0] = k11
    if k12 is not None and k12 > k11:
        steps[0][1] = k12 - k11
    for r in range(1, n_neural):
        steps[r][r] = k21
    steps[n_neural][n_neural] = 1
    return steps


def cascade_leniency(n_neural: int, leniency: float, mag_leniency: float = 1.0) -> list[float]:
    """``leniency`` at every inner review except the smallest drafter's, which reviews Max-Gram's point masses with
    ``mag_leniency``."""
    return [float(leniency)] * (n_neural - 1) + [float(mag_leniency)]


def sd_configs(drafter: str | None, grid: Sequence[int]) -> list[Config]:
    """SD with one neural drafter (None: Max-Gram) at each draft length k of ``grid``."""
    row = f"SD {drafter or 'MaG'}"
    return [Config(row, f"k={k}", "sd", (drafter,) if drafter else (), k=k) for k in grid]


def csd_configs(drafter: str, grid: Sequence[int], lenient: Sequence[float] = (1.0,), cap: int = 0) -> list[Config]:
    """The two-level cascade ``drafter`` + Max-Gram at each k11 of ``grid`` and leniency of ``lenient``; ``cap``: the
    target's block cap (0: the method's default)."""
    return [
        Config(
            f"CSD {drafter}+MaG",
            f"k11={k}" + (f" lm={lm:g}" if lm != 1 else ""),
            "csd",
            (drafter,),
            k=cap,
            steps=_frozen(cascade_steps(1, k)),
            leniency=(float(lm),),
        )
        for k in grid
        for lm in lenient
    ]


def full_configs(drafters: Sequence[str], grid: Sequence[tuple[float, ...]], cap: int = 0) -> list[Config]:
    """The full cascade at each (k11, k21, k12, l[, lm]) of ``grid`` (lm: 1 if left out); with one neural drafter
    k21 and l drop out and tuples that then coincide are tried once. ``cap``: the target's block cap (0: the
    method's default)."""
    n = len(drafters)
    out: dict[str, Config] = {}
    for k11, k21, k12, lenience, *rest in grid:
        mag_lenience = rest[0] if rest else 1.0
        if n == 1:
            setting = f"k11={k11} k12={max(k12, k11)}"
            k21, lenience = 1, 1.0
        else:
            setting = f"k11={k11} k21={k21} k12={max(k12, k11)} l={lenience:g}"
        if mag_lenience != 1:
            setting += f" lm={mag_lenience:g}"
        steps = _frozen(cascade_steps(n, k11, k21, k12))
        lens = tuple(cascade_leniency(n, lenience, mag_lenience))
        out.setdefault(setting, Config("CSD full", setting, "csd", tuple(drafters), k=cap, steps=steps, leniency=lens))
    return list(out.values())


def _frozen(steps: list[list[int]]) -> tuple[tuple[int, ...], ...]:
    return tuple(tuple(r) for r in steps)


def parse_ints(text: str, name: str) -> list[int]:
    try:
        vals = [int(x) for x in text.split(",") if x.strip()]
    except ValueError as err:
        raise SystemExit(f"{name} must be comma-separated ints, got {text!r}") from err
    if not vals or min(vals) < 1:
        raise SystemExit(f"{name} must hold ints >= 1, got {text!r}")
    return vals


def parse_cascade_grid(text: str) -> list[tuple[int, int, int, float, float]]:
    """``"k11,k21,k12,l[,lm];..."`` -> [(k11, k21, k12, l, lm), ...] (lm, the smallest drafter's leniency: 1 if
    left out)."""
    out = []
    for item in (s for s in text.split(";") if s.strip()):
        parts = item.split(",")
        try:
            if len(parts) not in (4, 5):
                raise ValueError
            k11, k21, k12, lenience = int(parts[0]), int(parts[1]), int(parts[2]), float(parts[3])
            mag_lenience = float(parts[4]) if len(parts) == 5 else 1.0
        except ValueError as err:
            raise SystemExit(f"--cascade-grid entries are k11,k21,k12,l[,lm] separated by ';', got {item!r}") from err
        if min(k11, k21, k12) < 1 or min(lenience, mag_lenience) < 1:
            raise SystemExit(f"--cascade-grid needs k11, k21, k12 >= 1 and l, lm >= 1, got {item!r}")
        out.append((k11, k21, k12, lenience, mag_lenience))
    if not out:
        raise SystemExit("--cascade-grid is empty")
    return out


# --------------------------------------------------------------------------------------------------- metrics


def swi(tokens: int, target_forwards: int, drafter_forwards: Sequence[int], costs: Sequence[float]) -> float:
    """Standardized walltime improvement n / (F_t + sum_i c_i F_i) (Max-Gram, absent here, costs 0)."""
    if len(drafter_forwards) != len(costs):
        raise ValueError(f"one cost per drafter: {len(drafter_forwards)} forward counts, {len(costs)} costs")
    denom = target_forwards + sum(f * c for f, c in zip(drafter_forwards, costs, strict=True))
    return tokens / denom if denom > 0 else float("nan")


@dataclass
class Tally:
    """One configuration's counters over the prompts of a pass."""

    tokens: int = 0
    seconds: float = 0.0
    target_forwards: int = 0
    emitted: int = 0
    row_rounds: int = 0
    drafter_forwards: list[int] = field(default_factory=list)
    equal: int = 0
    compared: int = 0

    def add(self, tokens: int, seconds: float, stats: Any, drafter_forwards: Sequence[int]) -> None:
        self.tokens += tokens
        self.seconds += seconds
        self.target_forwards += stats.target_calls
        self.emitted += stats.emitted
        self.row_rounds += stats.row_rounds
        if not self.drafter_forwards:
            self.drafter_forwards = [0] * len(drafter_forwards)
        self.drafter_forwards = [a + b for a, b in zip(self.drafter_forwards, drafter_forwards, strict=True)]

    @property
    def tok_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else float("nan")

    @property
    def block_eff(self) -> float:
        return self.emitted / self.row_rounds if self.row_rounds else float("nan")

    def swi(self, costs: Sequence[float]) -> float:
        return swi(self.tokens, self.target_forwards, self.drafter_forwards, costs)


def score(tally: Tally, select: str, costs: dict[str, Sequence[float]]) -> float:
    """The search criterion: measured tokens/s, or SWI with the costs of that setting (``costs[select]``)."""
    return tally.tok_s if select == "tok_s" else tally.swi(costs[select])


def pick_best(candidates: Sequence[Any], scores: Sequence[float]) -> Any:
    """The candidate of the highest score (NaN never wins); ties go to the earlier candidate."""
    if not candidates or len(candidates) != len(scores):
        raise ValueError(f"need one score per candidate, got {len(candidates)} candidates and {len(scores)} scores")
    best = 0
    for i, s in enumerate(scores):
        if s == s and (scores[best] != scores[best] or s > scores[best]):
            best = i
    return candidates[best]


def csv_row(
    run: dict[str, Any],
    cfg: Config,
    tally: Tally,
    ar: Tally,
    c_ms: dict[str, float],
    c_pw: dict[str, float],
    greedy: bool,
) -> dict[str, Any]:
    """One CSV row: the run's columns (``run``) and this configuration's measures."""
    ms, pw = [c_ms[d] for d in cfg.drafters], [c_pw[d] for d in cfg.drafters]
    return {
        **run,
        "row": cfg.row,
        "method": cfg.method,
        "setting": cfg.setting,
        "steps": json.dumps([list(r) for r in cfg.steps]) if cfg.steps else "",
        "leniency": ";".join(f"{x:g}" for x in cfg.leniency),
        "drafters": ";".join(cfg.drafters),
        "tok_s": round(tally.tok_s, 3),
        "ratio_vs_ar": round(tally.tok_s / ar.tok_s, 4),
        "block_eff": round(tally.block_eff, 4),
        "swi_ms": round(tally.swi(ms), 4),
        "swi_pw": round(tally.swi(pw), 4),
        "new_tokens": tally.tokens,
        "target_forwards": tally.target_forwards,
        "drafter_forwards": ";".join(map(str, tally.drafter_forwards)),
        "c_ms": ";".join(f"{c:.4g}" for c in ms),
        "c_pw": ";".join(f"{c:.4g}" for c in pw),
        "equal_ar": f"{tally.equal}/{tally.compared}" if greedy else "",
    }


# --------------------------------------------------------------------------------------------------- running


class Bench:
    """The models, one decoder per configuration (built once, reused on every prompt) and the run's settings."""

    def __init__(self, target: Any, drafts: dict[str, Any], bigram: Any, args: argparse.Namespace) -> None:
        self.target, self.drafts, self.bigram, self.args = target, drafts, bigram, args
        self.clock: Callable[[], float] = time.process_time if args.clock == "cpu" else time.perf_counter
        self.decoders: dict[Config, specdec.SpeculativeDecoder] = {}

    def decoder(self, cfg: Config) -> specdec.SpeculativeDecoder:
        if cfg not in self.decoders:
            if cfg.method == "ar":
                draft: Any = None
                params: dict[str, Any] = {}
            elif cfg.method == "sd":
                vocab = int(self.target.config.vocab_size)
                draft = (
                    self.drafts[cfg.drafters[0]]
                    if cfg.drafters
                    else NGramDrafter(vocab, max_tokens=cfg.k, bigram=self.bigram)
                )
                params = {"draft_length": cfg.k}
            else:
                draft = CascadeDrafter(
                    [self.drafts[d] for d in cfg.drafters],
                    bigram=self.bigram,
                    steps=[list(r) for r in cfg.steps],
                    leniency=list(cfg.leniency),
                    mag_tokens=self.args.mag_tokens,
                )
                params = {"draft_length": cfg.k} if cfg.k else {}
            self.decoders[cfg] = specdec.SpeculativeDecoder(self.target, draft, method=cfg.method, **params)
        return self.decoders[cfg]

    def run(
        self, cfg: Config, ids: torch.Tensor, temperature: float, seed: int
    ) -> tuple[list[int], float, Any, list[int]]:
        """One generate call: (new tokens, seconds, stats, forwards of each neural drafter of ``cfg``)."""
        dec = self.decoder(cfg)
        casc = dec.drafter if isinstance(dec.drafter, CascadeDrafter) else None
        before = list(casc.forwards) if casc else []
        kw = sampling_kwargs(temperature, 0, 1.0)
        t0 = self.clock()
        out = dec.generate(ids, max_new_tokens=self.args.tokens, eos_token_id=self.args.eos, seed=seed, **kw)
        seconds = self.clock() - t0
        st = out.stats
        if casc is not None:
            fwd = [a - b for a, b in zip(casc.forwards, before, strict=True)]
        else:
            fwd = [st.draft_calls] if cfg.drafters else []
        return out.new_tokens[0], seconds, st, fwd

    def measure(
        self, configs: list[Config], prompts: list[torch.Tensor], temperature: float, desc: str
    ) -> dict[Config, Tally]:
        """Every configuration on every prompt, in an order rotated per prompt; greedy passes that include AR count
        the prompts on which each configuration's output equals AR's."""
        tallies = {c: Tally() for c in configs}
        compare = temperature == 0 and AR in tallies
        with torch.inference_mode():
            for i, ids in enumerate(tqdm(prompts, desc=desc, leave=False)):
                shift = i % len(configs)
                outputs = {}
                for cfg in configs[shift:] + configs[:shift]:
                    toks, sec, st, fwd = self.run(cfg, ids, temperature, seed=i)
                    tallies[cfg].add(len(toks), sec, st, fwd)
                    outputs[cfg] = toks
                if compare:
                    for cfg, toks in outputs.items():
                        tallies[cfg].compared += 1
                        tallies[cfg].equal += int(toks == outputs[AR])
        return tallies


def step_costs(
    lms: dict[str, HFCausalLM], context: list[int], reps: int, clock: Callable[[], float]
) -> dict[str, float]:
    """Median time of a one-token cached forward of each model (the decoders' adapter, a verification pass of one
    node), measured interleaved so that load changes touch all alike. Returns seconds per model name."""
    states = {}
    with torch.inference_mode():
        for name, lm in lms.items():
            st = lm.new_state(1)
            lm.forward_chain(st, [context[:-1]], last_logits=False)
            states[name] = st
        tok = torch.tensor([[context[-1]]])
        times: dict[str, list[float]] = {name: [] for name in lms}
        for rep in range(reps + 1):
            for name, lm in lms.items():
                t0 = clock()
                lm.probe_chain(states[name], tok.to(lm.device))
                if rep:  # the first pass warms up
                    times[name].append(clock() - t0)
    return {name: statistics.median(ts) for name, ts in times.items()}


def load_sets(args: argparse.Namespace, tok: Any) -> dict[str, list[torch.Tensor]]:
    """Prompt token ids per set: the first ``tune_prompts`` for the search, then ``prompts`` to measure."""
    need = args.tune_prompts + args.prompts
    sets: dict[str, list[torch.Tensor]] = {}
    for name in args.sets:
        if name == "gsm8k":
            path = args.gsm8k or (
                os.path.join(os.environ["SPECDEC_DATA_DIR"], "gsm8k_test.jsonl")
                if os.environ.get("SPECDEC_DATA_DIR")
                else None
            )
            if path is None:
                raise SystemExit("--gsm8k PATH (a JSONL of GSM8K test questions) or $SPECDEC_DATA_DIR is needed")
            texts = [f"{q}\n{COT}" for q in load_prompts(path, need)]
        else:
            texts = load_prompts(None, need)
        if len(texts) < need:
            raise SystemExit(f"{name}: {len(texts)} prompts, need {need} (--tune-prompts + --prompts)")
        sets[name] = [torch.tensor([chat_prompt(tok, t)]) for t in texts]
    return sets


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sets", default="gsm8k,humaneval", help="prompt sets: gsm8k, humaneval")
    ap.add_argument("--gsm8k", default=None, help="GSM8K test JSONL (default $SPECDEC_DATA_DIR/gsm8k_test.jsonl)")
    ap.add_argument("--prompts", type=int, default=10, help="measured prompts per set")
    ap.add_argument("--tune-prompts", type=int, default=3, help="prompts per set for the search (not measured)")
    ap.add_argument("--tokens", type=int, default=128, help="new tokens per prompt (fewer at EOS)")
    ap.add_argument("--drafters", default="smollm2-distill", help="neural draft assets, largest first")
    ap.add_argument(
        "--draft-int8",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="the neural drafters with int8 weights (specdec.int8_weights), as the demo loads drafts",
    )
    ap.add_argument("--bigram", default="smollm2-bigram", help="Max-Gram's bigram table (asset or .npz)")
    ap.add_argument("--mag-tokens", type=int, default=10, help="tokens per Max-Gram proposal in the cascades")
    ap.add_argument("--k-grid", default="1,2,3,4,6,8", help="SD draft lengths k and cascade k11 to search")
    ap.add_argument(
        "--cascade-grid",
        default="2,1,4,1;3,1,6,1;4,1,8,1;2,1,4,1,8;3,1,6,1,8;4,2,8,2,8",
        help="full-cascade (k11,k21,k12,l[,lm]) tuples to search, ';'-separated",
    )
    ap.add_argument(
        "--mag-leniency-grid", default="1,8", help="leniencies lm of the drafter's reviews in CSD <drafter>+MaG"
    )
    ap.add_argument("--csd-cap", type=int, default=8, help="cap on the target's block in cascade rows (0: 24)")
    ap.add_argument("--select", choices=SELECT, default="tok_s", help="search criterion")
    ap.add_argument("--temperature", type=float, default=0.0, help="> 0: add rows sampled at this temperature")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall", help="cpu: process CPU time (1 thread)")
    ap.add_argument("--dtype", choices=("bf16", "fp32"), default="bf16")
    ap.add_argument("--cost-reps", type=int, default=30, help="one-token forwards per model for the costs c_i")
    ap.add_argument("--no-eos", action="store_true", help="always generate --tokens tokens")
    ap.add_argument("--no-csv", action="store_true", help="print only")
    args = ap.parse_args()
    args.sets = [s for s in args.sets.split(",") if s]
    if not args.sets or set(args.sets) - {"gsm8k", "humaneval"}:
        raise SystemExit(f"--sets must name gsm8k and/or humaneval, got {args.sets}")
    args.drafters = [d for d in args.drafters.split(",") if d]
    if not args.drafters:
        raise SystemExit("--drafters needs at least one neural draft asset")
    args.k_grid = parse_ints(args.k_grid, "--k-grid")
    args.cascade_grid = parse_cascade_grid(args.cascade_grid)
    try:
        args.mag_leniency_grid = [float(x) for x in args.mag_leniency_grid.split(",") if x.strip()]
    except ValueError as err:
        raise SystemExit(f"--mag-leniency-grid takes comma-separated numbers, got {args.mag_leniency_grid!r}") from err
    if not args.mag_leniency_grid or min(args.mag_leniency_grid) < 1:
        raise SystemExit(f"--mag-leniency-grid needs numbers >= 1, got {args.mag_leniency_grid}")
    if args.csd_cap < 0:
        raise SystemExit(f"--csd-cap must be >= 0, got {args.csd_cap}")
    if args.prompts < 1 or args.tune_prompts < 1 or args.tokens < 1:
        raise SystemExit("--prompts, --tune-prompts and --tokens must be >= 1")
    return args


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    load_before = os.getloadavg()
    print(f"load average before the run: {load_before[0]:.2f} {load_before[1]:.2f} {load_before[2]:.2f}")
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    target, tok = load_smollm2(dtype)
    args.eos = None if args.no_eos else tok.eos_token_id
    from specdec.drafters import load_draft

    drafts = {d: load_draft(d, target, dtype=dtype) for d in args.drafters}
    if args.draft_int8:
        drafts = {d: int8_weights(m) for d, m in drafts.items()}
    for d, m in drafts.items():
        if getattr(m, "reads_target_features", False):
            raise SystemExit(f"--drafters: {d} is a feature draft; a cascade level must review a block in one forward")
    bench = Bench(target, drafts, load_bigram(args.bigram), args)
    sets = load_sets(args, tok)

    lms = {"target": HFCausalLM(target, name="target")} | {d: HFCausalLM(m, name=d) for d, m in drafts.items()}
    first = next(iter(sets.values()))[0][0].tolist()
    secs = step_costs(lms, first, args.cost_reps, bench.clock)
    c_pw = {d: secs[d] / secs["target"] for d in drafts}
    c_ms = {d: lms[d].num_parameters / lms["target"].num_parameters for d in drafts}
    costs = {"swi_pw": c_pw, "swi_ms": c_ms}
    print(f"target one-token forward {1e3 * secs['target']:.2f} ms; costs c_i (PW measured, MS parameters):")
    for d in drafts:
        print(f"  {d}: PW {c_pw[d]:.4f}, MS {c_ms[d]:.4f}")

    families = [sd_configs(d, args.k_grid) for d in args.drafters] + [sd_configs(None, args.k_grid)]
    families += [csd_configs(d, args.k_grid, args.mag_leniency_grid, args.csd_cap) for d in args.drafters]
    families.append(full_configs(args.drafters, args.cascade_grid, args.csd_cap))

    def cfg_costs(cfg: Config) -> dict[str, list[float]]:
        return {k: [v[d] for d in cfg.drafters] for k, v in costs.items()}

    stamp = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    meta = run_meta()
    results: list[tuple[dict[str, Any], Config, Tally, Tally, bool]] = []
    for name, prompts in sets.items():
        tune, measured = prompts[: args.tune_prompts], prompts[args.tune_prompts :]
        tallies = bench.measure([c for fam in families for c in fam], tune, 0.0, f"{name}: search")
        chosen = [AR]
        for fam in families:
            best = pick_best(fam, [score(tallies[c], args.select, cfg_costs(c)) for c in fam])
            chosen.append(best)
            print(f"{name}: {best.row} -> {best.setting} (" + ", ".join(
                f"{c.setting}: {score(tallies[c], args.select, cfg_costs(c)):.3g}" for c in fam) + ")")  # fmt: skip
        base = {"dataset": name, "temperature": 0.0}
        greedy = bench.measure(chosen, measured, 0.0, f"{name}: greedy")
        results += [(base, c, greedy[c], greedy[AR], True) for c in chosen]
        if args.temperature > 0:
            sd_rows = [c for c in chosen if c.method == "sd"]
            fastest = max(sd_rows, key=lambda c: greedy[c].tok_s)
            full = chosen[-1]
            sampled = bench.measure([AR, fastest, full], measured, args.temperature, f"{name}: T={args.temperature}")
            base_t = {"dataset": name, "temperature": args.temperature}
            results += [(base_t, c, sampled[c], sampled[AR], False) for c in (AR, fastest, full)]

    load_after = os.getloadavg()
    run = {
        "time": stamp, "machine": meta["machine"], "cpu_flags": meta["cpu_flags"], "cpu_isa": meta["cpu_isa"],
        "torch": meta["torch"], "git": meta["git_rev"], "threads": args.threads, "clock": args.clock,
        "dtype": args.dtype, "load_before": f"{load_before[0]:.2f}", "load_after": f"{load_after[0]:.2f}",
        "prompts": args.prompts, "tune_prompts": args.tune_prompts, "tokens": args.tokens, "select": args.select,
        "draft_weights": "int8" if args.draft_int8 else args.dtype,
    }  # fmt: skip
    rows = [csv_row({**run, **base}, c, t, ar, c_ms, c_pw, g) for base, c, t, ar, g in results]
    print(f"\n{'set':10s} {'T':>4s} {'row':34s} {'setting':24s} {'tok/s':>7s} {'vs AR':>6s} {'blk eff':>7s} "
          f"{'SWI-MS':>7s} {'SWI-PW':>7s} {'= AR':>5s}")  # fmt: skip
    for r in rows:
        print(f"{r['dataset']:10s} {r['temperature']:4g} {r['row']:34s} {r['setting']:24s} {r['tok_s']:7.2f} "
              f"{r['ratio_vs_ar']:5.2f}x {r['block_eff']:7.2f} {r['swi_ms']:7.2f} {r['swi_pw']:7.2f} "
              f"{r['equal_ar']:>5s}")  # fmt: skip
    print(f"load average after the run: {load_after[0]:.2f} {load_after[1]:.2f} {load_after[2]:.2f}")
    if args.no_csv:
        return
    RESULTS.mkdir(exist_ok=True)
    append_csv(CSV, FIELDS, rows)
    import report

    # a report block, so that `python benchmarks/report.py` renders it again from the CSV like the docs' own
    block = f"<!-- report:begin csd -->\n{report.block_csd(RESULTS)}<!-- report:end -->\n"
    (RESULTS / "csd.md").write_text(block, encoding="utf-8")
    png = report.plot_csd(RESULTS)
    print(f"rows appended to {CSV}; table {RESULTS / 'csd.md'}" + (f"; plot {png}" if png else ""))


if __name__ == "__main__":
    main()
