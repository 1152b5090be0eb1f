"""Records and links: the write-once side of budgeted rendering.

When a unit closes (a later item started a new unit), it gets one **record**, a single
timeline line saying when, who and what, and up to m **content links** to the most similar
earlier units. Both are written once and never changed, so a rendered memory can always be
rebuilt from the item log plus these lines. Temporal links (unit j to j +/- 1) are implicit.

The record is written by a fixed rule by default, because a timeline must not depend on a model
being reachable at write time. A caller may configure an LLM writer (``Memory(record_writer=...)``);
when it fails, the rule writes the record instead and the store
says so (``writer = 'rule'``).

:class:`RecordIndex` also keeps, per scope, the record state the renderer reads on every call:
record texts with their token counts, and the link lists. Nothing here is recomputed per query.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np
from cachetools import LRUCache

from ._config import StoreConfig
from ._retrieve import Retriever, ScopeIndex
from ._store.base import Store
from ._text import STOPWORDS, sentence_spans, words
from ._tokens import count_tokens, encode, encoding
from ._types import Item, Unit, step_of

RecordWriter = Callable[[Sequence[Item]], str]
"""Writes the gist of one closed unit from its items (e.g. one LLM call); may raise."""

_SPACE = re.compile(r"\s+")

RECORD_PREFIX = "# "
"""Marks a record line in a rendered memory, so a reader tells records from item lines."""


def record_line(text: str) -> str:
    """A record as it appears in a rendered memory."""
    return RECORD_PREFIX + text


_HEAD = re.compile(r"^\[[^\]]*\](?: [^:\[\]]{1,80}(?=: ))?")


def header_line(text: str) -> str:
    """The record's when-and-who alone: the header over detail that shows the what verbatim."""
    m = _HEAD.match(text)
    return RECORD_PREFIX + m.group(0) if m else record_line(text)


# -- the fixed rule ----------------------------------------------------------------------------


def _when(items: Sequence[Item]) -> str:
    times = [it.observed_at for it in items if it.observed_at]
    if not times:
        steps = [s for it in items if (s := step_of(it)) is not None]
        if steps:  # an agent's run: its questions name steps, not positions in the log
            lo, hi = min(steps), max(steps)
            return f"[step {lo}]" if lo == hi else f"[steps {lo}-{hi}]"
        return f"[#{items[0].seq}-{items[-1].seq}]"
    if times[0] == times[-1]:
        return f"[{times[0]}]"
    return f"[{times[0]} - {times[-1]}]"


def _who(items: Sequence[Item]) -> str:
    names: list[str] = []
    for it in items:
        name = it.speaker or it.role or it.kind
        if name and name not in names:
            names.append(name)
    if len(names) > 3:
        return ", ".join(names[:3]) + f" +{len(names) - 3}"
    return ", ".join(names)


def _is_content(word: str, names: set[str]) -> bool:
    return len(word) >= 3 and word not in STOPWORDS and not word.isdigit() and word not in names


GIST_CHARS = 100_000
"""The rule reads at most this much of each item: a record is one line, and a huge item must
not make every render of its open unit slow (no chat or agent turn measured here is longer)."""


def _gist(items: Sequence[Item]) -> str:
    """Keywords (most frequent content words) and the first sentence that says something."""
    names = {w for it in items for w in words(it.speaker or "")}
    texts = [it.text[:GIST_CHARS] for it in items]
    counts: dict[str, int] = {}
    first: dict[str, int] = {}
    pos = 0
    for text in texts:
        for w in words(text):
            if _is_content(w, names):
                counts[w] = counts.get(w, 0) + 1
                first.setdefault(w, pos)
                pos += 1
    keywords = sorted(counts, key=lambda w: (-counts[w], first[w]))[:4]
    opening = ""
    for text in texts:
        for s, e in sentence_spans(text):
            sentence = text[s:e]
            if sum(_is_content(w, names) for w in words(sentence)) >= 3:
                opening = sentence
                break
        if opening:
            break
    if not opening:
        opening = texts[0][:GIST_CHARS // 100]
    opening = _SPACE.sub(" ", opening[:GIST_CHARS // 100]).strip()
    return f"{', '.join(keywords)} | {opening}" if keywords else opening


def fit_line(text: str, max_tokens: int) -> str:
    """``text`` on one line, cut at a word boundary with an ellipsis to at most ``max_tokens``."""
    line = _SPACE.sub(" ", text).strip()
    if count_tokens(line) <= max_tokens:
        return line
    ids = encode(line)
    keep = max(max_tokens - 1, 0)
    while keep > 0:
        head = encoding().decode(ids[:keep])
        cut = head.rfind(" ")
        if cut > 0:
            head = head[:cut]
        head = head.rstrip(" ,;:|-") + "…"
        if count_tokens(head) <= max_tokens:
            return head
        keep -= 1
    return ""


def rule_record(items: Sequence[Item], max_tokens: int = 40) -> str:
    """The fixed-rule record of a unit: ``[when] who: keywords | opening sentence``, cut to fit."""
    if not items:
        return ""
    return fit_line(f"{_when(items)} {_who(items)}: {_gist(items)}", max_tokens)


def _writer_record(writer: RecordWriter, items: Sequence[Item], max_tokens: int) -> str:
    """An LLM gist under the same time stamp as rule records; '' when the writer fails."""
    try:
        gist = writer(items)
    except Exception:  # noqa: BLE001 - any writer failure falls back to the rule
        return ""
    if not isinstance(gist, str) or not gist.strip():
        return ""
    first = next((ln for ln in gist.splitlines() if ln.strip()), "")
    return fit_line(f"{_when(items)} {first}", max_tokens)


# -- per-scope state -------------------------------------------------------------------------


@dataclass
class ScopeRecords:
    """Records and links of one scope, extended as the log grows.

    Tied to one :class:`ScopeIndex`: when the retriever starts a scope over (after a forget or
    rebuild), the record state is started over with it.
    """

    index: ScopeIndex
    lock: threading.Lock = field(default_factory=threading.Lock)
    texts: list[str | None] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    """o200k tokens of each stored record's rendered line (0 where a record is missing)."""
    writers: list[str] = field(default_factory=list)
    links_upto: int = -1
    adjacency: dict[int, list[tuple[int, float]]] = field(default_factory=dict)
    """Content links in both directions: unit -> [(other unit, cosine)]."""
    header_cost: LRUCache[str, int] = field(default_factory=lambda: LRUCache(100_000))
    """Tokens of header lines by text (records never change, the open unit's may)."""
    open_record: tuple[int, int, str, int] | None = None
    """(unit, last_seq, text, tokens) of the open unit's on-the-fly record."""

    def set_record(self, unit: int, text: str, writer: str, tokens: int) -> None:
        while len(self.texts) <= unit:
            self.texts.append(None)
            self.tokens.append(0)
            self.writers.append("")
        self.texts[unit], self.tokens[unit], self.writers[unit] = text, tokens, writer


RULE = "rule"
"""The writer name stored with a record the fixed rule wrote."""

_Span = TypeVar("_Span")


def _span(unit: Unit) -> tuple[int, int]:
    return unit.first_seq, unit.last_seq


def _units_items(store: Store, scope: str, spans: Sequence[_Span],
                 seqs: Callable[[_Span], tuple[int, int]]) -> Iterator[tuple[_Span, list[Item]]]:
    """Each of ``spans`` (ordered by position) with the items it covers (first to last seq, both
    included), read 256 at a time; spans whose items are all gone are skipped."""
    for g in range(0, len(spans), 256):
        group = spans[g:g + 256]
        items = store.items(scope, start=seqs(group[0])[0], end=seqs(group[-1])[1] + 1)
        by_seq = {it.seq: it for it in items}
        for span in group:
            first, last = seqs(span)
            unit_items = [by_seq[q] for q in range(first, last + 1) if q in by_seq]
            if unit_items:
                yield span, unit_items


def content_links(vecs: np.ndarray, unit: int, m: int) -> list[tuple[int, float]]:
    """Top-``m`` earlier units by cosine to ``unit`` (its temporal neighbour excluded)."""
    if m <= 0 or unit < 2 or vecs.shape[1] == 0:
        return []
    sims = vecs[:unit - 1] @ vecs[unit]
    order = sorted(range(sims.shape[0]), key=lambda j: (-float(sims[j]), -j))[:m]
    return [(j, round(float(sims[j]), 6)) for j in order if sims[j] > 0]


class RecordIndex:
    """Writes each closed unit's record and links once, and serves them to the renderer."""

    def __init__(self, store: Store, retriever: Retriever, config: StoreConfig,
                 writer: RecordWriter | None = None) -> None:
        self.store = store
        self.retriever = retriever
        self.config = config
        self.writer = writer
        """Writes a unit's timeline line once when it closes; None uses the fixed rule."""
        self._scopes: dict[str, ScopeRecords] = {}
        self._lock = threading.Lock()
        retriever.on_reset(self._drop)

    def _drop(self) -> None:
        with self._lock:
            self._scopes.clear()

    def state(self, scope: str) -> tuple[ScopeIndex, ScopeRecords]:
        """The scope's index and record state, both in step with the store."""
        idx = self.retriever.index(scope)
        with self._lock:
            st = self._scopes.get(scope)
            if st is None or st.index is not idx:
                st = self._scopes[scope] = ScopeRecords(idx)
        with st.lock:
            self._load(st, scope, idx.views.units)
        return idx, st

    def _load(self, st: ScopeRecords, scope: str, units: Sequence[Unit]) -> None:
        """Pick up records and links written since the last look (by us or another process).

        Reading starts at the first unit we hold no record for, so a record another writer stored
        first is not skipped. A stored record whose item span differs from the unit's is ignored
        (it cannot happen while the store config is checked on open); the rule stands in for it.
        """
        first_missing = next((i for i, t in enumerate(st.texts) if t is None), len(st.texts))
        for unit, first, last, text, writer in self.store.records(scope, after_unit=first_missing - 1):
            if unit < len(units) and (units[unit].first_seq, units[unit].last_seq) != (first, last):
                continue
            st.set_record(unit, text, writer, count_tokens(record_line(text)))
        for src, dst, kind, weight in self.store.links(scope, after_src=st.links_upto):
            if kind == "content":
                st.adjacency.setdefault(src, []).append((dst, weight))
                st.adjacency.setdefault(dst, []).append((src, weight))
            st.links_upto = max(st.links_upto, src)

    def open_record(self, scope: str, st: ScopeRecords, unit: Unit) -> tuple[str, int]:
        """A rule record for the still-open unit (text, line tokens), made on the fly, never stored."""
        with st.lock:
            cached = st.open_record
            if cached is not None and cached[0] == unit.index and cached[1] == unit.last_seq:
                return cached[2], cached[3]
        items = self.store.items(scope, start=unit.first_seq, end=unit.last_seq + 1)
        text = rule_record(items, self.config.record_tokens)
        tokens = count_tokens(record_line(text))
        with st.lock:
            st.open_record = (unit.index, unit.last_seq, text, tokens)
        return text, tokens

    def lines(self, scope: str, st: ScopeRecords, units: Sequence[Unit],
              allowed: set[int] | None = None, end: int | None = None) -> tuple[list[str], list[int]]:
        """Record line and its token cost (newline included) for each of ``units``.

        With ``allowed`` (the seqs a filter lets through), a unit that also holds other items
        gets a rule record made from its allowed items only: a stored gist may quote the rest.
        With ``end`` (a render "as of" seq ``end``), a unit that runs past it gets a rule record
        of its items before ``end``: later items do not exist yet at that moment.
        """
        with st.lock:
            texts = list(st.texts[:len(units)])
            costs = list(st.tokens[:len(units)])
        texts += [None] * (len(units) - len(texts))
        costs += [0] * (len(units) - len(costs))
        lines: list[str] = []
        out: list[int] = []
        for u, text in zip(units, texts, strict=True):
            last = u.last_seq if end is None else min(u.last_seq, end - 1)
            if last < u.last_seq or (
                    allowed is not None and not all(q in allowed for q in range(u.first_seq, last + 1))):
                mine = [q for q in range(u.first_seq, last + 1) if allowed is None or q in allowed]
                text = rule_record(self.store.items(scope, mine), self.config.record_tokens) if mine else "…"
                costs[u.index] = count_tokens(record_line(text))
            elif text is None:  # the open unit (or a record not written yet): a rule record on the fly
                if not u.closed:
                    text, tok = self.open_record(scope, st, u)
                else:
                    text = rule_record(self.store.items(scope, start=u.first_seq, end=u.last_seq + 1),
                                       self.config.record_tokens)
                    tok = count_tokens(record_line(text))
                costs[u.index] = tok
            lines.append(record_line(text))
            out.append(costs[u.index] + 1)
        return lines, out

    def write_new(self, scope: str) -> int:
        """Write records and links for units closed since the last call; return how many.

        Idempotent and safe to race: a record another writer stored first is kept as it is.
        """
        idx, st = self.state(scope)
        units = [u for u in idx.views.units if u.closed]
        with st.lock:
            pending = [u for u in units if u.index >= len(st.texts) or st.texts[u.index] is None]
        vecs = idx.unit_vectors(len(idx.views.units))
        written = 0
        for u, unit_items in _units_items(self.store, scope, pending, _span):
            text, who = "", RULE
            if self.writer is not None:
                text = _writer_record(self.writer, unit_items, self.config.record_tokens)
                who = str(getattr(self.writer, "name", "llm")) if text else RULE
            if not text:
                text = rule_record(unit_items, self.config.record_tokens)
            links = [(dst, "content", w)
                     for dst, w in content_links(vecs, u.index, self.config.links_per_unit)]
            if self.store.put_record(scope, u.index, u.first_seq, u.last_seq, text, who, links,
                                     generation=idx.generation):
                written += 1
                with st.lock:
                    st.set_record(u.index, text, who, count_tokens(record_line(text)))
            elif self.store.generation() != idx.generation:
                # A forget or rebuild ran while this unit's items were read: what was read may
                # be gone. Its own write_new writes the records of what remains.
                break
        with st.lock:
            self._load(st, scope, idx.views.units)
        return written

    def stale(self, scope: str, records: Sequence[tuple[int, int, int, str, str]]) -> int:
        """How many of ``records`` (the store's rows) the fixed rule wrote differently from how it
        writes them now: records are written once, so an older version's lines stay."""
        ruled = [r for r in records if r[4] == RULE]
        return sum(rule_record(unit_items, self.config.record_tokens) != r[3]
                   for r, unit_items in _units_items(self.store, scope, ruled, lambda r: (r[1], r[2])))

    def summary(self, scope: str) -> dict[str, Any]:
        """Counts for receipts and tests: records, writers, content links."""
        _idx, st = self.state(scope)
        with st.lock:
            writers: dict[str, int] = {}
            for w in st.writers:
                if w:
                    writers[w] = writers.get(w, 0) + 1
            links = sum(len(v) for v in st.adjacency.values()) // 2
            return {"records": sum(t is not None for t in st.texts), "writers": writers, "links": links}
