"""What the command line reads from disk, checked before any model loads: prompt files, target and draft model
directories, GGUF files. Each check returns a reason (one line, for ``FLAG reason``) or None when the input is fine,
so that a bad input costs no model load and ends in one line naming its flag."""

from __future__ import annotations

import functools
import glob
import json
import os
from typing import Any

#: the files that hold a model's weights in an HF directory (any one of them)
WEIGHT_PATTERNS = ("*.safetensors", "*.bin", "*.safetensors.index.json", "*.bin.index.json")
#: the files from which AutoTokenizer builds a tokenizer (any one of them)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "spiece.model", "tiktoken.model")
#: GGUF architecture names whose transformers model type differs
GGUF_MODEL_TYPES = {"gemma3": "gemma3_text"}


def prompt_text(record: Any, where: str) -> str:
    """The prompt of one JSONL record: its ``prompt``, ``question``, ``instruction`` or ``text`` string, or the first
    of its ``turns``. ``where``: the record's place (``line N``) for the error."""
    if not isinstance(record, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(record).__name__}")
    for key in ("prompt", "question", "instruction", "text"):
        if isinstance(record.get(key), str) and record[key]:
            return record[key]
    turns = record.get("turns")
    if isinstance(turns, list) and turns and isinstance(turns[0], str) and turns[0]:
        return turns[0]
    raise ValueError(
        f"{where}: no prompt text (expected a 'prompt', 'question', 'instruction', 'text' or 'turns' field)"
    )


def read_prompts(path: str, limit: int) -> list[str]:
    """The first ``limit`` prompts of a JSONL file (blank lines skipped). Raises ValueError naming the line of a
    record that is not JSON, not an object or holds no prompt, and when the file holds none."""
    out: list[str] = []
    with open(path, encoding="utf-8") as fh:
        for i, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"line {i}: not JSON ({err.msg})") from None
            out.append(prompt_text(record, f"line {i}"))
            if len(out) >= limit:
                break
    if not out:
        raise ValueError("no prompts found")
    return out


def _config(path: str) -> tuple[dict[str, Any] | None, str | None]:
    file = os.path.join(path, "config.json")
    if not os.path.isfile(file):
        return None, f"{path!r} is not an HF model directory (no config.json)"
    try:
        with open(file, encoding="utf-8") as fh:
            config = json.load(fh)
    except (OSError, ValueError) as err:
        return None, f"{path!r}: config.json is not readable JSON ({err})"
    if not isinstance(config, dict):
        return None, f"{path!r}: config.json does not hold a JSON object"
    return config, None


def _unsupported(model_type: Any, supported: tuple[str, ...], where: str) -> str | None:
    if model_type in supported:
        return None
    return f"{where}: architecture {model_type!r} is not supported (supported: {', '.join(supported)})"


def check_model_dir(path: str, supported: tuple[str, ...], *, tokenizer: bool) -> str | None:
    """Why the HF directory ``path`` cannot serve (no config, an unsupported ``model_type``, no weights, and with
    ``tokenizer`` no tokenizer or chat template), or None."""
    config, why = _config(path)
    if config is None:
        return why
    why = _unsupported(config.get("model_type"), supported, repr(path))
    if why:
        return why
    if not any(glob.glob(os.path.join(path, p)) for p in WEIGHT_PATTERNS):
        return f"{path!r} holds no weights (*.safetensors or *.bin)"
    if tokenizer:
        if not any(os.path.isfile(os.path.join(path, f)) for f in TOKENIZER_FILES):
            return f"{path!r} holds no tokenizer (one of {', '.join(TOKENIZER_FILES)})"
        if not _has_chat_template(path):
            return f"{path!r}: the tokenizer has no chat template (the demo formats its prompts as chats)"
    return None


def _has_chat_template(path: str) -> bool:
    if any(os.path.isfile(os.path.join(path, f)) for f in ("chat_template.jinja", "chat_template.json")):
        return True
    file = os.path.join(path, "tokenizer_config.json")
    try:
        with open(file, encoding="utf-8") as fh:
            return bool(json.load(fh).get("chat_template"))
    except (OSError, ValueError, AttributeError):
        return False


def check_gguf(path: str, supported: tuple[str, ...]) -> str | None:
    """Why the GGUF file ``path`` cannot serve as a chat target (unreadable, an unsupported architecture, no chat
    template), or None. Reads the file's header with the gguf package (memory-mapped)."""
    try:
        import gguf  # noqa: F401 (only whether it is there)
    except ImportError:
        return "reading a .gguf file needs the gguf package (pip install gguf)"
    try:
        reader = _gguf_reader(path)
        field = reader.fields["general.architecture"]
        arch = bytes(field.parts[field.data[0]]).decode()
    except Exception as err:  # noqa: BLE001 (a corrupt file fails in many ways inside the parser)
        return f"{path!r} is not a readable GGUF file ({type(err).__name__}: {err})"
    why = _unsupported(GGUF_MODEL_TYPES.get(arch, arch), supported, repr(path))
    if why:
        return why
    if "tokenizer.chat_template" not in reader.fields:
        return f"{path!r}: the tokenizer has no chat template (the demo formats its prompts as chats)"
    return None


def model_vocab(path: str) -> int | None:
    """``vocab_size`` of an HF directory's config.json (None where it has none)."""
    config, _ = _config(path)
    value = None if config is None else config.get("vocab_size", config.get("text_config", {}).get("vocab_size"))
    return value if isinstance(value, int) else None


@functools.lru_cache(maxsize=2)
def _gguf_reader(path: str) -> Any:
    from gguf import GGUFReader

    return GGUFReader(path)


def gguf_vocab(path: str) -> int | None:
    """The number of tokens of a GGUF file's tokenizer (None where it lists none)."""
    field = _gguf_reader(path).fields.get("tokenizer.ggml.tokens")
    return None if field is None else len(field.data)
