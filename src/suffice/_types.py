"""Data that crosses module boundaries: items and the views derived from them.

Items are immutable once written; every other structure here is derived from items and can be
rebuilt at any time.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal, TypedDict

Role = Literal["system", "user", "assistant"]


class Message(TypedDict):
    """One chat message sent to a model."""

    role: Role
    content: str


HitSource = Literal["bm25", "dense", "fused", "recency", "step"]
"""``step``: fetched because the query named the item's step (:mod:`suffice._steps`)."""


@dataclass(frozen=True, slots=True)
class NewItem:
    """One turn or agent step as a caller hands it to ``add``.

    ``id`` is optional: when given, adding the same item twice is a no-op (idempotent writes).
    ``observed_at`` is when it happened, as text ("1:56 pm on 8 May, 2023", ISO 8601) or a
    datetime; the text is kept as written and parsed once into a UTC timestamp.
    ``agent`` names the agent whose memory this is, when a scope holds several.
    """

    text: str
    session: str = ""
    speaker: str = ""
    role: str = ""
    kind: str = "message"
    observed_at: str | datetime = ""
    meta: dict[str, Any] = field(default_factory=dict)
    id: str | None = None
    agent: str = ""


@dataclass(frozen=True, slots=True)
class Item:
    """One stored turn or step, immutable.

    ``seq`` is the item's position in its scope (0, 1, 2, ...): it orders the log, and
    :meth:`~suffice.Memory.forget` closes the gaps it leaves, so use ``id`` to refer to an item
    over time. ``observed_ts`` is ``observed_at`` parsed at write time (UTC POSIX seconds), None
    when the text states no date.
    """

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
    observed_ts: float | None = None
    agent: str = ""

    def header(self, *, with_time: bool = True) -> str:
        """The ``[time] [step N] speaker:`` prefix used wherever an item is shown to a model.

        An agent's questions name steps, so an item with ``meta['step']`` (the trajectory
        importers set it) shows its step; ``with_time=False`` leaves the time out, for a line
        under a header that already states it.
        """
        parts = [f"[{self.observed_at}]"] if self.observed_at and with_time else []
        step = step_of(self)
        if step is not None:
            parts.append(f"[step {step}]")
        if self.speaker:
            parts.append(f"{self.speaker}:")
        return " ".join(parts)

    def render(self) -> str:
        """The item as one evidence line: time, speaker and verbatim text."""
        head = self.header()
        return f"{head} {self.text}" if head else self.text


def step_of(item: Item) -> int | None:
    """The agent step an item belongs to (``meta['step']``, an int as the importers and the
    store's step filter use it), else None."""
    step = item.meta.get("step")
    return step if isinstance(step, int) and not isinstance(step, bool) else None


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
    """One retrieved item, the item itself, and where it sits in every view."""

    item: Item
    score: float
    rank: int
    source: HitSource
    piece: int | None
    unit: int
    blocks: tuple[int, ...]
    bm25_score: float | None = None
    dense_score: float | None = None
    excerpt: str | None = None
    """For a very long item, the part of it the evidence context shows (its best piece)."""

    @property
    def item_id(self) -> str:
        return self.item.id

    @property
    def seq(self) -> int:
        return self.item.seq


@dataclass(frozen=True, slots=True)
class Evidence:
    """The result of the shared retrieval prefix: hits, best first, each with its item.

    Iterating gives the hits in rank order. ``items`` are the same items in chronological
    order; ``text`` renders them one per line with time and speaker, which is the evidence
    context ``C_f`` every path starts from.
    """

    query: str
    scope: str
    hits: tuple[Hit, ...]
    timings_ms: dict[str, float]
    notice: str = ""
    """What the prefix had to say about these hits (a reranker that failed: the fused order)."""

    @property
    def items(self) -> tuple[Item, ...]:
        return tuple(sorted((h.item for h in self.hits), key=lambda it: it.seq))

    @property
    def text(self) -> str:
        """One line per hit in time order; a very long item shows its excerpt, not all of it."""
        lines = []
        for h in sorted(self.hits, key=lambda h: h.seq):
            if h.excerpt is None:
                lines.append(h.item.render())
            else:
                head = h.item.header()
                lines.append(f"{head} … {h.excerpt} …" if head else f"… {h.excerpt} …")
        return "\n".join(lines)

    def top(self, k: int) -> Evidence:
        """The first ``k`` hits as an Evidence of their own."""
        return Evidence(self.query, self.scope, self.hits[:k], self.timings_ms, self.notice)

    def __iter__(self) -> Iterator[Hit]:
        return iter(self.hits)

    def __len__(self) -> int:
        return len(self.hits)


def canonical_json(value: Any) -> str:
    """JSON text that is the same for equal values: sorted keys, no spaces, unicode as is."""
    return json.dumps(value, ensure_ascii=False, sort_keys=True, separators=(",", ":"))


def same_json(have: Any, want: Any) -> bool:
    """Equality of two JSON values as a meta filter means it: same JSON type (``true`` is not
    ``1``), numbers by value, objects and arrays by content."""
    if want is None or isinstance(want, bool):
        return have is want
    if isinstance(want, (int, float)):
        return isinstance(have, (int, float)) and not isinstance(have, bool) and have == want
    if isinstance(want, str):
        return isinstance(have, str) and have == want
    return isinstance(have, (dict, list)) and canonical_json(have) == canonical_json(want)


@dataclass(frozen=True, slots=True)
class Filter:
    """Which items of a scope a read may see; every field given must match (AND).

    ``since`` / ``until`` bound ``observed_ts`` (UTC seconds, ``since <= t < until``): an item
    whose time could not be read is outside any time range. ``meta`` matches top-level keys of
    an item's meta by equality. ``before_seq`` keeps items older than that position (the
    renderer uses it to keep the recent window out of the ranking).
    """

    session: str | None = None
    speaker: str | None = None
    kind: str | None = None
    role: str | None = None
    agent: str | None = None
    since: float | None = None
    until: float | None = None
    meta: Mapping[str, Any] | None = None
    before_seq: int | None = None

    @property
    def empty(self) -> bool:
        return all(getattr(self, f) is None for f in self.__slots__)

    def matches(self, item: Item) -> bool:
        """The same test the store applies in SQL, for items already in hand."""
        for name in ("session", "speaker", "kind", "role", "agent"):
            want = getattr(self, name)
            if want is not None and getattr(item, name) != want:
                return False
        if self.since is not None or self.until is not None:
            ts = item.observed_ts
            if ts is None or (self.since is not None and ts < self.since) or (
                    self.until is not None and ts >= self.until):
                return False
        if self.meta:
            for key, value in self.meta.items():
                if key not in item.meta or not same_json(item.meta[key], value):
                    return False
        return self.before_seq is None or item.seq < self.before_seq


@dataclass(frozen=True, slots=True)
class ForgetReport:
    """What one ``forget`` removed: counts only, never content."""

    scope: str
    items: int
    pieces: int
    vectors: int
    records: int
    links: int
    checkpointed: bool
    """SQLite: True when the write-ahead log was folded into the database file and emptied, so
    no copy of the forgotten pages is left in it. PostgreSQL: True when VACUUM (with ANALYZE,
    so the planner's statistics drop the forgotten values) ran on every touched table; its
    write-ahead log and backups keep old pages until the server recycles them."""
    scrubbed: bool = False
    """True when the database was rewritten after the deletion (SQLite ``VACUUM``), so no stale
    copy of a forgotten row is left in the free space of a page. Zeroing freed cells is not
    enough: when a page splits or merges, SQLite moves rows out and leaves their old bytes in
    the page's unused area. False when the store was opened with ``vacuum_on_forget=False``, the
    rewrite failed (the deletion itself stands), and always on PostgreSQL, whose VACUUM frees
    dead rows without overwriting them."""


@dataclass(frozen=True, slots=True)
class AuditEntry:
    """One audit line: when, what kind of deletion, and sha256 digests of the names and ids
    deleted (so a deletion can be proven for a given id without keeping the id)."""

    at: float
    action: str
    scope_sha256: str
    ids_sha256: tuple[str, ...]
    counts: dict[str, int]


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
    encoder: str = ""


@dataclass(frozen=True, slots=True)
class ContextPart:
    """One included part of a rendered context and why it is there (part of the receipt)."""

    kind: Literal["record", "raw", "excerpt", "piece", "recent", "notice"]
    unit: int | None
    seqs: tuple[int, ...]
    tokens: int
    """Tokens of the part's own lines as the renderer charged them, each line with its newline
    counted apart and a cut line by an estimate of its pieces; the whole context is counted
    exactly (``Context.tokens``, the figure the budget holds), and the parts' sum can differ
    from it by a few tokens either way (a newline sharing a token with its neighbour, a piece's
    estimate)."""
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
