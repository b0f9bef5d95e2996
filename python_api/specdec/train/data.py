"""Stage ``data``: distillation data from the target.

Four sources, each written as resumable shards ``<workdir>/data/<source>_<i>.pt``:

* ``magpie``: the target writes an instruction itself (chat template cut at the user turn, Magpie-style), then
  answers it; in-domain for chat prompts and costs nothing but target time.
* ``gsm8k_sample``: target answers to GSM8K *train* questions.
* ``gsm8k_label``: GSM8K train question + reference solution, teacher-forced through the target (~4x cheaper per
  position than sampling: one forward labels a whole sequence).
* ``code_sample``: target answers to Python stubs (a signature and its docstring, the shape of a HumanEval problem)
  taken from the public functions and methods of the Python standard library that runs the stage
  (:func:`code_stubs`), after the demo's instruction for HumanEval problems; HumanEval itself is never read, so it
  stays a held-out set.

Sampling is plain T = 1 from the target's softmax (no top-k/top-p; ``answer_temperature`` draws the answers at another
temperature), and every response position stores the target's T = 1 top-k log-probs (free during sampling), so the
draft learns from soft labels, not just one sampled token.
Each shard has its own seed derived from (seed, source, shard), so an interrupted run resumes to the same data.
GSM8K train is read from ``$SPECDEC_DATA_DIR/gsm8k_train.jsonl`` (:func:`specdec.train.common.shared_data_dir`).
"""

from __future__ import annotations

import ast
import math
import platform
import sysconfig
import time
from dataclasses import asdict, dataclass
from itertools import zip_longest
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from ..models import cache_argument
from ..smollm2 import CODE_INSTRUCTION
from .common import (
    chat_ids,
    clean_gsm8k_answer,
    magpie_prefix,
    read_jsonl,
    save_atomic,
    shared_data_dir,
    sub_seed,
    tensors_sha256,
    update_manifest,
)


@dataclass
class DataConfig:
    """How much data to build. The defaults keep the whole pipeline short enough for a small CPU machine."""

    seed: int = 0
    n_magpie: int = 128
    n_gsm8k_sample: int = 0
    n_gsm8k_label: int = 320
    n_code_sample: int = 0
    # put before each code stub, as the demo puts it before each HumanEval problem
    code_instruction: str = CODE_INSTRUCTION
    # appended on a new line to each question the target answers itself (gsm8k_sample), e.g. the zero-shot
    # chain-of-thought cue of an evaluation, so that the answers are written as they are there
    gsm8k_cue: str = ""
    max_instruction_tokens: int = 48
    # sampling temperature of the self-written instructions
    instruction_temperature: float = 1.0
    # sampling temperature of the answers: below 1 the answers read more like what greedy or T < 1 decoding writes
    # (a small target's T = 1 text drifts off topic); the stored labels are the T = 1 law either way
    answer_temperature: float = 1.0
    max_new_tokens: int = 96
    batch_size: int = 64
    label_batch_size: int = 16
    top_k: int = 32
    shard_size: int = 64
    gsm8k_file: str = "gsm8k_train.jsonl"


@torch.no_grad()
def sample_responses(
    model: Any,
    prompts: list[list[int]],
    *,
    max_new_tokens: int,
    eos_id: int,
    generator: torch.Generator,
    top_k: int = 32,
    temperature: float = 1.0,
) -> list[tuple[list[int], torch.Tensor, torch.Tensor]]:
    """Sample continuations (T = 1 unless ``temperature``; batched, left-padded, KV cache), keeping the target's
    top-k log-probs.

    Returns per prompt (tokens incl. a final EOS if one was drawn, topk_ids [n, k] int32, topk_logp [n, k] fp16),
    where row j describes the target's T = 1 law at the j-th new token. ``temperature`` changes only how the
    tokens are drawn (softmax(logits / T)); the stored law stays the T = 1 one.
    """
    from transformers import DynamicCache

    if not (temperature > 0 and math.isfinite(temperature)):
        raise ValueError(f"temperature must be a positive finite number, got {temperature!r}")
    B = len(prompts)
    L = max(len(p) for p in prompts)
    ids = torch.full((B, L), eos_id, dtype=torch.long)
    mask = torch.zeros((B, L), dtype=torch.long)
    for b, p in enumerate(prompts):
        ids[b, L - len(p) :] = torch.tensor(p)
        mask[b, L - len(p) :] = 1
    pos = (mask.cumsum(-1) - 1).clamp_min(0)
    cache = DynamicCache(config=model.config)
    key = cache_argument(model)
    out = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True, **{key: cache})
    logits = out.logits[:, -1].float()
    done = torch.zeros(B, dtype=torch.bool)
    toks: list[list[int]] = [[] for _ in range(B)]
    tk_ids: list[list[torch.Tensor]] = [[] for _ in range(B)]
    tk_lp: list[list[torch.Tensor]] = [[] for _ in range(B)]
    next_pos = pos[:, -1] + 1
    for _ in range(max_new_tokens):
        logp = torch.log_softmax(logits, dim=-1)
        law = logp.exp() if temperature == 1.0 else torch.softmax(logits / temperature, dim=-1)
        nxt = torch.multinomial(law, 1, generator=generator).squeeze(1)
        lp, ix = logp.topk(top_k, dim=-1)
        for b in range(B):
            if not done[b]:
                toks[b].append(int(nxt[b]))
                tk_ids[b].append(ix[b].to(torch.int32))
                tk_lp[b].append(lp[b].to(torch.float16))
        done |= nxt == eos_id
        if bool(done.all()):
            break
        mask = torch.cat([mask, torch.ones((B, 1), dtype=torch.long)], dim=1)
        out = model(
            input_ids=nxt[:, None],
            attention_mask=mask,
            position_ids=next_pos[:, None],
            use_cache=True,
            **{key: cache},  # the cache object the first call filled, updated in place
        )
        next_pos = next_pos + 1
        logits = out.logits[:, -1].float()
    return [(toks[b], torch.stack(tk_ids[b]), torch.stack(tk_lp[b])) for b in range(B)]


@torch.no_grad()
def label_sequences(
    model: Any, seqs: list[list[int]], starts: list[int], *, top_k: int = 32
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Teacher-forced top-k log-probs of the target for tokens ``seq[start:]`` (one forward per batch).

    Returns per sequence (topk_ids [n - start, k] int32, topk_logp [n - start, k] fp16); the lm_head runs only
    on the rows that are labelled (it is a quarter of the forward cost otherwise).
    """
    B = len(seqs)
    L = max(len(s) for s in seqs)
    ids = torch.zeros((B, L), dtype=torch.long)
    mask = torch.zeros((B, L), dtype=torch.long)
    for b, s in enumerate(seqs):
        ids[b, : len(s)] = torch.tensor(s)
        mask[b, : len(s)] = 1
    hidden = model.model(input_ids=ids, attention_mask=mask).last_hidden_state
    rows = [hidden[b, starts[b] - 1 : len(seqs[b]) - 1] for b in range(B)]
    flat = torch.cat(rows)
    logp = torch.log_softmax(model.lm_head(flat).float(), dim=-1)
    lp, ix = logp.topk(top_k, dim=-1)
    out, o = [], 0
    for r in rows:
        n = r.shape[0]
        out.append((ix[o : o + n].to(torch.int32), lp[o : o + n].to(torch.float16)))
        o += n
    return out


def gsm8k_splits(cfg: DataConfig) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Disjoint, seed-shuffled GSM8K train subsets for sampling and for labelling."""
    rows = read_jsonl(shared_data_dir() / cfg.gsm8k_file)
    g = torch.Generator().manual_seed(sub_seed(cfg.seed, "gsm8k_order"))
    order = torch.randperm(len(rows), generator=g).tolist()
    if cfg.n_gsm8k_sample + cfg.n_gsm8k_label > len(order):
        raise ValueError(f"n_gsm8k_sample + n_gsm8k_label exceeds the {len(order)} GSM8K train questions")
    # Sampling walks the order from the front, labelling from the back: every shard keeps its questions when
    # either count changes (so larger runs extend smaller ones).
    sample = [rows[i] for i in order[: cfg.n_gsm8k_sample]]
    label = [rows[i] for i in order[::-1][: cfg.n_gsm8k_label]]
    return sample, label


#: standard-library folders whose code is not library code (tests, demos, the IDE, vendored packages)
_STUB_SKIP = frozenset({"test", "tests", "idlelib", "site-packages", "lib2to3", "turtledemo", "__phello__"})


def _stub(fn: ast.FunctionDef, doc: str, owner: str | None) -> str:
    """``def name(args) -> ret:`` and its docstring, inside ``class owner:`` for a method."""
    ret = f" -> {ast.unparse(fn.returns)}" if fn.returns is not None else ""
    body = "\n".join("    " + line if line.strip() else "" for line in doc.splitlines())
    text = f'def {fn.name}({ast.unparse(fn.args)}){ret}:\n    """{body.lstrip()}\n    """\n'
    if owner is None:
        return text
    return f"class {owner}:\n" + "".join("    " + line if line.strip() else line for line in text.splitlines(True))


def code_stubs(n: int, seed: int, root: Path | None = None) -> list[str]:
    """``n`` Python stubs, seed-shuffled: the public top-level functions and public classes' public methods of the
    standard library under ``root`` (default: the running Python's) whose docstrings have 20 to 600 characters,
    each a signature and its docstring (a method inside its class line), unique and in a fixed order before the
    shuffle. Fewer than ``n`` is an error."""
    root = Path(sysconfig.get_paths()["stdlib"]) if root is None else root
    stubs: set[str] = set()
    for path in sorted(root.rglob("*.py")):
        if _STUB_SKIP.intersection(path.relative_to(root).parts):
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        for node in tree.body:
            if isinstance(node, ast.FunctionDef):
                found = [(node, None)]
            elif isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                found = [(m, node.name) for m in node.body if isinstance(m, ast.FunctionDef)]
            else:
                continue
            for fn, owner in found:
                doc = ast.get_docstring(fn)
                if not fn.name.startswith("_") and doc and 20 <= len(doc) <= 600:
                    stubs.add(_stub(fn, doc, owner))
    if len(stubs) < n:
        raise ValueError(f"{n} code stubs asked for, the standard library under {root} has {len(stubs)}")
    ordered = sorted(stubs)
    g = torch.Generator().manual_seed(sub_seed(seed, "code_order"))
    return [ordered[i] for i in torch.randperm(len(ordered), generator=g)[:n].tolist()]


def _shard_path(workdir: Path, source: str, i: int) -> Path:
    return workdir / "data" / f"{source}_{i:04d}.pt"


def _sample_shard(model: Any, tok: Any, prompts: list[list[int]], cfg: DataConfig, seed: int) -> dict[str, Any]:
    g = torch.Generator().manual_seed(seed)
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))  # less padding
    recs: list[dict[str, Any]] = []
    for lo in range(0, len(order), cfg.batch_size):
        idx = order[lo : lo + cfg.batch_size]
        res = sample_responses(
            model,
            [prompts[i] for i in idx],
            max_new_tokens=cfg.max_new_tokens,
            eos_id=int(tok.eos_token_id),
            generator=g,
            top_k=cfg.top_k,
            temperature=cfg.answer_temperature,
        )
        for i, (toks, ids, lp) in zip(idx, res, strict=True):
            recs.append(
                {
                    "tokens": torch.tensor(prompts[i] + toks, dtype=torch.int32),
                    "start": len(prompts[i]),
                    "topk_ids": ids,
                    "topk_logp": lp,
                }
            )
    return {"records": recs}


def _magpie_prompts(model: Any, tok: Any, n: int, cfg: DataConfig, seed: int) -> list[list[int]]:
    """Instructions written by the target itself; too-short or unfinished ones are dropped."""
    prefix = magpie_prefix(tok)
    g = torch.Generator().manual_seed(seed)
    res = []
    for lo in range(0, n, cfg.batch_size):
        b = min(cfg.batch_size, n - lo)
        res += sample_responses(
            model,
            [prefix] * b,
            max_new_tokens=cfg.max_instruction_tokens,
            eos_id=int(tok.eos_token_id),
            generator=g,
            top_k=1,
            temperature=cfg.instruction_temperature,
        )
    prompts = []
    for toks, _, _ in res:
        if toks and toks[-1] == int(tok.eos_token_id) and len(toks) >= 4:
            text = tok.decode(toks[:-1]).strip()
            if text:
                prompts.append(chat_ids(tok, text))
    return prompts


def build_data(model: Any, tok: Any, workdir: Path, cfg: DataConfig, *, progress: bool = True) -> dict[str, Any]:
    """Run (or resume) the data stage; returns the manifest record (counts, hash, seconds)."""
    torch.manual_seed(cfg.seed)
    t0 = time.time()
    sample_q, label_q = gsm8k_splits(cfg)
    stubs = code_stubs(cfg.n_code_sample, cfg.seed) if cfg.n_code_sample else []
    # the user turns of the sources whose prompts are fixed texts, which the target answers
    asked = {
        "gsm8k_sample": [f"{r['question']}\n{cfg.gsm8k_cue}" if cfg.gsm8k_cue else r["question"] for r in sample_q],
        "code_sample": [cfg.code_instruction + stub for stub in stubs],
    }
    per_source: list[list[tuple[str, int, int]]] = []  # (source, shard index, number of prompts)
    sources = (("gsm8k_label", len(label_q)), ("magpie", cfg.n_magpie), ("gsm8k_sample", len(sample_q)))
    for source, n in (*sources, ("code_sample", len(stubs))):
        starts = range(0, n, cfg.shard_size)
        per_source.append([(source, i, min(cfg.shard_size, n - lo)) for i, lo in enumerate(starts)])
    # Round-robin over sources, so a run cut short still has a mix of every source.
    jobs = [job for group in zip_longest(*per_source) for job in group if job is not None]
    bar = tqdm(jobs, desc="data shards", disable=not progress)
    for source, i, n in bar:
        path = _shard_path(workdir, source, i)
        if path.is_file():
            continue
        seed = sub_seed(cfg.seed, source, i)
        if source == "magpie":
            prompts = _magpie_prompts(model, tok, n, cfg, seed)
            shard = _sample_shard(model, tok, prompts, cfg, sub_seed(seed, "response"))
        elif source in asked:
            texts = asked[source][i * cfg.shard_size : i * cfg.shard_size + n]
            shard = _sample_shard(model, tok, [chat_ids(tok, t) for t in texts], cfg, seed)
        else:
            rows = label_q[i * cfg.shard_size : i * cfg.shard_size + n]
            seqs = [chat_ids(tok, r["question"], clean_gsm8k_answer(r["answer"])) for r in rows]
            starts = [len(chat_ids(tok, r["question"])) for r in rows]
            order = sorted(range(len(seqs)), key=lambda j: len(seqs[j]))
            recs = []
            for lo in range(0, len(order), cfg.label_batch_size):
                idx = order[lo : lo + cfg.label_batch_size]
                lab = label_sequences(model, [seqs[j] for j in idx], [starts[j] for j in idx], top_k=cfg.top_k)
                for j, (ids, lp) in zip(idx, lab, strict=True):
                    recs.append(
                        {
                            "tokens": torch.tensor(seqs[j], dtype=torch.int32),
                            "start": starts[j],
                            "topk_ids": ids,
                            "topk_logp": lp,
                        }
                    )
            shard = {"records": recs}
        shard["source"] = source
        save_atomic(shard, path)
        bar.set_postfix(positions=sum(r["topk_ids"].shape[0] for r in shard["records"]))
    records = load_records(workdir)
    info = {
        "config": asdict(cfg),
        "sequences": len(records),
        "positions": int(sum(r["topk_ids"].shape[0] for r in records)),
        "positions_by_source": _count_by_source(workdir),
        # the code stubs come from the running Python's standard library, which differs between Python versions
        "python": platform.python_version(),
        "data_sha256": tensors_sha256(t for r in records for t in (r["tokens"], r["topk_ids"])),
        "seconds_this_run": round(time.time() - t0, 1),
    }
    update_manifest(workdir, "data", info)
    return info


def _count_by_source(workdir: Path) -> dict[str, int]:
    counts: dict[str, int] = {}
    for path in sorted((workdir / "data").glob("*.pt")):
        shard = torch.load(path, weights_only=False)
        counts[shard["source"]] = counts.get(shard["source"], 0) + sum(r["topk_ids"].shape[0] for r in shard["records"])
    return counts


def load_records(workdir: Path) -> list[dict[str, Any]]:
    """All shards' records in a fixed order (sorted file names)."""
    recs: list[dict[str, Any]] = []
    for path in sorted((workdir / "data").glob("*.pt")):
        recs += torch.load(path, weights_only=False)["records"]
    return recs
