"""SQLite store (WAL): the embedded default.

Items are append-only: there is no API to change an item's text, and a trigger refuses
UPDATE on the items table. A batch is one transaction; ids supplied by the client make
re-adding a batch a no-op. Several processes may write at once: ``BEGIN IMMEDIATE`` takes the
write lock before ``seq`` is assigned, and a busy store is retried with back-off.
"""

from __future__ import annotations

import json
import os
import random
import sqlite3
import threading
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ConflictError, InvalidItemError, StoreError, UnknownScopeError
from ..types import Item, NewItem, StoreStats

SCHEMA_VERSION = 2
"""2: client ids are unique per scope (1 had them unique across the whole store)."""

_ITEMS_COLUMNS = """
    rowid INTEGER PRIMARY KEY,
    id TEXT NOT NULL,
    scope TEXT NOT NULL,
    seq INTEGER NOT NULL,
    session TEXT NOT NULL,
    speaker TEXT NOT NULL,
    role TEXT NOT NULL,
    kind TEXT NOT NULL,
    observed_at TEXT NOT NULL,
    text TEXT NOT NULL,
    meta TEXT NOT NULL,
    tokens INTEGER NOT NULL,
    created_at REAL NOT NULL,
    UNIQUE (scope, seq),
    UNIQUE (scope, id)
"""
_ITEM_FIELDS = ("id, scope, seq, session, speaker, role, kind, observed_at, text, meta, tokens, "
                "created_at")
_ITEMS_TRIGGER = """CREATE TRIGGER IF NOT EXISTS items_immutable BEFORE UPDATE ON items
BEGIN SELECT RAISE(ABORT, 'items are immutable'); END;"""

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS items (""" + _ITEMS_COLUMNS + """);
""" + _ITEMS_TRIGGER + """
CREATE TABLE IF NOT EXISTS pieces (
    rowid INTEGER PRIMARY KEY,
    scope TEXT NOT NULL,
    seq INTEGER NOT NULL,
    idx INTEGER NOT NULL,
    start INTEGER NOT NULL,
    end INTEGER NOT NULL,
    UNIQUE (scope, seq, idx)
);
CREATE VIRTUAL TABLE IF NOT EXISTS pieces_fts USING fts5(body, tokenize = 'porter unicode61');
CREATE TABLE IF NOT EXISTS embeddings (
    scope TEXT NOT NULL,
    seq INTEGER NOT NULL,
    model TEXT NOT NULL,
    vec BLOB NOT NULL,
    PRIMARY KEY (scope, seq, model)
);
CREATE TABLE IF NOT EXISTS records (
    scope TEXT NOT NULL,
    unit INTEGER NOT NULL,
    first_seq INTEGER NOT NULL,
    last_seq INTEGER NOT NULL,
    text TEXT NOT NULL,
    writer TEXT NOT NULL,
    PRIMARY KEY (scope, unit)
);
CREATE TABLE IF NOT EXISTS links (
    scope TEXT NOT NULL,
    src INTEGER NOT NULL,
    dst INTEGER NOT NULL,
    kind TEXT NOT NULL,
    weight REAL NOT NULL,
    PRIMARY KEY (scope, src, dst, kind)
);
"""


@dataclass(frozen=True, slots=True)
class ItemRow:
    """An item ready to be written: the caller has counted tokens and cut pieces.

    Keeping that work out of the store keeps the storage layer free of tokenizers and models.
    """

    item: NewItem
    tokens: int
    pieces: Sequence[tuple[int, int]]
    piece_bodies: Sequence[str]
    embedding: np.ndarray | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def validate_scope(scope: str) -> str:
    if not isinstance(scope, str) or not scope.strip():
        raise InvalidItemError("scope must be a non-empty string")
    if any(ord(c) < 32 for c in scope):
        raise InvalidItemError(f"scope {scope!r} contains control characters")
    return scope


def validate_item(item: NewItem, index: int) -> None:
    """Raise InvalidItemError naming the item when it cannot be stored."""
    where = f"item {index}" + (f" (id {item.id!r})" if item.id else "")
    if not isinstance(item.text, str):
        raise InvalidItemError(f"{where}: text must be a string, got {type(item.text).__name__}")
    if not item.text.strip():
        raise InvalidItemError(f"{where}: text is empty")
    if "\x00" in item.text:
        raise InvalidItemError(f"{where}: text contains a NUL character")
    if item.id is not None and (not isinstance(item.id, str) or not item.id.strip()):
        raise InvalidItemError(f"{where}: id must be a non-empty string when given")
    for name in ("session", "speaker", "role", "kind", "observed_at"):
        if not isinstance(getattr(item, name), str):
            raise InvalidItemError(f"{where}: {name} must be a string")
    for name in ("text", "session", "speaker", "role", "kind", "observed_at", "id"):
        value = getattr(item, name)
        if isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                raise InvalidItemError(f"{where}: {name} is not valid unicode (lone surrogate)") from None
    if not isinstance(item.meta, Mapping):
        raise InvalidItemError(f"{where}: meta must be a mapping, got {type(item.meta).__name__}")
    try:
        json.dumps(item.meta)
    except (TypeError, ValueError) as exc:
        raise InvalidItemError(f"{where}: meta is not JSON-serialisable ({exc})") from None


class SQLiteStore:
    """An append-only item log with its pieces, FTS5 index, embeddings, records and links."""

    def __init__(self, path: str | os.PathLike[str] = ":memory:", *, busy_timeout_s: float = 30.0,
                 max_retries: int = 50) -> None:
        self.path = str(path)
        if self.path != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        self._busy_timeout_s = busy_timeout_s
        self._max_retries = max_retries
        self._lock = threading.RLock()
        try:
            self._conn = sqlite3.connect(self.path, timeout=busy_timeout_s, isolation_level=None,
                                         check_same_thread=False)
        except sqlite3.Error as exc:
            raise StoreError(f"cannot open store at {self.path}: {exc}") from exc
        self._conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_s * 1000)}")
        if self.path != ":memory:":
            self._retry(lambda: self._conn.execute("PRAGMA journal_mode = WAL"))
        self._conn.execute("PRAGMA synchronous = NORMAL")
        self._migrate()

    # -- plumbing -----------------------------------------------------------------------------

    def _retry(self, fn: Any) -> Any:
        """Run ``fn``, retrying while another process holds the write lock."""
        delay = 0.005
        for attempt in range(self._max_retries):
            try:
                return fn()
            except sqlite3.OperationalError as exc:
                msg = str(exc).lower()
                if ("locked" not in msg and "busy" not in msg) or attempt == self._max_retries - 1:
                    raise StoreError(f"store {self.path}: {exc}") from exc
                time.sleep(delay * (1 + random.random()))
                delay = min(delay * 2, 0.5)
        raise StoreError(f"store {self.path}: still busy after {self._max_retries} attempts")

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One write transaction holding the database write lock from its first statement."""
        with self._lock:
            self._retry(lambda: self._conn.execute("BEGIN IMMEDIATE"))
            try:
                yield self._conn
                self._retry(lambda: self._conn.execute("COMMIT"))
            except BaseException:
                # SQLite may already have rolled back (e.g. on a failed COMMIT); never leave a
                # transaction open, or every later write would fail.
                if self._conn.in_transaction:
                    self._conn.execute("ROLLBACK")
                raise

    def _migrate(self) -> None:
        # The whole schema is created in one immediate transaction, so two processes opening a
        # new store at once cannot interleave; every statement is idempotent.
        script = "BEGIN IMMEDIATE;\n" + _SCHEMA + (
            "\nCREATE INDEX IF NOT EXISTS items_scope_session ON items (scope, session);"
            f"\nINSERT OR IGNORE INTO meta VALUES ('schema_version', '{SCHEMA_VERSION}');\nCOMMIT;"
        )
        self._run_script(script)
        version = self.schema_version
        if version == 1:
            self._migrate_v1()
            version = self.schema_version
        if version > SCHEMA_VERSION:
            raise StoreError(
                f"store {self.path} has schema version {version}, newer than this suffice "
                f"({SCHEMA_VERSION}); upgrade suffice"
            )

    def _migrate_v1(self) -> None:
        """v1 -> v2: rebuild the items table so client ids are unique per scope, not globally."""
        script = (
            "BEGIN IMMEDIATE;\n"
            f"CREATE TABLE items_v2 ({_ITEMS_COLUMNS});\n"
            f"INSERT INTO items_v2 (rowid, {_ITEM_FIELDS}) SELECT rowid, {_ITEM_FIELDS} FROM items;\n"
            "DROP TABLE items;\nALTER TABLE items_v2 RENAME TO items;\n"
            f"{_ITEMS_TRIGGER}\n"
            "CREATE INDEX IF NOT EXISTS items_scope_session ON items (scope, session);\n"
            "UPDATE meta SET value = '2' WHERE key = 'schema_version' AND value = '1';\nCOMMIT;"
        )
        self._run_script(script)

    def _run_script(self, script: str) -> None:
        """Run a schema script (its own BEGIN IMMEDIATE ... COMMIT), rolled back on failure."""
        with self._lock:
            try:
                self._retry(lambda: self._conn.executescript(script))
            except BaseException:
                if self._conn.in_transaction:
                    self._conn.execute("ROLLBACK")
                raise

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def __enter__(self) -> SQLiteStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def schema_version(self) -> int:
        row = self._conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        return int(row[0])

    # -- writes ---------------------------------------------------------------------------

    def append(self, scope: str, rows: Sequence[ItemRow], *, embed_model: str = "") -> list[Item]:
        """Write ``rows`` to ``scope`` in one transaction; return the stored items in order.

        An item whose client id is already stored with the same content is returned as stored
        (idempotent); with different content it raises ConflictError and nothing is written.
        """
        validate_scope(scope)
        for i, row in enumerate(rows):
            validate_item(row.item, i)
        ids = [r.item.id for r in rows if r.item.id is not None]
        if len(ids) != len(set(ids)):
            dup = next(x for x in ids if ids.count(x) > 1)
            raise InvalidItemError(f"id {dup!r} appears twice in one batch")
        out: list[Item] = []
        now = time.time()
        with self._write() as c:
            (top,) = c.execute("SELECT COALESCE(MAX(seq), -1) FROM items WHERE scope = ?",
                               (scope,)).fetchone()
            seq = int(top)
            for row in rows:
                new = row.item
                if new.id is not None:
                    existing = c.execute("SELECT * FROM items WHERE scope = ? AND id = ?",
                                         (scope, new.id)).fetchone()
                    if existing is not None:
                        stored = _row_to_item(existing)
                        if _content(stored) != _content(new):
                            raise ConflictError(
                                f"item id {new.id!r} is already stored in this scope with different "
                                "content; items are immutable"
                            )
                        out.append(stored)
                        continue
                seq += 1
                item_id = new.id if new.id is not None else uuid.uuid4().hex
                meta = json.dumps(new.meta, ensure_ascii=False, sort_keys=True)
                c.execute(
                    "INSERT INTO items (id, scope, seq, session, speaker, role, kind, observed_at,"
                    " text, meta, tokens, created_at) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
                    (item_id, scope, seq, new.session, new.speaker, new.role, new.kind,
                     new.observed_at, new.text, meta, row.tokens, now),
                )
                self._write_pieces(c, scope, seq, row.pieces, row.piece_bodies)
                if row.embedding is not None and embed_model:
                    c.execute("INSERT OR REPLACE INTO embeddings VALUES (?,?,?,?)",
                              (scope, seq, embed_model,
                               np.asarray(row.embedding, dtype=np.float32).tobytes()))
                out.append(Item(item_id, scope, seq, new.session, new.speaker, new.role, new.kind,
                                new.observed_at, new.text, dict(new.meta), row.tokens))
        return out

    def check_ids(self, scope: str, items: Sequence[NewItem]) -> list[bool]:
        """For each item: True if its client id is already stored with the same content.

        Raises ConflictError (before anything is written) if one is stored with other content,
        so a multi-batch add can refuse the whole input up front.
        """
        out: list[bool] = []
        ids = [it.id for it in items if it.id is not None]
        stored: dict[str, Item] = {}
        for i in range(0, len(ids), 500):
            chunk = ids[i:i + 500]
            marks = ",".join("?" * len(chunk))
            for r in self._read(f"SELECT * FROM items WHERE scope = ? AND id IN ({marks})",
                                (scope, *chunk)):
                stored[r[1]] = _row_to_item(r)
        for it in items:
            old = stored.get(it.id) if it.id is not None else None
            if old is not None and _content(old) != _content(it):
                raise ConflictError(f"item id {it.id!r} is already stored in this scope with "
                                    "different content; items are immutable")
            out.append(old is not None)
        return out

    @staticmethod
    def _write_pieces(c: sqlite3.Connection, scope: str, seq: int,
                      spans: Sequence[tuple[int, int]], bodies: Sequence[str]) -> None:
        for idx, ((start, end), body) in enumerate(zip(spans, bodies, strict=True)):
            cur = c.execute("INSERT INTO pieces (scope, seq, idx, start, end) VALUES (?,?,?,?,?)",
                            (scope, seq, idx, start, end))
            c.execute("INSERT INTO pieces_fts (rowid, body) VALUES (?, ?)", (cur.lastrowid, body))

    def replace_pieces(self, scope: str, seq: int, spans: Sequence[tuple[int, int]],
                       bodies: Sequence[str]) -> None:
        """Rebuild one item's pieces (a derived view; the item itself is untouched)."""
        with self._write() as c:
            old = [r[0] for r in c.execute("SELECT rowid FROM pieces WHERE scope=? AND seq=?",
                                           (scope, seq))]
            for rid in old:
                c.execute("DELETE FROM pieces_fts WHERE rowid = ?", (rid,))
            c.execute("DELETE FROM pieces WHERE scope=? AND seq=?", (scope, seq))
            self._write_pieces(c, scope, seq, spans, bodies)

    def put_embeddings(self, scope: str, model: str, seqs: Sequence[int], vecs: np.ndarray) -> None:
        with self._write() as c:
            c.executemany(
                "INSERT OR IGNORE INTO embeddings VALUES (?,?,?,?)",
                [(scope, int(s), model, np.asarray(v, dtype=np.float32).tobytes())
                 for s, v in zip(seqs, vecs, strict=True)],
            )

    def put_record(self, scope: str, unit: int, first_seq: int, last_seq: int, text: str,
                   writer: str, links: Sequence[tuple[int, str, float]] = ()) -> bool:
        """Write a unit's record and links once; returns False if the record already existed."""
        with self._write() as c:
            cur = c.execute("INSERT OR IGNORE INTO records VALUES (?,?,?,?,?,?)",
                            (scope, unit, first_seq, last_seq, text, writer))
            if cur.rowcount == 0:
                return False
            c.executemany("INSERT OR IGNORE INTO links VALUES (?,?,?,?,?)",
                          [(scope, unit, dst, kind, w) for dst, kind, w in links])
            return True

    # -- reads ----------------------------------------------------------------------------

    def _read(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        with self._lock:
            return self._retry(lambda: self._conn.execute(sql, params).fetchall())  # type: ignore[no-any-return]

    def scopes(self) -> list[str]:
        return [r[0] for r in self._read("SELECT DISTINCT scope FROM items ORDER BY scope")]

    def has_scope(self, scope: str) -> bool:
        return bool(self._read("SELECT 1 FROM items WHERE scope = ? LIMIT 1", (scope,)))

    def require_scope(self, scope: str) -> None:
        if not self.has_scope(scope):
            # Other scopes are not named: they may belong to other tenants.
            raise UnknownScopeError(f"unknown scope {scope!r}: it holds no items")

    def max_seq(self, scope: str) -> int:
        return int(self._read("SELECT COALESCE(MAX(seq), -1) FROM items WHERE scope = ?",
                              (scope,))[0][0])

    def items(self, scope: str, seqs: Sequence[int] | None = None, *, start: int = 0,
              end: int | None = None) -> list[Item]:
        """Items of ``scope`` by seq list, or the range ``start <= seq < end``, in seq order."""
        if seqs is not None:
            if not seqs:
                return []
            wanted = sorted({int(s) for s in seqs})
            rows: list[Any] = []
            for i in range(0, len(wanted), 500):
                chunk = wanted[i:i + 500]
                marks = ",".join("?" * len(chunk))
                rows += self._read(f"SELECT * FROM items WHERE scope = ? AND seq IN ({marks})",
                                   (scope, *chunk))
            return sorted((_row_to_item(r) for r in rows), key=lambda it: it.seq)
        hi = end if end is not None else 2**62
        rows = self._read("SELECT * FROM items WHERE scope = ? AND seq >= ? AND seq < ? ORDER BY seq",
                          (scope, start, hi))
        return [_row_to_item(r) for r in rows]

    def layout(self, scope: str, after_seq: int = -1) -> list[tuple[int, str, int]]:
        """(seq, session, tokens) of items after ``after_seq``: all the views need."""
        return [(int(a), str(b), int(c)) for a, b, c in self._read(
            "SELECT seq, session, tokens FROM items WHERE scope = ? AND seq > ? ORDER BY seq",
            (scope, after_seq))]

    def pieces(self, scope: str, seqs: Sequence[int]) -> dict[int, list[tuple[int, int, int]]]:
        """Pieces (idx, start, end) of the given items."""
        out: dict[int, list[tuple[int, int, int]]] = {}
        wanted = sorted({int(s) for s in seqs})
        for i in range(0, len(wanted), 500):
            chunk = wanted[i:i + 500]
            marks = ",".join("?" * len(chunk))
            for seq, idx, start, end in self._read(
                    f"SELECT seq, idx, start, end FROM pieces WHERE scope = ? AND seq IN ({marks})"
                    " ORDER BY seq, idx", (scope, *chunk)):
                out.setdefault(int(seq), []).append((int(idx), int(start), int(end)))
        return out

    def bm25(self, scope: str, terms: Sequence[str], limit: int,
             seq_range: tuple[int, int] | None = None) -> list[tuple[int, int, float]]:
        """(seq, piece idx, score) of the best pieces for ``terms``, best first.

        Scores are FTS5's Okapi BM25 (k1 = 1.2, b = 0.75) negated so larger is better.
        """
        if not terms:
            return []
        match = " OR ".join('"' + t.replace('"', '""') + '"' for t in terms)
        sql = ("SELECT p.seq, p.idx, -bm25(pieces_fts) AS s FROM pieces_fts "
               "JOIN pieces p ON p.rowid = pieces_fts.rowid "
               "WHERE pieces_fts MATCH ? AND p.scope = ?")
        params: list[Any] = [match, scope]
        if seq_range is not None:
            sql += " AND p.seq >= ? AND p.seq < ?"
            params += [seq_range[0], seq_range[1]]
        sql += " ORDER BY s DESC LIMIT ?"
        params.append(limit)
        return [(int(a), int(b), float(c)) for a, b, c in self._read(sql, params)]

    def embeddings(self, scope: str, model: str, after_seq: int = -1) -> tuple[np.ndarray, np.ndarray]:
        """(seqs, matrix) of stored embeddings of ``model`` for items after ``after_seq``."""
        rows = self._read("SELECT seq, vec FROM embeddings WHERE scope = ? AND model = ? AND seq > ?"
                          " ORDER BY seq", (scope, model, after_seq))
        if not rows:
            return np.zeros(0, dtype=np.int64), np.zeros((0, 0), dtype=np.float32)
        seqs = np.fromiter((r[0] for r in rows), dtype=np.int64, count=len(rows))
        # A writable, owned copy: BLAS is several times slower on the read-only buffer view.
        mat = np.frombuffer(b"".join(r[1] for r in rows), dtype=np.float32).reshape(len(rows), -1).copy()
        return seqs, mat

    def missing_embeddings(self, scope: str, model: str) -> list[int]:
        return [int(r[0]) for r in self._read(
            "SELECT i.seq FROM items i LEFT JOIN embeddings e ON e.scope = i.scope AND e.seq = i.seq"
            " AND e.model = ? WHERE i.scope = ? AND e.seq IS NULL ORDER BY i.seq", (model, scope))]

    def records(self, scope: str, after_unit: int = -1) -> list[tuple[int, int, int, str, str]]:
        """(unit, first_seq, last_seq, text, writer) of records after ``after_unit``, in unit order."""
        return [(int(a), int(b), int(c), str(d), str(e)) for a, b, c, d, e in self._read(
            "SELECT unit, first_seq, last_seq, text, writer FROM records WHERE scope = ? AND unit > ?"
            " ORDER BY unit", (scope, after_unit))]

    def links(self, scope: str, after_src: int = -1) -> list[tuple[int, int, str, float]]:
        """(src, dst, kind, weight) of links written by units after ``after_src``."""
        return [(int(a), int(b), str(c), float(d)) for a, b, c, d in self._read(
            "SELECT src, dst, kind, weight FROM links WHERE scope = ? AND src > ? ORDER BY src, dst, kind",
            (scope, after_src))]

    def stats(self, scope: str | None = None, *, embed_model: str = "") -> StoreStats:
        where, params = ("WHERE scope = ?", (scope,)) if scope is not None else ("", ())
        n, ntok, nsc, nses = self._read(
            f"SELECT COUNT(*), COALESCE(SUM(tokens), 0), COUNT(DISTINCT scope),"
            f" COUNT(DISTINCT scope || char(0) || session) FROM items {where}", params)[0]
        if embed_model:
            emb_where = "WHERE model = ?" + (" AND scope = ?" if scope is not None else "")
            emb_params: tuple[Any, ...] = (embed_model, *((scope,) if scope is not None else ()))
            (nemb,) = self._read(f"SELECT COUNT(*) FROM embeddings {emb_where}", emb_params)[0]
        else:  # any model: count items that have at least one vector
            (nemb,) = self._read(f"SELECT COUNT(*) FROM (SELECT DISTINCT scope, seq FROM embeddings"
                                 f" {where})", params)[0]
        return StoreStats(items=int(n), scopes=int(nsc), sessions=int(nses), embedded=int(nemb),
                          tokens=int(ntok), schema_version=self.schema_version, path=self.path)


def _content(item: Item | NewItem) -> tuple[str, ...]:
    """Everything a client supplies about an item, for the idempotency check."""
    return (item.text, item.session, item.speaker, item.role, item.kind, item.observed_at,
            json.dumps(item.meta, ensure_ascii=False, sort_keys=True))


def _row_to_item(r: Any) -> Item:
    return Item(id=r[1], scope=r[2], seq=int(r[3]), session=r[4], speaker=r[5], role=r[6],
                kind=r[7], observed_at=r[8], text=r[9], meta=json.loads(r[10]), tokens=int(r[11]))
