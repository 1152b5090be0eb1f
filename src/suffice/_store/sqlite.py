"""SQLite store (WAL): the embedded default.

Items are append-only: no call changes an item's content, and a trigger refuses an UPDATE of
any content column. The one exception is deletion for privacy (:meth:`SQLiteStore.forget`),
which removes items with every derived trace, closes the gap in ``seq`` and overwrites the freed
pages (``secure_delete``), then rewrites the database (``VACUUM``: page splits leave stale copies
of moved rows that ``secure_delete`` never sees) and folds and empties the write-ahead log, so the
text is gone from the files and not only from the tables.

A batch is one transaction; ids supplied by the client make re-adding a batch a no-op. Several
processes may write at once: ``BEGIN IMMEDIATE`` takes the write lock before ``seq`` is
assigned, and a busy store is retried with back-off.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from .._errors import ConflictError, InvalidItemError, StoreError
from .._types import AuditEntry, Filter, ForgetReport, Item, NewItem, StoreStats, canonical_json
from . import lexical
from .base import (
    TRANSFER_MARK,
    ItemRow,
    Layout,
    changes_key,
    content_key,
    validate_filter,
    validate_item,
    validate_scope,
)

SCHEMA_VERSION = 4
"""2: client ids unique per scope (1: across the store). 3: parsed time and agent columns,
audit table, content-only immutability (seq may close up after a forget). 4: one full-text
table per scope, so BM25's term statistics are each tenant's own."""

T = TypeVar("T")

_CONTENT = ("id, scope, session, speaker, role, kind, observed_at, text, meta, tokens, created_at, "
            "observed_ts, agent")
_COLUMNS = "id, scope, seq, session, speaker, role, kind, observed_at, text, meta, tokens, observed_ts, agent"
"""Item columns in the order :func:`_row_to_item` reads them."""

_ITEMS_COLUMNS_V2 = """
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
_V2_FIELDS = "id, scope, seq, session, speaker, role, kind, observed_at, text, meta, tokens, created_at"
_TRIGGER = f"""CREATE TRIGGER IF NOT EXISTS items_immutable BEFORE UPDATE OF {_CONTENT} ON items
BEGIN SELECT RAISE(ABORT, 'items are immutable'); END;"""

_VIEWS_SCHEMA = """
CREATE TABLE IF NOT EXISTS pieces (
    rowid INTEGER PRIMARY KEY,
    scope TEXT NOT NULL,
    seq INTEGER NOT NULL,
    idx INTEGER NOT NULL,
    start INTEGER NOT NULL,
    end INTEGER NOT NULL,
    UNIQUE (scope, seq, idx)
);
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
_V3_ADDITIONS = f"""
{_TRIGGER}
CREATE TABLE IF NOT EXISTS audit (
    rowid INTEGER PRIMARY KEY,
    at REAL NOT NULL,
    action TEXT NOT NULL,
    scope_sha256 TEXT NOT NULL,
    ids_sha256 TEXT NOT NULL,
    counts TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS items_scope_session ON items (scope, session);
CREATE INDEX IF NOT EXISTS items_scope_time ON items (scope, observed_ts);
"""


_CURRENT_OBJECTS = frozenset({"meta", "items", "pieces", "embeddings", "records", "links", "audit",
                              "items_immutable", "items_scope_session", "items_scope_time"})
"""What a store at SCHEMA_VERSION holds (tables, trigger, indexes): all of it, or it is migrated."""


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def fts_table(scope: str) -> str:
    """The scope's full-text table. Named by a digest, so the schema holds no scope name; one
    table per scope keeps BM25's document counts and frequencies within the tenant (a shared
    index would let one tenant's text move another's scores, and reveal its words)."""
    return "fts_" + _sha(scope)[:24]


_FTS_DDL = ("CREATE VIRTUAL TABLE IF NOT EXISTS \"{}\" USING fts5(body, tokenize = '"
            + lexical.FTS_TOKENIZER + "')")


def observed_text(value: object) -> str:
    """``observed_at`` as stored: text as given, a datetime as ISO 8601."""
    iso = getattr(value, "isoformat", None)
    return str(iso()) if callable(iso) else str(value)


class SQLiteStore:
    """An append-only item log with its pieces, FTS5 index, embeddings, records and links.

    ``create=False`` refuses to open a file that does not exist (read-only commands must not
    leave an empty store behind a mistyped path). ``vacuum_on_forget=False`` skips the rewrite
    after a forget (it reads and writes the whole file, seconds for a large store), at the price
    of stale copies of forgotten rows in free page space until the next ``VACUUM``.
    ``lexical_index_items``: a scope with at least this many items gets its BM25 postings held
    in memory (:mod:`suffice._store.lexical`), built on a thread of its own the first time a query
    finds the scope that large; FTS5 answers until it is ready, and whenever a query holds a
    filter or a term FTS5 reads as a phrase. None: FTS5 always.
    """

    def __init__(self, path: str | os.PathLike[str] = ":memory:", *, create: bool = True,
                 busy_timeout_s: float = 30.0, max_retries: int = 50,
                 vacuum_on_forget: bool = True, lexical_index_items: int | None = 20_000) -> None:
        self.path = str(path)
        self.config_poll_s = 0.0  # a local read: check on every call
        self.vacuum_on_forget = vacuum_on_forget
        self.lexical_index_items = lexical_index_items
        self._postings: lexical.Postings | None = None  # made once the file is open (it holds a connection)
        if self.path != ":memory:":
            p = Path(self.path)
            if p.is_dir():
                raise StoreError(f"store path {self.path} is a directory; name a file")
            if not create and not p.exists():
                raise StoreError(f"no store at {self.path}")
            try:
                p.parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:  # a file where a folder should be, no permission
                raise StoreError(f"cannot create the folder of store {self.path}: "
                                 f"{exc.strerror or exc}") from None
        self._max_retries = max_retries
        self._busy_timeout_s = busy_timeout_s
        self._lock = threading.RLock()
        try:
            self._conn = sqlite3.connect(self.path, timeout=busy_timeout_s, isolation_level=None,
                                         check_same_thread=False)
        except sqlite3.Error as exc:
            raise StoreError(f"cannot open store at {self.path}: {exc}") from None
        try:
            self._conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_s * 1000)}")
            self._refuse_foreign(create)
            if self.path != ":memory:":
                self._retry(lambda: self._conn.execute("PRAGMA journal_mode = WAL"))
            self._conn.execute("PRAGMA synchronous = NORMAL")
            # Freed content is overwritten with zeros: forgotten text leaves no bytes behind.
            self._conn.execute("PRAGMA secure_delete = ON")
            self._migrate()
        except (sqlite3.DatabaseError, StoreError) as exc:
            self._conn.close()
            # _retry gives a StoreError; a file that is no database says so in the opener's words
            cause = exc.__cause__ if isinstance(exc, StoreError) else exc
            if isinstance(cause, sqlite3.DatabaseError) and not isinstance(cause, sqlite3.OperationalError):
                raise StoreError(f"cannot open store at {self.path}: {cause} "
                                 "(is it a suffice store?)") from None
            raise
        except BaseException:
            self._conn.close()
            raise
        if lexical_index_items is not None and self.path != ":memory:":
            self._postings = lexical.Postings(self.path, lexical_index_items, self._read, self.generation,
                                              self.max_seq)

    def _refuse_foreign(self, create: bool) -> None:
        """Before anything is written: a database of another application is never turned into
        a store (its journal mode and tables stay its own), and with ``create=False`` neither
        is an empty file."""
        tables = {name for (name,) in self._retry(lambda: self._conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table'").fetchall())}
        if {"meta", "items"} <= tables \
                and any(r[1] == "key" for r in self._conn.execute("PRAGMA table_info(meta)")) \
                and self._retry(lambda: self._conn.execute(
                    "SELECT 1 FROM meta WHERE key = 'schema_version'").fetchone()) is not None:
            return  # a suffice store (any schema version)
        own = {t for t in tables if not t.startswith("sqlite_")}
        if own:
            shown = ", ".join(sorted(own)[:5]) + (", ..." if len(own) > 5 else "")
            raise StoreError(f"{self.path} is an SQLite database of another application (tables: "
                             f"{shown}), not a suffice store; name another file")
        if not create:
            raise StoreError(f"no store at {self.path} (the file holds no suffice store)")

    # -- plumbing -------------------------------------------------------------------------------

    def _retry(self, fn: Callable[[], T]) -> T:
        """Run ``fn``, retrying while another process holds the write lock, for at most
        ``busy_timeout_s`` in all (SQLite's own wait included): retries are for the busy
        answers SQLite gives without waiting, not a multiple of the timeout."""
        delay = 0.005
        give_up = time.monotonic() + self._busy_timeout_s
        for attempt in range(self._max_retries):
            try:
                return fn()
            except sqlite3.ProgrammingError as exc:  # e.g. used after close()
                raise StoreError(f"store {self.path}: {exc}") from None
            except sqlite3.OperationalError as exc:
                msg = str(exc).lower()
                if "locked" not in msg and "busy" not in msg:
                    raise StoreError(f"store {self.path}: {exc}") from exc
                if attempt == self._max_retries - 1 or time.monotonic() >= give_up:
                    raise StoreError(
                        f"store {self.path}: another process kept it locked for "
                        f"{self._busy_timeout_s:g} s ({exc}); try again when its write is done"
                    ) from exc
                time.sleep(delay * (1 + random.random()))
                delay = min(delay * 2, 0.5)
            except sqlite3.Error as exc:  # a damaged file, a full disk, ...: ours, with the path
                raise StoreError(f"store {self.path}: {exc}") from exc
        raise StoreError(f"store {self.path}: still busy after {self._max_retries} attempts")

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One write transaction holding the database write lock from its first statement."""
        with self._lock:
            self._retry(lambda: self._conn.execute("BEGIN IMMEDIATE"))
            try:
                yield self._conn
                self._retry(lambda: self._conn.execute("COMMIT"))
            except BaseException as exc:
                # SQLite may already have rolled back (e.g. on a failed COMMIT); never leave a
                # transaction open, or every later write would fail.
                if self._conn.in_transaction:
                    with suppress(sqlite3.Error):
                        self._conn.execute("ROLLBACK")
                if isinstance(exc, sqlite3.Error):  # a statement of the block: "disk is full", ...
                    raise StoreError(f"store {self.path}: {exc}; nothing of this write was kept") from exc
                raise

    def _run_script(self, script: str) -> None:
        """Run a schema script (its own BEGIN IMMEDIATE ... COMMIT), rolled back on failure."""
        with self._lock:
            try:
                self._retry(lambda: self._conn.executescript(script))
            except BaseException:
                if self._conn.in_transaction:
                    self._conn.execute("ROLLBACK")
                raise

    def _is_current(self) -> bool:
        """Whether the store already has this version's whole schema. Then opening it writes
        nothing: a reader does not wait for the write lock (a long import or forget may hold
        it) and a read-only file can be read."""
        try:
            names = {r[0] for r in self._conn.execute("SELECT name FROM sqlite_master")}
            if not _CURRENT_OBJECTS <= names:
                return False
            row = self._conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        except sqlite3.Error:
            return False
        return (row is not None and row[0] == str(SCHEMA_VERSION)
                and self._has_column("items", "observed_ts") and self._has_column("items", "agent"))

    def _migrate(self) -> None:
        if self._is_current():
            return
        # A new store gets the whole schema in one immediate transaction, so two processes
        # opening it at once cannot interleave; every statement is idempotent.
        self._run_script(
            "BEGIN IMMEDIATE;\nCREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);\n"
            "CREATE TABLE IF NOT EXISTS items (" + _ITEMS_COLUMNS_V2 + ");\n" + _VIEWS_SCHEMA
            + f"\nINSERT OR IGNORE INTO meta VALUES ('schema_version', '{SCHEMA_VERSION}');\n"
            "INSERT OR IGNORE INTO meta VALUES ('generation', '0');\nCOMMIT;")
        version = self.schema_version
        if version == 1:
            self._migrate_v1()
            version = self.schema_version
        if version == 2 or not self._has_column("items", "observed_ts"):
            self._migrate_v2()
            version = self.schema_version
        if version > SCHEMA_VERSION:
            raise StoreError(
                f"store {self.path} has schema version {version}, newer than this suffice "
                f"({SCHEMA_VERSION}); upgrade suffice")
        self._run_script("BEGIN IMMEDIATE;\n" + _V3_ADDITIONS + "\nCOMMIT;")
        if self.schema_version == 3:
            self._migrate_v3()

    def _has_column(self, table: str, column: str) -> bool:
        return any(r[1] == column for r in self._conn.execute(f"PRAGMA table_info({table})"))

    def _migrate_v1(self) -> None:
        """v1 -> v2: rebuild the items table so client ids are unique per scope, not globally.

        The version is checked again inside the transaction: another process may have migrated
        (and written) since this one read it."""
        with self._write() as c:
            if c.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()[0] != "1":
                return
            c.execute(f"CREATE TABLE items_v2 ({_ITEMS_COLUMNS_V2})")
            c.execute(f"INSERT INTO items_v2 (rowid, {_V2_FIELDS}) SELECT rowid, {_V2_FIELDS} FROM items")
            c.execute("DROP TABLE items")
            c.execute("ALTER TABLE items_v2 RENAME TO items")
            c.execute("UPDATE meta SET value = '2' WHERE key = 'schema_version' AND value = '1'")

    def _migrate_v2(self) -> None:
        """v2 -> v3 (and a new store): the parsed-time and agent columns; times are parsed from
        the stored text once, here."""
        from .._times import observed_time

        with self._write() as c:
            if not self._has_column("items", "observed_ts"):
                c.execute("ALTER TABLE items ADD COLUMN observed_ts REAL")
            if not self._has_column("items", "agent"):
                c.execute("ALTER TABLE items ADD COLUMN agent TEXT NOT NULL DEFAULT ''")
            c.execute("DROP TRIGGER IF EXISTS items_immutable")
            texts = c.execute("SELECT DISTINCT observed_at FROM items WHERE observed_at != ''").fetchall()
            c.executemany("UPDATE items SET observed_ts = ? WHERE observed_at = ?",
                          [(observed_time(t)[0], t) for (t,) in texts])
            c.execute(_TRIGGER)
            c.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", (str(SCHEMA_VERSION),))

    def _migrate_v3(self) -> None:
        """v3 -> v4: the one shared full-text table becomes one table per scope."""
        with self._write() as c:
            if c.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()[0] != "3":
                return
            shared = c.execute("SELECT 1 FROM sqlite_master WHERE name = 'pieces_fts'").fetchone()
            if shared:
                for (scope,) in c.execute("SELECT DISTINCT scope FROM pieces").fetchall():
                    table = self._fts(c, scope)
                    c.execute(f'INSERT INTO "{table}" (rowid, body) SELECT f.rowid, f.body FROM pieces_fts f'
                              " JOIN pieces p ON p.rowid = f.rowid WHERE p.scope = ?", (scope,))
                c.execute("DROP TABLE pieces_fts")
            c.execute("UPDATE meta SET value = '4' WHERE key = 'schema_version'")

    @staticmethod
    def _fts(c: sqlite3.Connection, scope: str) -> str:
        """The scope's full-text table, created inside the current write when it is new (another
        process may have dropped it with a forget: so it is never assumed)."""
        table = fts_table(scope)
        c.execute(_FTS_DDL.format(table))
        return table

    def _fts_exists(self, scope: str) -> str | None:
        table = fts_table(scope)
        found = self._read("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (table,))
        return table if found else None

    def close(self) -> None:
        if self._postings is not None:
            self._postings.close()
        with self._lock:
            self._conn.close()

    def __enter__(self) -> SQLiteStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _read(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        with self._lock:
            return self._retry(lambda: self._conn.execute(sql, params).fetchall())

    def _meta(self, key: str) -> str | None:
        rows = self._read("SELECT value FROM meta WHERE key = ?", (key,))
        return str(rows[0][0]) if rows else None

    @property
    def schema_version(self) -> int:
        return int(self._meta("schema_version") or 0)

    # -- configuration ----------------------------------------------------------------------------

    def load_config(self) -> dict[str, Any] | None:
        raw = self._meta("store_config")
        return None if raw is None else dict(json.loads(raw))

    def save_config(self, config: Mapping[str, Any], *, replace: bool = True) -> None:
        with self._write() as c:
            verb = "REPLACE" if replace else "IGNORE"  # IGNORE: a racing opener's config stands
            c.execute(f"INSERT OR {verb} INTO meta VALUES ('store_config', ?)",
                      (json.dumps(dict(config), sort_keys=True),))

    def generation(self) -> int:
        return int(self._meta("generation") or 0)

    def changes(self, scope: str) -> int:
        return int(self._meta(changes_key(scope)) or 0)

    @staticmethod
    def _count_change(c: sqlite3.Connection, scope: str) -> None:
        c.execute("INSERT INTO meta VALUES (?, '1') ON CONFLICT (key) DO UPDATE"
                  " SET value = CAST(value AS INTEGER) + 1", (changes_key(scope),))

    def note_transfer(self, scope: str, note: Mapping[str, Any] | None) -> None:
        key = TRANSFER_MARK + validate_scope(scope)
        with self._write() as c:
            if note is None:
                c.execute("DELETE FROM meta WHERE key = ?", (key,))
            else:
                c.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)",
                          (key, json.dumps(dict(note), sort_keys=True)))

    def unfinished_transfers(self) -> dict[str, dict[str, Any]]:
        rows = self._read("SELECT key, value FROM meta WHERE substr(key, 1, ?) = ? ORDER BY key",
                          (len(TRANSFER_MARK), TRANSFER_MARK))
        return {str(k)[len(TRANSFER_MARK):]: dict(json.loads(v)) for k, v in rows}

    def _bump_generation(self, c: sqlite3.Connection) -> None:
        c.execute("UPDATE meta SET value = CAST(value AS INTEGER) + 1 WHERE key = 'generation'")
        if self._postings is not None:  # they go at once: they hold forgotten rows' terms
            self._postings.invalidate()

    # -- writes -----------------------------------------------------------------------------------

    def append(self, scope: str, rows: Sequence[ItemRow], *, encoder: str = "",
               created: list[bool] | None = None) -> list[Item]:
        """Write ``rows`` to ``scope`` in one transaction; return the stored items in order.

        An item whose client id is already stored with the same content is returned as stored
        (idempotent); with different content it raises ConflictError and nothing is written.
        ``created`` (when given) gets one flag per returned item: True for a row this call
        wrote, False for one already there.
        """
        validate_scope(scope)
        for i, row in enumerate(rows):
            validate_item(row.item, i)
        ids = [r.item.id for r in rows if r.item.id is not None]
        if len(ids) != len(set(ids)):
            dup = next(x for x in ids if ids.count(x) > 1)
            raise InvalidItemError(f"id {dup!r} appears twice in one batch")
        out: list[Item] = []
        made: list[bool] = []
        now = time.time()
        with self._write() as c:
            (top,) = c.execute("SELECT COALESCE(MAX(seq), -1) FROM items WHERE scope = ?",
                               (scope,)).fetchone()
            seq = int(top)
            table = self._fts(c, scope) if rows else ""
            for row in rows:
                new = row.item
                if new.id is not None:
                    existing = c.execute(f"SELECT {_COLUMNS} FROM items WHERE scope = ? AND id = ?",
                                         (scope, new.id)).fetchone()
                    if existing is not None:
                        stored = _row_to_item(existing)
                        if content_key(stored) != content_key(new, row.observed_at):
                            raise ConflictError(
                                f"item id {new.id!r} is already stored in this scope with different "
                                "content; items are immutable")
                        out.append(stored)
                        made.append(False)
                        continue
                seq += 1
                made.append(True)
                item_id = new.id if new.id is not None else uuid.uuid4().hex
                meta = json.dumps(new.meta, ensure_ascii=False, sort_keys=True)
                c.execute(
                    "INSERT INTO items (id, scope, seq, session, speaker, role, kind, observed_at,"
                    " text, meta, tokens, created_at, observed_ts, agent)"
                    " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                    (item_id, scope, seq, new.session, new.speaker, new.role, new.kind,
                     row.observed_at, new.text, meta, row.tokens, now, row.observed_ts, new.agent))
                self._write_pieces(c, table, scope, seq, row.pieces, row.piece_bodies)
                if row.embedding is not None and encoder:
                    c.execute("INSERT OR REPLACE INTO embeddings VALUES (?,?,?,?)",
                              (scope, seq, encoder, np.asarray(row.embedding, dtype=np.float32).tobytes()))
                out.append(Item(item_id, scope, seq, new.session, new.speaker, new.role, new.kind,
                                row.observed_at, new.text, dict(new.meta), row.tokens,
                                row.observed_ts, new.agent))
        if created is not None:  # only once the transaction committed
            created.extend(made)
        return out

    def check_ids(self, scope: str, items: Sequence[NewItem]) -> list[Item | None]:
        """For each item: the stored item if its client id is already stored with the same
        content, else None.

        Raises ConflictError (before anything is written) if one is stored with other content,
        so a multi-batch add can refuse the whole input up front.
        """
        ids = [it.id for it in items if it.id is not None]
        stored: dict[str, Item] = {}
        for chunk in _chunks(ids):
            marks = ",".join("?" * len(chunk))
            for r in self._read(f"SELECT {_COLUMNS} FROM items WHERE scope = ? AND id IN ({marks})",
                                (scope, *chunk)):
                stored[r[0]] = _row_to_item(r)
        out: list[Item | None] = []
        for it in items:
            old = stored.get(it.id) if it.id is not None else None
            if old is not None and content_key(old) != content_key(it, observed_text(it.observed_at)):
                raise ConflictError(f"item id {it.id!r} is already stored in this scope with "
                                    "different content; items are immutable")
            out.append(old)
        return out

    @staticmethod
    def _write_pieces(c: sqlite3.Connection, table: str, scope: str, seq: int,
                      spans: Sequence[tuple[int, int]], bodies: Sequence[str]) -> None:
        for idx, ((start, end), body) in enumerate(zip(spans, bodies, strict=True)):
            cur = c.execute("INSERT INTO pieces (scope, seq, idx, start, end) VALUES (?,?,?,?,?)",
                            (scope, seq, idx, start, end))
            c.execute(f'INSERT INTO "{table}" (rowid, body) VALUES (?, ?)', (cur.lastrowid, body))

    def _delete_pieces(self, c: sqlite3.Connection, scope: str, seqs: Sequence[int]) -> int:
        table = self._fts(c, scope)
        n = 0
        for chunk in _chunks(list(seqs)):
            marks = ",".join("?" * len(chunk))
            rids = [r[0] for r in c.execute(
                f"SELECT rowid FROM pieces WHERE scope = ? AND seq IN ({marks})", (scope, *chunk))]
            c.executemany(f'DELETE FROM "{table}" WHERE rowid = ?', [(r,) for r in rids])
            c.execute(f"DELETE FROM pieces WHERE scope = ? AND seq IN ({marks})", (scope, *chunk))
            n += len(rids)
        return n

    def rebuild_pieces(self, scope: str, rows: Sequence[tuple[int, Sequence[tuple[int, int]],
                                                             Sequence[str]]]) -> None:
        with self._write() as c:
            self._delete_pieces(c, scope, [seq for seq, _, _ in rows])
            table = self._fts(c, scope)
            for seq, spans, bodies in rows:
                self._write_pieces(c, table, scope, seq, spans, bodies)
            self._count_change(c, scope)
            self._bump_generation(c)

    @staticmethod
    def _moved(c: sqlite3.Connection, generation: int | None) -> bool:
        """Inside a write: has the store left ``generation`` (None: no check)?"""
        if generation is None:
            return False
        row = c.execute("SELECT value FROM meta WHERE key = 'generation'").fetchone()
        return int(row[0] if row else 0) != generation

    def put_embeddings(self, scope: str, encoder: str, seqs: Sequence[int], vecs: np.ndarray, *,
                       generation: int | None = None) -> bool:
        with self._write() as c:
            if self._moved(c, generation):
                return False
            c.executemany(
                "INSERT OR IGNORE INTO embeddings VALUES (?,?,?,?)",
                [(scope, int(s), encoder, np.asarray(v, dtype=np.float32).tobytes())
                 for s, v in zip(seqs, vecs, strict=True)])
        return True

    def drop_embeddings(self) -> None:
        with self._write() as c:
            c.execute("DELETE FROM embeddings")
            self._bump_generation(c)

    def put_audit(self, entries: Sequence[AuditEntry]) -> None:
        with self._write() as c:
            c.executemany("INSERT INTO audit (at, action, scope_sha256, ids_sha256, counts)"
                          " VALUES (?,?,?,?,?)",
                          [(float(e.at), e.action, e.scope_sha256, json.dumps(list(e.ids_sha256)),
                            json.dumps(dict(e.counts))) for e in entries])

    def put_record(self, scope: str, unit: int, first_seq: int, last_seq: int, text: str,
                   writer: str, links: Sequence[tuple[int, str, float]] = (), *,
                   generation: int | None = None) -> bool:
        with self._write() as c:
            if self._moved(c, generation):
                return False
            cur = c.execute("INSERT OR IGNORE INTO records VALUES (?,?,?,?,?,?)",
                            (scope, unit, first_seq, last_seq, text, writer))
            if cur.rowcount == 0:
                return False
            c.executemany("INSERT OR IGNORE INTO links VALUES (?,?,?,?,?)",
                          [(scope, unit, dst, kind, w) for dst, kind, w in links])
            return True

    def drop_records(self, scope: str) -> None:
        with self._write() as c:
            c.execute("DELETE FROM records WHERE scope = ?", (scope,))
            c.execute("DELETE FROM links WHERE scope = ?", (scope,))
            self._count_change(c, scope)
            self._bump_generation(c)

    # -- forget -----------------------------------------------------------------------------------

    def forget(self, scope: str, *, ids: Sequence[str] | None = None,
               session: str | None = None) -> ForgetReport:
        """Delete items (the whole scope, one session's, or these ids) and all they left behind.

        In one transaction: the items, their pieces and full-text entries, their vectors, the
        records and links of every unit from the first one touched (they are rebuilt from the
        items that remain), then later items move up to close the gap in ``seq``, the full-text
        index is merged so no deleted term stays in an old segment, and one audit line (sha256
        digests and counts, never names or text) is written. Then the database is rewritten
        (``VACUUM``) and the write-ahead log is folded into the file and truncated.
        """
        validate_scope(scope)
        if ids is not None and session is not None:
            raise InvalidItemError("forget takes ids or a session, not both")
        with self._write() as c:
            if ids is not None:
                wanted = list(dict.fromkeys(str(x) for x in ids))
                rows = []
                for batch in _chunks(wanted):
                    marks = ",".join("?" * len(batch))
                    rows += c.execute(f"SELECT seq, id FROM items WHERE scope = ? AND id IN ({marks})",
                                      (scope, *batch)).fetchall()
                action = "forget items"
            elif session is not None:
                rows = c.execute("SELECT seq, id FROM items WHERE scope = ? AND session = ?",
                                 (scope, session)).fetchall()
                action = "forget session"
            else:
                rows = c.execute("SELECT seq, id FROM items WHERE scope = ?", (scope,)).fetchall()
                action = "forget scope"
                c.execute("DELETE FROM meta WHERE key = ?", (TRANSFER_MARK + scope,))
            if not rows:
                return ForgetReport(scope, 0, 0, 0, 0, 0, checkpointed=False)
            seqs = sorted(int(r[0]) for r in rows)
            first = seqs[0]
            n_pieces = self._delete_pieces(c, scope, seqs)
            n_vecs = _delete_seqs(c, "embeddings", scope, seqs)
            # The unit ending just before the first forgotten item closed because that item
            # started a new unit; with it gone, the next item may join it, so records are
            # re-derived from that unit on.
            (first_unit,) = c.execute(
                "SELECT COALESCE(MIN(unit), (SELECT COALESCE(MAX(unit), -1) + 1 FROM records"
                " WHERE scope = ?1)) FROM records WHERE scope = ?1 AND last_seq >= ?2",
                (scope, first - 1)).fetchone()
            n_records = c.execute("DELETE FROM records WHERE scope = ? AND unit >= ?",
                                  (scope, first_unit)).rowcount
            n_links = c.execute("DELETE FROM links WHERE scope = ? AND src >= ?",
                                (scope, first_unit)).rowcount
            _delete_seqs(c, "items", scope, seqs)
            self._close_gaps(c, scope, first)
            table = fts_table(scope)
            if c.execute("SELECT 1 FROM items WHERE scope = ? LIMIT 1", (scope,)).fetchone() is None:
                c.execute(f'DROP TABLE IF EXISTS "{table}"')  # the whole scope: its index goes too
            else:  # merge the segments, so no deleted term stays in an old one
                c.execute(f"INSERT INTO \"{table}\" (\"{table}\") VALUES ('optimize')")
            c.execute("INSERT INTO audit (at, action, scope_sha256, ids_sha256, counts) VALUES (?,?,?,?,?)",
                      (time.time(), action, _sha(scope),
                       json.dumps(sorted(_sha(str(r[1])) for r in rows)),
                       json.dumps({"items": len(seqs), "pieces": n_pieces, "vectors": n_vecs,
                                   "records": n_records, "links": n_links})))
            self._count_change(c, scope)
            self._bump_generation(c)
        scrubbed = self._vacuum() if self.vacuum_on_forget else False
        return ForgetReport(scope, len(seqs), n_pieces, n_vecs, n_records, n_links,
                            checkpointed=self._checkpoint(), scrubbed=scrubbed)

    def _vacuum(self) -> bool:
        """Rewrite the database into fresh pages; False (and the deletion stands) when it could
        not run, for example on a full disk: VACUUM needs room for a second copy."""
        with self._lock:
            try:
                self._retry(lambda: self._conn.execute("VACUUM"))
            except StoreError:
                return False
        return True

    @staticmethod
    def _close_gaps(c: sqlite3.Connection, scope: str, first: int) -> None:
        """Renumber the items after ``first`` to 0..n-1 order, with their pieces and vectors.

        Two passes through negative numbers, so no step collides with a seq still in use.
        """
        c.execute("DROP TABLE IF EXISTS temp.remap")
        c.execute("CREATE TEMP TABLE remap (old INTEGER PRIMARY KEY, new INTEGER NOT NULL)")
        c.execute("INSERT INTO temp.remap SELECT seq, ? + ROW_NUMBER() OVER (ORDER BY seq) - 1 FROM items"
                  " WHERE scope = ? AND seq > ?", (first, scope, first))
        c.execute("DELETE FROM temp.remap WHERE old = new")
        for table in ("items", "pieces", "embeddings"):
            c.execute(f"UPDATE {table} SET seq = -1 - (SELECT new FROM temp.remap WHERE old = {table}.seq)"
                      f" WHERE scope = ? AND seq IN (SELECT old FROM temp.remap)", (scope,))
            c.execute(f"UPDATE {table} SET seq = -1 - seq WHERE scope = ? AND seq < 0", (scope,))
        c.execute("DROP TABLE temp.remap")

    def _checkpoint(self, wait_s: float = 2.0) -> bool:
        """Fold the write-ahead log into the file and truncate it; False if other readers kept it
        in use for ``wait_s`` (the log is then emptied by a later checkpoint)."""
        if self.path == ":memory:":
            return True
        deadline = time.monotonic() + wait_s
        delay = 0.01
        with self._lock:
            (timeout_ms,) = self._conn.execute("PRAGMA busy_timeout").fetchone()
            self._conn.execute("PRAGMA busy_timeout = 0")  # poll here, never block in SQLite
            try:
                while True:
                    busy, _log, _done = self._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
                    if busy == 0:
                        return True
                    if time.monotonic() + delay > deadline:
                        return False
                    time.sleep(delay)
                    delay = min(delay * 2, 0.25)
            finally:
                self._conn.execute(f"PRAGMA busy_timeout = {int(timeout_ms)}")

    def check(self) -> list[str]:
        """Problems found in the store's files and derived tables; an empty list when sound.

        SQLite's own integrity check, the full-text index against its rows, pieces against
        items, contiguous seqs, vectors of one dimension and only for items that exist,
        records within their scope's log.
        """
        problems: list[str] = []
        try:
            self._check(problems)
        except (sqlite3.DatabaseError, StoreError) as exc:  # too damaged to finish the checks
            problems.append(f"sqlite: {exc} (the checks stopped here; restore a backup, or "
                            "export what can still be read)")
        return problems

    def _check(self, problems: list[str]) -> None:
        with self._lock:
            rows = self._conn.execute("PRAGMA integrity_check").fetchall()
            if [r[0] for r in rows] != ["ok"]:
                problems += [f"sqlite: {r[0]}" for r in rows[:20]]
        for scope in self.scopes():
            table = self._fts_exists(scope)
            if table is None:
                problems.append(f"scope {scope!r} has no full-text table")
                continue
            with self._lock:
                try:
                    self._conn.execute(f"INSERT INTO \"{table}\" (\"{table}\", rank)"
                                       " VALUES ('integrity-check', 1)")
                except sqlite3.DatabaseError as exc:
                    problems.append(f"full-text index of scope {scope!r}: {exc}")
            for what, sql in (
                    ("pieces not in the scope's full-text table",
                     f'SELECT p.rowid FROM pieces p LEFT JOIN "{table}" f ON f.rowid = p.rowid'
                     " WHERE p.scope = ? AND f.rowid IS NULL"),
                    ("full-text rows of no piece of the scope",
                     f'SELECT f.rowid FROM "{table}" f LEFT JOIN pieces p ON p.rowid = f.rowid'
                     " AND p.scope = ?"
                     " WHERE p.rowid IS NULL")):
                found = self._read(sql, (scope,))
                if found:
                    problems.append(f"scope {scope!r}: {what}: {len(found)}")
        checks = {
            "scopes whose seqs have gaps or repeats":
                "SELECT scope FROM items GROUP BY scope HAVING MAX(seq) + 1 != COUNT(*) OR MIN(seq) != 0",
            "items without a piece":
                "SELECT i.scope, i.seq FROM items i LEFT JOIN pieces p ON p.scope = i.scope AND p.seq = i.seq"
                " WHERE p.rowid IS NULL",
            "pieces of no item":
                "SELECT p.scope, p.seq FROM pieces p LEFT JOIN items i ON i.scope = p.scope AND i.seq = p.seq"
                " WHERE i.rowid IS NULL",
            "vectors of no item":
                "SELECT e.scope, e.seq FROM embeddings e LEFT JOIN items i ON i.scope = e.scope"
                " AND i.seq = e.seq"
                " WHERE i.rowid IS NULL",
            "vectors of another encoder than most":
                "SELECT DISTINCT model FROM embeddings WHERE model != (SELECT model FROM embeddings"
                " GROUP BY model ORDER BY COUNT(*) DESC LIMIT 1)",
            "vectors of unequal size": "SELECT 1 FROM embeddings GROUP BY LENGTH(vec) HAVING COUNT(*) > 0"
                                       " LIMIT -1 OFFSET 1",
            "records beyond their scope's log":
                "SELECT r.scope, r.unit FROM records r WHERE r.last_seq >= (SELECT COUNT(*) FROM items i"
                " WHERE i.scope = r.scope) OR r.first_seq > r.last_seq",
            "links from or to a unit with no record":
                "SELECT l.scope, l.src FROM links l LEFT JOIN records r ON r.scope = l.scope"
                " AND r.unit = l.src"
                " WHERE r.unit IS NULL",
        }
        for what, sql in checks.items():
            found = self._read(sql)
            if found:
                problems.append(f"{what}: {len(found)} (first: {found[0]!r})")

    def audit(self) -> list[AuditEntry]:
        return [AuditEntry(float(at), str(action), str(sc), tuple(json.loads(ids)), dict(json.loads(counts)))
                for at, action, sc, ids, counts in self._read(
                    "SELECT at, action, scope_sha256, ids_sha256, counts FROM audit ORDER BY rowid")]

    # -- reads ------------------------------------------------------------------------------------

    def scopes(self) -> list[str]:
        return [r[0] for r in self._read("SELECT DISTINCT scope FROM items ORDER BY scope")]

    def has_scope(self, scope: str) -> bool:
        return bool(self._read("SELECT 1 FROM items WHERE scope = ? LIMIT 1", (scope,)))

    def max_seq(self, scope: str) -> int:
        return int(self._read("SELECT COALESCE(MAX(seq), -1) FROM items WHERE scope = ?", (scope,))[0][0])

    def items(self, scope: str, seqs: Sequence[int] | None = None, *, start: int = 0,
              end: int | None = None) -> list[Item]:
        """Items of ``scope`` by seq list, or the range ``start <= seq < end``, in seq order."""
        if seqs is not None:
            rows: list[Any] = []
            for part in _chunks(sorted({int(s) for s in seqs})):
                marks = ",".join("?" * len(part))
                rows += self._read(f"SELECT {_COLUMNS} FROM items WHERE scope = ? AND seq IN ({marks})",
                                   (scope, *part))
            return sorted((_row_to_item(r) for r in rows), key=lambda it: it.seq)
        hi = end if end is not None else 2**62
        return [_row_to_item(r) for r in self._read(
            f"SELECT {_COLUMNS} FROM items WHERE scope = ? AND seq >= ? AND seq < ? ORDER BY seq",
            (scope, start, hi))]

    def get(self, scope: str, item_id: str) -> Item | None:
        rows = self._read(f"SELECT {_COLUMNS} FROM items WHERE scope = ? AND id = ?", (scope, item_id))
        return _row_to_item(rows[0]) if rows else None

    def find(self, scope: str, flt: Filter | None = None, *, offset: int = 0, limit: int | None = None,
             newest_first: bool = False) -> list[Item]:
        where, params = _filter_sql(flt, "items")
        order = "DESC" if newest_first else "ASC"
        return [_row_to_item(r) for r in self._read(
            f"SELECT {_COLUMNS} FROM items WHERE scope = ?{where} ORDER BY seq {order} LIMIT ? OFFSET ?",
            (scope, *params, -1 if limit is None else limit, offset))]

    def filter_seqs(self, scope: str, flt: Filter) -> np.ndarray:
        where, params = _filter_sql(flt, "items")
        rows = self._read(f"SELECT seq FROM items WHERE scope = ?{where} ORDER BY seq", (scope, *params))
        return np.fromiter((r[0] for r in rows), dtype=np.int64, count=len(rows))

    def layout(self, scope: str, after_seq: int = -1) -> Layout:
        return [(int(a), str(b), int(c)) for a, b, c in self._read(
            "SELECT seq, session, tokens FROM items WHERE scope = ? AND seq > ? ORDER BY seq",
            (scope, after_seq))]

    def pieces(self, scope: str, seqs: Sequence[int]) -> dict[int, list[tuple[int, int, int]]]:
        """Pieces (idx, start, end) of the given items."""
        out: dict[int, list[tuple[int, int, int]]] = {}
        for part in _chunks(sorted({int(s) for s in seqs})):
            marks = ",".join("?" * len(part))
            for seq, idx, start, end in self._read(
                    f"SELECT seq, idx, start, end FROM pieces WHERE scope = ? AND seq IN ({marks})"
                    " ORDER BY seq, idx", (scope, *part)):
                out.setdefault(int(seq), []).append((int(idx), int(start), int(end)))
        return out

    def piece_bodies(self, scope: str, seqs: Sequence[int]) -> dict[int, list[str]]:
        table = self._fts_exists(scope)
        out: dict[int, list[str]] = {}
        if table is None:
            return out
        for part in _chunks(sorted({int(s) for s in seqs})):
            marks = ",".join("?" * len(part))
            for seq, body in self._read(
                    f'SELECT p.seq, f.body FROM pieces p JOIN "{table}" f ON f.rowid = p.rowid'
                    f" WHERE p.scope = ? AND p.seq IN ({marks}) ORDER BY p.seq, p.idx", (scope, *part)):
                out.setdefault(int(seq), []).append(str(body))
        return out

    def bm25(self, scope: str, terms: Sequence[str], limit: int, flt: Filter | None = None
             ) -> list[tuple[int, int, float]]:
        """(seq, piece idx, score) of the best pieces for ``terms``, best first.

        Scores are FTS5's Okapi BM25 (k1 = 1.2, b = 0.75) negated so larger is better.
        """
        if not terms or limit <= 0:
            return []
        if flt is not None:
            validate_filter(flt)
        if self._postings is not None and (flt is None or not _needs_items(flt)):
            found = self._postings.search(scope, fts_table(scope), terms, limit,
                                          None if flt is None else flt.before_seq)
            if found is not None:
                return found
        match = " OR ".join('"' + t.replace('"', '""') + '"' for t in terms)
        table = fts_table(scope)
        sql = (f'SELECT p.seq, p.idx, -bm25("{table}") AS s FROM "{table}" f '
               "JOIN pieces p ON p.rowid = f.rowid ")
        params: list[Any] = []
        where, fparams = _filter_sql(flt, "i", seq_alias="p")
        if flt is not None and _needs_items(flt):
            sql += "JOIN items i ON i.scope = p.scope AND i.seq = p.seq "
        sql += f'WHERE "{table}" MATCH ? AND p.scope = ?{where} ORDER BY s DESC LIMIT ?'
        params = [match, scope, *fparams, limit]
        try:
            rows = self._read(sql, params)
        except StoreError as exc:
            if "no such table" in str(exc):  # the scope holds no items (or all were forgotten)
                return []
            raise
        return [(int(a), int(b), float(c)) for a, b, c in rows]

    def prepare_lexical(self, scope: str) -> bool:
        """Build the scope's in-memory BM25 index now, whatever its size, and wait for it; False
        when there is none to build (an in-memory store, the option off, no items). For
        benchmarks and warm-ups: a large scope gets its index on its own at its first query."""
        return self._postings is not None and self._postings.prepare(scope, fts_table(scope))

    def embeddings(self, scope: str, encoder: str, after_seq: int = -1, *,
                   before_seq: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(seqs, matrix) of stored vectors of ``encoder`` for items after ``after_seq`` (and
        before ``before_seq``)."""
        rows = self._read("SELECT seq, vec FROM embeddings WHERE scope = ? AND model = ? AND seq > ?"
                          " AND seq < ? ORDER BY seq",
                          (scope, encoder, after_seq, 2**62 if before_seq is None else before_seq))
        if not rows:
            return np.zeros(0, dtype=np.int64), np.zeros((0, 0), dtype=np.float32)
        seqs = np.fromiter((r[0] for r in rows), dtype=np.int64, count=len(rows))
        # A writable, owned copy: BLAS is several times slower on the read-only buffer view.
        mat = np.frombuffer(b"".join(r[1] for r in rows), dtype=np.float32).reshape(len(rows), -1).copy()
        return seqs, mat

    def encoders(self, scope: str) -> list[str]:
        return sorted(str(r[0]) for r in self._read("SELECT DISTINCT model FROM embeddings WHERE scope = ?",
                                                    (scope,)))

    def missing_embeddings(self, scope: str, encoder: str) -> list[int]:
        return [int(r[0]) for r in self._read(
            "SELECT i.seq FROM items i LEFT JOIN embeddings e ON e.scope = i.scope AND e.seq = i.seq"
            " AND e.model = ? WHERE i.scope = ? AND e.seq IS NULL ORDER BY i.seq", (encoder, scope))]

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

    def stats(self, scope: str | None = None) -> StoreStats:
        where, params = ("WHERE scope = ?", (scope,)) if scope is not None else ("", ())
        n, ntok, nsc, nses = self._read(
            f"SELECT COUNT(*), COALESCE(SUM(tokens), 0), COUNT(DISTINCT scope),"
            f" COUNT(DISTINCT scope || char(0) || session) FROM items {where}", params)[0]
        (nemb,) = self._read(f"SELECT COUNT(*) FROM (SELECT DISTINCT scope, seq FROM embeddings {where})",
                             params)[0]
        config = self.load_config() or {}
        return StoreStats(items=int(n), scopes=int(nsc), sessions=int(nses), embedded=int(nemb),
                          tokens=int(ntok), schema_version=self.schema_version, path=self.path,
                          encoder=str(config.get("encoder", "")))


def _chunks(values: Sequence[T], size: int = 500) -> Iterator[Sequence[T]]:
    """Slices small enough for SQLite's limit on bound parameters."""
    for i in range(0, len(values), size):
        yield values[i:i + size]


def _delete_seqs(c: sqlite3.Connection, table: str, scope: str, seqs: Sequence[int]) -> int:
    """Delete the rows of ``table`` for these items of ``scope``; how many went."""
    n = 0
    for part in _chunks(seqs):
        marks = ",".join("?" * len(part))
        n += c.execute(f"DELETE FROM {table} WHERE scope = ? AND seq IN ({marks})", (scope, *part)).rowcount
    return n


def _needs_items(flt: Filter) -> bool:
    return any(getattr(flt, f) is not None for f in
               ("session", "speaker", "kind", "role", "agent", "since", "until", "meta"))


def _filter_sql(flt: Filter | None, alias: str, seq_alias: str | None = None) -> tuple[str, list[Any]]:
    """`` AND ...`` conditions (and their parameters) that apply ``flt`` to items as ``alias``."""
    if flt is None:
        return "", []
    validate_filter(flt)
    conds: list[str] = []
    params: list[Any] = []
    for name in ("session", "speaker", "kind", "role", "agent"):
        value = getattr(flt, name)
        if value is not None:
            conds.append(f"{alias}.{name} = ?")
            params.append(value)
    if flt.since is not None:
        conds.append(f"{alias}.observed_ts >= ?")
        params.append(float(flt.since))
    if flt.until is not None:
        conds.append(f"{alias}.observed_ts < ?")
        params.append(float(flt.until))
    for key, value in (flt.meta or {}).items():
        test, args = _meta_test(value)
        conds.append(f"EXISTS (SELECT 1 FROM json_each({alias}.meta) j WHERE j.key = ? AND {test})")
        params += [key, *args]
    if flt.before_seq is not None:
        conds.append(f"{seq_alias or alias}.seq < ?")
        params.append(int(flt.before_seq))
    return "".join(f" AND {c}" for c in conds), params


def _meta_test(value: Any) -> tuple[str, list[Any]]:
    """SQL over ``json_each`` (as ``j``) that holds when a meta value equals ``value`` the way
    :meth:`Filter.matches` decides it: same JSON type, numbers by value, containers by content."""
    if value is None:
        return "j.type = 'null'", []
    if isinstance(value, bool):
        return "j.type = ?", ["true" if value else "false"]
    if isinstance(value, (int, float)):
        return "j.type IN ('integer', 'real') AND j.value = ?", [value]
    if isinstance(value, str):
        return "j.type = 'text' AND j.value = ?", [value]
    return "j.type IN ('object', 'array') AND j.value = ?", [canonical_json(value)]


def _row_to_item(r: Sequence[Any]) -> Item:
    return Item(id=r[0], scope=r[1], seq=int(r[2]), session=r[3], speaker=r[4], role=r[5],
                kind=r[6], observed_at=r[7], text=r[8], meta=json.loads(r[9]), tokens=int(r[10]),
                observed_ts=None if r[11] is None else float(r[11]), agent=r[12])
