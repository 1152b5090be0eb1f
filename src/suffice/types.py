"""Data that crosses module boundaries: items and the views derived from them.

Items are immutable once written; every other structure here is derived from items and can be
rebuilt at any time.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

HitSource = Literal["bm25", "dense", "fused", "recency"]


@dataclass(frozen=True, slots=True)
class NewItem:
    """One turn or agent step as a caller hands it to ``add``.

    ``id`` is optional: when given, adding the same item twice is a no-op (idempotent writes).
    """

    text: str
    session: str = ""
    speaker: str = ""
    role: str = ""
    kind: str = "message"
    observed_at: str = ""
    meta: dict[str, Any] = field(default_factory=dict)
    id: str | None = None


@dataclass(frozen=True, slots=True)
class Item:
    """One stored turn or step. ``seq`` orders items within their scope."""

    id: str
    scope: str
    seq: int
    session: str
    speaker: str
    role: str
    kind: str
    observed_at: str
    text: str
    meta: dict[str, Any]
    tokens: int

    def header(self) -> str:
        """The ``[time] speaker:`` prefix used wherever an item is shown to a model."""
        parts = []
        if self.observed_at:
            parts.append(f"[{self.observed_at}]")
        if self.speaker:
            parts.append(f"{self.speaker}:")
        return " ".join(parts)

    def render(self) -> str:
        """The item as one evidence line: time, speaker and verbatim text."""
        head = self.header()
        return f"{head} {self.text}" if head else self.text


@dataclass(frozen=True, slots=True)
class Piece:
    """A verbatim sub-span ``text[start:end]`` of one item: the unit of BM25 search."""

    item_seq: int
    index: int
    start: int
    end: int


@dataclass(frozen=True, slots=True)
class Unit:
    """Consecutive items of one session packed to about ``U`` tokens."""

    index: int
    first_seq: int
    last_seq: int
    session: str
    tokens: int
    closed: bool


@dataclass(frozen=True, slots=True)
class Block:
    """An overlapping window of consecutive items, the input of one deep-path memory agent."""

    index: int
    first_seq: int
    last_seq: int
    tokens: int


@dataclass(frozen=True, slots=True)
class Hit:
    """One retrieved item with where it sits in every view."""

    item_id: str
    seq: int
    score: float
    rank: int
    source: HitSource
    piece: int | None
    unit: int
    blocks: tuple[int, ...]
    bm25_score: float | None = None
    dense_score: float | None = None


@dataclass(frozen=True, slots=True)
class Evidence:
    """The result of the shared retrieval prefix: hits and the items they point at.

    ``items`` are the hit items in chronological order; ``text`` renders them one per line with
    time and speaker, which is the evidence context ``C_f`` every path starts from.
    """

    query: str
    scope: str
    hits: tuple[Hit, ...]
    items: tuple[Item, ...]
    timings_ms: dict[str, float]

    @property
    def text(self) -> str:
        return "\n".join(item.render() for item in self.items)


@dataclass(frozen=True, slots=True)
class StoreStats:
    """Counts of one store, or of one scope of it."""

    items: int
    scopes: int
    sessions: int
    embedded: int
    tokens: int
    schema_version: int
    path: str


RenderMode = Literal["unit", "piece", "unit+piece", "timeline"]


@dataclass(frozen=True, slots=True)
class ContextPart:
    """One included part of a rendered context and why it is there (part of the receipt)."""

    kind: Literal["record", "raw", "excerpt", "piece", "recent", "notice"]
    unit: int | None
    seqs: tuple[int, ...]
    tokens: int
    reason: str
    """e.g. 'seed 0.82', 'link from unit 4 (0.41)', 'recency', 'timeline'."""
    score: float = 0.0


@dataclass(frozen=True, slots=True)
class Context:
    """A rendered memory: text within budget, its exact o200k count, and its parts."""

    text: str
    tokens: int
    budget: int
    cap: int
    mode: str
    parts: tuple[ContextPart, ...]
    notice: str = ""
    """Set when the budget was too small for anything, or a part had to be dropped."""
    timings_ms: dict[str, float] = field(default_factory=dict)

    @property
    def empty(self) -> bool:
        return not self.text
