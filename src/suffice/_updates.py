"""Revisions in the evidence: a later message that changes what an earlier one said.

Small readers answer from the first mention they meet. Shown "we plan the trip for October"
and, two months later, "the trip moved to November", the 1.5B reader answers "October" even
when told in its instructions that the latest value holds; asked in the question line itself,
it answers "November". So when the evidence holds a message that revises an earlier one on the
question's topic, the question line asks for the latest value (the engine's ``updates`` lever).

A rule, not a model: it fires only on explicit revision wording (:data:`REVISION`) in a message
that shares a topic word of the question with an earlier message of the same evidence. On
LoCoMo's acceptance conversation it fires in none of the 150 questions' 1k and 2k renders (9 of
the dataset's turns hold such wording at all), so the figures of docs/benchmarks.md §7 stand.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ._text import query_terms, stem, words
from ._types import Item

REVISION = re.compile(
    r"\b(?:change of plans?"
    r"|chang(?:e|ed|ing) (?:my|our|the|their|his|her) (?:mind|plans?)"
    r"|(?:moved|pushed|postponed|rescheduled|delayed|bumped) (?!(?:me|you|us|him|her|them|myself)\b)"
    r"(?:[\w'-]+ ){0,3}?(?:to|back|forward|until)\b"
    r"|postponed|rescheduled|cancel+ed|called off"
    r"|no longer"
    r"|(?:has|have) (?:now |recently |since )?(?:grown|risen|dropped|fallen|increased|decreased|changed"
    r"|improved|gone up|gone down) (?:further )?(?:to|from|by)\b"
    r"|(?:is|are) now\b|now (?:is|are|at|averag\w*|stands|costs)\b"
    r"|instead)",
    re.IGNORECASE,
)
"""Wording that says a fact or plan changed: a new date, a cancellation, a value that moved."""

_NOW = re.compile(
    r"^\s*(?:(?:is|are|do|does)\b"
    r"|(?:what|which|who|where|when|how\s+(?:many|much|long|often|far))\b.*"
    r"\b(?:is|are|am|do|does|have|has|currently|now)\b"
    r"|(?:what|who|where|when)'s\b)",
    re.IGNORECASE | re.DOTALL)
_THEN = re.compile(r"\b(?:did|was|were|had|first|originally|initially|earlier|previous(?:ly)?|used to"
                   r"|order|between|ever|before)\b", re.IGNORECASE)

HINT = "(The memory shows this changed later on; give the latest value.)"
"""Appended to the question line when a revision is found (see the module's docstring)."""


@dataclass(frozen=True, slots=True)
class Revision:
    """A later message that revises an earlier one on the question's topic."""

    later: Item
    earlier: Item
    topic: tuple[str, ...]
    """The question's words the two messages share."""

    def describe(self) -> str:
        when = f" of {self.later.observed_at}" if self.later.observed_at else ""
        was = f" of {self.earlier.observed_at}" if self.earlier.observed_at else ""
        return (f"item {self.later.seq}{when} revises item {self.earlier.seq}{was} "
                f"on {', '.join(self.topic)}")


def _topic(question: str, names: Iterable[str]) -> set[str]:
    """The question's content words, less the names of the people speaking."""
    skip = {stem(w) for n in names for w in words(n)}
    return {stem(w) for w in query_terms(question) if len(w) > 2 and stem(w) not in skip}


def asks_current(question: str) -> bool:
    """Whether ``question`` asks how something stands now ("When is the trip?", "How many
    commits have been merged?") rather than about the past, an order or a span ("When did
    ...", "What was ... first", "How many days between ..."), where the latest value is not the
    answer."""
    return bool(_NOW.search(question)) and not _THEN.search(question)


def find_revision(question: str, items: Sequence[Item]) -> Revision | None:
    """The newest message of ``items`` that revises an earlier one of them on the question's
    topic, or None; None too when the question does not ask how something stands now
    (:func:`asks_current`). ``items``: the messages a context shows, in any order."""
    if not asks_current(question):
        return None
    ordered = sorted({it.seq: it for it in items}.values(), key=lambda it: it.seq)
    if len(ordered) < 2:
        return None
    topic = _topic(question, {it.speaker for it in ordered if it.speaker})
    if not topic:
        return None
    on_topic = [(it, topic & {stem(w) for w in words(it.text)}) for it in ordered]
    for i in range(len(on_topic) - 1, 0, -1):
        later, shared = on_topic[i]
        if not shared or not REVISION.search(later.text):
            continue
        for earlier, theirs in reversed(on_topic[:i]):
            common = shared & theirs
            if common:
                return Revision(later, earlier, tuple(sorted(common)))
    return None
