"""Budgeted rendering: a fresh memory per call that never exceeds its token budget.

The rendered memory is one chronological stream: record lines (``# [when] who: what``) of the
units on the timeline, and under a unit's record the verbatim detail recovered for it. The rule
that fills a budget ``B`` (FlexA-Mem, our reading in docs/render.md):

1. cap ``P = floor(prompt_cap * B)``; in agent mode the newest items are kept verbatim first, up
   to ``recent_share * B``, and leave the rest of the memory;
2. unit priorities: seeds are the top-k units by a seed score mixing the unit's cosine to the
   query with the prefix hits (BM25 + dense) inside it; priority spreads over temporal and
   content links with discount lambda per hop. The hits come from the query's one
   :class:`~suffice._retrieve.Ranking`: the renderer never ranks on its own;
3. timeline: up to ``rho * M`` tokens of records, all of them when they fit, else by priority
   (ties to the newer unit) with an elision line for each gap; unused tokens go to detail;
4. detail by mode: ``unit`` (for each unit by priority an excerpt of about E tokens grown by
   whole pieces around its best piece, then widened to the whole raw unit while that fits; or,
   with ``raw_first``, the whole unit if it fits, else the excerpt, else skip), ``piece``
   (verbatim pieces in fused score order), ``unit+piece`` (both in turn) or ``timeline``;
   a unit with detail is shown under a short header (when and who: the detail says what);
5. assemble, count the exact o200k tokens of the final string and, if the concatenation came
   out over the cap, drop the lowest-priority part and count again.

No model is called except the query embedding (inside the ranking); the same store, query and
budget give the same context. A filter narrows the render to matching items: their units'
records on the timeline, their text as detail.
"""

from __future__ import annotations

import bisect
import math
import re
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

import numpy as np
from cachetools import LRUCache

from ._config import RenderConfig, RenderMode, RetrievalConfig
from ._errors import BudgetError, ConfigError, StoreError
from ._records import RECORD_PREFIX, RecordIndex, header_line
from ._retrieve import Ranking, Retriever, ScopeIndex
from ._steps import StepRef, cited_steps
from ._store.base import Store
from ._tokens import count_tokens
from ._types import Context, ContextPart, Filter, Item, Unit

MODES: tuple[RenderMode, ...] = ("unit", "piece", "unit+piece", "timeline")
RECENT_LABEL = "# Recent items"
EXACT_PIECES = 64
"""Items of up to this many pieces have partial lines counted exactly; longer ones estimated."""
MAX_MISSES = 32
"""Pieces of one many-piece item tried in a row without one fitting before moving on."""
MAX_BUDGET = 10_000_000
"""Largest budget a render takes, in tokens."""
STEP_LINE_TOKENS = 12
"""Tokens a step-addressed item's line adds to its text (its `[step N] speaker:` head, newline), for
the room kept."""
UNIT_HEAD_TOKENS = 16
"""Room for the header line over each unit that shows a named step's items (``# [steps 4-9] ...``)."""
STEP_HITS = 100
"""With step references, up to this many of the ranking's next hits (then BM25's and dense's
deeper items) follow them whole, before unit recovery, and the timeline leaves them room too: a
question that addresses steps wants evidence more than an overview. Chosen on the first 10
AMA-Bench episodes (10, 30 and 100 tried; room for them or not)."""
STEP_PRIORITY = 10.0
"""Step-addressed detail outranks every unit's priority (at most 1) when parts must be dropped."""
_HEADER_TIME = re.compile(r"^# \[([^\]]*)\] ")
CUT = "…"


def _marker(n: int) -> str:
    return f"{CUT} {n} record{'s' if n != 1 else ''} omitted"


@dataclass(slots=True)
class _Part:
    """One droppable part of the context while it is being built."""

    kind: Literal["record", "raw", "excerpt", "piece", "recent"]
    unit: int
    priority: float
    reason: str
    seqs: tuple[int, ...] = ()
    pieces: dict[int, set[int]] = field(default_factory=dict)
    """seq -> indices of that item's pieces this part shows (detail parts)."""
    tokens: int = 0


class _Lines:
    """Item lines of the detail: which pieces of which item are shown, and what that costs."""

    def __init__(self, cache: _ScopeCache, unit_of: Sequence[int] = (),
                 header_time: Sequence[str | None] = ()) -> None:
        self.cache = cache
        self.items: dict[int, Item] = {}
        self.pieces: dict[int, list[tuple[int, int, int]]] = {}
        """Items and piece spans this render has read (from the scope cache or the store)."""
        self.unit_of = unit_of
        self.header_time = header_time
        """Per unit: the time its record header states, which its item lines need not repeat."""
        self.shown: dict[int, set[int]] = {}
        self._cost: dict[tuple[int, frozenset[int]], int] = {}
        self._piece_tokens: dict[tuple[int, int], int] = {}
        self._spans: dict[int, dict[int, tuple[int, int]]] = {}

    def head(self, item: Item) -> str:
        if item.observed_at and self.header_time:
            u = self.unit_of[item.seq]
            if u < len(self.header_time) and self.header_time[u] == item.observed_at:
                return item.header(with_time=False)
        return item.header()

    def all_pieces(self, seq: int) -> list[tuple[int, int, int]]:
        return self.pieces.get(seq) or [(0, 0, len(self.items[seq].text))]

    def line(self, seq: int, shown: set[int]) -> str:
        """The item's line showing only ``shown`` pieces; cuts are marked with an ellipsis."""
        item = self.items[seq]
        spans = self.all_pieces(seq)
        if len(shown) >= len(spans):
            head = self.head(item)
            return f"{head} {item.text}" if head else item.text
        runs: list[list[int]] = []  # [start, end] of consecutive shown pieces
        prev = False
        for idx, start, end in spans:
            on = idx in shown
            if on and prev:
                runs[-1][1] = end
            elif on:
                runs.append([start, end])
            prev = on
        body = f" {CUT} ".join(item.text[a:b].strip() for a, b in runs)
        if spans[0][0] not in shown:
            body = f"{CUT} {body}"
        if spans[-1][0] not in shown:
            body = f"{body} {CUT}"
        head = self.head(item)
        return f"{head} {body}" if head else body

    def cost(self, seq: int, shown: set[int]) -> int:
        """Tokens of the item's line plus its newline (0 when nothing of it is shown)."""
        if not shown:
            return 0
        if len(shown) >= len(self.all_pieces(seq)):
            # A whole item: its stored token count plus its head's, and one for the space when
            # the text does not start with a letter (a letter merges with the space). Checked on
            # 21k LoCoMo, BEAM and PyPI lines: exact for 97%, otherwise off by one either way;
            # the exact count of the assembled context settles the rest.
            item = self.items[seq]
            if not self.head(item):
                return item.tokens + 1
            return self._head_tokens(item) + item.tokens + (0 if item.text[:1].isalpha() else 1) + 1
        if len(self.all_pieces(seq)) > EXACT_PIECES:
            return self._estimate(seq, shown)
        key = (seq, frozenset(shown))
        c = self._cost.get(key)
        if c is None:
            c = self._cost[key] = count_tokens(self.line(seq, shown)) + 1
        return c

    def _estimate(self, seq: int, shown: set[int]) -> int:
        """Tokens of a partly shown line of a many-piece item, from its pieces' own counts.

        Counting the whole line again for every piece tried made a render of one huge item
        quadratic. A piece's tokens plus two per cut (the ellipsis and its space) bound the
        line from above in practice; the exact count of the assembled context settles the rest.
        """
        item = self.items[seq]
        spans = self._spans.get(seq)
        if spans is None:
            spans = self._spans[seq] = {idx: (a, b) for idx, a, b in self.all_pieces(seq)}
        total = self._head_tokens(item) + 1
        runs = 0
        prev = None
        for q in sorted(shown):
            key = (seq, q)
            n = self._piece_tokens.get(key)
            if n is None:
                a, b = spans[q]
                n = self._piece_tokens[key] = count_tokens(item.text[a:b].strip())
            total += n
            if prev is None or q != prev + 1:
                runs += 1
            prev = q
        return total + 2 * (runs + 1)

    def _head_tokens(self, item: Item) -> int:
        """Tokens of the item's head (``[time] speaker:``), shared by every render of the scope."""
        head = self.head(item)
        if not head:
            return 0
        with self.cache.lock:
            h = self.cache.head_cost.get(head)
        if h is None:
            h = count_tokens(head)
            with self.cache.lock:
                self.cache.head_cost[head] = h
        return h

    def delta(self, seq: int, add: Iterable[int]) -> int:
        cur = self.shown.get(seq, set())
        return self.cost(seq, cur | set(add)) - self.cost(seq, cur)

    def show(self, seq: int, add: Iterable[int]) -> None:
        self.shown.setdefault(seq, set()).update(add)


class _Stream:
    """Which units have a record line, with the exact cost of the elision lines between them."""

    def __init__(self, n_units: int, record_cost: Sequence[int], all_listed: bool,
                 header_cost: Callable[[int], int] | None = None) -> None:
        self.n = n_units
        self.record_cost = record_cost
        self.header_cost = header_cost or (lambda u: record_cost[u])
        self.listed: list[int] = list(range(n_units)) if all_listed else []
        self.listed_set = set(self.listed)
        self.detailed: set[int] = set()
        """Units with detail: their line is the short header, not the whole record."""
        self._marker_cost: dict[int, int] = {}

    def marker_cost(self, n: int) -> int:
        if n <= 0:
            return 0
        c = self._marker_cost.get(n)
        if c is None:
            c = self._marker_cost[n] = count_tokens(_marker(n)) + 1
        return c

    def add_cost(self, u: int) -> int:
        """Tokens that listing unit ``u`` adds: its record and the change in elision lines."""
        if u in self.listed_set:
            return 0
        i = bisect.bisect_left(self.listed, u)
        left = self.listed[i - 1] if i > 0 else -1
        right = self.listed[i] if i < len(self.listed) else self.n
        before = self.marker_cost(right - left - 1)
        after = self.marker_cost(u - left - 1) + self.marker_cost(right - u - 1)
        return self.record_cost[u] + after - before

    def add(self, u: int) -> None:
        if u not in self.listed_set:
            bisect.insort(self.listed, u)
            self.listed_set.add(u)

    def detail_cost(self, u: int) -> int:
        """Tokens that giving unit ``u`` detail adds to its line (negative: header is shorter)."""
        if u in self.detailed:
            return 0
        if u in self.listed_set:
            return self.header_cost(u) - self.record_cost[u]
        return self.add_cost(u) - self.record_cost[u] + self.header_cost(u)

    def add_detail(self, u: int) -> None:
        self.add(u)
        self.detailed.add(u)


@dataclass(slots=True)
class _Scores:
    """Per-call relevance: unit priorities and fused piece scores."""

    priority: dict[int, float]
    reason: dict[int, str]
    piece_score: dict[tuple[int, int], float]
    item_cos: dict[int, float]


def _check_budget(budget_tokens: object) -> int:
    if isinstance(budget_tokens, bool) or not isinstance(budget_tokens, (int, np.integer)):
        raise BudgetError(f"budget_tokens must be an integer number of tokens, got {budget_tokens!r}")
    b = int(budget_tokens)
    if b < 0:
        raise BudgetError(f"budget_tokens must not be negative, got {b}; pass 0 for an empty context")
    if b > MAX_BUDGET:
        raise BudgetError(f"budget_tokens is {b}; at most {MAX_BUDGET:,} (no model reads more)")
    return b


def _empty(budget: int, cap: int, mode: str, notice: str, timings: dict[str, float]) -> Context:
    return Context(text="", tokens=0, budget=budget, cap=cap, mode=mode, parts=(), notice=notice,
                   timings_ms=timings)


class _ScopeCache:
    """Items, piece spans and head costs read by recent renders of one scope (all immutable
    while the scope's index lives), bounded, and safe to share between threads."""

    def __init__(self, index: ScopeIndex, size: int = 100_000) -> None:
        self.index = index
        self.lock = threading.Lock()
        self.items: LRUCache[int, Item] = LRUCache(size)
        self.pieces: LRUCache[int, list[tuple[int, int, int]]] = LRUCache(size)
        self.head_cost: LRUCache[str, int] = LRUCache(size)


@dataclass(slots=True)
class _Call:
    """What one render call reads: where, with which knobs, and which items it may show."""

    store: Store
    scope: str
    idx: ScopeIndex
    cache: _ScopeCache
    config: RenderConfig
    rrf_k: int
    dense_weight: float
    piece_max_tokens: int
    allowed: set[int] | None
    """Seqs a filter lets through (None: all)."""


class Renderer:
    """Builds the budgeted memory of a scope for a query, from the query's one ranking."""

    def __init__(self, store: Store, retriever: Retriever, records: RecordIndex) -> None:
        self.store = store
        self.retriever = retriever
        self.records = records
        self._caches: dict[str, _ScopeCache] = {}
        self._lock = threading.Lock()
        retriever.on_reset(self._drop)

    def _drop(self) -> None:
        with self._lock:
            self._caches.clear()

    def _cache(self, scope: str, idx: ScopeIndex) -> _ScopeCache:
        with self._lock:
            cache = self._caches.get(scope)
            if cache is None or cache.index is not idx:  # the scope was started over
                cache = self._caches[scope] = _ScopeCache(idx)
            return cache

    def ranking(self, scope: str, query: str, budget: int, config: RenderConfig,
                retrieval: RetrievalConfig, flt: Filter | None = None) -> Ranking:
        """The ranking a render of ``budget`` tokens needs (deep enough in pieces)."""
        return self.retriever.rank(scope, query, retrieval, piece_depth=config.depth(budget), flt=flt)

    def render(self, scope: str, query: str, budget_tokens: int, *, config: RenderConfig,
               retrieval: RetrievalConfig, ranking: Ranking | None = None, flt: Filter | None = None,
               agent: bool = False) -> Context:
        """Render the memory of ``scope`` for ``query`` within ``budget_tokens`` o200k tokens.

        ``ranking`` is the query's ranking when the caller has it already (the engine does);
        otherwise one is made here. In agent mode the newest items are kept verbatim first.
        """
        t0 = time.perf_counter()
        mode = config.mode
        if mode not in MODES:
            raise ConfigError(f"unknown render mode {mode!r}; use one of {', '.join(MODES)}")
        budget = _check_budget(budget_tokens)
        cap = math.floor(budget * config.prompt_cap)
        timings: dict[str, float] = {}
        idx, st = self.records.state(scope)
        units = list(idx.views.units)
        n_items = idx.views.size if ranking is None else min(idx.views.size, ranking.size)
        if flt is not None and flt.before_seq is not None:
            # "As of" an earlier moment (an agent's checkpoint): later items do not exist yet.
            n_items = max(0, min(n_items, flt.before_seq))
        allowed = None
        if flt is not None and not replace(flt, before_seq=None).empty:
            allowed = set(self.store.filter_seqs(scope, replace(flt, before_seq=n_items)).tolist())
        call = _Call(self.store, scope, idx, self._cache(scope, idx), config,
                     retrieval.rrf_k, retrieval.dense_weight, self.records.config.piece_max_tokens, allowed)
        timings["sync_ms"] = _ms(t0)
        if cap <= 0 or n_items == 0 or (allowed is not None and not allowed):
            what = "no item matches the filter" if allowed is not None and n_items else \
                f"budget {budget} leaves no room (cap {cap} tokens)"
            return _empty(budget, cap, mode, f"{what}; nothing rendered", timings)

        # 1. Recent window (agent mode): newest items verbatim, outside the rendered memory.
        recent: list[_Part] = []
        recent_items: list[Item] = []
        first_recent = n_items
        if agent:
            window = math.floor(config.recent_share * budget)
            if config.steps_over_recent and retrieval.step_refs and cited_steps(query):
                # The query names steps: they outrank the newest items, so the window gives way
                # to them (their items by the store's step filter; the ranking comes after).
                upto = replace(flt or Filter(), before_seq=n_items)
                named_items = self.retriever.named_step_items(scope, query, upto)
                named_items = [q for q in named_items if allowed is None or q in allowed]
                # Their lines as shown ([step N] head and all), not their text's count.
                need = sum(count_tokens(it.render()) + 1 for it in self.store.items(scope, named_items))
                need += UNIT_HEAD_TOKENS * len({idx.views.unit_of[q] for q in named_items})
                window = max(0, min(window, cap - need))
            recent_items, recent = _recent_window(call, n_items, window, cap)
            if recent_items:
                first_recent = recent_items[0].seq
        recent_cost = sum(p.tokens for p in recent) + (count_tokens(RECENT_LABEL) + 1 if recent else 0)
        memory_budget = cap - recent_cost
        # Units with at least one item outside the window take part in the rendered memory.
        n_units = sum(1 for u in units if u.first_seq < first_recent)
        eligible = None
        if allowed is not None:
            unit_of = idx.views.unit_of
            eligible = {unit_of[q] for q in allowed if q < first_recent}

        # 2. Relevance, from the query's ranking.
        t1 = time.perf_counter()
        if ranking is None and query.strip():
            # The recent window is shown whole below: rank only what lies before it.
            before = flt if not agent else replace(flt or Filter(), before_seq=first_recent)
            ranking = self.ranking(scope, query, budget, config, retrieval, before)
            timings["rank_ms"] = _ms(t1)
        scores = _score(call, ranking, units[:n_units], agent, first_recent, config.depth(budget), eligible,
                        st.adjacency)
        timings["score_ms"] = _ms(t1)

        # 3. Timeline.
        t2 = time.perf_counter()
        rec_text, rec_cost = self.records.lines(
            scope, st, units[:n_units], allowed, end=n_items if n_items < idx.views.size else None)
        timeline_cap = (memory_budget if mode == "timeline"
                        else math.floor(config.timeline_share * memory_budget))
        # Items the query addressed by step come before any other detail, then its ranked hits:
        # the timeline leaves them room (the query named them, so they are what it needs).
        refs = [r for r in (ranking.refs if ranking is not None else ())
                if r.seq < first_recent and (allowed is None or r.seq in allowed)]
        hits: list[StepRef] = []
        # When the query addressed steps (not only a latest state), the rest of the fused
        # ranking follows them whole; a state question's one newest match goes before the
        # usual detail instead (on SWE-bench the hits crowded out whole units: §9).
        if any(r.reason.startswith("step ") for r in refs) and ranking is not None and STEP_HITS:
            named = {r.seq for r in refs}
            # The ranking's hits, then deeper: BM25's items, then dense's, in their order.
            deeper = [*ranking.seqs, *(q for q, _p, _s in ranking.pieces), *(q for q, _c in ranking.dense)]
            hits = [StepRef(q, -1, f"hit {i + 1}") for i, q in enumerate(dict.fromkeys(
                q for q in deeper if q not in named and q < first_recent
                and (allowed is None or q in allowed)))][:STEP_HITS]
        if refs and mode != "timeline":
            need = sum(idx.views.tokens[r.seq] + STEP_LINE_TOKENS for r in refs + hits)
            timeline_cap = max(0, min(timeline_cap, memory_budget - need))

        def head_of(u: int) -> str:
            return header_line(rec_text[u][len(RECORD_PREFIX):]) if config.short_headers else rec_text[u]

        def head_cost(u: int) -> int:
            h = head_of(u)
            with st.lock:
                c = st.header_cost.get(h)
            if c is None:
                c = count_tokens(h) + 1
                with st.lock:
                    st.header_cost[h] = c
            return c

        stream, timeline = _timeline(n_units, rec_cost, scores, max(timeline_cap, 0), memory_budget,
                                     head_cost, eligible)
        used = sum(rec_cost[u] for u in stream.listed) + _markers_cost(stream)
        detail_left = memory_budget - used
        timings["timeline_ms"] = _ms(t2)

        # 4. Detail.
        t3 = time.perf_counter()
        detail: list[_Part] = []
        header_time: list[str | None] = []
        if not config.repeat_time:
            for line in rec_text:
                m = _HEADER_TIME.match(line)
                header_time.append(m.group(1) if m else None)
        lines = _Lines(call.cache, idx.views.unit_of, header_time)
        if refs and mode != "timeline" and detail_left > 0:
            detail_left = _step_recovery(call, refs, scores, stream, lines, detail, detail_left)
            if hits:
                detail_left = _step_recovery(call, hits, scores, stream, lines, detail, detail_left,
                                             excerpts=False, base=STEP_PRIORITY - 1)
        if mode in ("unit", "unit+piece") and detail_left > 0:
            detail_left = _unit_recovery(call, units[:n_units], scores, stream, lines, detail,
                                         detail_left, first_recent)
        if mode in ("piece", "unit+piece") and detail_left > 0:
            detail_left = _piece_recovery(call, scores, stream, lines, detail, detail_left, first_recent)
        timings["detail_ms"] = _ms(t3)

        # 5. Assemble, count exactly, drop the lowest-priority part while over the cap.
        t4 = time.perf_counter()
        ctx = _assemble(budget, cap, mode, timeline, detail, recent, recent_items, lines, rec_text,
                        rec_cost, head_of, head_cost, n_units, timings)
        self.retriever.check_unchanged(idx)  # every item above was read at the same numbering
        timings["assemble_ms"] = _ms(t4)
        timings["total_ms"] = _ms(t0)
        # What the ranking had to say (a reranker that failed) is the render's to say too.
        said = "; ".join(n for n in (ctx.notice, ranking.notice if ranking is not None else "") if n)
        return replace(ctx, timings_ms=timings, notice=said)


def _ms(t0: float) -> float:
    return (time.perf_counter() - t0) * 1e3


# -- recent window -----------------------------------------------------------------------------


def _recent_window(call: _Call, n_items: int, window: int, cap: int) -> tuple[list[Item], list[_Part]]:
    """Newest items, whole and verbatim, while their lines fit ``window`` (and the cap)."""
    limit = min(window, cap) - (count_tokens(RECENT_LABEL) + 1)
    if limit <= 0:
        return [], []
    views = call.idx.views
    # Text tokens under-count a line, so these items surely hold every one that can fit.
    candidates = range(n_items - 1, -1, -1) if call.allowed is None else sorted(call.allowed, reverse=True)
    wanted: list[int] = []
    total = 0
    for q in candidates:
        if total > limit:
            break
        wanted.append(q)
        total += views.tokens[q]
    items = call.store.items(call.scope, wanted)
    chosen: list[Item] = []
    parts: list[_Part] = []
    used = 0
    for it in reversed(items):
        c = count_tokens(it.render()) + 1
        if used + c > limit:
            break
        used += c
        chosen.append(it)
        parts.append(_Part("recent", views.unit_of[it.seq], float("inf"), "recency", seqs=(it.seq,),
                           tokens=c))
    chosen.reverse()
    parts.reverse()
    return chosen, parts


# -- relevance ---------------------------------------------------------------------------------


def _score(call: _Call, ranking: Ranking | None, units: Sequence[Unit], agent: bool, first_recent: int,
           depth: int, eligible: set[int] | None,
           adjacency: dict[int, list[tuple[int, float]]]) -> _Scores:
    """Seed units, spread priority over links, and score candidate pieces (BM25 + dense, RRF),
    all from the ranking; items of the recent window and units a filter excludes take no part."""
    n_units = len(units)
    priority: dict[int, float] = {}
    reason: dict[int, str] = {}
    piece_score: dict[tuple[int, int], float] = {}
    item_cos: dict[int, float] = {}
    if n_units == 0 or ranking is None:
        return _Scores(priority, reason, piece_score, item_cos)
    s, idx, rrf_k = call.config, call.idx, call.rrf_k
    # Unit cosine: it seeds the priorities.
    cos = np.zeros(n_units, dtype=np.float64)
    qvec = ranking.qvec
    if qvec is not None:
        all_vecs = idx.unit_vectors(len(idx.views.units))
        if all_vecs.shape[1]:
            if agent:  # task + newest unit (usually inside the recent window)
                seed_vec = qvec.astype(np.float32) + all_vecs[-1]
                norm = float(np.linalg.norm(seed_vec))
                seed_vec = seed_vec / norm if norm > 0 else seed_vec
                cos = np.maximum(np.einsum("ij,j->i", all_vecs[:n_units], seed_vec), 0.0).astype(np.float64)
            elif ranking.unit_cos is not None and ranking.unit_cos.shape[0] >= n_units:
                cos = ranking.unit_cos[:n_units].astype(np.float64)
            else:
                cos = np.maximum(np.einsum("ij,j->i", all_vecs[:n_units], qvec), 0.0).astype(np.float64)
    # Dense and BM25 candidates outside the recent window, ranked again among themselves.
    dense = [(q, c) for q, c in ranking.dense if q < first_recent][:depth]
    dense_part = {q: call.dense_weight / (rrf_k + 1 + r) for r, (q, _c) in enumerate(dense)}
    item_cos = dict(dense)
    pieces = [(q, p) for q, p, _ in ranking.pieces if q < first_recent][:depth]
    for r, (seq, pidx) in enumerate(pieces):
        piece_score[(seq, pidx)] = 1.0 / (rrf_k + r + 1) + dense_part.get(seq, 0.0)
    for seq, dp in dense_part.items():
        piece_score[(seq, -1)] = dp  # -1: a dense hit, matched as a whole item
    # Seed score per unit: cosine to the unit vector, mixed with the prefix-hit mass inside it
    # (each item counts once, with its best score).
    hit: np.ndarray = np.zeros(n_units, dtype=np.float64)
    if piece_score:
        keys = np.fromiter((k[0] for k in piece_score), dtype=np.int64, count=len(piece_score))
        vals = np.fromiter(piece_score.values(), dtype=np.float64, count=len(piece_score))
        best = np.zeros(int(keys.max()) + 1, dtype=np.float64)
        np.maximum.at(best, keys, vals)
        items_hit = np.flatnonzero(best)
        unit_ids = idx.views.units_array()[items_hit]
        hit = np.bincount(unit_ids, weights=best[items_hit], minlength=n_units)[:n_units]
    if eligible is not None:
        mask = np.zeros(n_units, dtype=bool)
        mask[[u for u in eligible if u < n_units]] = True
        cos, hit = np.where(mask, cos, 0.0), np.where(mask, hit, 0.0)
    w = s.seed_hit_weight
    seed = (1 - w) * (cos / cos.max() if cos.max() > 0 else cos) + w * (
        hit / hit.max() if hit.max() > 0 else hit)
    order = np.lexsort((-np.arange(n_units), -seed))[:s.seeds]
    for u in order:
        if seed[u] > 0:
            priority[int(u)] = float(seed[u])
            reason[int(u)] = f"seed {seed[u]:.2f}"
    # Spread over links: temporal neighbours and content links, discount lambda per hop.
    frontier = dict(priority)
    for _hop in range(s.link_hops):
        nxt: dict[int, float] = {}
        for u in sorted(frontier, key=lambda x: (-frontier[x], -x)):
            p = frontier[u] * s.link_discount
            if p <= 0:
                continue
            linked = [(u - 1, "previous"), (u + 1, "next")]
            linked += [(v, "similar") for v, _w in adjacency.get(u, ())]
            for v, kind in linked:
                if 0 <= v < n_units and p > priority.get(v, 0.0) and (eligible is None or v in eligible):
                    priority[v] = p
                    reason[v] = f"link ({kind}) from unit {u} ({p:.2f})"
                    nxt[v] = p
        frontier = nxt
    return _Scores(priority, reason, piece_score, item_cos)


def _timeline(n_units: int, cost: Sequence[int], scores: _Scores, cap: int, hard_cap: int,
              head_cost: Callable[[int], int], eligible: set[int] | None = None
              ) -> tuple[_Stream, list[_Part]]:
    """All records when they fit in ``cap``, else the highest-priority ones (ties: newer).

    The top record is kept even when the share ``cap`` is too small for it (but the memory
    budget is not): detail under it would need it as a header anyway, and a budget that holds
    one record but no detail then shows the timeline, the last stage before nothing. With a
    filter only ``eligible`` units (those holding a matching item) may be listed.
    """
    if eligible is None and sum(cost) <= cap:
        stream = _Stream(n_units, cost, all_listed=True, header_cost=head_cost)
        return stream, [_Part("record", u, scores.priority.get(u, 0.0), "timeline", tokens=cost[u])
                        for u in range(n_units)]
    stream = _Stream(n_units, cost, all_listed=False, header_cost=head_cost)
    pri = np.array([scores.priority.get(u, 0.0) for u in range(n_units)])
    order = np.lexsort((-np.arange(n_units), -pri))
    if eligible is not None:
        order = np.array([u for u in order if int(u) in eligible], dtype=np.int64)
    used = 0
    smallest = min(cost) if cost else 0
    parts = []
    for rank, u in enumerate(order):
        u = int(u)
        c = stream.add_cost(u)
        if used + c <= cap or (rank == 0 and c <= hard_cap):
            stream.add(u)
            used += c
            parts.append(_Part("record", u, float(pri[u]), "timeline", tokens=cost[u]))
        if cap - used < smallest:
            break
    return stream, parts


def _markers_cost(stream: _Stream) -> int:
    total = 0
    prev = -1
    for u in [*stream.listed, stream.n]:
        total += stream.marker_cost(u - prev - 1)
        prev = u
    return total


# -- step recovery -----------------------------------------------------------------------------


def _step_recovery(call: _Call, refs: Sequence[StepRef], scores: _Scores, stream: _Stream, lines: _Lines,
                   detail: list[_Part], left: int, *, excerpts: bool = True,
                   base: float = STEP_PRIORITY) -> int:
    """The items the query named by step, in the order named: whole when they fit, else (with
    ``excerpts``) an excerpt around their best piece in what is left, so a huge observation still
    shows its part that matches the question. Also shows the ranked hits that follow them
    (``excerpts=False``, a lower ``base`` priority)."""
    _fetch(call, lines, sorted({r.seq for r in refs}))
    for i, ref in enumerate(refs):
        seq = ref.seq
        if seq not in lines.items or left <= 0:
            continue
        u = call.idx.views.unit_of[seq]
        header = stream.detail_cost(u)
        pri = base + (len(refs) - i) / len(refs)  # above every unit's; first named highest
        whole = {p[0] for p in lines.all_pieces(seq)}
        cost = lines.delta(seq, whole)
        if cost == 0:
            continue  # already on screen
        if cost + header <= left:
            lines.show(seq, whole)
            stream.add_detail(u)
            detail.append(_Part("raw", u, pri, ref.reason, (seq,), {seq: whole}, cost))
            left -= cost + header
            continue
        room = left - header
        if room < 8 or not excerpts:
            continue
        chosen, c = _excerpt(lines, [seq], scores, room)
        if chosen:
            for q, ps in chosen.items():
                lines.show(q, ps)
            stream.add_detail(u)
            detail.append(_Part("excerpt", u, pri, ref.reason, (seq,), chosen, c))
            left -= c + header
    return left


# -- unit recovery -----------------------------------------------------------------------------


def _unit_recovery(call: _Call, units: Sequence[Unit], scores: _Scores, stream: _Stream,
                   lines: _Lines, detail: list[_Part], left: int, first_recent: int) -> int:
    """Raw unit if it fits, else an excerpt of about E tokens around its best piece, else skip.

    With ``raw_first`` off, a first pass gives each unit (best first) its excerpt and a second
    pass widens excerpts to whole units, best first, while they fit: more units get a look.
    """
    s = call.config
    order = sorted(scores.priority, key=lambda u: (-scores.priority[u], -u))
    tokens = call.idx.views.tokens
    excerpt_first = not s.raw_first and s.excerpts
    for u in order:
        seqs = _unit_seqs(call, units[u], first_recent)
        if not seqs:
            continue
        header = stream.detail_cost(u)
        raw_floor = sum(tokens[q] for q in seqs)  # text tokens: a lower bound of the lines
        can_raw = raw_floor + header <= left and not excerpt_first
        can_excerpt = s.excerpts and left - header >= s.excerpt_tokens
        if not (can_raw or can_excerpt):
            continue
        _fetch(call, lines, seqs)
        pri, why = scores.priority[u], scores.reason[u]
        if can_raw:
            all_p = {seq: {p[0] for p in lines.all_pieces(seq)} for seq in seqs}
            raw_cost = sum(lines.delta(seq, ps) for seq, ps in all_p.items())
            if raw_cost + header <= left:
                for seq, ps in all_p.items():
                    lines.show(seq, ps)
                stream.add_detail(u)
                detail.append(_Part("raw", u, pri, why, tuple(seqs), all_p, raw_cost))
                left -= raw_cost + header
                continue
        if can_excerpt:
            chosen, cost = _excerpt(lines, seqs, scores, min(s.excerpt_tokens, left - header))
            if chosen:
                for seq, ps in chosen.items():
                    lines.show(seq, ps)
                stream.add_detail(u)
                detail.append(_Part("excerpt", u, pri, why, tuple(sorted(chosen)), chosen, cost))
                left -= cost + header
    if excerpt_first:
        for i, part in enumerate(detail):
            if part.kind != "excerpt" or part.priority >= STEP_PRIORITY:  # a step's excerpt stays one
                continue
            seqs = _unit_seqs(call, units[part.unit], first_recent)
            all_p = {seq: {q[0] for q in lines.all_pieces(seq)} for seq in seqs}
            extra = sum(lines.delta(seq, ps) for seq, ps in all_p.items())
            if extra <= left:
                for seq, ps in all_p.items():
                    lines.show(seq, ps)
                detail[i] = _Part("raw", part.unit, part.priority, part.reason, tuple(seqs), all_p,
                                  part.tokens + extra)
                left -= extra
    return left


def _unit_seqs(call: _Call, unit: Unit, first_recent: int) -> list[int]:
    """The unit's items outside the recent window that the filter lets through."""
    seqs = range(unit.first_seq, min(unit.last_seq, first_recent - 1) + 1)
    return [q for q in seqs if call.allowed is None or q in call.allowed]


def _excerpt(lines: _Lines, seqs: Sequence[int], scores: _Scores, limit: int
             ) -> tuple[dict[int, set[int]], int]:
    """Whole pieces around the unit's best piece, grown alternately left and right within ``limit``."""
    flat = [(seq, p[0]) for seq in seqs for p in lines.all_pieces(seq)]
    if not flat:
        return {}, 0

    def score(i: int) -> tuple[float, float, int]:
        seq, p = flat[i]
        best = max(scores.piece_score.get((seq, p), 0.0), scores.piece_score.get((seq, -1), 0.0) / 2)
        return (best, scores.item_cos.get(seq, -1.0), -i)

    centre = max(range(len(flat)), key=score)
    chosen: dict[int, set[int]] = {}

    def cost_with(extra: tuple[int, int] | None) -> int:
        total = 0
        touched = {seq for seq in chosen} | ({extra[0]} if extra else set())
        for seq in touched:
            ps = set(chosen.get(seq, set()))
            if extra and extra[0] == seq:
                ps.add(extra[1])
            total += lines.delta(seq, ps)
        return total

    if cost_with(flat[centre]) > limit:
        return {}, 0
    chosen.setdefault(flat[centre][0], set()).add(flat[centre][1])
    lo, hi = centre - 1, centre + 1
    turn_left = True
    while lo >= 0 or hi < len(flat):
        grew = False
        for side in ((0, 1) if turn_left else (1, 0)):
            pos = lo if side == 0 else hi
            if not 0 <= pos < len(flat):
                continue
            seq, p = flat[pos]
            if seq in lines.shown and p in lines.shown[seq]:
                blocked = True  # already on screen: the excerpt may not reach over it
            else:
                blocked = cost_with((seq, p)) > limit
            if not blocked:
                chosen.setdefault(seq, set()).add(p)
                if side == 0:
                    lo -= 1
                else:
                    hi += 1
                grew = True
                break
            if side == 0:
                lo = -1
            else:
                hi = len(flat)
        if not grew:
            break
        turn_left = not turn_left
    return chosen, cost_with(None)


# -- piece recovery ----------------------------------------------------------------------------


def _piece_recovery(call: _Call, scores: _Scores, stream: _Stream, lines: _Lines,
                    detail: list[_Part], left: int, first_recent: int) -> int:
    """Verbatim pieces not shown yet, best fused score first, while they fit."""
    s = call.config
    unit_of = call.idx.views.unit_of
    boost = s.piece_unit_boost / (call.rrf_k + 1)
    cand = [(seq, p) for seq, p in scores.piece_score
            if seq < first_recent and (call.allowed is None or seq in call.allowed)]
    if not cand:
        return left
    seq_arr = np.fromiter((c[0] for c in cand), dtype=np.int64, count=len(cand))
    p_arr = np.fromiter((c[1] for c in cand), dtype=np.int64, count=len(cand))
    sc_arr = np.fromiter((scores.piece_score[c] for c in cand), dtype=np.float64, count=len(cand))
    if boost:
        units_arr = call.idx.views.units_array()[seq_arr]
        sc_arr = sc_arr + boost * np.fromiter((scores.priority.get(u, 0.0) for u in units_arr.tolist()),
                                              dtype=np.float64, count=len(cand))
    by = np.lexsort((p_arr, -seq_arr, -sc_arr))  # score desc, newer first, piece order
    ranked = list(zip(sc_arr[by].tolist(), seq_arr[by].tolist(), p_arr[by].tolist(), strict=True))
    order = list(dict.fromkeys(seq for _sc, seq, _p in ranked))
    fetched = 0
    whole_item = s.piece_whole_item_tokens
    min_line = 4
    for sc, seq, p in ranked:
        if left < min_line:
            break
        if seq not in lines.items:  # fetch lazily, in score order, a chunk at a time
            chunk = order[fetched:fetched + 256]
            fetched += len(chunk)
            _fetch(call, lines, chunk)
            if seq not in lines.items:
                _fetch(call, lines, [seq])
        spans = lines.all_pieces(seq)
        if p >= 0 and (len(spans) == 1 or lines.items[seq].tokens > whole_item):
            todo = [p]
        else:  # a dense hit (it matched the whole item) or a piece of a short item: all of it
            todo = [q[0] for q in spans]
        misses = 0
        for q in todo:
            # A huge item has thousands of pieces: stop trying once nothing more fits, or
            # after a run of pieces that did not.
            if left < min_line or (misses >= MAX_MISSES and len(todo) > EXACT_PIECES):
                break
            if q in lines.shown.get(seq, set()):
                continue
            u = unit_of[seq]
            own = lines.delta(seq, {q})
            c = own + stream.detail_cost(u)
            if c <= left:
                lines.show(seq, {q})
                stream.add_detail(u)
                # The part is charged its own lines, as raw and excerpt parts are: the change of
                # the unit's line (record to shorter header) is the header part's, not the piece's
                # (charging it here gave first pieces negative costs). A piece that joins two
                # shown ones may save a gap mark (own < 0); a unit's pieces sum to their lines.
                detail.append(_Part("piece", u, sc, f"piece score {sc:.4f}", (seq,), {seq: {q}}, own))
                left -= c
                misses = 0
            else:
                misses += 1
    return left


def _fetch(call: _Call, lines: _Lines, seqs: Sequence[int]) -> None:
    """Make items and their pieces available to ``lines``: from the scope cache, else from the
    store in one query each (and into the cache)."""
    missing = [q for q in seqs if q not in lines.items]
    if not missing:
        return
    cache = call.cache
    with cache.lock:
        for q in missing:
            it = cache.items.get(q)
            if it is not None:
                lines.items[q] = it
                spans = cache.pieces.get(q)
                if spans is not None:
                    lines.pieces[q] = spans
    missing = [q for q in missing if q not in lines.items]
    if not missing:
        return
    contiguous = missing[-1] - missing[0] + 1 == len(missing) and missing == sorted(missing)
    items = (call.store.items(call.scope, start=missing[0], end=missing[-1] + 1) if contiguous
             else call.store.items(call.scope, missing))
    # An item within piece_max_tokens was stored as one piece: only longer ones need a look.
    long = [it.seq for it in items if it.tokens > call.piece_max_tokens]
    spans_of = call.store.pieces(call.scope, long) if long else {}
    with cache.lock:
        for it in items:
            lines.items[it.seq] = it
            cache.items[it.seq] = it
            if it.seq in spans_of:
                lines.pieces[it.seq] = cache.pieces[it.seq] = spans_of[it.seq]
    if len(items) < len(missing):
        # The ranking named items by seq and a forget has since renumbered the scope: the
        # retryable error the retriever gives for the same race, not a KeyError further on.
        raise StoreError("a forget changed the store while this query read it; run the query again")


# -- assembly ----------------------------------------------------------------------------------


def _assemble(budget: int, cap: int, mode: str, timeline: list[_Part], detail: list[_Part],
              recent: list[_Part], recent_items: Sequence[Item], lines: _Lines, rec_text: Sequence[str],
              rec_cost: Sequence[int], head_of: Callable[[int], str], head_cost: Callable[[int], int],
              n_units: int, timings: dict[str, float]) -> Context:
    notice = ""
    dropped = 0
    while True:
        text, parts = _compose(timeline, detail, recent, recent_items, lines, rec_text, rec_cost,
                               head_of, head_cost, n_units)
        n = count_tokens(text)
        if n <= cap:
            break
        # The concatenation came out longer than its parts: drop the lowest-priority part.
        dropped += 1
        if not _drop_one(timeline, detail, recent, lines):
            text, parts, n = "", [], 0
            break
    if dropped:
        notice = f"{dropped} part(s) dropped to stay within the cap"
    if not text:
        notice = (f"budget {budget} (cap {cap} tokens) is too small for any record or item; "
                  "nothing rendered")
    return Context(text=text, tokens=n, budget=budget, cap=cap, mode=mode, parts=tuple(parts),
                   notice=notice, timings_ms=timings)


def _drop_one(timeline: list[_Part], detail: list[_Part], recent: list[_Part], lines: _Lines) -> bool:
    needed = {p.unit for p in detail}
    bare = [p for p in timeline if p.unit not in needed]
    if bare:
        timeline.remove(min(bare, key=lambda p: (p.priority, p.unit)))
        return True
    if detail:
        worst = min(detail, key=lambda p: (p.kind != "piece", p.priority, p.unit))
        detail.remove(worst)
        for seq, ps in worst.pieces.items():
            # Only what no other part shows goes: parts may claim the same pieces (a unit
            # recovered whole holds the step a step part shows), and the kept part must keep them.
            claimed = set().union(*(p.pieces.get(seq, ()) for p in detail))
            rest = lines.shown.get(seq, set()) - (ps - claimed)
            if rest:
                lines.shown[seq] = rest
            else:
                lines.shown.pop(seq, None)
        return True
    if timeline:
        timeline.remove(min(timeline, key=lambda p: (p.priority, p.unit)))
        return True
    if recent:
        recent.pop(0)
        return True
    return False


def _compose(timeline: list[_Part], detail: list[_Part], recent: list[_Part],
             recent_items: Sequence[Item], lines: _Lines, rec_text: Sequence[str],
             rec_cost: Sequence[int], head_of: Callable[[int], str], head_cost: Callable[[int], int],
             n_units: int) -> tuple[str, list[ContextPart]]:
    """The final string: the chronological stream of records with their detail, then the window."""
    detail_units: dict[int, list[_Part]] = {}
    for p in detail:
        detail_units.setdefault(p.unit, []).append(p)
    on_timeline = {p.unit: p for p in timeline}
    listed = sorted(set(on_timeline) | set(detail_units))
    out: list[str] = []
    parts: list[ContextPart] = []
    prev = -1
    for u in listed:
        if u - prev - 1 > 0:
            out.append(_marker(u - prev - 1))
        prev = u
        tp = on_timeline.get(u)
        if u in detail_units:
            out.append(head_of(u))
            parts.append(ContextPart("record", u, (), head_cost(u), "header of recovered detail",
                                     tp.priority if tp is not None else 0.0))
        else:
            out.append(rec_text[u])
            parts.append(ContextPart("record", u, (), rec_cost[u], "timeline",
                                     tp.priority if tp is not None else 0.0))
        if u in detail_units:
            seqs = sorted({q for p in detail_units[u] for q in p.pieces})
            for seq in seqs:
                shown = lines.shown.get(seq)
                if shown:
                    out.append(lines.line(seq, shown))
            pieces = [p for p in detail_units[u] if p.kind == "piece"]
            for p in detail_units[u]:
                if p.kind != "piece":
                    parts.append(ContextPart(p.kind, u, tuple(sorted(p.pieces)), p.tokens, p.reason,
                                             p.priority))
            if pieces:  # one receipt line per unit for its pieces, with the best score
                top = max(pieces, key=lambda p: p.priority)
                parts.append(ContextPart("piece", u, tuple(sorted({q for p in pieces for q in p.seqs})),
                                         max(sum(p.tokens for p in pieces), 0),
                                         f"{len(pieces)} piece(s), best {top.reason}", top.priority))
    if listed and n_units - prev - 1 > 0:
        out.append(_marker(n_units - prev - 1))
    if recent:
        keep = {p.seqs[0] for p in recent}
        if out:
            out.append(RECENT_LABEL)
        for it in recent_items:
            if it.seq in keep:
                out.append(it.render())
        parts.extend(ContextPart("recent", p.unit, p.seqs, p.tokens, p.reason, 0.0) for p in recent)
    return "\n".join(out), parts
