"""PostgreSQL + pgvector store: the SQLite store's contract on a database server.

Layout. One schema (``suffice`` unless the URL says ``?schema=NAME``) holds the tables. Items get
an immutable row id (``rid``) besides their ``seq``: pieces and vectors hang off the row id, so
closing the gap after a forget renumbers ``items.seq`` only and never rewrites a vector (which
would mean re-inserting it into the HNSW graph). Row ids grow with ``seq`` inside a scope (one
writer per scope at a time, identity values handed out in order), so ``seq < n`` becomes
``rid < rid(n)`` and pieces and vectors can be cut by position without a join.

Lexical side: a real Okapi BM25 (k1 = 1.2, b = 0.75, FTS5's idf) over each scope's own
statistics, from an inverted index kept in step with the pieces: ``terms`` maps (scope, lexeme)
to a term id, ``postings`` holds (term, row, piece, term frequency, piece length) under a
covering primary key, and each scope row keeps its piece count and token total. A query reads
the postings of its lexemes (an index-only scan) and counts document frequencies from them on
the way, so no write keeps a count up to date. Not ``ts_rank_cd``: it has no idf (a common word
weighs as much as a rare name), so it would rank differently from the SQLite store, and a memory
must answer the same on either backend; nor BM25 computed from ``tsvector`` positions, which
unpacks every matching piece (22 ms a query at 10k items, against 1.8 ms from postings). Lexemes
come from PostgreSQL's parser and the Snowball English stemmer without a stopword list (FTS5
keeps stopwords too).

Dense side: ``vector`` columns and, per scope, encoder and dimension, a partial HNSW index
(cosine), built in the background once the scope has ``exact_below`` items and a dense query
asks for it; below that (and until it is built) :meth:`PostgresStore.nearest` scans exactly.
One index per scope keeps another tenant's vectors out of every graph walk.

Isolation. Every statement names its scope, as a bound parameter (or, for the partial vector
indexes, as the scope's integer id written into the statement); postings are reached only
through the scope's term ids. No row-level security, decided after trying it: an operator that
is not marked leakproof (full-text ``@@``, jsonb ``@>``) may not be an index condition under a
policy, so the planner scans the whole scope instead (measured here: 4.7 ms instead of 1.1 ms at
10k rows, growing with the scope); postings carry no scope column for a policy to test; and
superusers and table owners bypass policies while any client can set the session variable a
policy would read, so it would guard against nothing but this module's own SQL, which the
isolation property tests already run against this backend.

Writes. Each call is one transaction that first takes an advisory lock on its scope, so
concurrent writers (threads or processes) queue per scope and never share a ``seq``; other
scopes write in parallel. Connections come from a small pool, so a store is safe to share
between threads.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import re
import struct
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from typing import Any, TypeVar
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

import numpy as np
import psycopg
from psycopg import errors as pgerrors
from psycopg import sql
from psycopg.adapt import Buffer, Dumper, Loader
from psycopg.pq import Format
from psycopg.types import TypeInfo
from psycopg_pool import ConnectionPool

from .._errors import ConflictError, InvalidItemError, StoreError
from .._types import AuditEntry, Filter, ForgetReport, Item, NewItem, StoreStats
from .base import (
    TRANSFER_MARK,
    ItemRow,
    Layout,
    changes_key,
    content_key,
    has_nul,
    validate_filter,
    validate_item,
    validate_scope,
)
from .sqlite import observed_text

PG_SCHEMA_VERSION = 2
"""Version of this backend's table layout (independent of the SQLite store's). 2: text goes
through ``suffice_prep`` before it is parsed (a version-1 store's full text is re-derived on
open)."""

HNSW_MAX_DIM = 2000
"""pgvector's HNSW index takes vectors of at most this many dimensions; larger ones are
searched exactly."""
MAX_DIM = 16000
"""pgvector's ``vector`` type holds at most this many dimensions."""
BUILD_RETRY_S = 600.0
"""After an index build failed, dense queries wait this long before starting another."""

K1, B = 1.2, 0.75
"""BM25 parameters: FTS5's, so both backends score alike."""

DEFAULT_SCHEMA = "suffice"
_SCHEMA_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")

T = TypeVar("T")

_COLUMNS = ("id, scope, seq, session, speaker, role, kind, observed_at, text, meta, tokens, observed_ts,"
            " agent")
"""Item columns in the order :func:`_row_to_item` reads them."""

_RID_OF_BOUND = ("COALESCE((SELECT rid FROM items WHERE scope = %(scope)s AND seq = %(bound)s),"
                 " 9223372036854775807)")
"""Row id of the item at ``before_seq`` (none beyond the log): ``seq < n`` as ``rid < this``."""

_CONTENT = ("id, scope, session, speaker, role, kind, observed_at, text, meta, meta_j, tokens, created_at,"
            " observed_ts, agent")

_DDL = f"""
CREATE TABLE IF NOT EXISTS meta (key text PRIMARY KEY, value text NOT NULL);
CREATE TABLE IF NOT EXISTS scopes (
    name text PRIMARY KEY,
    sid bigint GENERATED ALWAYS AS IDENTITY UNIQUE,
    items bigint NOT NULL DEFAULT 0,
    pieces bigint NOT NULL DEFAULT 0,
    piece_tokens bigint NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS items (
    rid bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    scope text NOT NULL,
    seq integer NOT NULL,
    id text NOT NULL,
    session text NOT NULL,
    speaker text NOT NULL,
    role text NOT NULL,
    kind text NOT NULL,
    observed_at text NOT NULL,
    text text NOT NULL,
    meta text NOT NULL,
    meta_j jsonb NOT NULL,
    tokens integer NOT NULL,
    created_at double precision NOT NULL,
    observed_ts double precision,
    agent text NOT NULL,
    CONSTRAINT items_scope_seq UNIQUE (scope, seq) DEFERRABLE INITIALLY IMMEDIATE,
    CONSTRAINT items_scope_id UNIQUE (scope, id)
);
CREATE INDEX IF NOT EXISTS items_scope_session ON items (scope, session);
CREATE INDEX IF NOT EXISTS items_scope_time ON items (scope, observed_ts);
CREATE INDEX IF NOT EXISTS items_meta ON items USING gin (meta_j jsonb_path_ops);
CREATE TABLE IF NOT EXISTS pieces (
    rid bigint NOT NULL,
    idx integer NOT NULL,
    scope text NOT NULL,
    start integer NOT NULL,
    "end" integer NOT NULL,
    body text NOT NULL,
    dl integer NOT NULL,
    PRIMARY KEY (rid, idx)
);
CREATE TABLE IF NOT EXISTS terms (
    tid bigint GENERATED ALWAYS AS IDENTITY UNIQUE,
    scope text NOT NULL,
    lex text NOT NULL,
    PRIMARY KEY (scope, lex)
);
CREATE TABLE IF NOT EXISTS postings (
    tid bigint NOT NULL,
    rid bigint NOT NULL,
    idx integer NOT NULL,
    tf integer NOT NULL,
    dl integer NOT NULL,
    PRIMARY KEY (tid, rid, idx) INCLUDE (tf, dl)
);
CREATE TABLE IF NOT EXISTS embeddings (
    rid bigint NOT NULL,
    model text NOT NULL,
    sid bigint NOT NULL,
    dim integer NOT NULL,
    vec vector NOT NULL,
    PRIMARY KEY (rid, model)
);
ALTER TABLE embeddings ALTER COLUMN vec SET STORAGE MAIN;
CREATE INDEX IF NOT EXISTS embeddings_scope ON embeddings (sid, model, dim, rid);
CREATE TABLE IF NOT EXISTS records (
    scope text NOT NULL,
    unit integer NOT NULL,
    first_seq integer NOT NULL,
    last_seq integer NOT NULL,
    text text NOT NULL,
    writer text NOT NULL,
    PRIMARY KEY (scope, unit)
);
CREATE TABLE IF NOT EXISTS links (
    scope text NOT NULL,
    src integer NOT NULL,
    dst integer NOT NULL,
    kind text NOT NULL,
    weight double precision NOT NULL,
    PRIMARY KEY (scope, src, dst, kind)
);
CREATE TABLE IF NOT EXISTS audit (
    n bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at double precision NOT NULL,
    action text NOT NULL,
    scope_sha256 text NOT NULL,
    ids_sha256 text NOT NULL,
    counts text NOT NULL
);
CREATE OR REPLACE FUNCTION items_immutable() RETURNS trigger LANGUAGE plpgsql AS
$$BEGIN RAISE EXCEPTION 'items are immutable'; END$$;
CREATE OR REPLACE TRIGGER items_immutable BEFORE UPDATE OF {_CONTENT} ON items
    FOR EACH ROW EXECUTE FUNCTION items_immutable();
INSERT INTO meta VALUES ('schema_version', '{PG_SCHEMA_VERSION}'), ('generation', '0')
    ON CONFLICT (key) DO NOTHING;
"""

_TS_CONFIG = """
CREATE TEXT SEARCH DICTIONARY {schema}.suffice_stem (TEMPLATE = snowball, LANGUAGE = english);
CREATE TEXT SEARCH CONFIGURATION {schema}.suffice_en (COPY = pg_catalog.english);
ALTER TEXT SEARCH CONFIGURATION {schema}.suffice_en
    ALTER MAPPING FOR asciiword, asciihword, hword_asciipart, word, hword, hword_part
    WITH {schema}.suffice_stem;
"""
"""English stemming without a stopword list: "the" and "who" stay searchable, as in FTS5."""

_TS_PREP = r"""
CREATE OR REPLACE FUNCTION {schema}.suffice_prep(t text) RETURNS text
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS
$$ SELECT regexp_replace({unaccented}, '[][!"#$%&''()*+,./:;<=>?@\\^_`{{|}}~-]+', ' ', 'g') $$;
"""
"""Text as FTS5's unicode61 tokenizer sees it, for PostgreSQL's parser: ASCII punctuation is a
separator (the parser would keep ``ana@example.com``, ``2.5`` or ``taxes.pdf`` whole, where FTS5
finds ``example``, ``5`` and ``pdf``) and accents are dropped (``café`` is found by ``cafe``).
Created once per store and kept: its postings were parsed with it, so a change here needs a new
schema version that parses them again."""
_UNACCENT_UTF8 = r"normalize(regexp_replace(normalize(t, NFD), '[\u0300-\u036f]+', '', 'g'), NFC)"
"""Accents off: decompose, drop the combining marks, compose again (UTF-8 databases only)."""

_REPARSE = """
UPDATE pieces p SET dl = (SELECT COALESCE(sum(cardinality(l.positions)), 0)
    FROM unnest(to_tsvector('{cfg}', {prep}(p.body))) l);
DELETE FROM postings;
DELETE FROM terms;
INSERT INTO terms (scope, lex) SELECT DISTINCT p.scope, l.lexeme
    FROM pieces p, unnest(to_tsvector('{cfg}', {prep}(p.body))) l;
INSERT INTO postings (tid, rid, idx, tf, dl) SELECT t.tid, p.rid, p.idx, cardinality(l.positions), p.dl
    FROM pieces p CROSS JOIN LATERAL unnest(to_tsvector('{cfg}', {prep}(p.body))) l
    JOIN terms t ON t.scope = p.scope AND t.lex = l.lexeme;
UPDATE scopes s SET piece_tokens = COALESCE((SELECT sum(dl) FROM pieces WHERE scope = s.name), 0);
UPDATE meta SET value = (value::bigint + 1)::text WHERE key = 'generation';
"""
"""Every scope's full-text statistics derived again from the stored pieces (the upgrade to 2)."""


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def split_url(url: str) -> tuple[str, str, str]:
    """(conninfo for libpq, schema, the URL without its password): ``?schema=`` is ours, not
    libpq's, so it is taken out before connecting."""
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    schema = DEFAULT_SCHEMA
    rest: list[tuple[str, str]] = []
    for key, value in query:
        if key == "schema":
            schema = value
        else:
            rest.append((key, value))
    if not _SCHEMA_NAME.fullmatch(schema):
        raise StoreError(f"schema {schema!r} in {url.split('@')[-1]!r} must be a lower-case identifier "
                         "(letters, digits, underscores; at most 63 characters)")
    conninfo = urlunsplit(parts._replace(query=urlencode(rest, safe="/", quote_via=quote)))
    netloc = parts.netloc
    if "@" in netloc:
        cred, host = netloc.rsplit("@", 1)
        netloc = cred.split(":", 1)[0] + "@" + host
    shown = [(k, v) for k, v in rest if "password" not in k.lower()]  # password, sslpassword
    if schema != DEFAULT_SCHEMA:
        shown.append(("schema", schema))
    return conninfo, schema, urlunsplit(parts._replace(netloc=netloc, query=urlencode(shown, safe="/",
                                                                                  quote_via=quote)))


# -- pgvector's binary format: uint16 dimensions, uint16 unused, float32 big-endian values -----------

class _VectorDumper(Dumper):
    format = Format.BINARY

    def dump(self, obj: Any) -> Buffer:
        arr = np.ascontiguousarray(obj, dtype=">f4").ravel()
        return struct.pack(">HH", arr.size, 0) + arr.tobytes()


class _VectorLoader(Loader):
    format = Format.BINARY

    def load(self, data: Buffer) -> np.ndarray:
        return np.frombuffer(data, dtype=">f4", offset=4).astype(np.float32)


class _VectorTextLoader(Loader):
    def load(self, data: Buffer) -> np.ndarray:
        return np.asarray(json.loads(bytes(data)), dtype=np.float32)


class PostgresStore:
    """The store contract on PostgreSQL with pgvector (see the module docstring for the layout).

    ``url`` is a libpq URL; ``?schema=NAME`` picks the schema (default ``suffice``), so one
    database can hold several stores. ``create=False`` refuses a schema that holds no store.
    ``exact_below``: scopes with fewer items are searched exactly (no ANN index);
    ``ef_search``: the HNSW candidate list of a query (raised to the query's limit);
    ``auto_index``: build a scope's HNSW index in the background the first time a dense query
    finds the scope large enough; ``vacuum_on_forget``: VACUUM the touched tables after a forget,
    so the forgotten rows' space is reclaimed and reused rather than left as dead rows.
    """

    def __init__(self, url: str, *, create: bool = True, pool_size: int = 8, exact_below: int = 3000,
                 ef_search: int = 100, auto_index: bool = True, vacuum_on_forget: bool = True,
                 hnsw_m: int = 16, hnsw_ef_construction: int = 64, connect_timeout_s: float = 30.0) -> None:
        self._conninfo, self.schema, self.path = split_url(url)
        self.config_poll_s = 1.0  # a round trip: at most once a second per memory
        self.exact_below = int(exact_below)
        self.ef_search = int(ef_search)
        self.auto_index = auto_index
        self.vacuum_on_forget = vacuum_on_forget
        self._hnsw = (int(hnsw_m), int(hnsw_ef_construction))
        self._lock_ns = int.from_bytes(hashlib.sha256(self.schema.encode()).digest()[:4], "big", signed=True)
        self._tscfg = f"{self.schema}.suffice_en"
        self._prep = f"{self.schema}.suffice_prep"
        self._closed = False
        self.created = False
        """True when this open created the schema (see :meth:`drop_if_created`)."""
        self._builds: dict[str, tuple[threading.Thread, list[psycopg.Connection[Any]]]] = {}
        self._build_lock = threading.Lock()
        self._valid_indexes: set[str] = set()
        self._failed_builds: dict[str, float] = {}
        self._heads: dict[str, tuple[int, int, float]] = {}
        try:
            with psycopg.connect(self._conninfo, autocommit=True,
                                 connect_timeout=int(connect_timeout_s)) as c:
                vector_schema = self._setup(c, create)
                oid, array_oid = c.execute(
                    "SELECT t.oid, t.typarray FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace"
                    " WHERE t.typname = 'vector' AND n.nspname = %s", (vector_schema,)).fetchone() or (0, 0)
        except psycopg.Error as exc:
            raise StoreError(f"cannot open store at {self.path}: {_message(exc)}") from None
        self._vector = TypeInfo("vector", int(oid), int(array_oid))
        self._search_path = f"{self.schema},{vector_schema}"
        self._pool = ConnectionPool(
            self._conninfo, min_size=1, max_size=max(1, pool_size), open=False, timeout=connect_timeout_s,
            name=f"suffice-{self.schema}", configure=self._configure, num_workers=1,
            kwargs={"autocommit": True, "options": (
                f"-c search_path={self._search_path} -c hnsw.ef_search={self.ef_search}"
                # Iterative scans only start when a filter has rejected candidates: without one a
                # query reads its ef_search list once, as before. Results are re-sorted here.
                " -c hnsw.iterative_scan=relaxed_order")})
        try:
            self._pool.open(wait=True, timeout=connect_timeout_s)
        except Exception as exc:
            self._pool.close()
            raise StoreError(f"cannot open store at {self.path}: {exc}") from None

    # -- plumbing -------------------------------------------------------------------------------

    def _setup(self, c: psycopg.Connection[Any], create: bool) -> str:
        """Create (or check) the schema; returns the schema holding pgvector's ``vector`` type.

        Under one advisory lock, so two processes opening a new store at once cannot interleave
        their DDL; every statement is idempotent."""
        ident = sql.Identifier(self.schema)
        keyword = c.execute("SELECT catdesc FROM pg_get_keywords() WHERE word = %s AND catcode <> 'U'",
                            (self.schema,)).fetchone()
        if keyword is not None:  # the schema's name goes into statements unquoted
            raise StoreError(f"cannot open store at {self.path}: schema {self.schema!r} is an SQL keyword "
                             f"({keyword[0]}); name another with ?schema=")
        with c.transaction():
            c.execute("SELECT pg_advisory_xact_lock(%s, 0)", (self._lock_ns,))
            has_meta = c.execute("SELECT to_regclass(%s)", (f"{self.schema}.meta",)).fetchone()
            if has_meta is None or has_meta[0] is None:
                if not create:
                    raise StoreError(f"no store at {self.path}")
                others = c.execute("SELECT count(*) FROM pg_class c JOIN pg_namespace n"
                                   " ON n.oid = c.relnamespace WHERE n.nspname = %s",
                                   (self.schema,)).fetchone()
                if others is not None and others[0]:
                    raise StoreError(f"cannot open store at {self.path}: schema {self.schema!r} holds tables "
                                     "that are not a suffice store; name another with ?schema=")
            row = c.execute("SELECT n.nspname FROM pg_extension e JOIN pg_namespace n"
                            " ON n.oid = e.extnamespace WHERE e.extname = 'vector'").fetchone()
            if row is None:
                try:
                    with c.transaction():
                        c.execute("CREATE EXTENSION IF NOT EXISTS vector SCHEMA public")
                except pgerrors.UniqueViolation:
                    pass  # another store's first open created it at the same moment: it is there
                except psycopg.Error as exc:
                    raise StoreError(
                        f"cannot open store at {self.path}: the pgvector extension is not installed in this "
                        f"database and could not be created ({_message(exc)}); run CREATE EXTENSION vector "
                        "as a superuser") from None
                row = c.execute("SELECT n.nspname FROM pg_extension e JOIN pg_namespace n"
                                " ON n.oid = e.extnamespace WHERE e.extname = 'vector'").fetchone()
                vector_schema = str(row[0]) if row is not None else "public"
            else:
                vector_schema = str(row[0])
            self.created = c.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s",
                                     (self.schema,)).fetchone() is None
            c.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(ident))
            c.execute(sql.SQL("SET LOCAL search_path = {}, {}").format(ident, sql.Identifier(vector_schema)))
            version = c.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone() \
                if has_meta is not None and has_meta[0] is not None else None
            if version is not None and int(version[0]) > PG_SCHEMA_VERSION:
                raise StoreError(f"store {self.path} has schema version {version[0]}, newer than this "
                                 f"suffice ({PG_SCHEMA_VERSION}); upgrade suffice")
            items = c.execute("SELECT to_regclass(%s)", (f"{self.schema}.items",)).fetchone()
            if version is None or items is None or items[0] is None:
                c.execute(_DDL.encode())
            if not c.execute("SELECT 1 FROM pg_ts_config WHERE cfgname = 'suffice_en'"
                             " AND cfgnamespace = %s::regnamespace", (self.schema,)).fetchone():
                c.execute(_TS_CONFIG.format(schema=self.schema).encode())
            if c.execute("SELECT to_regprocedure(%s)", (f"{self._prep}(text)",)).fetchone() == (None,):
                utf8 = c.execute("SHOW server_encoding").fetchone() == ("UTF8",)
                unaccented = _UNACCENT_UTF8 if utf8 else "t"
                c.execute(_TS_PREP.format(schema=self.schema, unaccented=unaccented).encode())
            if version is not None and int(version[0]) < 2:  # parsed without suffice_prep: again
                c.execute(_REPARSE.format(cfg=self._tscfg, prep=self._prep).encode())
                c.execute("UPDATE meta SET value = %s WHERE key = 'schema_version'",
                          (str(PG_SCHEMA_VERSION),))
        return vector_schema

    def _configure(self, conn: psycopg.Connection[Any]) -> None:
        self._vector.register(conn)
        dumper = type("VectorDumper", (_VectorDumper,), {"oid": self._vector.oid})
        conn.adapters.register_dumper(np.ndarray, dumper)
        conn.adapters.register_loader(self._vector.oid, _VectorLoader)
        conn.adapters.register_loader(self._vector.oid, _VectorTextLoader)

    @contextmanager
    def _conn(self) -> Iterator[psycopg.Connection[Any]]:
        if self._closed:
            raise StoreError(f"store {self.path} is closed")
        try:
            with self._pool.connection() as conn:
                yield conn
        except psycopg.Error as exc:
            raise StoreError(f"store {self.path}: {_message(exc)}") from exc
        except Exception as exc:
            if type(exc).__module__.startswith("psycopg_pool"):
                raise StoreError(f"store {self.path}: {exc}") from exc
            raise

    def _read(self, query: Any, params: Sequence[Any] | Mapping[str, Any] = (), *,
              binary: bool = False) -> list[tuple[Any, ...]]:
        with self._conn() as conn:
            return conn.execute(query, params, binary=binary).fetchall()

    def _tx(self, scope: str | None, fn: Callable[[psycopg.Connection[Any]], T], retries: int = 8) -> T:
        """Run ``fn`` in one transaction holding ``scope``'s write lock; a deadlock (two forgets
        meeting on shared rows) is retried with back-off: each attempt starts from scratch."""
        delay = 0.01
        for attempt in range(retries):
            try:
                with self._conn() as conn, conn.transaction():
                    if scope is not None:
                        conn.execute("SELECT pg_advisory_xact_lock(%s, hashtext(%s))", (self._lock_ns, scope))
                    return fn(conn)
            except StoreError as exc:
                cause = exc.__cause__
                if not isinstance(cause, (pgerrors.DeadlockDetected, pgerrors.SerializationFailure)) \
                        or attempt == retries - 1:
                    raise
                time.sleep(delay * (1 + random.random()))
                delay = min(delay * 2, 0.5)
        raise StoreError(f"store {self.path}: gave up after {retries} attempts")  # pragma: no cover

    def drop_if_created(self) -> bool:
        """Drop the schema this open created, if it still holds no item, and close: a first
        import that fails leaves no empty store behind. False (store kept) otherwise."""
        if not self.created or self._closed:
            return False

        def drop(c: psycopg.Connection[Any]) -> bool:
            c.execute("SELECT pg_advisory_xact_lock(%s, 0)", (self._lock_ns,))
            if c.execute("SELECT EXISTS (SELECT 1 FROM items)").fetchone() != (False,):
                return False
            c.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(self.schema)))
            return True

        try:
            return self._tx(None, drop)
        finally:
            self.close()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        with self._build_lock:
            builds = list(self._builds.values())
        for _, conns in builds:
            for conn in list(conns):
                with suppress(Exception):
                    conn.cancel_safe(timeout=2.0)
        for thread, _ in builds:
            thread.join(timeout=10.0)
        self._pool.close()

    def __enter__(self) -> PostgresStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _meta(self, key: str) -> str | None:
        rows = self._read("SELECT value FROM meta WHERE key = %s", (key,))
        return str(rows[0][0]) if rows else None

    @property
    def schema_version(self) -> int:
        return int(self._meta("schema_version") or 0)

    # -- configuration ----------------------------------------------------------------------------

    def load_config(self) -> dict[str, Any] | None:
        raw = self._meta("store_config")
        return None if raw is None else dict(json.loads(raw))

    def save_config(self, config: Mapping[str, Any], *, replace: bool = True) -> None:
        verb = "UPDATE SET value = excluded.value" if replace else "NOTHING"  # NOTHING: a racing opener wins
        value = json.dumps(dict(config), sort_keys=True)
        self._tx(None, lambda c: c.execute(
            f"INSERT INTO meta VALUES ('store_config', %s) ON CONFLICT (key) DO {verb}", (value,)))

    def generation(self) -> int:
        return int(self._meta("generation") or 0)

    def changes(self, scope: str) -> int:
        return int(self._meta(changes_key(scope)) or 0)

    @staticmethod
    def _count_change(c: psycopg.Connection[Any], scope: str) -> None:
        c.execute("INSERT INTO meta VALUES (%s, '1') ON CONFLICT (key) DO UPDATE"
                  " SET value = (meta.value::bigint + 1)::text", (changes_key(scope),))

    def note_transfer(self, scope: str, note: Mapping[str, Any] | None) -> None:
        key = TRANSFER_MARK + validate_scope(scope)
        if note is None:
            self._tx(None, lambda c: c.execute("DELETE FROM meta WHERE key = %s", (key,)))
            return
        value = json.dumps(dict(note), sort_keys=True)
        self._tx(None, lambda c: c.execute(
            "INSERT INTO meta VALUES (%s, %s) ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            (key, value)))

    def unfinished_transfers(self) -> dict[str, dict[str, Any]]:
        rows = self._read("SELECT key, value FROM meta WHERE left(key, %s) = %s ORDER BY key",
                          (len(TRANSFER_MARK), TRANSFER_MARK))
        return {str(k)[len(TRANSFER_MARK):]: dict(json.loads(v)) for k, v in rows}

    @staticmethod
    def _bump_generation(c: psycopg.Connection[Any]) -> None:
        c.execute("UPDATE meta SET value = (value::bigint + 1)::text WHERE key = 'generation'")

    # -- writes -----------------------------------------------------------------------------------

    def append(self, scope: str, rows: Sequence[ItemRow], *, encoder: str = "",
               created: list[bool] | None = None) -> list[Item]:
        """Write ``rows`` to ``scope`` in one transaction; return the stored items in order.

        An item whose client id is already stored with the same content is returned as stored
        (idempotent); with different content it raises ConflictError and nothing is written.
        """
        validate_scope(scope)
        for i, row in enumerate(rows):
            validate_item(row.item, i)
            _refuse_nul(row, i)
        ids = [r.item.id for r in rows if r.item.id is not None]
        if len(ids) != len(set(ids)):
            dup = next(x for x in ids if ids.count(x) > 1)
            raise InvalidItemError(f"id {dup!r} appears twice in one batch")
        if not rows:
            return []
        now = time.time()

        def write(c: psycopg.Connection[Any]) -> tuple[list[Item], list[bool]]:
            stored: dict[str, Item] = {}
            if ids:
                for r in c.execute(f"SELECT {_COLUMNS} FROM items WHERE scope = %s AND id = ANY(%s)",
                                   (scope, ids)).fetchall():
                    stored[r[0]] = _row_to_item(r)
            top = c.execute("SELECT COALESCE(MAX(seq), -1) FROM items WHERE scope = %s", (scope,)).fetchone()
            seq = int(top[0]) if top else -1
            out: list[Item] = []
            made: list[bool] = []
            fresh: list[tuple[int, ItemRow, Item]] = []
            for row in rows:
                new = row.item
                old = stored.get(new.id) if new.id is not None else None
                if old is not None:
                    if content_key(old) != content_key(new, row.observed_at):
                        raise ConflictError(f"item id {new.id!r} is already stored in this scope with "
                                            "different content; items are immutable")
                    out.append(old)
                    made.append(False)
                    continue
                seq += 1
                made.append(True)
                item = Item(new.id if new.id is not None else uuid.uuid4().hex, scope, seq, new.session,
                            new.speaker, new.role, new.kind, row.observed_at, new.text, dict(new.meta),
                            row.tokens, row.observed_ts, new.agent)
                fresh.append((len(out), row, item))
                out.append(item)
            if fresh:
                self._insert(c, scope, fresh, encoder, now)
            return out, made

        out, made = self._tx(scope, write)
        if created is not None:  # only once the transaction committed (a retried one runs again)
            created.extend(made)
        return out

    def _insert(self, c: psycopg.Connection[Any], scope: str, fresh: Sequence[tuple[int, ItemRow, Item]],
                encoder: str, now: float) -> None:
        c.execute("INSERT INTO scopes (name) VALUES (%s) ON CONFLICT (name) DO NOTHING", (scope,))
        items = [it for _, _, it in fresh]
        metas = [json.dumps(it.meta, ensure_ascii=False, sort_keys=True) for it in items]
        got = c.execute(
            "INSERT INTO items (scope, seq, id, session, speaker, role, kind, observed_at, text, meta,"
            " meta_j, tokens, created_at, observed_ts, agent)"
            " SELECT %s, u.seq, u.id, u.session, u.speaker, u.role, u.kind, u.observed_at, u.text, u.meta,"
            " u.meta::jsonb, u.tokens, %s, u.ts, u.agent"
            " FROM unnest(%s::int[], %s::text[], %s::text[], %s::text[], %s::text[], %s::text[], %s::text[],"
            " %s::text[], %s::text[], %s::int[], %s::float8[], %s::text[])"
            " AS u(seq, id, session, speaker, role, kind, observed_at, text, meta, tokens, ts, agent)"
            " ORDER BY u.seq RETURNING seq, rid",
            (scope, now, [it.seq for it in items], [it.id for it in items], [it.session for it in items],
             [it.speaker for it in items], [it.role for it in items], [it.kind for it in items],
             [it.observed_at for it in items], [it.text for it in items], metas, [it.tokens for it in items],
             [it.observed_ts for it in items], [it.agent for it in items])).fetchall()
        rid_of = {int(s): int(r) for s, r in got}
        self._write_pieces(c, scope, [(rid_of[it.seq], row.pieces, row.piece_bodies)
                                      for (_, row, it) in fresh])
        with_vec = [(rid_of[it.seq], row.embedding) for _, row, it in fresh if row.embedding is not None]
        _check_dims([v for _, v in with_vec])
        if with_vec and encoder:
            c.execute(
                "INSERT INTO embeddings (rid, model, sid, dim, vec)"
                " SELECT u.rid, %s, s.sid, vector_dims(u.v), u.v"
                " FROM unnest(%s::bigint[], %b::vector[]) AS u(rid, v)"
                " JOIN scopes s ON s.name = %s ON CONFLICT DO NOTHING",
                (encoder, [r for r, _ in with_vec], [np.asarray(v, dtype=np.float32) for _, v in with_vec],
                 scope))
        c.execute("UPDATE scopes SET items = items + %s WHERE name = %s", (len(items), scope))

    def _write_pieces(self, c: psycopg.Connection[Any], scope: str,
                      rows: Sequence[tuple[int, Sequence[tuple[int, int]], Sequence[str]]]) -> None:
        """Insert pieces and add them to the scope's BM25 statistics, in one statement."""
        rids: list[int] = []
        idxs: list[int] = []
        starts: list[int] = []
        ends: list[int] = []
        bodies: list[str] = []
        for rid, spans, texts in rows:
            for idx, ((start, end), body) in enumerate(zip(spans, texts, strict=True)):
                rids.append(rid)
                idxs.append(idx)
                starts.append(int(start))
                ends.append(int(end))
                bodies.append(body)
        if not rids:
            return
        # The bodies are parsed once (the MATERIALIZED CTE): the pieces, their postings, new
        # lexemes of the scope and its piece count and token total all come from that.
        c.execute(
            "WITH x AS MATERIALIZED (SELECT u.r, u.i, u.s, u.e, u.b,"
            f"  to_tsvector('{self._tscfg}', {self._prep}(u.b)) AS v"
            "  FROM unnest(%(r)s::bigint[], %(i)s::int[], %(s)s::int[], %(e)s::int[], %(b)s::text[])"
            "  AS u(r, i, s, e, b)),"
            " lx AS MATERIALIZED (SELECT x.r, x.i, l.lexeme, cardinality(l.positions) AS tf"
            "  FROM x, unnest(x.v) l),"
            " dl AS MATERIALIZED (SELECT r, i, sum(tf)::int AS dl FROM lx GROUP BY r, i),"
            " np AS (INSERT INTO pieces (rid, idx, scope, start, \"end\", body, dl)"
            "  SELECT x.r, x.i, %(scope)s, x.s, x.e, x.b, COALESCE(dl.dl, 0)"
            "  FROM x LEFT JOIN dl ON dl.r = x.r AND dl.i = x.i),"
            " lexs AS MATERIALIZED (SELECT DISTINCT lexeme FROM lx),"
            " old AS MATERIALIZED (SELECT t.tid, t.lex FROM terms t JOIN lexs ON t.scope = %(scope)s"
            "  AND t.lex = lexs.lexeme),"
            " new AS (INSERT INTO terms (scope, lex) SELECT %(scope)s, lexeme FROM lexs"
            "  WHERE lexeme NOT IN (SELECT lex FROM old) RETURNING tid, lex),"
            " ids AS (SELECT tid, lex FROM old UNION ALL SELECT tid, lex FROM new),"
            " npo AS (INSERT INTO postings (tid, rid, idx, tf, dl) SELECT ids.tid, lx.r, lx.i, lx.tf, dl.dl"
            "  FROM lx JOIN ids ON ids.lex = lx.lexeme JOIN dl ON dl.r = lx.r AND dl.i = lx.i)"
            " UPDATE scopes SET pieces = pieces + %(n)s,"
            " piece_tokens = piece_tokens + (SELECT COALESCE(sum(dl), 0) FROM dl) WHERE name = %(scope)s",
            {"scope": scope, "r": rids, "i": idxs, "s": starts, "e": ends, "b": bodies, "n": len(rids)})

    def _delete_pieces(self, c: psycopg.Connection[Any], scope: str, rids: Sequence[int]) -> int:
        """Delete the pieces of these items with their postings, and take them out of the BM25
        statistics; lexemes no piece holds any more go too (they are words of the deleted text).
        The postings are found by parsing the bodies again (the parse is deterministic), so
        they need no index by row id."""
        row = c.execute(
            "WITH dp AS (DELETE FROM pieces WHERE scope = %(scope)s AND rid = ANY(%(rids)s)"
            "  RETURNING rid, idx, body, dl),"
            f" lx AS MATERIALIZED (SELECT DISTINCT dp.rid, dp.idx, l.lexeme"
            f"  FROM dp, unnest(to_tsvector('{self._tscfg}', {self._prep}(dp.body))) l),"
            " tx AS MATERIALIZED (SELECT t.tid, lx.rid, lx.idx FROM lx JOIN terms t"
            "  ON t.scope = %(scope)s AND t.lex = lx.lexeme),"
            " dpo AS (DELETE FROM postings po USING tx WHERE po.tid = tx.tid AND po.rid = tx.rid"
            "  AND po.idx = tx.idx RETURNING po.tid),"
            " ds AS (UPDATE scopes SET pieces = pieces - (SELECT count(*) FROM dp),"
            "  piece_tokens = piece_tokens - (SELECT COALESCE(sum(dl), 0) FROM dp) WHERE name = %(scope)s)"
            " SELECT (SELECT count(*) FROM dp), ARRAY(SELECT DISTINCT tid FROM dpo)",
            {"scope": scope, "rids": list(rids)}).fetchone()
        if row is None:
            return 0
        c.execute("DELETE FROM terms t WHERE t.scope = %s AND t.tid = ANY(%s)"
                  " AND NOT EXISTS (SELECT 1 FROM postings p WHERE p.tid = t.tid)", (scope, list(row[1])))
        return int(row[0])

    def check_ids(self, scope: str, items: Sequence[NewItem]) -> list[Item | None]:
        """For each item: the stored item if its client id is already stored with the same
        content, else None.

        Raises ConflictError (before anything is written) if one is stored with other content.
        """
        ids = [it.id for it in items if it.id is not None and "\x00" not in it.id]  # NUL: never stored
        stored: dict[str, Item] = {}
        if ids:
            for r in self._read(f"SELECT {_COLUMNS} FROM items WHERE scope = %s AND id = ANY(%s)",
                                (scope, ids)):
                stored[r[0]] = _row_to_item(r)
        out: list[Item | None] = []
        for it in items:
            old = stored.get(it.id) if it.id is not None else None
            if old is not None and content_key(old) != content_key(it, observed_text(it.observed_at)):
                raise ConflictError(f"item id {it.id!r} is already stored in this scope with "
                                    "different content; items are immutable")
            out.append(old)
        return out

    def _rids(self, c: psycopg.Connection[Any], scope: str, seqs: Sequence[int]) -> dict[int, int]:
        return {int(s): int(r) for s, r in c.execute(
            "SELECT seq, rid FROM items WHERE scope = %s AND seq = ANY(%s)", (scope, [int(s) for s in seqs]))}

    def rebuild_pieces(self, scope: str, rows: Sequence[tuple[int, Sequence[tuple[int, int]],
                                                             Sequence[str]]]) -> None:
        for seq, _, bodies in rows:
            if any("\x00" in b for b in bodies):
                raise InvalidItemError(f"item at seq {seq}: a piece contains a NUL character")

        def write(c: psycopg.Connection[Any]) -> None:
            rid_of = self._rids(c, scope, [seq for seq, _, _ in rows])
            self._delete_pieces(c, scope, list(rid_of.values()))
            self._write_pieces(c, scope, [(rid_of[seq], spans, bodies) for seq, spans, bodies in rows
                                          if seq in rid_of])
            self._count_change(c, scope)
            self._bump_generation(c)

        self._tx(scope, write)

    @staticmethod
    def _moved(c: psycopg.Connection[Any], generation: int | None) -> bool:
        """Inside a transaction: has the store left ``generation`` (None: no check)? The row is
        read FOR SHARE, so a forget's bump of it waits for this transaction, and this read
        waits for (and then sees) a forget already under way."""
        if generation is None:
            return False
        row = c.execute("SELECT value FROM meta WHERE key = 'generation' FOR SHARE").fetchone()
        return int(row[0] if row else 0) != generation

    def put_embeddings(self, scope: str, encoder: str, seqs: Sequence[int], vecs: np.ndarray, *,
                       generation: int | None = None) -> bool:
        if len(seqs) == 0:
            return True
        arrays = [np.asarray(v, dtype=np.float32) for v in vecs]
        _check_dims(arrays)
        if len(arrays) != len(seqs):
            raise StoreError(f"put_embeddings: {len(seqs)} seqs but {len(arrays)} vectors")

        def write(c: psycopg.Connection[Any]) -> bool:
            if self._moved(c, generation):
                return False
            c.execute(
                "INSERT INTO embeddings (rid, model, sid, dim, vec)"
                " SELECT i.rid, %s, s.sid, vector_dims(u.v), u.v"
                " FROM unnest(%s::int[], %b::vector[]) AS u(seq, v)"
                " JOIN items i ON i.scope = %s AND i.seq = u.seq JOIN scopes s ON s.name = %s"
                " ON CONFLICT DO NOTHING", (encoder, [int(s) for s in seqs], arrays, scope, scope))
            return True

        return self._tx(scope, write)

    def drop_embeddings(self) -> None:
        def write(c: psycopg.Connection[Any]) -> None:
            c.execute("DELETE FROM embeddings")
            self._bump_generation(c)

        self._tx(None, write)
        self._drop_indexes("hnsw\\_%")

    def put_audit(self, entries: Sequence[AuditEntry]) -> None:
        if not entries:
            return
        self._tx(None, lambda c: c.execute(
            "INSERT INTO audit (at, action, scope_sha256, ids_sha256, counts)"
            " SELECT * FROM unnest(%s::float8[], %s::text[], %s::text[], %s::text[], %s::text[])",
            ([float(e.at) for e in entries], [e.action for e in entries], [e.scope_sha256 for e in entries],
             [json.dumps(list(e.ids_sha256)) for e in entries],
             [json.dumps(dict(e.counts)) for e in entries])))

    def put_record(self, scope: str, unit: int, first_seq: int, last_seq: int, text: str,
                   writer: str, links: Sequence[tuple[int, str, float]] = (), *,
                   generation: int | None = None) -> bool:
        def write(c: psycopg.Connection[Any]) -> bool:
            if self._moved(c, generation):
                return False
            cur = c.execute("INSERT INTO records (scope, unit, first_seq, last_seq, text, writer)"
                            " VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT DO NOTHING",
                            (scope, unit, first_seq, last_seq, text, writer))
            if cur.rowcount == 0:
                return False
            if links:
                c.execute("INSERT INTO links (scope, src, dst, kind, weight)"
                          " SELECT %s, %s, u.dst, u.kind, u.w"
                          " FROM unnest(%s::int[], %s::text[], %s::float8[]) AS u(dst, kind, w)"
                          " ON CONFLICT DO NOTHING",
                          (scope, unit, [int(d) for d, _, _ in links], [k for _, k, _ in links],
                           [float(w) for _, _, w in links]))
            return True

        return self._tx(scope, write)

    def drop_records(self, scope: str) -> None:
        def write(c: psycopg.Connection[Any]) -> None:
            c.execute("DELETE FROM records WHERE scope = %s", (scope,))
            c.execute("DELETE FROM links WHERE scope = %s", (scope,))
            self._count_change(c, scope)
            self._bump_generation(c)

        self._tx(scope, write)

    # -- forget -----------------------------------------------------------------------------------

    def forget(self, scope: str, *, ids: Sequence[str] | None = None,
               session: str | None = None) -> ForgetReport:
        """Delete items (the whole scope, one session's, or these ids) and all they left behind.

        In one transaction: the items, their pieces and full-text entries (a lexeme no piece of
        the scope holds any more goes from the statistics too), their vectors, the records and
        links from the first unit touched on (they are re-derived), then later items move up to
        close the gap in ``seq``, and one audit line (digests and counts) is written. A scope
        left empty loses its row (its name) and its vector indexes. Then VACUUM reclaims the dead
        rows and refreshes the statistics, which sample column values (``checkpointed`` says
        whether it could; PostgreSQL's WAL and backups keep old pages until they are recycled,
        which no SQL can hurry).
        """
        validate_scope(scope)
        if ids is not None and session is not None:
            raise InvalidItemError("forget takes ids or a session, not both")

        def write(c: psycopg.Connection[Any]) -> tuple[ForgetReport, int | None]:
            if ids is not None:
                wanted = list(dict.fromkeys(str(x) for x in ids if "\x00" not in str(x)))  # none stored
                rows = c.execute("SELECT rid, seq, id FROM items WHERE scope = %s AND id = ANY(%s)",
                                 (scope, wanted)).fetchall()
                action = "forget items"
            elif session is not None:
                rows = c.execute("SELECT rid, seq, id FROM items WHERE scope = %s AND session = %s",
                                 (scope, session)).fetchall()
                action = "forget session"
            else:
                rows = c.execute("SELECT rid, seq, id FROM items WHERE scope = %s", (scope,)).fetchall()
                action = "forget scope"
                c.execute("DELETE FROM meta WHERE key = %s", (TRANSFER_MARK + scope,))
            if not rows:
                return ForgetReport(scope, 0, 0, 0, 0, 0, checkpointed=False), None
            rids = [int(r[0]) for r in rows]
            first = min(int(r[1]) for r in rows)
            n_pieces = self._delete_pieces(c, scope, rids)
            n_vecs = c.execute("DELETE FROM embeddings WHERE sid = (SELECT sid FROM scopes WHERE name = %s)"
                               " AND rid = ANY(%s)", (scope, rids)).rowcount
            # The unit ending just before the first forgotten item closed because that item
            # started a new unit; with it gone the next item may join it, so records are
            # re-derived from that unit on.
            unit = c.execute(
                "SELECT COALESCE(MIN(unit), (SELECT COALESCE(MAX(unit), -1) + 1 FROM records"
                " WHERE scope = %(s)s)) FROM records WHERE scope = %(s)s AND last_seq >= %(f)s",
                {"s": scope, "f": first - 1}).fetchone()
            first_unit = int(unit[0]) if unit else 0
            n_records = c.execute("DELETE FROM records WHERE scope = %s AND unit >= %s",
                                  (scope, first_unit)).rowcount
            n_links = c.execute("DELETE FROM links WHERE scope = %s AND src >= %s",
                                (scope, first_unit)).rowcount
            c.execute("DELETE FROM items WHERE scope = %s AND rid = ANY(%s)", (scope, rids))
            c.execute("SET CONSTRAINTS items_scope_seq DEFERRED")
            c.execute("UPDATE items SET seq = r.new FROM (SELECT rid,"
                      " %(f)s + row_number() OVER (ORDER BY seq) - 1 AS new"
                      " FROM items WHERE scope = %(s)s AND seq > %(f)s) r"
                      " WHERE items.rid = r.rid AND items.seq <> r.new", {"s": scope, "f": first})
            gone_sid = None
            left = c.execute("UPDATE scopes SET items = items - %s WHERE name = %s RETURNING items, sid",
                             (len(rids), scope)).fetchone()
            if left is not None and int(left[0]) <= 0:
                c.execute("DELETE FROM terms WHERE scope = %s", (scope,))
                c.execute("DELETE FROM scopes WHERE name = %s", (scope,))
                gone_sid = int(left[1])
            c.execute("INSERT INTO audit (at, action, scope_sha256, ids_sha256, counts)"
                      " VALUES (%s, %s, %s, %s, %s)",
                      (time.time(), action, _sha(scope), json.dumps(sorted(_sha(str(r[2])) for r in rows)),
                       json.dumps({"items": len(rids), "pieces": n_pieces, "vectors": n_vecs,
                                   "records": n_records, "links": n_links})))
            self._count_change(c, scope)
            self._bump_generation(c)
            done = ForgetReport(scope, len(rids), n_pieces, n_vecs, n_records, n_links, checkpointed=False)
            return done, gone_sid

        report, gone_sid = self._tx(scope, write)
        self._heads.pop(scope, None)
        if report.items == 0:
            return report
        if gone_sid is not None:
            self._drop_indexes(f"hnsw\\_{gone_sid}\\_%")
        vacuumed = self._vacuum() if self.vacuum_on_forget else False
        return ForgetReport(report.scope, report.items, report.pieces, report.vectors, report.records,
                            report.links, checkpointed=vacuumed)

    def _vacuum(self) -> bool:
        """VACUUM the tables a forget touches; False when another VACUUM or an index build held
        one of them (SKIP_LOCKED: a forget never waits on a build)."""
        try:
            with self._conn() as conn:
                notices: list[str] = []

                def note(diag: psycopg.errors.Diagnostic) -> None:
                    notices.append(str(diag.message_primary))

                conn.add_notice_handler(note)
                try:
                    # ANALYZE too: pg_stats samples column values (most common ones, histogram
                    # bounds), and a forgotten value must not live on there.
                    conn.execute("VACUUM (SKIP_LOCKED, ANALYZE) items, pieces, terms, postings, embeddings,"
                                 " records, links, scopes")
                finally:
                    conn.remove_notice_handler(note)
                return not any("skipping" in n for n in notices)
        except StoreError:
            return False

    # -- reads ------------------------------------------------------------------------------------

    def scopes(self) -> list[str]:
        return sorted(str(r[0]) for r in self._read("SELECT name FROM scopes WHERE items > 0"))

    def has_scope(self, scope: str) -> bool:
        return bool(self._read("SELECT 1 FROM items WHERE scope = %s LIMIT 1", (scope,)))

    def max_seq(self, scope: str) -> int:
        return int(self._read("SELECT COALESCE(MAX(seq), -1) FROM items WHERE scope = %s", (scope,))[0][0])

    def items(self, scope: str, seqs: Sequence[int] | None = None, *, start: int = 0,
              end: int | None = None) -> list[Item]:
        """Items of ``scope`` by seq list, or the range ``start <= seq < end``, in seq order."""
        if seqs is not None:
            wanted = sorted({int(s) for s in seqs})
            if not wanted:
                return []
            return [_row_to_item(r) for r in self._read(
                f"SELECT {_COLUMNS} FROM items WHERE scope = %s AND seq = ANY(%s) ORDER BY seq",
                (scope, wanted))]
        hi = end if end is not None else 2**31 - 1
        return [_row_to_item(r) for r in self._read(
            f"SELECT {_COLUMNS} FROM items WHERE scope = %s AND seq >= %s AND seq < %s ORDER BY seq",
            (scope, max(start, -2**31), min(hi, 2**31 - 1)))]

    def get(self, scope: str, item_id: str) -> Item | None:
        if "\x00" in item_id:  # PostgreSQL text cannot hold one, so no stored id does
            return None
        rows = self._read(f"SELECT {_COLUMNS} FROM items WHERE scope = %s AND id = %s", (scope, item_id))
        return _row_to_item(rows[0]) if rows else None

    def find(self, scope: str, flt: Filter | None = None, *, offset: int = 0, limit: int | None = None,
             newest_first: bool = False) -> list[Item]:
        where, params = _filter_sql(flt, "items")
        order = "DESC" if newest_first else "ASC"
        return [_row_to_item(r) for r in self._read(
            f"SELECT {_COLUMNS} FROM items WHERE scope = %s{where} ORDER BY seq {order} LIMIT %s OFFSET %s",
            (scope, *params, limit, offset))]

    def filter_seqs(self, scope: str, flt: Filter) -> np.ndarray:
        where, params = _filter_sql(flt, "items")
        rows = self._read(f"SELECT seq FROM items WHERE scope = %s{where} ORDER BY seq", (scope, *params))
        return np.fromiter((r[0] for r in rows), dtype=np.int64, count=len(rows))

    def layout(self, scope: str, after_seq: int = -1) -> Layout:
        return [(int(a), str(b), int(c)) for a, b, c in self._read(
            "SELECT seq, session, tokens FROM items WHERE scope = %s AND seq > %s ORDER BY seq",
            (scope, max(after_seq, -2**31)))]

    def pieces(self, scope: str, seqs: Sequence[int]) -> dict[int, list[tuple[int, int, int]]]:
        """Pieces (idx, start, end) of the given items."""
        out: dict[int, list[tuple[int, int, int]]] = {}
        wanted = sorted({int(s) for s in seqs})
        if not wanted:
            return out
        for seq, idx, start, end in self._read(
                "SELECT i.seq, p.idx, p.start, p.\"end\" FROM items i JOIN pieces p ON p.rid = i.rid"
                " WHERE i.scope = %s AND p.scope = %s AND i.seq = ANY(%s) ORDER BY i.seq, p.idx",
                (scope, scope, wanted)):
            out.setdefault(int(seq), []).append((int(idx), int(start), int(end)))
        return out

    def piece_bodies(self, scope: str, seqs: Sequence[int]) -> dict[int, list[str]]:
        out: dict[int, list[str]] = {}
        wanted = sorted({int(s) for s in seqs})
        if not wanted:
            return out
        for seq, body in self._read(
                "SELECT i.seq, p.body FROM items i JOIN pieces p ON p.rid = i.rid"
                " WHERE i.scope = %s AND p.scope = %s AND i.seq = ANY(%s) ORDER BY i.seq, p.idx",
                (scope, scope, wanted)):
            out.setdefault(int(seq), []).append(str(body))
        return out

    def bm25(self, scope: str, terms: Sequence[str], limit: int, flt: Filter | None = None
             ) -> list[tuple[int, int, float]]:
        """(seq, piece idx, score) of the best pieces for ``terms``, best first.

        Okapi BM25 as FTS5 computes it (k1 = 1.2, b = 0.75; idf ln((N - n + 0.5) / (n + 0.5)),
        at least 1e-6) over the scope's own statistics: N pieces, their mean length, n pieces
        holding the lexeme. A term counts once per occurrence in ``terms`` (FTS5 sums its phrases
        the same way). Ties go to the older piece, as FTS5's scan order gives them.
        """
        if not terms or limit <= 0:
            return []
        where, params, bound = self._bounds(flt, "i")
        if bound is not None and bound <= 0:
            return []
        q: dict[str, Any] = {"scope": scope, "terms": [str(t) for t in terms], "limit": int(limit),
                             "k1": K1, "k1p1": K1 + 1.0, "b": B, "bound": bound}
        ranked = (
            "WITH q AS (SELECT l.lexeme AS lex, count(*)::float8 AS mult"
            "  FROM unnest(%(terms)s::text[]) AS t(term),"
            f"  unnest(to_tsvector('{self._tscfg}', {self._prep}(t.term))) AS l"
            "  GROUP BY l.lexeme),"
            " st AS (SELECT pieces::float8 AS n,"
            "  GREATEST(piece_tokens::float8 / GREATEST(pieces, 1), 1e-9) AS avgdl"
            "  FROM scopes WHERE name = %(scope)s),"
            " w AS (SELECT t.tid, q.mult FROM q JOIN terms t ON t.scope = %(scope)s AND t.lex = q.lex),"
            # Every posting of the query's lexemes is read to score anyway: counting them there
            # gives the document frequencies, so no write has to keep a count up to date.
            " po AS MATERIALIZED (SELECT p.tid, p.rid, p.idx, p.tf, p.dl"
            "  FROM w JOIN postings p ON p.tid = w.tid),"
            " idf AS (SELECT w.tid, w.mult * GREATEST(ln((st.n - d.n + 0.5) / (d.n + 0.5)), 1e-6) AS v"
            "  FROM w JOIN (SELECT tid, count(*)::float8 AS n FROM po GROUP BY tid) d ON d.tid = w.tid"
            "  CROSS JOIN st),"
            " scored AS (SELECT po.rid, po.idx, sum(idf.v * po.tf * %(k1p1)s"
            "  / (po.tf + %(k1)s * (1 - %(b)s + %(b)s * po.dl / st.avgdl))) AS s"
            "  FROM po JOIN idf ON idf.tid = po.tid CROSS JOIN st"
            + (" WHERE po.rid < " + _RID_OF_BOUND if bound is not None else "") +
            "  GROUP BY po.rid, po.idx)")
        if where:
            query = (ranked + " SELECT i.seq, sc.idx, sc.s FROM scored sc JOIN items i ON i.rid = sc.rid"
                     f" WHERE i.scope = %(scope)s{where} ORDER BY sc.s DESC, sc.rid, sc.idx LIMIT %(limit)s")
            q.update(params)
        else:
            query = (ranked + " SELECT i.seq, sc.idx, sc.s FROM (SELECT * FROM scored"
                     " ORDER BY s DESC, rid, idx LIMIT %(limit)s) sc"
                     " JOIN items i ON i.rid = sc.rid AND i.scope = %(scope)s"
                     " ORDER BY sc.s DESC, sc.rid, sc.idx")
        return [(int(a), int(b), float(c)) for a, b, c in self._read(query, q)]

    @staticmethod
    def _bounds(flt: Filter | None, alias: str) -> tuple[str, dict[str, Any], int | None]:
        """A filter split in two: ``before_seq`` (applied through row ids, no join needed) and
        the rest as named-parameter SQL on items as ``alias``."""
        if flt is None:
            return "", {}, None
        validate_filter(flt)
        rest = Filter(session=flt.session, speaker=flt.speaker, kind=flt.kind, role=flt.role, agent=flt.agent,
                      since=flt.since, until=flt.until, meta=flt.meta)
        where, params = _filter_sql(rest, alias, named=True)
        return where, dict(params), None if flt.before_seq is None else int(flt.before_seq)

    # -- dense ----------------------------------------------------------------------------------

    @staticmethod
    def index_name(sid: int, encoder: str, dim: int) -> str:
        """The HNSW index of one scope (by its integer id: no name in the schema), encoder and size."""
        return f"hnsw_{sid}_" + _sha(encoder + "\x00" + str(dim))[:16]

    def nearest(self, scope: str, encoder: str, qvec: np.ndarray, limit: int, flt: Filter | None = None
                ) -> list[tuple[int, float]]:
        """(seq, cosine similarity) of the ``limit`` items closest to ``qvec``, best first (ties:
        the newer item first).

        Exact below ``exact_below`` items in the scope, and until the scope's HNSW index is
        built (asking for it starts the build, in the background); above, the HNSW index with
        ``hnsw.ef_search`` at least ``limit`` and, when a filter may reject candidates, an
        iterative scan. Should the index give fewer than ``limit`` results, the exact scan
        answers instead, so a selective filter never loses items.
        """
        if limit <= 0:
            return []
        q = np.ascontiguousarray(qvec, dtype=np.float32).ravel()
        dim = int(q.size)
        where, params, bound = self._bounds(flt, "i")
        if bound is not None and bound <= 0:
            return []
        for fresh in (False, True):
            head = self._head(scope, fresh)
            if head is None:
                return []
            sid, n_items, remembered = head
            # The bound goes into the query even when it lies beyond the count read above: that
            # count may be a second old, and one statement's snapshot keeps the cut exact.
            cut = bound
            name = self.index_name(sid, encoder, dim)
            use_index = (n_items >= self.exact_below and dim <= HNSW_MAX_DIM
                         and self._index_ready(name, sid, encoder, dim))
            args: dict[str, Any] = {"scope": scope, "model": encoder, "dim": dim, "q": q, "limit": int(limit),
                                    "bound": cut, **params}
            found = self._search(sid, args, where, cut, exact=False) if use_index else []
            if len(found) < limit:
                found = self._search(sid, args, where, cut, exact=True)
            # Fewer than the remembered head promises: the scope may have been forgotten and
            # written anew since (another id) or have grown: look again, once.
            stale = remembered and len(found) < limit and (
                not found or (not where and cut is None and len(found) < n_items))
            if not stale:
                return found
        return []  # pragma: no cover - the loop returns

    def _head(self, scope: str, fresh: bool) -> tuple[int, int, bool] | None:
        """(scope id, item count, remembered), kept for a second: a dense query needs them before
        it can name the scope's index, and one round trip fewer shows on a busy machine."""
        now = time.monotonic()
        known = self._heads.get(scope)
        if not fresh and known is not None and now - known[2] < 1.0:
            return known[0], known[1], True
        rows = self._read("SELECT sid, items FROM scopes WHERE name = %s", (scope,))
        if not rows:
            self._heads.pop(scope, None)
            return None
        self._heads[scope] = (int(rows[0][0]), int(rows[0][1]), now)
        return int(rows[0][0]), int(rows[0][1]), False

    def _search(self, sid: int, args: dict[str, Any], where: str, bound: int | None, *, exact: bool
                ) -> list[tuple[int, float]]:
        dim = int(args["dim"])
        # The partial index is matched only when its predicate is written out: sid and dim are
        # integers of ours and the encoder name goes in as a quoted literal.
        model = sql.Literal(str(args["model"]).replace("%", "%%"))  # % doubled: placeholders are read after
        dist = "e.vec <=> %(q)s::vector" if exact else f"e.vec::vector({dim}) <=> %(q)s::vector({dim})"
        # Equal distances: the newer item first, before LIMIT cuts (the HNSW scan orders by
        # distance alone, so a second key would keep the planner off the index).
        tie = ", e.rid DESC" if exact else ""
        rid_cut = " AND e.rid < " + _RID_OF_BOUND if bound is not None else ""
        own = f"e.sid = {sid} AND e.model = {{model}} AND e.dim = {dim}{rid_cut}"
        if where:
            query = (f"SELECT i.seq, {dist} AS d FROM embeddings e JOIN items i ON i.rid = e.rid"
                     f" WHERE {own} AND i.scope = %(scope)s{where} ORDER BY {dist}{tie} LIMIT %(limit)s")
        else:
            query = (f"SELECT i.seq, t.d FROM (SELECT e.rid, {dist} AS d FROM embeddings e WHERE {own}"
                     f" ORDER BY {dist}{tie} LIMIT %(limit)s) t"
                     " JOIN items i ON i.rid = t.rid AND i.scope = %(scope)s")
        composed = sql.SQL(query).format(model=model)
        with self._conn() as conn:
            if exact or int(args["limit"]) <= self.ef_search:
                # The connection's own settings (see __init__) serve: one round trip.
                rows = conn.execute(composed, args, binary=True).fetchall()
            else:  # a deeper list for this query only, sent with it in one pipeline
                with conn.pipeline(), conn.transaction():
                    conn.execute(f"SET LOCAL hnsw.ef_search = {min(int(args['limit']), 1000)}")
                    cur = conn.execute(composed, args, binary=True)
                rows = cur.fetchall()
        # A zero vector has no direction: pgvector gives NaN, read as no similarity.
        out = [(int(s), 0.0 if math.isnan(float(d)) else 1.0 - float(d)) for s, d in rows]
        out.sort(key=lambda p: (-p[1], -p[0]))
        return out

    def _index_ready(self, name: str, sid: int, encoder: str, dim: int) -> bool:
        """True when the index is built and valid; otherwise starts building it (when allowed)."""
        if name in self._valid_indexes:
            return True
        rows = self._read("SELECT i.indisvalid FROM pg_class c JOIN pg_index i ON i.indexrelid = c.oid"
                          " WHERE c.relnamespace = %s::regnamespace AND c.relname = %s", (self.schema, name))
        if rows and rows[0][0]:
            self._valid_indexes.add(name)
            return True
        failed = self._failed_builds.get(name)
        if self.auto_index and (failed is None or time.monotonic() - failed > BUILD_RETRY_S):
            self.build_index_for(sid, encoder, dim, wait=False)
        return False

    def build_index(self, scope: str, encoder: str, *, wait: bool = True) -> list[str]:
        """Build the HNSW indexes of ``scope``'s vectors of ``encoder`` (one per dimension found),
        whatever the scope's size; returns their names. Without ``wait`` the builds run in the
        background and :meth:`nearest` scans exactly until they are done."""
        head = self._read("SELECT sid FROM scopes WHERE name = %s", (scope,))
        if not head:
            return []
        sid = int(head[0][0])
        dims = [int(r[0]) for r in self._read(  # larger vectors have no HNSW index: exact scans
            "SELECT DISTINCT dim FROM embeddings WHERE sid = %s AND model = %s AND dim <= %s",
            (sid, encoder, HNSW_MAX_DIM))]
        for dim in dims:
            self.build_index_for(sid, encoder, dim, wait=wait)
        return [self.index_name(sid, encoder, d) for d in dims]

    def build_index_for(self, sid: int, encoder: str, dim: int, *, wait: bool) -> None:
        name = self.index_name(sid, encoder, dim)
        with self._build_lock:
            running = self._builds.get(name)
            if running is None and not self._closed:
                conns: list[psycopg.Connection[Any]] = []
                thread = threading.Thread(target=self._build, args=(name, sid, encoder, dim, conns),
                                          name=f"suffice-{name}", daemon=True)
                self._builds[name] = running = (thread, conns)
                thread.start()
        if wait and running is not None:
            running[0].join()

    def _build(self, name: str, sid: int, encoder: str, dim: int,
               conns: list[psycopg.Connection[Any]]) -> None:
        """CREATE INDEX CONCURRENTLY, so writers of every scope go on while the graph is built; an
        invalid index left by a build that died (and that nobody is building) is dropped first."""
        m, efc = self._hnsw
        try:
            with psycopg.connect(self._conninfo, autocommit=True,
                                 options=f"-c search_path={self._search_path}") as conn:
                conns.append(conn)
                conn.execute("SET maintenance_work_mem = '1GB'")
                state = conn.execute(
                    "SELECT i.indisvalid, EXISTS (SELECT 1 FROM pg_stat_progress_create_index p"
                    " WHERE p.index_relid = c.oid) FROM pg_class c JOIN pg_index i ON i.indexrelid = c.oid"
                    " WHERE c.relnamespace = %s::regnamespace AND c.relname = %s",
                    (self.schema, name)).fetchone()
                if state is not None and not state[0] and not state[1]:
                    conn.execute(sql.SQL("DROP INDEX CONCURRENTLY IF EXISTS {}").format(sql.Identifier(name)))
                conn.execute(sql.SQL(
                    "CREATE INDEX CONCURRENTLY IF NOT EXISTS {} ON embeddings USING hnsw ((vec::vector({})) "
                    "vector_cosine_ops) WITH (m = {}, ef_construction = {}) "
                    "WHERE sid = {} AND model = {} AND dim = {}").format(
                        sql.Identifier(name), sql.Literal(dim), sql.Literal(m), sql.Literal(efc),
                        sql.Literal(sid), sql.Literal(encoder), sql.Literal(dim)))
        except psycopg.Error:
            # The exact scan keeps answering; a dense query tries again after BUILD_RETRY_S, not
            # at once (a build that fails for good would otherwise start with every query).
            self._failed_builds[name] = time.monotonic()
        finally:
            with self._build_lock:
                self._builds.pop(name, None)

    def _drop_indexes(self, pattern: str) -> None:
        """Drop the vector indexes whose names match ``pattern`` (after the rows went): waits at
        most a few seconds for a lock, since an empty index left behind costs nothing."""
        with self._build_lock:
            for name, (_, conns) in list(self._builds.items()):
                if re.fullmatch(pattern.replace("\\_", "_").replace("%", ".*"), name):
                    for conn in conns:
                        with suppress(Exception):
                            conn.cancel_safe(timeout=2.0)
        names = [str(r[0]) for r in self._read(
            "SELECT relname FROM pg_class WHERE relnamespace = %s::regnamespace AND relkind = 'i'"
            " AND relname LIKE %s",
            (self.schema, pattern))]
        for name in names:
            self._valid_indexes.discard(name)
            with suppress(StoreError), self._conn() as conn:
                conn.execute("SET lock_timeout = '5s'")
                try:
                    conn.execute(sql.SQL("DROP INDEX CONCURRENTLY IF EXISTS {}").format(sql.Identifier(name)))
                finally:
                    conn.execute("RESET lock_timeout")

    def embeddings(self, scope: str, encoder: str, after_seq: int = -1, *,
                   before_seq: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(seqs, matrix) of stored vectors of ``encoder`` for items ``after_seq < seq < before_seq``."""
        hi = 2**31 - 1 if before_seq is None else min(int(before_seq), 2**31 - 1)
        rows = self._read("SELECT i.seq, e.vec FROM items i JOIN embeddings e ON e.rid = i.rid"
                          " AND e.model = %s WHERE i.scope = %s AND i.seq > %s AND i.seq < %s ORDER BY i.seq",
                          (encoder, scope, max(after_seq, -2**31), hi), binary=True)
        if not rows:
            return np.zeros(0, dtype=np.int64), np.zeros((0, 0), dtype=np.float32)
        seqs = np.fromiter((r[0] for r in rows), dtype=np.int64, count=len(rows))
        return seqs, np.stack([r[1] for r in rows]).astype(np.float32, copy=False)

    def encoders(self, scope: str) -> list[str]:
        return sorted(str(r[0]) for r in self._read(
            "SELECT DISTINCT model FROM embeddings WHERE sid = (SELECT sid FROM scopes WHERE name = %s)",
            (scope,)))

    def missing_embeddings(self, scope: str, encoder: str) -> list[int]:
        return [int(r[0]) for r in self._read(
            "SELECT i.seq FROM items i WHERE i.scope = %s AND NOT EXISTS (SELECT 1 FROM embeddings e"
            " WHERE e.rid = i.rid AND e.model = %s) ORDER BY i.seq", (scope, encoder))]

    def records(self, scope: str, after_unit: int = -1) -> list[tuple[int, int, int, str, str]]:
        """(unit, first_seq, last_seq, text, writer) of records after ``after_unit``, in unit order."""
        return [(int(a), int(b), int(c), str(d), str(e)) for a, b, c, d, e in self._read(
            "SELECT unit, first_seq, last_seq, text, writer FROM records WHERE scope = %s AND unit > %s"
            " ORDER BY unit", (scope, max(after_unit, -2**31)))]

    def links(self, scope: str, after_src: int = -1) -> list[tuple[int, int, str, float]]:
        """(src, dst, kind, weight) of links written by units after ``after_src``."""
        return [(int(a), int(b), str(c), float(d)) for a, b, c, d in self._read(
            "SELECT src, dst, kind, weight FROM links WHERE scope = %s AND src > %s"
            " ORDER BY src, dst, kind COLLATE \"C\"", (scope, max(after_src, -2**31)))]

    def stats(self, scope: str | None = None) -> StoreStats:
        if scope is not None:
            n, ntok, nsc, nses = self._read(
                "SELECT COUNT(*), COALESCE(SUM(tokens), 0), COUNT(DISTINCT scope), COUNT(DISTINCT session)"
                " FROM items WHERE scope = %s", (scope,))[0]
            (nemb,) = self._read("SELECT COUNT(DISTINCT rid) FROM embeddings"
                                 " WHERE sid = (SELECT sid FROM scopes WHERE name = %s)", (scope,))[0]
        else:
            n, ntok, nsc, nses = self._read(
                "SELECT COUNT(*), COALESCE(SUM(tokens), 0), COUNT(DISTINCT scope),"
                " COUNT(DISTINCT (scope, session)) FROM items")[0]
            (nemb,) = self._read("SELECT COUNT(DISTINCT rid) FROM embeddings")[0]
        config = self.load_config() or {}
        return StoreStats(items=int(n), scopes=int(nsc), sessions=int(nses), embedded=int(nemb),
                          tokens=int(ntok), schema_version=self.schema_version, path=self.path,
                          encoder=str(config.get("encoder", "")))

    def audit(self) -> list[AuditEntry]:
        return [AuditEntry(float(at), str(action), str(sc), tuple(json.loads(ids)), dict(json.loads(counts)))
                for at, action, sc, ids, counts in self._read(
                    "SELECT at, action, scope_sha256, ids_sha256, counts FROM audit ORDER BY n")]

    def check(self) -> list[str]:
        """Problems found in the tables, the BM25 statistics and the indexes; empty when sound.

        Contiguous seqs in row-id order, pieces and vectors only of items of their own scope,
        every item with a piece, the per-scope piece counts, token totals and document
        frequencies against a recount, vectors of one size per encoder, records within their
        scope's log, links of existing records, no invalid index, the immutability trigger.
        """
        problems: list[str] = []
        checks: dict[str, str] = {
            "scopes whose seqs have gaps or repeats":
                "SELECT scope FROM items GROUP BY scope HAVING MAX(seq) + 1 <> COUNT(*) OR MIN(seq) <> 0",
            "items whose row ids are not in seq order":
                "SELECT scope, seq FROM (SELECT scope, seq, rid,"
                " lag(rid) OVER (PARTITION BY scope ORDER BY seq) AS prev FROM items) x WHERE prev > rid",
            "items without a piece":
                "SELECT i.scope, i.seq FROM items i"
                " WHERE NOT EXISTS (SELECT 1 FROM pieces p WHERE p.rid = i.rid)",
            "pieces of no item of their scope":
                "SELECT p.scope, p.rid FROM pieces p LEFT JOIN items i ON i.rid = p.rid"
                " WHERE i.rid IS NULL OR i.scope <> p.scope",
            "vectors of no item of their scope":
                "SELECT e.rid, e.model FROM embeddings e LEFT JOIN items i ON i.rid = e.rid"
                " LEFT JOIN scopes s ON s.name = i.scope WHERE i.rid IS NULL OR s.sid IS DISTINCT FROM e.sid",
            "vectors whose recorded size is wrong":
                "SELECT rid, model FROM embeddings WHERE vector_dims(vec) <> dim",
            "vectors of another encoder than most":
                "SELECT DISTINCT model FROM embeddings WHERE model <> (SELECT model FROM embeddings"
                " GROUP BY model ORDER BY COUNT(*) DESC LIMIT 1)",
            "vectors of unequal size":
                "SELECT model FROM embeddings GROUP BY model HAVING COUNT(DISTINCT dim) > 1",
            "scopes whose counts differ from their rows":
                "SELECT s.name FROM scopes s"
                " LEFT JOIN (SELECT scope, COUNT(*) AS n FROM items GROUP BY scope) i"
                " ON i.scope = s.name LEFT JOIN (SELECT scope, COUNT(*) AS n, SUM(dl) AS t FROM pieces"
                " GROUP BY scope) p ON p.scope = s.name"
                " WHERE s.items <> COALESCE(i.n, 0) OR s.pieces <> COALESCE(p.n, 0)"
                " OR s.piece_tokens <> COALESCE(p.t, 0) OR COALESCE(i.n, 0) = 0",
            "items of a scope with no row":
                "SELECT DISTINCT i.scope FROM items i LEFT JOIN scopes s ON s.name = i.scope"
                " WHERE s.name IS NULL",
            "postings that differ from a new parse of the pieces":
                "WITH r AS (SELECT p.scope, p.rid, p.idx, l.lexeme, cardinality(l.positions) AS tf, p.dl"
                f" FROM pieces p, unnest(to_tsvector('{self._tscfg}', {self._prep}(p.body))) l),"
                " s AS (SELECT t.scope, po.rid, po.idx, t.lex, po.tf, po.dl FROM postings po"
                " JOIN terms t ON t.tid = po.tid)"
                " SELECT * FROM (SELECT * FROM r EXCEPT ALL SELECT * FROM s) a"
                " UNION ALL SELECT * FROM (SELECT * FROM s EXCEPT ALL SELECT * FROM r) b",
            "pieces whose length is not their tokens":
                "SELECT p.rid, p.idx FROM pieces p"
                " WHERE p.dl <> (SELECT COALESCE(sum(cardinality(l.positions)), 0)"
                f" FROM unnest(to_tsvector('{self._tscfg}', {self._prep}(p.body))) l)",
            "lexemes of no posting":
                "SELECT t.scope, t.tid FROM terms t"
                " WHERE NOT EXISTS (SELECT 1 FROM postings p WHERE p.tid = t.tid)",
            "records beyond their scope's log":
                "SELECT r.scope, r.unit FROM records r WHERE r.last_seq >= (SELECT COUNT(*) FROM items i"
                " WHERE i.scope = r.scope) OR r.first_seq > r.last_seq",
            "links from or to a unit with no record":
                "SELECT l.scope, l.src FROM links l"
                " LEFT JOIN records r ON r.scope = l.scope AND r.unit = l.src WHERE r.unit IS NULL",
        }
        for what, query in checks.items():
            found = self._read(query)
            if found:
                problems.append(f"{what}: {len(found)} (first: {found[0]!r})")
        invalid = self._read(
            "SELECT c.relname FROM pg_class c JOIN pg_index i ON i.indexrelid = c.oid"
            " WHERE c.relnamespace = %s::regnamespace AND NOT i.indisvalid"
            " AND NOT EXISTS (SELECT 1 FROM pg_stat_progress_create_index p WHERE p.index_relid = c.oid)",
            (self.schema,))
        if invalid:
            problems.append(f"invalid indexes (a build died; the next dense query rebuilds them): "
                            f"{', '.join(str(r[0]) for r in invalid)}")
        if not self._read("SELECT 1 FROM pg_trigger WHERE tgname = 'items_immutable'"
                          " AND tgrelid = %s::regclass", (f"{self.schema}.items",)):
            problems.append("the trigger that keeps items immutable is missing")
        return problems


def _check_dims(vectors: Sequence[Any]) -> None:
    """Refuse, before anything is sent, a vector pgvector cannot store."""
    for v in vectors:
        n = int(np.asarray(v).size)
        if not 1 <= n <= MAX_DIM:
            raise StoreError(f"a vector of {n} dimensions cannot be stored on PostgreSQL: pgvector holds "
                             f"1 to {MAX_DIM:,}")


def _message(exc: BaseException) -> str:
    """A psycopg error as one line (the server's primary message when it sent one)."""
    diag = getattr(exc, "diag", None)
    primary = getattr(diag, "message_primary", None) if diag is not None else None
    return str(primary or exc).strip().splitlines()[0] if str(primary or exc).strip() else type(exc).__name__


def _refuse_nul(row: ItemRow, index: int) -> None:
    """PostgreSQL text cannot hold NUL (and jsonb no \\u0000): name the field rather than fail
    deep in the driver. The shared checks refuse it in the text already."""
    item = row.item
    where = f"item {index}" + (f" (id {item.id!r})" if isinstance(item.id, str) and item.id else "")
    for name in ("id", "session", "speaker", "role", "kind", "agent"):
        value = getattr(item, name)
        if isinstance(value, str) and "\x00" in value:
            raise InvalidItemError(f"{where}: {name} contains a NUL character")
    if "\x00" in row.observed_at:
        raise InvalidItemError(f"{where}: observed_at contains a NUL character")
    if has_nul(item.meta):
        raise InvalidItemError(f"{where}: meta contains a NUL character")
    if any("\x00" in b for b in row.piece_bodies):
        raise InvalidItemError(f"{where}: a piece contains a NUL character")


def _filter_sql(flt: Filter | None, alias: str, *, named: bool = False) -> tuple[str, Any]:
    """`` AND ...`` conditions that apply ``flt`` to items as ``alias``, with their parameters
    (a list for ``%s`` placeholders, or a dict for named ones)."""
    if flt is None:
        return "", {} if named else []
    validate_filter(flt)
    conds: list[str] = []
    values: list[Any] = []

    def mark(value: Any, cast: str = "") -> str:
        values.append(value)
        return (f"%(f{len(values)})s" if named else "%s") + cast

    for name in ("session", "speaker", "kind", "role", "agent"):
        value = getattr(flt, name)
        if value is not None:
            conds.append(f"{alias}.{name} = {mark(value)}")
    if flt.since is not None:
        conds.append(f"{alias}.observed_ts >= {mark(float(flt.since))}")
    if flt.until is not None:
        conds.append(f"{alias}.observed_ts < {mark(float(flt.until))}")
    for key, value in (flt.meta or {}).items():
        # Containment finds the rows through the GIN index and, for a scalar, is the whole test:
        # jsonb keeps JSON's types (true is not 1) and compares numbers by value. An object or
        # array must also equal the stored one as JSON text (jsonb's text keeps 1.0 apart from
        # 1, as Filter.matches does), not merely be contained in it.
        conds.append(f"{alias}.meta_j @> {mark(json.dumps({key: value}), '::jsonb')}")
        if isinstance(value, (dict, list)):
            have = f"({alias}.meta_j -> {mark(key)})::text"  # marked first: %s follow the text's order
            conds.append(f"{have} = ({mark(json.dumps(value), '::jsonb')})::text")
    if flt.before_seq is not None:
        conds.append(f"{alias}.seq < {mark(int(flt.before_seq))}")
    where = "".join(f" AND {c}" for c in conds)
    if named:
        return where, {f"f{i + 1}": v for i, v in enumerate(values)}
    return where, values


def _row_to_item(r: Sequence[Any]) -> Item:
    return Item(id=r[0], scope=r[1], seq=int(r[2]), session=r[3], speaker=r[4], role=r[5],
                kind=r[6], observed_at=r[7], text=r[8], meta=json.loads(r[9]), tokens=int(r[10]),
                observed_ts=None if r[11] is None else float(r[11]), agent=r[12])
