"""BEAM (``chat.json`` + ``probing_questions.json`` per conversation folder).

Each message becomes one item: its role is the speaker (``user`` / ``assistant``), the batch
number is the session, the message ``id`` is kept in ``meta['chat_id']``, and the last time
anchor seen so far is its ``observed_at`` (anchors are given on a few messages only, and later
messages happen after them). Questions keep their ability, gold answer (the field name varies by
ability) and evidence, the flattened ``source_chat_ids``; abstention questions have none.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._errors import ImportFormatError
from .._types import NewItem
from .paths import read_json, shared_data_dir

ANSWER_FIELDS = ("answer", "ideal_answer", "ideal_response", "ideal_summary", "expected_compliance")
"""Where each ability keeps its gold answer, in the order we look."""


@dataclass(frozen=True, slots=True)
class BeamQuestion:
    question: str
    answer: str
    ability: str
    evidence: tuple[str, ...]
    """``chat_id``s of the messages holding the evidence; empty for abstention."""
    difficulty: str = ""


@dataclass(frozen=True, slots=True)
class BeamConversation:
    conv_id: str
    items: tuple[NewItem, ...]
    questions: tuple[BeamQuestion, ...]
    tier: str = "100K"

    @property
    def scope(self) -> str:
        return f"beam-{self.tier}-{self.conv_id}"


def default_path() -> Path:
    """The shared copy of the 100K tier: ``../shared/data/beam/100K`` (or under $SUFFICE_DATA)."""
    return shared_data_dir() / "beam" / "100K"


def _flatten_ids(raw: Any) -> list[str]:
    """``source_chat_ids`` is a list, or a dict of lists (e.g. first/second statement)."""
    out: list[str] = []
    stack = [raw]
    while stack:
        x = stack.pop(0)
        if isinstance(x, dict):
            stack[0:0] = list(x.values())
        elif isinstance(x, (list, tuple)):
            stack[0:0] = list(x)
        elif isinstance(x, (int, str)) and str(x).strip() and str(x) not in out:
            out.append(str(x).strip())
    return out


def load_conversation(folder: str | Path, tier: str = "100K") -> BeamConversation:
    """One conversation folder; raise ImportFormatError naming the offending record."""
    d = Path(folder)
    chat = read_json(d / "chat.json", "BEAM")
    if not isinstance(chat, list):
        raise ImportFormatError(f"{d / 'chat.json'}: expected a list of batches")
    items: list[NewItem] = []
    anchor = ""
    for bi, batch in enumerate(chat):
        where = f"{d.name}/chat.json batch {bi}"
        if not isinstance(batch, dict) or not isinstance(batch.get("turns"), list):
            raise ImportFormatError(f"{where}: expected an object with a 'turns' list")
        session = str(batch.get("batch_number", bi + 1))
        if batch.get("time_anchor"):
            anchor = str(batch["time_anchor"])
        for ti, turn in enumerate(batch["turns"]):
            messages = turn if isinstance(turn, list) else [turn]
            for mi, msg in enumerate(messages):
                if not isinstance(msg, dict) or "content" not in msg or "role" not in msg:
                    raise ImportFormatError(f"{where} turn {ti} message {mi}: needs 'role' and 'content'")
                if msg.get("time_anchor"):
                    anchor = str(msg["time_anchor"])
                text = str(msg["content"])
                if not text.strip():
                    continue
                chat_id = str(msg.get("id", f"{bi}.{ti}.{mi}"))
                role = str(msg["role"])
                items.append(NewItem(
                    text=text, session=session, speaker=role, role=role, kind="message",
                    observed_at=anchor, meta={"chat_id": chat_id, "dataset": "beam"},
                    id=f"beam-{tier}-{d.name}:{chat_id}",
                ))
    known = {str(it.meta["chat_id"]) for it in items}
    probing = read_json(d / "probing_questions.json", "BEAM")
    if not isinstance(probing, dict):
        raise ImportFormatError(f"{d / 'probing_questions.json'}: expected an object of abilities")
    questions: list[BeamQuestion] = []
    for ability, qs in probing.items():
        if not isinstance(qs, list):
            raise ImportFormatError(f"{d.name}/probing_questions.json {ability}: expected a list")
        for qi, q in enumerate(qs):
            if not isinstance(q, dict) or "question" not in q:
                raise ImportFormatError(f"{d.name}/probing_questions.json {ability} {qi}: no 'question'")
            answer = next((q[f] for f in ANSWER_FIELDS if f in q), "")
            evidence = tuple(x for x in _flatten_ids(q.get("source_chat_ids", [])) if x in known)
            questions.append(BeamQuestion(
                question=str(q["question"]),
                answer=answer if isinstance(answer, str) else json.dumps(answer, ensure_ascii=False),
                ability=str(ability), evidence=evidence, difficulty=str(q.get("difficulty", "")),
            ))
    return BeamConversation(d.name, tuple(items), tuple(questions), tier)


def load_beam(path: str | Path | None = None, tier: str = "100K") -> list[BeamConversation]:
    """A tier folder of numbered conversation folders, or one conversation folder."""
    p = Path(path) if path is not None else default_path()
    if (p / "chat.json").exists():
        return [load_conversation(p, tier)]
    if not p.is_dir():
        raise ImportFormatError(f"BEAM folder not found: {p}")
    folders = sorted((c for c in p.iterdir() if (c / "chat.json").exists()),
                     key=lambda c: (not c.name.isdigit(), int(c.name) if c.name.isdigit() else 0, c.name))
    if not folders:
        raise ImportFormatError(f"{p}: no conversation folders with a chat.json")
    return [load_conversation(c, tier) for c in folders]
