"""HotpotQA, distractor setting: each item's paragraphs become one history of sentences.

Two shapes are read: the official JSON (``context`` a list of [title, sentences], and
``supporting_facts`` a list of [title, sentence index]) and HippoRAG's copy of a train sample,
which stores those two fields as Python-literal strings. A sentence's paragraph title is its
speaker, so ``speaker: text`` carries the title as the official retrievers see it.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

from .._errors import ImportFormatError
from .._types import NewItem
from .paths import read_json, shared_data_dir

DEV = "hotpot_dev_distractor_first103.json"
TRAIN = "hipporag_hotpotqa_train100.json"


def default_path(split: str = "dev") -> Path:
    return shared_data_dir() / "hotpotqa" / (TRAIN if split == "train" else DEV)


def _field(entry: dict[str, Any], name: str, where: str) -> list[Any]:
    raw = entry.get(name)
    if isinstance(raw, str):
        try:
            raw = ast.literal_eval(raw)
        except (ValueError, SyntaxError):
            raise ImportFormatError(f"{where}: '{name}' is neither a list nor a literal of one") from None
    if not isinstance(raw, list):
        raise ImportFormatError(f"{where}: '{name}' must be a list")
    return raw


def load_hotpotqa(path: str | Path | None = None, split: str = "dev") -> list[dict[str, Any]]:
    """Entries with ``question``, ``answer``, ``type``, ``context`` and ``supporting_facts`` as
    lists (whichever shape the file stores them in)."""
    p = Path(path) if path is not None else default_path(split)
    raw = read_json(p, "HotpotQA")
    if not isinstance(raw, list):
        raise ImportFormatError(f"{p}: expected a list of questions")
    out = []
    for n, entry in enumerate(raw):
        where = f"{p.name} item {n}"
        if not isinstance(entry, dict) or "question" not in entry:
            raise ImportFormatError(f"{where}: needs 'question'")
        out.append({**entry, "context": _field(entry, "context", where),
                    "supporting_facts": _field(entry, "supporting_facts", where)})
    return out


def items_of(entry: dict[str, Any]) -> list[NewItem]:
    """The entry's sentences in paragraph order, with ``meta`` title and sentence index."""
    return [NewItem(text=sentence.strip(), speaker=title, meta={"title": title, "sent": i})
            for title, sentences in entry["context"] for i, sentence in enumerate(sentences)
            if sentence.strip()]
