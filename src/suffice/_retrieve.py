"""The shared retrieval prefix: BM25 over pieces and dense cosine over items, fused, once.

:meth:`Retriever.rank` runs each ranker once per query and returns one :class:`Ranking` that
keeps every source's scores (BM25 per piece and per item, cosine per item, the fused order).
Everything after it consumes that object: search results, the renderer's piece and unit
scores, the router's evidence, the deep path's blocks, the benchmarks. Nothing re-ranks.

The retriever also keeps, per scope, the in-memory state that follows the log: the views
(units, blocks), the item vectors and the unit vectors (mean of their items' vectors). The
state is extended as items arrive and dropped when the store's generation changes (a forget or
a rebuild, by this process or another). Nothing here calls a language model.

Dense search scores every vector of a small scope; from ``RetrievalConfig.dense_index_items``
vectors up it asks an HNSW index (:mod:`suffice._ann`) kept in step with the same state and
rescores its candidates exactly. A store that answers nearest-neighbour queries itself (a
server database with a vector index) is asked instead: see :class:`NearestStore`.
"""

from __future__ import annotations

import hashlib
import logging
import re
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal, Protocol, runtime_checkable

import numpy as np

from . import _ann
from ._config import RetrievalConfig, StoreConfig
from ._embed.protocol import Embedder, Reranker
from ._errors import InvalidQueryError, StoreError
from ._steps import (
    STEP_KEY,
    StepRef,
    acted_on,
    asks_latest,
    before_step,
    cited_steps,
    implied_steps,
    key_terms,
    step_bound,
)
from ._store.base import Store
from ._text import embedding_text, query_terms
from ._types import Evidence, Filter, Hit, Unit
from ._views import ScopeViews

Method = Literal["bm25", "dense", "fused", "recency"]
METHODS: tuple[Method, ...] = ("bm25", "dense", "fused", "recency")

EVIDENCE_ITEM_TOKENS = 512
"""An item longer than this appears in the evidence context by its best piece, not whole."""

_EMPTY_SEQS = np.zeros(0, dtype=np.int64)
_EMPTY_MATRIX = np.zeros((0, 0), dtype=np.float32)

MAX_STEP_ITEMS = 200
"""Most items a query's step references fetch (50 steps of a few items each), taken in their
order: named steps, acted-on steps, implied steps (at most 20), then the steps before each
named one. Putting the steps before ahead of the implied ones lost on AMA-Bench (step-range
questions at 4k: 83.8% against 85.5%)."""
PRECEDING_STEPS = 2
"""After the named steps come the this many steps before each (an action answers the state the
steps before it left; AMA-Bench answers cite them). Chosen on the first 10 AMA-Bench episodes
(120 questions) and reported on all 166."""
ACTION_KINDS = ("action", "tool_call")
"""Item kinds that are an agent's acts (the trajectory importers' names)."""
MAX_ACTED_STEPS = 20
"""Most steps an enumeration question ("which actions on X") fetches, the earliest first."""
LATEST_CANDIDATES = 20
"""A state question's newest match is picked among this many best BM25 items of its key terms."""
LATEST_FLOOR = 0.5
"""... that score at least this share of the best one (weaker matches are about something else)."""

ANN_COST_RATIO = 30
"""One HNSW candidate costs about this many exact row scores (measured here: ~3 us against
~0.1 us; the two cross near 3k rows at width 128), so the index answers only when its search
width times this is under the rows it would otherwise scan: a deep ranking (a large render)
or a narrow filter on a mid-sized scope is scanned exactly."""

INDEX_WAIT_S = 0.05
"""A query waits this long for another query's build or extension of the index, then scans:
adding a few rows takes milliseconds, building a large index minutes."""

log = logging.getLogger("suffice")


@contextmanager
def _held(lock: threading.Lock) -> Iterator[None]:
    """Release a lock already acquired (with a timeout) when the block ends."""
    try:
        yield
    finally:
        lock.release()


@runtime_checkable
class NearestStore(Protocol):
    """A store that ranks its own vectors (e.g. PostgreSQL with pgvector's HNSW): the dense
    ranker asks it instead of loading the vectors into memory and scanning them."""

    def nearest(self, scope: str, encoder: str, qvec: np.ndarray, limit: int,
                flt: Filter | None = None) -> list[tuple[int, float]]:
        """(seq, cosine) of the ``limit`` items nearest ``qvec``, best first."""
        ...


@dataclass
class ScopeIndex:
    """Per-scope state kept in step with the store: views, item vectors, unit vectors.

    Arrays are replaced, never changed in place where a reader could see them, and
    :meth:`vectors` hands out a consistent pair, so readers need no lock.
    """

    views: ScopeViews
    generation: int = 0
    """The store's generation this state was built at (see :meth:`Store.generation`)."""
    scope: str = ""
    changes: int = 0
    """The scope's change count when this state was built (see :meth:`Store.changes`)."""
    lock: threading.RLock = field(default_factory=threading.RLock)
    seqs: np.ndarray = field(default_factory=lambda: _EMPTY_SEQS)
    matrix: np.ndarray = field(default_factory=lambda: _EMPTY_MATRIX)
    buffer: np.ndarray = field(default_factory=lambda: _EMPTY_MATRIX)
    """Storage behind ``matrix`` with room to grow: ``matrix`` is a view of its first rows."""
    folded: int = 0
    """Items whose vector has been added into ``sums``."""
    sums: np.ndarray = field(default_factory=lambda: _EMPTY_MATRIX)
    unit_vecs: np.ndarray = field(default_factory=lambda: _EMPTY_MATRIX)
    """Row j: normalised mean vector of unit j's items (zero while it has none)."""
    ann: _ann.DenseIndex | None = None
    """HNSW index over the rows of ``matrix`` (row r = key r), built by the first query that
    wants it and extended by later ones; it goes with this object when the generation changes."""
    ann_lock: threading.Lock = field(default_factory=threading.Lock)
    """Held while the index is built or extended (one builder; searches use the index's own lock)."""
    ann_failed: bool = False

    def vectors(self) -> tuple[np.ndarray, np.ndarray]:
        """(seqs, matrix) of the item vectors, taken together."""
        with self.lock:
            return self.seqs, self.matrix

    def vectors_of(self, seqs: Sequence[int]) -> np.ndarray:
        """The stored vectors of ``seqs``, one row each; a zero row for an item without one."""
        all_seqs, matrix = self.vectors()
        dim = matrix.shape[1] if matrix.ndim == 2 and matrix.shape[1] else 0
        out = np.zeros((len(seqs), dim), np.float32)
        if not len(seqs) or not dim or not all_seqs.shape[0]:
            return out
        want = np.asarray(seqs, dtype=np.int64)
        rows = np.searchsorted(all_seqs, want)
        ok = (rows < all_seqs.shape[0]) & (all_seqs[np.minimum(rows, all_seqs.shape[0] - 1)] == want)
        out[ok] = matrix[rows[ok]]
        return out

    def append_vectors(self, seqs: np.ndarray, mat: np.ndarray) -> None:
        """Add rows; capacity doubles, so adding one item at a time costs O(1) amortised.

        Rows are written past the current view before the view is widened, so a reader holding
        the old ``matrix`` never sees a half-written row.
        """
        n, k = self.matrix.shape[0], mat.shape[0]
        if self.buffer.shape[0] < n + k or self.buffer.shape[1:] != mat.shape[1:]:
            grown = np.empty((max(n + k, 2 * self.buffer.shape[0], 1024), mat.shape[1]), dtype=np.float32)
            if n:
                grown[:n] = self.matrix
            self.buffer = grown
        self.buffer[n:n + k] = mat
        self.seqs, self.matrix = np.concatenate([self.seqs, seqs]), self.buffer[:n + k]
        self._fold()

    def _fold(self) -> None:
        """Add vectors not folded yet into their units' sums; renormalise those units."""
        start = int(np.searchsorted(self.seqs, self.folded))
        if start >= self.seqs.size:
            return
        seqs, rows = self.seqs[start:], self.matrix[start:]
        units = self.views.units_array()[seqs]
        n_units = len(self.views.units)
        dim = rows.shape[1]
        if self.sums.shape[0] < n_units or self.sums.shape[1] != dim:
            grown = np.zeros((max(n_units, 2 * self.sums.shape[0]), dim), dtype=np.float32)
            if self.sums.size and self.sums.shape[1] == dim:
                grown[:self.sums.shape[0]] = self.sums
            self.sums = grown
        np.add.at(self.sums, units, rows)
        lo = int(units.min())
        block = self.sums[lo:n_units]
        norms = np.linalg.norm(block, axis=1, keepdims=True)
        fresh = np.divide(block, norms, out=np.zeros_like(block), where=norms > 0)
        head = self.unit_vecs[:lo] if self.unit_vecs.shape[1:] == (dim,) else np.zeros((0, dim), np.float32)
        if head.shape[0] < lo:  # units before the first vector: zero rows keep the alignment
            head = np.vstack([head, np.zeros((lo - head.shape[0], dim), np.float32)])
        self.unit_vecs = np.vstack([head, fresh]).astype(np.float32, copy=False)
        self.folded = int(seqs[-1]) + 1

    def unit_vectors(self, n_units: int) -> np.ndarray:
        """Vectors of the first ``n_units`` units (zero rows for units with no vector yet)."""
        vecs = self.unit_vecs
        if vecs.shape[0] >= n_units:
            return vecs[:n_units]
        dim = vecs.shape[1] if vecs.ndim == 2 else 0
        if not dim:
            return np.zeros((n_units, 0), dtype=np.float32)
        return np.vstack([vecs, np.zeros((n_units - vecs.shape[0], dim), dtype=np.float32)])


@dataclass(frozen=True, slots=True)
class Ranking:
    """One query's ranking of one scope, with every source's scores kept.

    ``seqs`` / ``scores``: items in the method's order, best first (the first ``reranked`` in the
    reranker's order). ``pieces``: BM25's pieces, best first, as (seq, piece index, score).
    ``dense``: items by cosine, best first.
    ``size``: how many items of the log the ranking saw (later items wait for the next query).
    """

    scope: str
    query: str
    method: Method
    seqs: tuple[int, ...]
    scores: tuple[float, ...]
    pieces: tuple[tuple[int, int, float], ...]
    dense: tuple[tuple[int, float], ...]
    qvec: np.ndarray | None
    size: int
    filter: Filter | None = None
    unit_cos: np.ndarray | None = None
    """Cosine of the query to each unit vector, when the dense scan computed it."""
    timings_ms: dict[str, float] = field(default_factory=dict)
    candidate_k: int = 100
    """How deep each ranker was read for the fused order (the hits' dense scores come from it)."""
    index: ScopeIndex | None = field(default=None, repr=False, compare=False)
    """The scope's state as the ranking saw it: views (unit, blocks of each hit), generation."""
    reranked: int = 0
    """How many of the first ``seqs`` a cross-encoder put in order (their ``scores`` stay the
    fused ones, so a hit's score means the same with or without a reranker)."""
    notice: str = ""
    """What went wrong on the way, when the ranking fell back to a cheaper one."""
    refs: tuple[StepRef, ...] = ()
    """Items the query addressed by step (:mod:`suffice._steps`), in the order named; they lead
    ``seqs`` and the renderer shows them before any other detail."""

    @property
    def best_piece(self) -> dict[int, int]:
        """Each BM25-matched item's best piece."""
        out: dict[int, int] = {}
        for seq, piece, _ in self.pieces:
            out.setdefault(seq, piece)
        return out

    @property
    def bm25(self) -> dict[int, float]:
        """Each BM25-matched item's best piece score."""
        out: dict[int, float] = {}
        for seq, _, score in self.pieces:
            out.setdefault(seq, score)
        return out

    @property
    def cosine(self) -> dict[int, float]:
        return dict(self.dense)


class Retriever:
    """Ranks one scope's items for a query; owns the per-scope state and a worker thread.

    Layers above keep per-scope state of their own (records, render caches); they register a
    callback with :meth:`on_reset` and drop it when the store's generation changes.

    ``persist_index``: an HNSW index of at least :attr:`persist_min_rows` rows is saved beside
    a file store (``<file>.ann/``) and loaded on the next open instead of being rebuilt
    (building 1M rows takes minutes here); files of another generation are deleted as soon as
    this process sees the generation move, and :meth:`reset` (every forget) deletes them too.
    """

    persist_min_rows = 20_000
    """Smallest index saved to a file: the default ``dense_index_items``, so every index built
    by default is saved (building one takes ~10 s per 20k rows here, loading well under one)."""

    def __init__(self, store: Store, embedder: Embedder | None, config: StoreConfig,
                 reranker: Reranker | None = None, *, persist_index: bool = True) -> None:
        self.store = store
        self.embedder = embedder
        self.reranker = reranker
        self.config = config
        self.persist_index = persist_index
        self._scopes: dict[str, ScopeIndex] = {}
        self._generation = -1
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None
        self._resets: list[Callable[[], None]] = []

    def on_reset(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` whenever all per-scope state is dropped (after a forget or rebuild)."""
        self._resets.append(callback)

    def reset(self) -> None:
        """Drop every scope's state here and in the layers registered with :meth:`on_reset`,
        and every saved index of another generation (they may hold forgotten items' vectors)."""
        with self._lock:
            self._scopes.clear()
            self._generation = -1
        self._drop_stale_indexes()
        for callback in self._resets:
            callback()

    def close(self) -> None:
        """Stop the worker thread (BM25 runs there while the query is embedded); save the
        HNSW indexes that grew since they were last saved."""
        with self._lock:
            pool, self._pool = self._pool, None
            scopes = list(self._scopes.items())
        if pool is not None:
            pool.shutdown(wait=True)
        for scope, idx in scopes:
            if idx.ann is not None and idx.ann.count > idx.ann.saved:
                with idx.ann_lock:
                    self._save_index(scope, idx, idx.ann, idx.vectors()[1], force=True)

    def _worker(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="suffice-bm25")
            return self._pool

    # -- keeping in step with the log -------------------------------------------------------------

    def index(self, scope: str) -> ScopeIndex:
        """The scope's views and vectors, extended with any items appended since last time."""
        for _ in range(5):
            idx = self._sync(scope)
            # No forget or rebuild in this scope ran while we read (another scope's must not
            # make a tenant's query retry, and fail after five). A vector refused meanwhile
            # because the generation moved is written by the next query.
            if self.unchanged(idx):
                return idx
        raise StoreError("the store keeps changing under this query (forgets in progress); try again")

    def _sync(self, scope: str) -> ScopeIndex:
        generation = self.store.generation()
        if generation != self._generation:  # a forget or rebuild happened: start over
            self.reset()
        with self._lock:
            self._generation = generation
            idx = self._scopes.get(scope)
            if idx is None or idx.generation != generation:
                idx = self._scopes[scope] = ScopeIndex(ScopeViews(self.config), generation, scope,
                                                       self.store.changes(scope))
        with idx.lock:
            new = self.store.layout(scope, after_seq=idx.views.size - 1)
            if new:
                idx.views.extend(new)
            if self.embedder is not None:
                have = int(idx.seqs[-1]) if idx.seqs.size else -1
                if have < idx.views.size - 1:
                    self._ensure_embedded(scope)
                    seqs, mat = self.store.embeddings(scope, self.embedder.name, after_seq=have)
                    # Another writer may have committed since the layout read: keep the
                    # vectors in step with the views, never ahead of them.
                    keep = seqs < idx.views.size
                    if keep.any():
                        idx.append_vectors(seqs[keep], mat[keep])
        return idx

    def _ensure_embedded(self, scope: str) -> None:
        """Embed items stored without a vector (e.g. written by another process); once each."""
        assert self.embedder is not None
        generation = self.store.generation()
        missing = self.store.missing_embeddings(scope, self.embedder.name)
        for i in range(0, len(missing), 512):
            items = self.store.items(scope, missing[i:i + 512])
            vecs = self.embedder.embed([embedding_text(it.speaker, it.text) for it in items])
            # A forget in between renumbers the seqs: these vectors would land on other items.
            # Nothing is written then; index() sees the new generation and starts over.
            if not self.store.put_embeddings(scope, self.embedder.name, [it.seq for it in items], vecs,
                                             generation=generation):
                return

    # -- ranking ------------------------------------------------------------------------------------

    def rank(self, scope: str, query: str, config: RetrievalConfig, *, method: Method = "fused",
             depth: int | None = None, piece_depth: int = 0, flt: Filter | None = None) -> Ranking:
        """Rank ``scope`` for ``query``: ``depth`` items (default ``config.k``) in the method's
        order, plus BM25 pieces and dense items at least ``piece_depth`` deep (the renderer's
        need), each ranker run once."""
        if method not in METHODS:
            raise InvalidQueryError(f"unknown method {method!r}; use {', '.join(METHODS)}")
        depth = config.k if depth is None else depth
        t0 = time.perf_counter()
        idx = self.index(scope)
        size = idx.views.size
        timings = {"sync_ms": _ms(t0)}
        # Only items the views know: a concurrent writer's newer items wait for the next query.
        below = size if flt is None or flt.before_seq is None else min(size, flt.before_seq)
        bounded = replace(flt or Filter(), before_seq=below)
        cand = max(depth, config.candidate_k)
        use_bm25 = method in ("bm25", "fused")
        use_dense = method in ("dense", "fused") and self.embedder is not None
        terms = query_terms(query) if use_bm25 else []
        piece_limit = max(3 * cand + 10, piece_depth)
        t = time.perf_counter()
        # BM25 (SQLite) runs on the worker thread while the query is embedded (ONNX): both
        # release the GIL, so on two cores the shorter of the two costs nothing.
        job = (self._worker().submit(self.store.bm25, scope, terms, piece_limit, bounded)
               if terms and use_dense and config.overlap_bm25 else None)
        qvec = None
        dense: list[tuple[int, float]] = []
        unit_cos = None
        if use_dense:
            assert self.embedder is not None
            qvec = self.embedder.embed_query(query)
            timings["embed_ms"] = _ms(t)
            t = time.perf_counter()
            dense, unit_cos = self._dense(scope, idx, qvec, max(cand, piece_depth), bounded, config)
            timings["dense_ms"] = _ms(t)
        t = time.perf_counter()
        if job is not None:
            pieces = tuple(job.result())
        else:
            pieces = tuple(self.store.bm25(scope, terms, piece_limit, bounded)) if terms else ()
        timings["bm25_ms"] = _ms(t)
        t = time.perf_counter()
        n_rerank = config.rerank if self.reranker is not None and method != "recency" else 0
        if method == "recency":
            seqs = self._recent(scope, size, depth, bounded)
            order, scores = seqs, [float(s) for s in seqs]
        else:
            order, scores = _fuse(method, pieces, dense, cand, max(depth, n_rerank), config)
        timings["fuse_ms"] = _ms(t)
        reranked, notice = 0, ""
        if n_rerank and len(order) > 1:
            t = time.perf_counter()
            try:
                order, scores, reranked = self._rerank(scope, query, order, scores, n_rerank)
            except Exception as exc:  # the fused order stands; the receipt says why
                notice = f"reranker failed ({type(exc).__name__}: {exc}); kept the fused order"
            timings["rerank_ms"] = _ms(t)
        refs: tuple[StepRef, ...] = ()
        if config.step_refs and method != "recency" and query.strip():
            t = time.perf_counter()
            refs = self._step_refs(scope, query, bounded, terms, pieces)
            if refs:  # addressed items first, then the ranking without them
                named = {r.seq for r in refs}
                top = max(scores, default=1.0)
                kept = [(q, sc) for q, sc in zip(order, scores, strict=True) if q not in named]
                order = [r.seq for r in refs] + [q for q, _ in kept]
                scores = [top] * len(refs) + [sc for _, sc in kept]
                depth, reranked = max(depth, len(refs)), 0
            timings["steps_ms"] = _ms(t)
        order, scores = order[:depth], scores[:depth]
        timings["total_ms"] = _ms(t0)
        return Ranking(scope, query, method, tuple(order), tuple(scores), pieces, tuple(dense), qvec,
                       size, flt, unit_cos, timings, cand, idx, min(reranked, depth), notice, refs)

    def _step_refs(self, scope: str, query: str, flt: Filter, terms: Sequence[str],
                   pieces: Sequence[tuple[int, int, float]]) -> tuple[StepRef, ...]:
        """The items of the steps ``query`` names, through the store's meta filter (with the
        query's own filter and bound), then, for a state question, the newest strong BM25 match
        of its key terms at or before the step it is asked at. Nothing for items without steps."""
        out: list[StepRef] = []
        seen: set[int] = set()
        named = cited_steps(query)
        # The named steps, the steps of every action on the object an enumeration question
        # names, the steps the question implies (between two named, or after one), then the
        # steps just before each named one (what the agent acted on there).
        wanted = [(n, f"step {n}") for n in named]
        obj = acted_on(query)
        if obj is not None:
            wanted += [(n, f"step {n} (an action on {obj})")
                       for n in self._acted_steps(scope, query, obj, flt)]
        wanted += implied_steps(query, named)
        wanted += [(n - k, f"step {n - k} (before step {n})") for n in named
                   for k in range(1, PRECEDING_STEPS + 1) if n - k >= 0 and n - k not in named]
        done: set[int] = set()
        for n, why in wanted:
            if n in done:
                continue
            done.add(n)
            for q in self._step_items(scope, n, flt):
                if q not in seen and len(out) < MAX_STEP_ITEMS:
                    seen.add(q)
                    out.append(StepRef(q, n, why))
        if pieces and asks_latest(query) and key_terms(list(terms)):
            latest = self._latest_match(scope, query, terms, pieces, flt, seen)
            if latest is not None:
                out.append(latest)
        return tuple(out)

    def _step_items(self, scope: str, step: int, flt: Filter) -> list[int]:
        """Seqs of the items of ``step`` that ``flt`` lets through (none when it pins another)."""
        meta = dict(flt.meta or {})
        pinned = meta.get(STEP_KEY)
        if pinned is not None and pinned != step:
            return []
        return [int(q) for q in self.store.filter_seqs(scope, replace(flt, meta={**meta, STEP_KEY: step}))]

    def named_step_items(self, scope: str, query: str, flt: Filter | None = None) -> list[int]:
        """Seqs of the items of the steps ``query`` names (no ranking): what the renderer keeps
        room for before it sizes an agent's recent window."""
        out: list[int] = []
        for n in cited_steps(query):
            out.extend(self._step_items(scope, n, flt or Filter()))
            if len(out) >= MAX_STEP_ITEMS:
                break
        return list(dict.fromkeys(out))[:MAX_STEP_ITEMS]

    def _acted_steps(self, scope: str, query: str, obj: str, flt: Filter) -> list[int]:
        """Steps (earliest first) of the actions whose text names ``obj`` as a whole phrase, up
        to the question's step bound ("before step 49": below it): BM25 on the object's most
        telling words finds candidates, the phrase decides."""
        terms = query_terms(obj)
        # "soapbar 1", "utils/io.py": numbers and two-letter parts match nearly every action.
        telling = [t for t in terms if len(t) > 2 and not t.isdigit()]
        terms = telling or terms
        if not terms:
            return []
        pat = re.compile(r"(?<![\w/.-])" + re.escape(obj) + r"(?![\w/-]|\.\w)", re.IGNORECASE)
        bound = step_bound(query)
        below = bound is not None and before_step(query) == bound
        cand: set[int] = set()
        for kind in ACTION_KINDS:
            cand.update(q for q, _p, _s in self.store.bm25(scope, terms, 400, replace(flt, kind=kind)))
        steps: set[int] = set()
        for it in self.store.items(scope, sorted(cand)):
            step = it.meta.get(STEP_KEY)
            if (isinstance(step, int) and not isinstance(step, bool)
                    and (bound is None or step < bound or (step == bound and not below))
                    and pat.search(it.text)):
                steps.add(step)
        return sorted(steps)[:MAX_ACTED_STEPS]

    def _latest_match(self, scope: str, query: str, terms: Sequence[str],
                      pieces: Sequence[tuple[int, int, float]], flt: Filter,
                      seen: set[int]) -> StepRef | None:
        """Among the items whose best BM25 piece for the key terms scores at least half the
        best one, the newest with a step at or before the question's step bound: a state is
        what its latest setter left."""
        keys = key_terms(list(terms))
        cand = (pieces if list(keys) == list(terms)
                else self.store.bm25(scope, keys, LATEST_CANDIDATES * 3, flt))
        if not cand:
            return None
        floor = cand[0][2] * LATEST_FLOOR
        best: dict[int, float] = {}
        for seq, _p, score in cand:
            if score >= floor and seq not in best:
                best[seq] = score
                if len(best) >= LATEST_CANDIDATES:
                    break
        bound = step_bound(query)
        stepped = []
        for it in self.store.items(scope, sorted(best)):
            step = it.meta.get(STEP_KEY)
            if isinstance(step, int) and not isinstance(step, bool) and (bound is None or step <= bound):
                stepped.append((it.seq, step))
        if not stepped:
            return None
        seq, step = max(stepped)
        if seq in seen:
            return None
        where = f" up to step {bound}" if bound is not None else ""
        return StepRef(seq, step, f"latest match{where} (step {step})")

    def _rerank(self, scope: str, query: str, order: list[int], scores: list[float],
                n: int) -> tuple[list[int], list[float], int]:
        """The first ``n`` of ``order`` sorted by the cross-encoder (ties: fused order)."""
        assert self.reranker is not None
        items = {it.seq: it for it in self.store.items(scope, order[:n])}
        head = [s for s in order[:n] if s in items]
        ce = self.reranker.score(query, [embedding_text(items[s].speaker, items[s].text) for s in head])
        fused = dict(zip(order, scores, strict=False))
        seen = set(head)
        new = rerank_order(head, ce.tolist(), len(head)) + [s for s in order if s not in seen]
        return new, [fused[s] for s in new], len(head)

    def _dense(self, scope: str, idx: ScopeIndex, qvec: np.ndarray, depth: int, flt: Filter,
               config: RetrievalConfig) -> tuple[list[tuple[int, float]], np.ndarray | None]:
        """Items by cosine, best first. A store with its own vector index answers itself;
        otherwise every allowed vector is scored, or, from ``dense_index_items`` allowed
        vectors up, the HNSW index's candidates are (rescored exactly). Without the index,
        above ``dense_scan_items`` only the vectors of the units closest to the query are."""
        if isinstance(self.store, NearestStore):
            assert self.embedder is not None
            pairs = self.store.nearest(scope, self.embedder.name, qvec, depth, flt)
            return sorted(pairs, key=lambda p: (-p[1], -p[0]))[:depth], None  # ties: the newer item
        seqs_all, matrix = idx.vectors()
        below = flt.before_seq if flt.before_seq is not None else idx.views.size
        limit = int(np.searchsorted(seqs_all, below))
        if limit == 0 or matrix.size == 0:
            return [], None
        allowed = None  # sorted seqs a filter lets through
        rows = np.arange(limit)
        if _needs_store(flt):
            allowed = self.store.filter_seqs(scope, replace(flt, before_seq=None))
            rows = np.flatnonzero(np.isin(seqs_all[:limit], allowed))
            if rows.size == 0:
                return [], None
        unit_cos = None
        n = rows.size
        found = self._from_index(scope, idx, matrix, qvec, depth, limit,
                                 rows if allowed is not None else None, config)
        if found is not None:
            sims, seqs = _matvec(matrix[found], qvec), seqs_all[found]
        elif n <= config.dense_scan_items or self._index_usable(n, config):
            if allowed is None:
                sims, seqs = _matvec(matrix[:limit], qvec), seqs_all[:limit]
            else:
                sims, seqs = _matvec(matrix[rows], qvec), seqs_all[rows]
        else:
            units = idx.views.units
            unit_cos = np.maximum(_matvec(idx.unit_vectors(len(units)), qvec), 0.0)
            pick = unit_cos
            if allowed is not None:  # only units that hold an allowed item are worth a look
                holds = np.zeros(len(units), dtype=bool)
                holds[idx.views.units_array()[seqs_all[rows]]] = True
                pick = np.where(holds, unit_cos, -1.0)
            if unit_cos.any():
                ranges = _best_unit_ranges(seqs_all, units, pick, limit, config.dense_scan_items)
            else:  # no unit leans toward the query: nothing to narrow by
                ranges = [(0, limit)]
            sims = np.concatenate([_matvec(matrix[lo:hi], qvec) for lo, hi in ranges])
            seqs = np.concatenate([seqs_all[lo:hi] for lo, hi in ranges])
            if allowed is not None:
                keep = np.isin(seqs, allowed)
                sims, seqs = sims[keep], seqs[keep]
        d = min(depth, sims.shape[0])
        if d == 0:
            return [], unit_cos
        top = np.argpartition(-sims, d - 1)[:d] if d < sims.shape[0] else np.arange(sims.shape[0])
        top = top[np.lexsort((-seqs[top], -sims[top]))]  # ties: the newer item first
        return list(zip(seqs[top].tolist(), sims[top].tolist(), strict=True)), unit_cos

    # -- the HNSW index -----------------------------------------------------------------------------

    @staticmethod
    def _index_usable(n: int, config: RetrievalConfig) -> bool:
        """True when ``n`` allowed vectors are enough for the index and it can be had."""
        return n >= config.dense_index_items and _ann.available()

    def _from_index(self, scope: str, idx: ScopeIndex, matrix: np.ndarray, qvec: np.ndarray,
                    depth: int, limit: int, rows: np.ndarray | None,
                    config: RetrievalConfig) -> np.ndarray | None:
        """Rows of the ``depth`` nearest allowed vectors by the HNSW index (rows below ``limit``,
        and among ``rows`` when a filter gave them), or None when the exact scan should answer:
        too few vectors, a search so wide (a deep ranking, a narrow filter) that scanning the
        allowed rows costs less, or fewer rows found than asked."""
        n = limit if rows is None else rows.size
        want = min(depth, n)
        if want <= 0 or idx.ann_failed or not self._index_usable(n, config):
            return None
        total = matrix.shape[0]
        if _ann.search_width(config.dense_index_ef, want, n / total) * ANN_COST_RATIO > n:
            return None
        ann = self._index(scope, idx, matrix)
        if ann is None:
            return None
        allowed = None
        if rows is not None or limit < total:
            allowed = np.zeros(total, dtype=bool)
            allowed[rows if rows is not None else slice(0, limit)] = True
        found = ann.search(qvec, want, config.dense_index_ef, allowed)
        found = found[found < limit]  # rows added by a concurrent query past this one's view
        if allowed is not None:  # a node found for one allowed row may hold others that are not
            found = found[allowed[found]]
        return found if found.size >= want else None

    def dense_index(self, scope: str) -> _ann.DenseIndex | None:
        """The scope's HNSW index, built (or loaded, or extended) now; None without faiss or
        vectors. A server can call this at start so the first query does not pay for it."""
        idx = self.index(scope)
        matrix = idx.vectors()[1]
        if not matrix.size or not _ann.available():
            return None
        return self._index(scope, idx, matrix)

    def _index(self, scope: str, idx: ScopeIndex, matrix: np.ndarray) -> _ann.DenseIndex | None:
        """``idx``'s index holding every row of ``matrix``: loaded from its file or built on
        first use, extended with the rows appended since. None while another query is building
        it (this one scans instead of waiting minutes for a large build)."""
        if not idx.ann_lock.acquire(timeout=INDEX_WAIT_S):
            return None
        with _held(idx.ann_lock):
            try:
                if idx.ann is None:
                    idx.ann = self._load_index(scope, idx, matrix) or _ann.DenseIndex(matrix.shape[1])
                idx.ann.extend(matrix)
            except Exception as exc:  # an index that cannot be built must not fail the query
                idx.ann_failed = True
                log.warning("dense index for a scope failed (%s: %s); scanning every vector instead",
                            type(exc).__name__, exc)
                return None
            if idx.ann.count - idx.ann.saved >= self.persist_min_rows:
                self._save_index(scope, idx, idx.ann, matrix)
            return idx.ann

    def _index_dir(self) -> Path | None:
        """Where saved indexes live: beside a store file, never for memory or server stores."""
        if not self.persist_index or not self.store.path or self.store.path == ":memory:":
            return None
        path = Path(self.store.path)
        return path.with_name(path.name + ".ann") if path.is_file() else None

    def _index_file(self, scope: str) -> Path | None:
        folder = self._index_dir()
        if folder is None:
            return None
        # Named by a digest: the folder's listing shows no scope name.
        return folder / f"{hashlib.sha256(scope.encode('utf-8')).hexdigest()[:24]}.hnsw"

    def _index_header(self, idx: ScopeIndex, dim: int) -> dict[str, object]:
        return {"generation": idx.generation, "encoder": self.embedder.name if self.embedder else "",
                "dim": dim}

    def _load_index(self, scope: str, idx: ScopeIndex, matrix: np.ndarray) -> _ann.DenseIndex | None:
        path = self._index_file(scope)
        if path is None or not path.exists():
            return None
        t = time.perf_counter()
        loaded = _ann.load(path, self._index_header(idx, matrix.shape[1]), matrix)
        if loaded is not None:
            log.info("loaded the dense index of %d rows in %.1f s", loaded.count, time.perf_counter() - t)
        return loaded

    def _save_index(self, scope: str, idx: ScopeIndex, ann: _ann.DenseIndex, matrix: np.ndarray,
                    force: bool = False) -> None:
        """Save ``ann`` when it is large enough, and only while its generation is current."""
        path = self._index_file(scope)
        if path is None or ann.count < self.persist_min_rows or (not force and ann.count <= ann.saved):
            return
        if self.store.generation() != idx.generation:
            return
        try:
            _ann.save(ann, path, self._index_header(idx, matrix.shape[1]), matrix)
        except OSError as exc:
            log.warning("could not save the dense index (%s); it is rebuilt on the next open", exc)
            return
        if self.store.generation() != idx.generation:  # a forget ran meanwhile: no copy stays
            _ann.remove(path)

    def _drop_stale_indexes(self) -> None:
        """Delete saved indexes built at another generation than the store's."""
        folder = self._index_dir()
        if folder is not None and folder.is_dir():
            _ann.remove_stale(folder, self.store.generation())

    def _recent(self, scope: str, size: int, depth: int, flt: Filter) -> list[int]:
        if not _needs_store(flt):
            top = min(size, flt.before_seq if flt.before_seq is not None else size)
            return list(range(top - 1, max(-1, top - 1 - depth), -1))
        return [it.seq for it in self.store.find(scope, flt, limit=depth, newest_first=True)]

    # -- evidence -------------------------------------------------------------------------------------

    def evidence(self, ranking: Ranking, k: int | None = None) -> Evidence:
        """The first ``k`` items of ``ranking`` (all when None) as hits carrying their items."""
        t0 = time.perf_counter()
        chosen = ranking.seqs if k is None else ranking.seqs[:k]
        idx = ranking.index or self.index(ranking.scope)
        views = idx.views
        items = {it.seq: it for it in self.store.items(ranking.scope, chosen)}
        self.check_unchanged(idx)
        best, bm = ranking.best_piece, ranking.bm25
        named = {r.seq for r in ranking.refs}
        cos = dict(ranking.dense[:ranking.candidate_k])
        long = [q for q, it in items.items() if it.tokens > EVIDENCE_ITEM_TOKENS]
        spans = self.store.pieces(ranking.scope, long) if long else {}
        excerpt: dict[int, str] = {}
        for q in long:  # the item's best BM25 piece, else its first
            pieces = {idx: (a, b) for idx, a, b in spans.get(q, [])}
            a, b = pieces.get(best.get(q, 0), pieces.get(0, (0, len(items[q].text))))
            excerpt[q] = items[q].text[a:b].strip()
        hits = tuple(
            Hit(item=items[seq], score=score, rank=r, source="step" if seq in named else ranking.method,
                piece=best.get(seq),
                unit=views.unit_of[seq], blocks=views.blocks_of(seq), bm25_score=bm.get(seq),
                dense_score=cos.get(seq), excerpt=excerpt.get(seq))
            for r, (seq, score) in enumerate(zip(chosen, ranking.scores, strict=False))
            if seq in items)
        timings = dict(ranking.timings_ms)
        timings["fetch_ms"] = _ms(t0)
        timings["total_ms"] = ranking.timings_ms.get("total_ms", 0.0) + timings["fetch_ms"]
        return Evidence(ranking.query, ranking.scope, hits, timings, ranking.notice)


    def unchanged(self, idx: ScopeIndex) -> bool:
        """Whether what was read by seq since ``idx`` was built is still as it was: no forget or
        rebuild anywhere, or none in its scope (another scope's forget renumbers nothing here,
        and must not fail another tenant's reads)."""
        return self.store.generation() == idx.generation or self.store.changes(idx.scope) == idx.changes

    def check_unchanged(self, idx: ScopeIndex) -> None:
        """Refuse results read by seq after a forget renumbered the scope (a rare race)."""
        if not self.unchanged(idx):
            raise StoreError("a forget changed the store while this query read it; run the query again")


def rerank_order(ranking: Sequence[int], scores: Sequence[float], n: int) -> list[int]:
    """The first ``n`` of ``ranking`` sorted by ``scores`` (aligned with them; ties keep the
    ranking's order), then the rest unchanged."""
    head = sorted(range(min(n, len(ranking), len(scores))), key=lambda i: (-scores[i], i))
    return [*(ranking[i] for i in head), *ranking[len(head):]]


def _fuse(method: Method, pieces: tuple[tuple[int, int, float], ...], dense: list[tuple[int, float]],
          cand: int, depth: int, config: RetrievalConfig) -> tuple[list[int], list[float]]:
    """Items in the method's order: BM25 items (best piece each), cosine, or the two fused."""
    bm_items: dict[int, float] = {}
    for seq, _, score in pieces:
        if seq not in bm_items:
            bm_items[seq] = score
            if len(bm_items) >= cand:
                break
    if method == "bm25":
        seqs = list(bm_items)[:depth]
        return seqs, [bm_items[s] for s in seqs]
    if method == "dense":
        return [s for s, _ in dense[:depth]], [c for _, c in dense[:depth]]
    fused: dict[int, float] = {}
    if config.fusion == "rrf":
        for r, seq in enumerate(bm_items):
            fused[seq] = fused.get(seq, 0.0) + 1.0 / (config.rrf_k + r + 1)
        for r, (seq, _) in enumerate(dense[:cand]):
            fused[seq] = fused.get(seq, 0.0) + config.dense_weight / (config.rrf_k + r + 1)
    else:
        lo, hi = min(bm_items.values(), default=0.0), max(bm_items.values(), default=0.0)
        span = hi - lo if hi > lo else 1.0
        nd = dict(dense[:cand])
        w = config.bm25_weight
        for seq in set(bm_items) | set(nd):
            b = (bm_items[seq] - lo) / span if seq in bm_items else 0.0
            fused[seq] = w * b + (1 - w) * nd.get(seq, 0.0)
    # Ties go to the newer item: later statements supersede earlier ones in a memory.
    order = sorted(fused, key=lambda q: (-fused[q], -q))[:depth]
    return order, [fused[q] for q in order]


def _needs_store(flt: Filter) -> bool:
    """True when the filter tests item fields (not only a seq bound) and the store must say which."""
    return not replace(flt, before_seq=None).empty


def _best_unit_ranges(seqs: np.ndarray, units: Sequence[Unit], unit_cos: np.ndarray, limit: int,
                      max_items: int) -> list[tuple[int, int]]:
    """Row ranges of the items of the units closest to the query, about ``max_items / 5`` rows."""
    budget = max(1, max_items // 5)
    picked: list[tuple[int, int]] = []
    total = 0
    for u in np.lexsort((-np.arange(len(units)), -unit_cos)):
        unit = units[int(u)]
        lo = int(np.searchsorted(seqs, unit.first_seq))
        hi = min(int(np.searchsorted(seqs, unit.last_seq + 1)), limit)
        if hi > lo:
            picked.append((lo, hi))
            total += hi - lo
        if total >= budget:
            break
    return sorted(picked)


def _matvec(matrix: np.ndarray, vec: np.ndarray) -> np.ndarray:
    """``matrix @ vec`` without BLAS threads: multithreaded BLAS stalls when cores are busy
    (measured 8-14x slower on a loaded 2-core machine), while this single-threaded SIMD loop
    is not."""
    out: np.ndarray = np.einsum("ij,j->i", matrix, vec)
    return out


def _ms(t0: float) -> float:
    return (time.perf_counter() - t0) * 1e3
