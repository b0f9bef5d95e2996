"""Max-Gram's greedy bigram table for a target's tokenizer, built from a corpus of chat transcripts
(``python -m specdec.train bigram``; docs/methods.md, CS Drafting).

Each JSONL record becomes one chat in the target's template: its user text (``question``, ``prompt``,
``instruction``, ``text`` or the first of ``turns``) and, when the record has one (``answer``, ``response``,
``output``, ``completion``), the assistant's reply (GSM8K's calculator annotations removed). The table maps each
token to the token that most often follows it (ties: the lowest id); tokens never followed by another map to the
corpus's most frequent token. It is written compactly next to a JSON manifest (corpus files and hashes, counts, the
command that rebuilds it).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ..drafters import bigram_table
from ..drafters.ngram import save_bigram
from ..drafters.store import ASSETS_DIR
from .common import chat_ids, clean_gsm8k_answer, file_sha256, read_jsonl, shared_data_dir, write_json_atomic

DEFAULT_BIGRAM = "smollm2-bigram"
USER_KEYS = ("question", "prompt", "instruction", "text")
REPLY_KEYS = ("answer", "response", "output", "completion")


def record_chat(tokenizer: Any, record: dict[str, Any], where: str) -> list[int]:
    """Token ids of one corpus record as a chat (user turn, then the reply when the record has one)."""
    user = next((record[k] for k in USER_KEYS if isinstance(record.get(k), str) and record[k]), None)
    turns = record.get("turns")
    if user is None and isinstance(turns, list) and turns and isinstance(turns[0], str):
        user = turns[0]
    if user is None:
        raise ValueError(f"{where}: no user text (expected one of {', '.join(USER_KEYS)} or 'turns')")
    reply = next((record[k] for k in REPLY_KEYS if isinstance(record.get(k), str) and record[k]), None)
    return chat_ids(tokenizer, user, None if reply is None else clean_gsm8k_answer(reply))


def build_bigram(
    tokenizer: Any, vocab_size: int, corpus: list[Path], *, name: str = DEFAULT_BIGRAM, out_dir: Path | None = None
) -> dict[str, Any]:
    """Tokenize ``corpus`` (JSONL files), build the table and write ``<out_dir>/<name>.npz`` and ``<name>.json``
    (default: the shipped assets). Returns the manifest."""
    seqs = []
    for path in corpus:
        for i, record in enumerate(read_jsonl(path), 1):
            seqs.append(record_chat(tokenizer, record, f"{path}:{i}"))
    freq = np.bincount(np.concatenate([np.asarray(s, dtype=np.int64) for s in seqs]), minlength=vocab_size)
    default = int(np.argmax(freq))
    table = bigram_table(seqs, vocab_size, default)
    out = out_dir or ASSETS_DIR
    path = save_bigram(table, out / f"{name}.npz", default)
    manifest = {
        "corpus": [{"file": p.name, "sha256": file_sha256(p)} for p in corpus],
        "sequences": len(seqs),
        "tokens": int(freq.sum()),
        "vocab_size": vocab_size,
        "default": default,
        "tokens_with_an_entry": int((table != default).sum()),
        "file": {"name": path.name, "bytes": path.stat().st_size, "sha256": file_sha256(path)},
        "rebuild": f"python -m specdec.train bigram --name {name}" + "".join(f" --corpus {p.name}" for p in corpus),
    }
    write_json_atomic(out / f"{name}.json", manifest)
    return manifest


def default_corpus() -> list[Path]:
    """GSM8K train (questions and solutions) from ``$SPECDEC_DATA_DIR``: training data only."""
    path = shared_data_dir() / "gsm8k_train.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing; pass --corpus FILE.jsonl")
    return [path]
