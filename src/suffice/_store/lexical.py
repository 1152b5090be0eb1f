"""BM25 over postings held in memory, for scopes too large for FTS5 to score every match fast.

FTS5 computes ``bm25()`` for every row that matches any query term and then sorts them: at a
million pieces a five-word query matches some 25,000 rows and takes 60-80 ms. This index keeps
the same postings (term, row, term frequency) and row lengths in numpy arrays and scores them
with FTS5's own formula, so the results are FTS5's results (same rows, same scores up to float
rounding; rows of equal score come newest-piece-last) in a few milliseconds.

Parity with FTS5 is by construction, not by imitation: the postings are read from the scope's
own FTS5 table (``fts5vocab`` instances), and new pieces are tokenized by an FTS5 table with the
same tokenizer, so stemming and case folding are SQLite's. The formula is FTS5's (k1 = 1.2,
b = 0.75, idf = ln((N - n + 0.5) / (n + 0.5)) floored at 1e-6, average length over the rows).
A query FTS5 would treat as a phrase of several tokens (``file_name`` is ``file`` then ``name``)
is left to FTS5: unigram postings cannot say whether two tokens are adjacent.

An index covers every piece of the items before ``covered`` (a seq). :class:`Postings` keeps a
store's indexes: it builds one on a thread of its own with its own read connection, extends it
with newer items' pieces at the next query (FTS5's row count and average length take in every
row of the table, so the index always covers the whole log and a query's ``before_seq`` only
filters), and drops them all the moment the store's generation changes (a forget or a
re-piecing renumbers or removes rows, and the postings hold the forgotten rows' terms).
"""

from __future__ import annotations

import logging
import sqlite3
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

_log = logging.getLogger("suffice")

K1 = 1.2
B = 0.75
IDF_FLOOR = 1e-6
FOLD_AT = 10_000
"""Postings added since the build are folded into the main arrays past this many (or an eighth
of the main arrays, whichever is more), or past ``FOLD_CHUNKS`` appended chunks."""
FOLD_CHUNKS = 20_000
FTS_TOKENIZER = "porter unicode61"
"""The tokenizer of every scope's FTS5 table (and of the tokenizer here that must match it)."""


class Tokenizer:
    """SQLite's FTS5 tokenizer, reached through a private in-memory FTS5 table."""

    def __init__(self, tokenize: str = FTS_TOKENIZER) -> None:
        self._conn = sqlite3.connect(":memory:", check_same_thread=False, isolation_level=None)
        self._conn.execute(f"CREATE VIRTUAL TABLE t USING fts5(body, tokenize = '{tokenize}')")
        self._conn.execute("CREATE VIRTUAL TABLE v USING fts5vocab(t, 'instance')")
        self._lock = threading.Lock()
        self._terms: dict[str, tuple[str, ...]] = {}

    def postings(self, rows: Iterable[tuple[int, str]]) -> list[tuple[str, int, int]]:
        """(token, row id, count) of every token of the given (row id, text) pairs."""
        with self._lock:
            c = self._conn
            c.execute("BEGIN")  # rolled back: the table only ever holds the texts being read
            try:
                c.executemany("INSERT INTO t (rowid, body) VALUES (?, ?)", rows)
                out = c.execute("SELECT term, doc, COUNT(*) FROM v GROUP BY term, doc").fetchall()
            finally:
                c.execute("ROLLBACK")
        return out

    def phrase(self, term: str) -> tuple[str, ...]:
        """The tokens FTS5 makes of one quoted query term, in order (cached: queries repeat)."""
        hit = self._terms.get(term)
        if hit is None:
            with self._lock:
                c = self._conn
                c.execute("BEGIN")
                try:
                    c.execute("INSERT INTO t (rowid, body) VALUES (1, ?)", (term,))
                    hit = tuple(str(r[0]) for r in c.execute("SELECT term FROM v ORDER BY offset"))
                finally:
                    c.execute("ROLLBACK")
                if len(self._terms) > 50_000:
                    self._terms.clear()
                self._terms[term] = hit
        return hit

    def clear(self) -> None:
        self._terms.clear()

    def close(self) -> None:
        with self._lock:
            self._conn.close()


@dataclass
class LexicalIndex:
    """Postings of one scope: term -> (rows, term frequencies), with each row's piece and length."""

    generation: int
    covered: int
    """Every piece of the items with seq below this is indexed."""
    term_ids: dict[str, int]
    starts: list[int]
    """Postings of term ``t`` are ``rows[starts[t]:ends[t]]`` (chunks appended later follow)."""
    ends: list[int]
    extra: dict[int, list[tuple[np.ndarray, np.ndarray]]]
    """Postings added after the build, per term: (rows, tfs) chunks."""
    post_rows: np.ndarray
    post_tf: np.ndarray
    seqs: np.ndarray
    idxs: np.ndarray
    lengths: np.ndarray
    total_tokens: int
    n_extra: int = 0
    """Postings in ``extra``; past an eighth of the main arrays they are folded in."""
    n_chunks: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    n: int = -1
    """Rows in use; the row arrays have spare room past it, so an append copies nothing."""

    def __post_init__(self) -> None:
        if self.n < 0:
            self.n = int(self.seqs.shape[0])

    @property
    def n_rows(self) -> int:
        return self.n

    def postings_of(self, token: str) -> tuple[np.ndarray, np.ndarray]:
        t = self.term_ids.get(token)
        if t is None:
            return _EMPTY_I, _EMPTY_F
        rows, tfs = self.post_rows[self.starts[t]:self.ends[t]], self.post_tf[self.starts[t]:self.ends[t]]
        more = self.extra.get(t)
        if more:
            rows = np.concatenate([rows, *(r for r, _ in more)])
            tfs = np.concatenate([tfs, *(f for _, f in more)])
        return rows, tfs

    def search(self, tokens: Sequence[str], limit: int,
               before_seq: int | None) -> list[tuple[int, int, float]]:
        """(seq, piece idx, score) of the best ``limit`` rows, best first: FTS5's ``-bm25()``."""
        with self.lock:
            n = self.n_rows
            if n == 0 or limit <= 0:
                return []
            avgdl = self.total_tokens / n
            norm_cache: dict[str, tuple[np.ndarray, np.ndarray]] = {}
            parts_r, parts_w = [], []
            for tok in tokens:  # one phrase per query term, repeats included, as FTS5 counts them
                if tok not in norm_cache:
                    rows, tfs = self.postings_of(tok)
                    if rows.size == 0:
                        norm_cache[tok] = (rows, tfs.astype(np.float64))
                    else:
                        idf = float(np.log((n - rows.size + 0.5) / (rows.size + 0.5)))
                        idf = idf if idf > 0.0 else IDF_FLOOR  # FTS5's floor, exactly
                        tf = tfs.astype(np.float64)
                        denom = tf + K1 * (1.0 - B + B * self.lengths[rows] / avgdl)
                        norm_cache[tok] = (rows, idf * tf * (K1 + 1.0) / denom)
                rows, w = norm_cache[tok]
                if rows.size:
                    parts_r.append(rows)
                    parts_w.append(w)
            if not parts_r:
                return []
            if len(parts_r) == 1:
                cand, score = parts_r[0], parts_w[0]
            else:
                total = np.bincount(np.concatenate(parts_r), weights=np.concatenate(parts_w), minlength=n)
                cand = np.flatnonzero(total)
                score = total[cand]
            if before_seq is not None and before_seq < self.covered:
                keep = self.seqs[cand] < before_seq
                cand, score = cand[keep], score[keep]
            if cand.size > limit:
                # The best ``limit``, rows tied at the cut taken oldest first (as FTS5's sort
                # leaves them): argpartition alone would pick among them arbitrarily.
                kth = np.partition(-score, limit - 1)[limit - 1]
                above = np.flatnonzero(-score < kth)
                tied = np.flatnonzero(-score == kth)
                tied = tied[np.argsort(cand[tied], kind="stable")][:limit - above.size]
                top = np.concatenate([above, tied])
                cand, score = cand[top], score[top]
            order = np.lexsort((cand, -score))  # best first; ties: the older row first
            cand, score = cand[order], score[order]
            return [(int(s), int(i), float(v)) for s, i, v in
                    zip(self.seqs[cand].tolist(), self.idxs[cand].tolist(), score.tolist(), strict=True)]

    def extend(self, covered: int, pieces: Sequence[tuple[int, int]], lengths: Sequence[int],
               postings: Sequence[tuple[str, int, int]]) -> None:
        """Add the rows of newer items: ``pieces`` (seq, idx) and their token ``lengths`` in row
        order, ``postings`` (token, position in ``pieces``, count)."""
        with self.lock:
            base = self.n_rows
            if pieces:
                need = base + len(pieces)
                if need > self.seqs.shape[0]:
                    cap = max(need, int(self.seqs.shape[0] * 1.5) + 1024)
                    self.seqs = _grown(self.seqs, cap)
                    self.idxs = _grown(self.idxs, cap)
                    self.lengths = _grown(self.lengths, cap)
                self.seqs[base:need] = [p[0] for p in pieces]
                self.idxs[base:need] = [p[1] for p in pieces]
                self.lengths[base:need] = lengths
                self.n = need
                self.total_tokens += int(sum(lengths))
                by_term: dict[str, tuple[list[int], list[int]]] = {}
                for tok, row, count in postings:
                    r, f = by_term.setdefault(tok, ([], []))
                    r.append(base + row)
                    f.append(count)
                for tok, (r, f) in by_term.items():
                    t = self.term_ids.get(tok)
                    if t is None:
                        t = self.term_ids[tok] = len(self.starts)
                        self.starts.append(0)
                        self.ends.append(0)
                    self.extra.setdefault(t, []).append((np.asarray(r, np.int64), np.asarray(f, np.int32)))
                    self.n_extra += len(r)
                    self.n_chunks += 1
                if self.n_extra > max(FOLD_AT, self.post_rows.size // 8) or self.n_chunks > FOLD_CHUNKS:
                    self._fold()
            self.covered = covered

    def _fold(self) -> None:
        """Merge the added postings into the main arrays (lock held), so a term's postings stay
        one slice however many appends came after the build. Main postings are in term order
        and a term's added rows are newer than its main ones, so each lands at a known place:
        no sort."""
        starts = np.asarray(self.starts, np.int64)
        main = np.asarray(self.ends, np.int64) - starts
        added = np.zeros(len(self.starts), np.int64)
        for t, chunks in self.extra.items():
            added[t] = sum(r.size for r, _ in chunks)
        new_starts = np.zeros(len(self.starts) + 1, np.int64)
        np.cumsum(main + added, out=new_starts[1:])
        rows = np.empty(int(new_starts[-1]), np.int64)
        tfs = np.empty(int(new_starts[-1]), np.int32)
        # The main arrays hold each term's postings back to back, in term order.
        term_of = np.repeat(np.arange(len(self.starts), dtype=np.int64), main)
        assert term_of.size == self.post_rows.size
        at = new_starts[:-1][term_of] + (np.arange(term_of.size, dtype=np.int64) - starts[term_of])
        rows[at], tfs[at] = self.post_rows, self.post_tf
        for t, chunks in self.extra.items():
            pos = int(new_starts[t] + main[t])
            for r, f in chunks:
                rows[pos:pos + r.size], tfs[pos:pos + r.size] = r, f
                pos += r.size
        self.post_rows, self.post_tf = rows, tfs
        self.starts, self.ends = new_starts[:-1].tolist(), new_starts[1:].tolist()
        self.extra = {}
        self.n_extra = self.n_chunks = 0


def _grown(a: np.ndarray, cap: int) -> np.ndarray:
    out = np.zeros(cap, a.dtype)
    out[:a.shape[0]] = a
    return out


_EMPTY_I = np.zeros(0, np.int64)
_EMPTY_F = np.zeros(0, np.int32)


class BuildStopped(Exception):
    """A build was called off (the store changed generation or closed)."""


def build(conn: sqlite3.Connection, table: str, scope: str, covered: int, generation: int, *,
          stop: Callable[[], bool] = lambda: False) -> LexicalIndex:
    """Read the scope's postings from its FTS5 table (inside the caller's read transaction).

    ``stop`` is asked between statements and between chunks of rows; when it says so the build
    raises :class:`BuildStopped` (an interrupt of ``conn`` may also end a statement early)."""
    rows = conn.execute("SELECT rowid, seq, idx FROM pieces WHERE scope = ? AND seq < ? ORDER BY rowid",
                        (scope, covered)).fetchall()
    rowids = np.fromiter((r[0] for r in rows), np.int64, count=len(rows))
    seqs = np.fromiter((r[1] for r in rows), np.int64, count=len(rows))
    idxs = np.fromiter((r[2] for r in rows), np.int32, count=len(rows))
    del rows
    if stop():
        raise BuildStopped
    vocab = f"lexv_{table}"
    conn.execute(f'CREATE VIRTUAL TABLE IF NOT EXISTS temp."{vocab}"'
                 f' USING fts5vocab(main, "{table}", \'instance\')')
    term_ids: dict[str, int] = {}
    docs_parts, term_parts = [], []
    cur = conn.execute(f'SELECT term, doc FROM temp."{vocab}"')
    while True:
        if stop():
            raise BuildStopped
        chunk = cur.fetchmany(200_000)
        if not chunk:
            break
        terms, docs = zip(*chunk, strict=True)
        ids = [term_ids.setdefault(t, len(term_ids)) for t in terms]
        term_parts.append(np.asarray(ids, np.int64))
        docs_parts.append(np.asarray(docs, np.int64))
    conn.execute(f'DROP TABLE temp."{vocab}"')
    t_all = np.concatenate(term_parts) if term_parts else _EMPTY_I
    d_all = np.concatenate(docs_parts) if docs_parts else _EMPTY_I
    pos = np.searchsorted(rowids, d_all)
    pos = np.minimum(pos, max(rowids.size - 1, 0))
    known = rowids[pos] == d_all if rowids.size else np.zeros(d_all.size, bool)
    # Rows of items past ``covered`` (a writer's newer items) wait for ``extend``.
    t_all, r_all = t_all[known], pos[known]
    lengths = np.bincount(r_all, minlength=rowids.size).astype(np.float64)
    # Instances come in (term, row, offset) order: one run per (term, row) is one posting.
    if r_all.size:
        new = np.ones(r_all.size, bool)
        new[1:] = (t_all[1:] != t_all[:-1]) | (r_all[1:] != r_all[:-1])
        starts_at = np.flatnonzero(new)
        tf = np.diff(np.append(starts_at, r_all.size)).astype(np.int32)
        p_term, p_row = t_all[starts_at], r_all[starts_at]
    else:
        tf, p_term, p_row = _EMPTY_F, _EMPTY_I, _EMPTY_I
    bounds = np.searchsorted(p_term, np.arange(len(term_ids) + 1))
    return LexicalIndex(generation=generation, covered=covered, term_ids=term_ids,
                        starts=bounds[:-1].tolist(), ends=bounds[1:].tolist(), extra={},
                        post_rows=p_row, post_tf=tf, seqs=seqs, idxs=idxs, lengths=lengths,
                        total_tokens=int(lengths.sum()))


def phrases(tokenizer: Tokenizer, terms: Sequence[str]) -> list[str] | None:
    """One token per query term, or None when a term is not a single token to FTS5."""
    out = []
    for term in terms:
        toks = tokenizer.phrase(term)
        if len(toks) != 1:
            return None
        out.append(toks[0])
    return out


class Postings:
    """The in-memory indexes of one SQLite store: which scopes have one, building, extending,
    dropping. The store hands over how to read (its connection, under its lock) and how to learn
    the store's generation and its newest seq; builds open their own read connection to ``path``.

    Locks: ``_lock`` serialises decisions and extensions and is taken before the store's
    connection lock; ``_leaf`` guards the dictionaries only and is never held while taking another
    lock, so :meth:`invalidate` may be called from inside a store write.
    """

    def __init__(self, path: str, threshold: int, read: Callable[[str, Sequence[Any]], list[Any]],
                 generation: Callable[[], int], max_seq: Callable[[str], int]) -> None:
        self.path = path
        self.threshold = threshold
        self._read = read
        self._max_seq = max_seq
        self._generation = generation
        self._indexes: dict[str, LexicalIndex] = {}
        self._building: dict[str, int] = {}
        """Scopes being built, with the epoch the build started in."""
        self._failed: dict[str, int] = {}
        """Scopes whose build failed, with the store generation: not retried in it."""
        self._conns: set[sqlite3.Connection] = set()
        self._threads: set[threading.Thread] = set()
        self._epoch = 0
        """Advanced by every invalidation: a build that started in an older epoch is discarded."""
        self._closed = False
        self._lock = threading.Lock()
        self._leaf = threading.Lock()
        self._tokenizer = Tokenizer()

    def search(self, scope: str, table: str, terms: Sequence[str], limit: int,
               before_seq: int | None) -> list[tuple[int, int, float]] | None:
        """The index's answer, or None when FTS5 must answer: no index (yet), a term FTS5 reads
        as a phrase, or a change of generation while the query ran."""
        index = self._indexes.get(scope)
        if index is None:
            if self._closed or (before_seq is not None and before_seq < self.threshold):
                return None  # small scopes cost no SQL here
            with self._lock:
                self._maybe_build(scope, table)
            return None
        generation = self._generation()
        if index.generation != generation:  # another process forgot or re-pieced
            self._drop_other_generations(generation)
            return None
        tokens = phrases(self._tokenizer, terms)
        if tokens is None:
            return None
        with self._lock:
            count = self._item_count(scope)
            if count > index.covered:
                self._extend(scope, table, index, count)
        found = index.search(tokens, limit, before_seq)
        return found if self._generation() == index.generation else None

    def invalidate(self) -> None:
        """Drop every index at once, and stop the builds under way (their snapshots would keep
        the write-ahead log from being emptied)."""
        with self._leaf:
            self._epoch += 1
            self._indexes.clear()
            self._building.clear()
            conns = list(self._conns)
        self._tokenizer.clear()
        for conn in conns:
            conn.interrupt()

    def prepare(self, scope: str, table: str) -> bool:
        """Build the scope's index now, whatever its size; True when it is in place."""
        if self._closed:
            return False
        with self._leaf:
            epoch = self._epoch
            self._building[scope] = epoch
        self._build(scope, table, epoch)
        return scope in self._indexes

    def close(self) -> None:
        with self._leaf:
            self._closed = True
            self._indexes.clear()
            self._building.clear()
            conns, threads = list(self._conns), list(self._threads)
        for conn in conns:
            conn.interrupt()
        for t in threads:
            t.join(timeout=5)
        self._tokenizer.close()

    # -- inside ----------------------------------------------------------------------------------

    def _item_count(self, scope: str) -> int:
        return self._max_seq(scope) + 1

    def _drop_other_generations(self, generation: int) -> None:
        with self._leaf:
            for scope in [s for s, ix in self._indexes.items() if ix.generation != generation]:
                del self._indexes[scope]

    def _maybe_build(self, scope: str, table: str) -> None:
        """Start a build on a thread when the scope is large enough (``_lock`` held)."""
        if scope in self._building:
            return
        generation = self._generation()
        if self._failed.get(scope) == generation or self._item_count(scope) < self.threshold:
            return
        with self._leaf:
            if self._closed:
                return
            epoch = self._epoch
            self._building[scope] = epoch
            thread = threading.Thread(target=self._build, args=(scope, table, epoch),
                                      daemon=True, name="suffice-lexical")
            self._threads.add(thread)
        thread.start()

    def _build(self, scope: str, table: str, epoch: int) -> None:
        """Build from one read snapshot on a connection of its own, so the store's connection
        stays free for queries (a million pieces take about a minute)."""
        index: LexicalIndex | None = None
        conn: sqlite3.Connection | None = None
        generation = -1
        try:
            conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            with self._leaf:
                if self._closed or self._epoch != epoch:
                    return
                self._conns.add(conn)
            conn.execute("PRAGMA busy_timeout = 30000")
            conn.execute("BEGIN")
            (gen,) = conn.execute("SELECT value FROM meta WHERE key = 'generation'").fetchone()
            generation = int(gen)
            (top,) = conn.execute("SELECT COALESCE(MAX(seq), -1) FROM items WHERE scope = ?",
                                  (scope,)).fetchone()
            index = build(conn, table, scope, int(top) + 1, generation,
                          stop=lambda: self._closed or self._epoch != epoch)
            conn.execute("COMMIT")
        except BuildStopped:
            pass
        except sqlite3.Error as exc:  # interrupted by a forget, or the scope is gone: FTS5 serves
            if "interrupt" not in str(exc) and not (self._closed or self._epoch != epoch):
                _log.warning("suffice: in-memory BM25 index of a scope not built: %s", exc)
                with self._leaf:
                    self._failed[scope] = generation
        finally:
            with self._leaf:
                if conn is not None:
                    self._conns.discard(conn)
                if index is not None and not self._closed and self._epoch == epoch:
                    self._indexes[scope] = index
                if self._building.get(scope) == epoch:
                    del self._building[scope]
                self._threads.discard(threading.current_thread())
            if conn is not None:
                conn.close()

    def _extend(self, scope: str, table: str, index: LexicalIndex, target: int) -> None:
        """Add the pieces of items ``index.covered`` .. ``target`` - 1 (``_lock`` held)."""
        rows = self._read(f'SELECT p.seq, p.idx, f.body FROM pieces p JOIN "{table}" f ON f.rowid = p.rowid'
                          " WHERE p.scope = ? AND p.seq >= ? AND p.seq < ? ORDER BY p.rowid",
                          (scope, index.covered, target))
        postings = self._tokenizer.postings((i + 1, str(r[2])) for i, r in enumerate(rows))
        lengths = [0] * len(rows)
        for _tok, doc, count in postings:
            lengths[doc - 1] += count
        index.extend(target, [(int(r[0]), int(r[1])) for r in rows], lengths,
                     [(t, d - 1, c) for t, d, c in postings])
