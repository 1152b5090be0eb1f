"""The shared retrieval prefix: BM25 over pieces and dense cosine over items, fused.

Every query runs this once; the fast path answers from it, the deep path reuses its hits to
pick blocks, and the renderer seeds from it. Nothing here calls a language model.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import numpy as np

from .config import Settings
from .embed.protocol import Embedder
from .errors import BudgetError
from .store.sqlite import SQLiteStore
from .text import embedding_text, query_terms
from .types import Evidence, Hit
from .views import ScopeViews

Method = Literal["bm25", "dense", "fused", "recency"]


@dataclass
class ScopeIndex:
    """Per-scope in-memory state kept in step with the store: views and the vector matrix."""

    views: ScopeViews
    seqs: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    matrix: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), dtype=np.float32))
    lock: threading.Lock = field(default_factory=threading.Lock)
    caches: dict[str, Any] = field(default_factory=dict)
    """Per-scope state of higher layers (e.g. records' unit vectors), kept as long as the index."""
    buffer: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), dtype=np.float32))
    """Storage behind ``matrix`` with room to grow: ``matrix`` is a view of its first rows."""

    def append_vectors(self, seqs: np.ndarray, mat: np.ndarray) -> None:
        """Add rows; capacity doubles, so adding one item at a time costs O(1) amortised.

        Rows are written past the current view before the view is widened, so a reader holding
        the old ``matrix`` never sees a half-written row.
        """
        n, k = self.matrix.shape[0], mat.shape[0]
        if self.buffer.shape[0] < n + k or self.buffer.shape[1:] != mat.shape[1:]:
            grown = np.empty((max(n + k, 2 * self.buffer.shape[0], 1024), mat.shape[1]),
                             dtype=np.float32)
            if n:
                grown[:n] = self.matrix
            self.buffer = grown
        self.buffer[n:n + k] = mat
        self.seqs = np.concatenate([self.seqs, seqs])
        self.matrix = self.buffer[:n + k]


@dataclass(frozen=True, slots=True)
class Ranking:
    """Item seqs best first, with the score of each and the best BM25 piece where known."""

    seqs: list[int]
    scores: list[float]
    pieces: dict[int, int]
    bm25: dict[int, float]
    dense: dict[int, float]


class Retriever:
    def __init__(self, store: SQLiteStore, embedder: Embedder | None, settings: Settings) -> None:
        self.store = store
        self.embedder = embedder
        self.settings = settings
        self._scopes: dict[str, ScopeIndex] = {}
        self._lock = threading.Lock()

    # -- keeping in step with the log -------------------------------------------------------

    def index(self, scope: str) -> ScopeIndex:
        """The scope's views and vectors, extended with any items appended since last time."""
        with self._lock:
            idx = self._scopes.get(scope)
            if idx is None:
                idx = self._scopes[scope] = ScopeIndex(ScopeViews(self.settings))
        with idx.lock:
            known = idx.views.size - 1
            new = self.store.layout(scope, after_seq=known)
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
                    seqs, mat = seqs[keep], mat[keep]
                    if seqs.size:
                        idx.append_vectors(seqs, mat)
        return idx

    def _ensure_embedded(self, scope: str) -> None:
        """Embed items stored without a vector (e.g. written by another process); once each."""
        assert self.embedder is not None
        missing = self.store.missing_embeddings(scope, self.embedder.name)
        for i in range(0, len(missing), 512):
            chunk = missing[i:i + 512]
            items = self.store.items(scope, chunk)
            vecs = self.embedder.embed([embedding_text(it.speaker, it.text) for it in items])
            self.store.put_embeddings(scope, self.embedder.name, [it.seq for it in items], vecs)

    # -- rankings -----------------------------------------------------------------------------

    def rank_bm25(self, scope: str, query: str, depth: int) -> Ranking:
        terms = query_terms(query)
        # Only items the views know: a concurrent writer's newer items wait for the next sync.
        known = self.index(scope).views.size
        # Several pieces of one item may match; over-fetch so ``depth`` distinct items remain.
        rows = self.store.bm25(scope, terms, limit=depth * 3 + 10, seq_range=(0, known))
        seqs: list[int] = []
        scores: list[float] = []
        pieces: dict[int, int] = {}
        for seq, piece, score in rows:
            if seq in pieces:
                continue
            pieces[seq] = piece
            seqs.append(seq)
            scores.append(score)
            if len(seqs) >= depth:
                break
        return Ranking(seqs, scores, pieces, dict(zip(seqs, scores, strict=True)), {})

    def rank_dense(self, scope: str, query: str, depth: int,
                   qvec: np.ndarray | None = None) -> Ranking:
        idx = self.index(scope)
        if self.embedder is None or idx.matrix.size == 0:
            return Ranking([], [], {}, {}, {})
        q = qvec if qvec is not None else self.embedder.embed_query(query)
        # einsum runs one plain loop; BLAS's threaded gemv was 8-14x slower here whenever
        # another process held a core (0.6 vs 8 ms at 10k items, 6.5 vs 16 ms at 100k).
        sims = np.einsum("ij,j->i", idx.matrix, q)
        depth = min(depth, sims.shape[0])
        top = np.argpartition(-sims, depth - 1)[:depth] if depth < sims.shape[0] else np.arange(sims.shape[0])
        top = top[np.argsort(-sims[top], kind="stable")]
        seqs = [int(s) for s in idx.seqs[top]]
        scores = [float(x) for x in sims[top]]
        return Ranking(seqs, scores, {}, {}, dict(zip(seqs, scores, strict=True)))

    def rank_recency(self, scope: str, depth: int) -> Ranking:
        top = self.index(scope).views.size - 1
        seqs = list(range(top, max(-1, top - depth), -1))
        return Ranking(seqs, [float(s) for s in seqs], {}, {}, {})

    def fuse(self, bm: Ranking, dn: Ranking, depth: int) -> Ranking:
        """Reciprocal-rank fusion (default) or min-max weighted fusion of two rankings."""
        s = self.settings
        fused: dict[int, float] = {}
        if s.fusion == "rrf":
            for r, seq in enumerate(bm.seqs):
                fused[seq] = fused.get(seq, 0.0) + 1.0 / (s.rrf_k + r + 1)
            for r, seq in enumerate(dn.seqs):
                fused[seq] = fused.get(seq, 0.0) + 1.0 / (s.rrf_k + r + 1)
        else:
            def norm(xs: dict[int, float]) -> dict[int, float]:
                if not xs:
                    return {}
                lo, hi = min(xs.values()), max(xs.values())
                span = hi - lo if hi > lo else 1.0
                return {k: (v - lo) / span for k, v in xs.items()}
            nb, nd = norm(bm.bm25), dn.dense
            for seq in set(nb) | set(nd):
                fused[seq] = s.bm25_weight * nb.get(seq, 0.0) + (1 - s.bm25_weight) * nd.get(seq, 0.0)
        # Ties go to the newer item: later statements supersede earlier ones in a memory.
        order = sorted(fused, key=lambda q: (-fused[q], -q))[:depth]
        return Ranking(order, [fused[q] for q in order], bm.pieces, bm.bm25, dn.dense)

    def rank(self, scope: str, query: str, method: Method, depth: int) -> Ranking:
        if method == "bm25":
            return self.rank_bm25(scope, query, depth)
        if method == "dense":
            return self.rank_dense(scope, query, depth)
        if method == "recency":
            return self.rank_recency(scope, depth)
        cand = max(depth, self.settings.candidate_k)
        return self.fuse(self.rank_bm25(scope, query, cand), self.rank_dense(scope, query, cand), depth)

    # -- the prefix -----------------------------------------------------------------------------

    def prefix(self, scope: str, query: str, k: int | None = None,
               method: Method = "fused") -> Evidence:
        """Hits for ``query`` and the evidence context: hit items in time order."""
        k = k if k is not None else self.settings.prefix_k
        if k < 0:
            raise BudgetError(f"k must not be negative, got {k}")
        t0 = time.perf_counter()
        idx = self.index(scope)
        t1 = time.perf_counter()
        timings: dict[str, float] = {"sync_ms": (t1 - t0) * 1e3}
        cand = max(k, self.settings.candidate_k)
        if method in ("fused", "dense"):
            qvec = self.embedder.embed_query(query) if self.embedder is not None else None
            t2 = time.perf_counter()
            timings["embed_ms"] = (t2 - t1) * 1e3
            dn = self.rank_dense(scope, query, cand, qvec=qvec)
            t3 = time.perf_counter()
            timings["dense_ms"] = (t3 - t2) * 1e3
        else:
            dn, t3 = Ranking([], [], {}, {}, {}), time.perf_counter()
        if method in ("fused", "bm25"):
            bm = self.rank_bm25(scope, query, cand)
            t4 = time.perf_counter()
            timings["bm25_ms"] = (t4 - t3) * 1e3
        else:
            bm, t4 = Ranking([], [], {}, {}, {}), time.perf_counter()
        if method == "fused":
            ranking = self.fuse(bm, dn, k)
        elif method == "bm25":
            ranking = Ranking(bm.seqs[:k], bm.scores[:k], bm.pieces, bm.bm25, {})
        elif method == "dense":
            ranking = Ranking(dn.seqs[:k], dn.scores[:k], {}, {}, dn.dense)
        else:
            ranking = self.rank_recency(scope, k)
        t5 = time.perf_counter()
        timings["fuse_ms"] = (t5 - t4) * 1e3
        hits = self._hits(idx, ranking, method)
        items = tuple(self.store.items(scope, [h.seq for h in hits]))
        hits = _attach_ids(hits, {it.seq: it.id for it in items})
        t6 = time.perf_counter()
        timings["fetch_ms"] = (t6 - t5) * 1e3
        timings["total_ms"] = (t6 - t0) * 1e3
        return Evidence(query=query, scope=scope, hits=hits, items=items, timings_ms=timings)

    def _hits(self, idx: ScopeIndex, ranking: Ranking, method: Method) -> tuple[Hit, ...]:
        views = idx.views
        out = []
        for r, (seq, score) in enumerate(zip(ranking.seqs, ranking.scores, strict=True)):
            out.append(Hit(
                item_id="",  # filled below from the fetched items
                seq=seq, score=score, rank=r, source=method, piece=ranking.pieces.get(seq),
                unit=views.unit_of[seq], blocks=views.blocks_of(seq),
                bm25_score=ranking.bm25.get(seq), dense_score=ranking.dense.get(seq),
            ))
        return tuple(out)


def _attach_ids(hits: Sequence[Hit], ids: dict[int, str]) -> tuple[Hit, ...]:
    return tuple(replace(h, item_id=ids.get(h.seq, "")) for h in hits)
