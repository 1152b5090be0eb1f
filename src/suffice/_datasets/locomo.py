"""LoCoMo (``locomo10.json`` format): long two-person conversations with evidence-annotated QA.

Each turn becomes one item: the session date is its ``observed_at``, the ``dia_id`` is kept in
``meta``, and a shared photo's caption is kept as text, since questions ask about photos.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._errors import ImportFormatError
from .._types import NewItem
from .paths import read_json, shared_data_dir

_SESSION_KEY = re.compile(r"^session_(\d+)$")
_DIA = re.compile(r"^D(\d+):(\d+)$")


@dataclass(frozen=True, slots=True)
class LocomoQuestion:
    question: str
    answer: str
    category: int
    evidence: tuple[str, ...]
    """Cleaned ``dia_id``s of the turns that hold the answer (ids that do not exist dropped)."""


@dataclass(frozen=True, slots=True)
class LocomoConversation:
    sample_id: str
    items: tuple[NewItem, ...]
    questions: tuple[LocomoQuestion, ...]

    @property
    def scope(self) -> str:
        return self.sample_id


def default_path() -> Path:
    """The shared copy: ``../shared/data/locomo/locomo_shared.json`` (or under $SUFFICE_DATA)."""
    return shared_data_dir() / "locomo" / "locomo_shared.json"


def _clean_evidence(raw: Any, known: set[str]) -> tuple[str, ...]:
    """Normalise the annotation's small irregularities: joined ids, 'D:11:26', 'D30:05'."""
    parts: list[str] = []
    for entry in raw if isinstance(raw, list) else [raw]:
        if not isinstance(entry, str):
            continue
        for tok in re.split(r"[;,\s]+", entry):
            tok = tok.strip()
            if not tok:
                continue
            tok = tok.replace("D:", "D")
            m = _DIA.match(tok)
            if m:
                tok = f"D{int(m.group(1))}:{int(m.group(2))}"
            if tok in known and tok not in parts:
                parts.append(tok)
    return tuple(parts)


def load_locomo(path: str | Path | None = None) -> list[LocomoConversation]:
    """Parse a LoCoMo file; raise ImportFormatError naming the offending record."""
    p = Path(path) if path is not None else default_path()
    data = read_json(p, "LoCoMo")
    if not isinstance(data, list):
        raise ImportFormatError(f"{p}: expected a JSON list of conversations, got {type(data).__name__}")
    out = []
    for ci, conv in enumerate(data):
        where = f"{p.name}: conversation {ci}"
        if not isinstance(conv, dict) or "conversation" not in conv:
            raise ImportFormatError(f"{where}: missing 'conversation'")
        raw_id = conv.get("sample_id")
        if raw_id is not None and not isinstance(raw_id, (str, int)) or isinstance(raw_id, bool):
            raise ImportFormatError(f"{where}: sample_id must be text, got {type(raw_id).__name__}")
        sample_id = str(raw_id or f"conv-{ci}")
        where = f"{p.name}: conversation {ci} ({sample_id})"
        body = conv["conversation"]
        if not isinstance(body, dict):
            raise ImportFormatError(f"{where}: 'conversation' is not an object")
        sessions = sorted((int(m.group(1)), k) for k in body if (m := _SESSION_KEY.match(k)))
        if not sessions:
            raise ImportFormatError(f"{where}: no session_<N> lists")
        items: list[NewItem] = []
        for _n, key in sessions:
            turns = body[key]
            date = body.get(f"{key}_date_time", "")
            if not isinstance(date, str):  # a null would be stored as the text "None"
                raise ImportFormatError(f"{where}, {key}_date_time: must be text, got {type(date).__name__}")
            if not isinstance(turns, list):
                raise ImportFormatError(f"{where}, {key}: expected a list of turns")
            for ti, turn in enumerate(turns):
                if not isinstance(turn, dict):
                    raise ImportFormatError(f"{where}, {key} turn {ti}: not an object")
                missing = [f for f in ("speaker", "dia_id", "text") if f not in turn]
                if missing:
                    raise ImportFormatError(f"{where}, {key} turn {ti}: missing {', '.join(missing)}")
                for field in ("text", "speaker", "dia_id"):  # a null speaker was stored as "None"
                    if not isinstance(turn[field], str):
                        raise ImportFormatError(f"{where}, {key} turn {ti}: {field} must be a string, "
                                                f"got {type(turn[field]).__name__}")
                text = turn["text"]
                meta: dict[str, Any] = {"dia_id": turn["dia_id"], "dataset": "locomo"}
                caption = turn.get("blip_caption")
                if caption:
                    photo = f"[shares a photo: {caption}]"
                    text = f"{text} {photo}" if text.strip() else photo
                    meta["blip_caption"] = caption
                if not text.strip():
                    raise ImportFormatError(f"{where}, {key} turn {ti} ({turn['dia_id']}): empty text")
                items.append(NewItem(
                    text=text, session=key, speaker=str(turn["speaker"]), role="user",
                    kind="message", observed_at=str(date), meta=meta,
                    id=f"{sample_id}:{turn['dia_id']}",
                ))
        known = {str(it.meta["dia_id"]) for it in items}
        questions = []
        qas = conv.get("qa", [])
        if not isinstance(qas, list):
            raise ImportFormatError(f"{where}: 'qa' must be a list, got {type(qas).__name__}")
        for qi, qa in enumerate(qas):
            if not isinstance(qa, dict) or "question" not in qa or "category" not in qa:
                raise ImportFormatError(f"{where}: qa {qi} lacks 'question' or 'category'")
            answer = qa.get("answer", qa.get("adversarial_answer", ""))
            category = qa["category"]
            if isinstance(category, bool) or not isinstance(category, int):
                raise ImportFormatError(f"{where}: qa {qi} category must be a whole number, got "
                                        f"{category!r}")
            questions.append(LocomoQuestion(
                question=str(qa["question"]), answer=str(answer), category=category,
                evidence=_clean_evidence(qa.get("evidence", []), known),
            ))
        out.append(LocomoConversation(sample_id, tuple(items), tuple(questions)))
    return out
