"""The PostgreSQL store passes the store contract; and what only it does: the immutability
trigger, concurrent writers (threads and processes), the dense search (HNSW against exact, filters,
scopes), BM25 scores equal to SQLite's, forget in the tables, opening by URL."""

from __future__ import annotations

import json
import multiprocessing as mp
import re
import sys
import threading

import numpy as np
import pytest
from store_contract import StoreContract, row, vec

pytest.importorskip("psycopg")
pytest.importorskip("psycopg_pool")

import psycopg  # noqa: E402

from suffice import ConflictError, Filter, Memory, MissingExtraError, NewItem, StoreError  # noqa: E402
from suffice._embed.hashing import HashEmbedder  # noqa: E402
from suffice._store import ItemRow, SQLiteStore, open_store  # noqa: E402
from suffice._store.postgres import PG_SCHEMA_VERSION, PostgresStore, split_url  # noqa: E402


class TestPostgresStore(StoreContract):
    @pytest.fixture
    def store(self, pg_location):
        st = PostgresStore(pg_location())
        yield st
        st.close()


@pytest.fixture
def pg(pg_location):
    st = PostgresStore(pg_location())
    yield st
    st.close()


def raw(st: PostgresStore) -> psycopg.Connection:
    """A connection of our own to the store's schema, behind the store's back."""
    conn = psycopg.connect(st._conninfo, autocommit=True)
    conn.execute(f"SET search_path = {st._search_path}")
    return conn


def vrow(text: str, v: np.ndarray, **kw) -> ItemRow:
    new = NewItem(text=text, **kw)
    return ItemRow(new, str(new.observed_at), None, len(text.split()), [(0, len(text))], [text], v)


def test_the_database_refuses_to_change_an_items_content(pg):
    pg.append("a", [row("original")])
    with raw(pg) as conn:
        for column, value in (("text", "'changed'"), ("meta", "'{}'"), ("id", "'other'"), ("scope", "'b'")):
            with pytest.raises(psycopg.errors.RaiseException, match="immutable"):
                conn.execute(f"UPDATE items SET {column} = {value}")
    assert pg.items("a")[0].text == "original"


def test_threads_writing_at_once_lose_and_double_nothing(pg):
    errors: list[BaseException] = []
    start = threading.Barrier(6)

    def writer(tag: str, scope: str) -> None:
        try:
            start.wait(timeout=30)
            for b in range(25):
                pg.append(scope, [row(f"{tag} {b} {i}", id=f"{tag}-{b}-{i}") for i in range(8)])
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    def again(tag: str) -> None:  # re-adds another writer's batches: idempotent, never doubled
        try:
            start.wait(timeout=30)
            for b in range(25):
                try:
                    pg.append("shared", [row(f"{tag} {b} {i}", id=f"{tag}-{b}-{i}") for i in range(8)])
                except ConflictError as exc:  # pragma: no cover - would be a bug
                    errors.append(exc)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(t, "shared")) for t in ("p", "q", "r")]
    threads += [threading.Thread(target=writer, args=("o", "own")),
                threading.Thread(target=again, args=("p",)), threading.Thread(target=again, args=("q",))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert errors == []
    items = pg.items("shared")
    assert len(items) == 3 * 25 * 8 == len({i.id for i in items})
    assert [i.seq for i in items] == list(range(len(items)))
    assert [i.seq for i in pg.items("own")] == list(range(25 * 8))
    assert pg.check() == []


def _writer(url: str, tag: str, n: int, batch: int, barrier) -> None:
    st = PostgresStore(url, pool_size=2)
    barrier.wait(timeout=60)  # start together so the writes really overlap
    for k, start in enumerate(range(0, n, batch)):
        st.append("shared", [row(f"{tag} item {i}", id=f"{tag}-{i}")
                             for i in range(start, min(n, start + batch))])
        st.append(f"own-{tag}", [row(f"{tag} own {start}")])
        if k < 2:  # lockstep for two batches: the writers interleave even on a busy machine
            barrier.wait(timeout=60)
    st.close()


def test_two_processes_writing_at_once_lose_and_double_nothing(pg_location):
    url = pg_location()
    PostgresStore(url).close()
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(2)
    procs = [ctx.Process(target=_writer, args=(url, tag, 1500, 50, barrier)) for tag in ("p", "q")]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=300)
        assert p.exitcode == 0
    st = PostgresStore(url)
    items = st.items("shared")
    assert len(items) == 3000 == len({i.id for i in items})
    assert [i.seq for i in items] == list(range(3000))
    tags = [i.id[0] for i in items]
    assert sum(1 for x, y in zip(tags, tags[1:], strict=False) if x != y) >= 2
    assert [len(st.items(f"own-{t}")) for t in "pq"] == [30, 30]
    assert st.check() == []
    st.close()


# -- dense search ------------------------------------------------------------------------------------

def _clustered(rng: np.random.Generator, n: int, dim: int) -> np.ndarray:
    """Unit vectors around 40 centres: closer to real embeddings than uniform noise."""
    centres = rng.standard_normal((40, dim)).astype(np.float32)
    x = centres[rng.integers(0, 40, n)] + 0.6 * rng.standard_normal((n, dim)).astype(np.float32)
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def _truth(mat: np.ndarray, q: np.ndarray, k: int, allowed: np.ndarray | None = None) -> list[int]:
    sims = mat @ q
    order = [int(i) for i in np.lexsort((-np.arange(len(sims)), -sims))]
    if allowed is not None:
        order = [i for i in order if allowed[i]]
    return order[:k]


def test_hnsw_and_exact_search_agree_on_the_top_10(pg_location):
    rng = np.random.default_rng(3)
    n, dim = 3000, 48
    mat = _clustered(rng, n, dim)
    st = PostgresStore(pg_location(), exact_below=10**9, auto_index=False)
    for b in range(0, n, 500):
        st.append("a", [vrow(f"t{i}", mat[i]) for i in range(b, b + 500)], encoder="e")
    queries = _clustered(rng, 60, dim)
    exact = [[s for s, _ in st.nearest("a", "e", q, 10)] for q in queries]
    assert exact == [_truth(mat, q, 10) for q in queries]  # the exact scan is exact
    [name] = st.build_index("a", "e", wait=True)
    st.exact_below = 0
    paths: list[bool] = []
    search = st._search
    st._search = lambda *a, **kw: paths.append(kw["exact"]) or search(*a, **kw)  # type: ignore[method-assign]
    approx = [[s for s, _ in st.nearest("a", "e", q, 10)] for q in queries]
    assert name in st._valid_indexes and set(paths) == {False}  # every query went through HNSW
    recall = np.mean([len(set(a) & set(e)) / 10 for a, e in zip(approx, exact, strict=True)])
    print(f"HNSW recall@10 against exact search: {recall:.3f}")
    assert recall >= 0.95
    sims = st.nearest("a", "e", queries[0], 10)
    assert [round(c, 4) for _, c in sims] == [round(float(mat[s] @ queries[0]), 4) for s, _ in sims]
    st.close()


def test_nearest_honours_filters_and_never_crosses_scopes(pg_location):
    rng = np.random.default_rng(5)
    n, dim = 1200, 32
    mat = _clustered(rng, n, dim)
    st = PostgresStore(pg_location(), exact_below=10**9, auto_index=False)
    sessions = [f"s{i % 3}" for i in range(n)]
    st.append("a", [vrow(f"t{i}", mat[i], session=sessions[i], meta={"odd": i % 2 == 1})
                    for i in range(n)], encoder="e")
    q = mat[7]
    st.append("b", [vrow("b's copy of the query", q, session="s1")], encoder="e")  # the best match, elsewhere
    cases = [(None, None), (Filter(session="s1"), np.array([s == "s1" for s in sessions])),
             (Filter(before_seq=500), np.arange(n) < 500),
             (Filter(meta={"odd": True}, before_seq=900), (np.arange(n) % 2 == 1) & (np.arange(n) < 900))]
    for indexed in (False, True):
        if indexed:
            st.build_index("a", "e", wait=True)
            st.exact_below = 0
        for flt, allowed in cases:
            got = st.nearest("a", "e", q, 20, flt)
            want = _truth(mat, q, 20, allowed)
            hit = len({s for s, _ in got} & set(want)) / 20
            assert hit >= (0.9 if indexed else 1.0), (indexed, flt)
            assert len(got) == 20 and all(allowed is None or allowed[s] for s, _ in got)
    assert [s for s, _ in st.nearest("b", "e", q, 5)] == [0]
    assert st.nearest("nobody", "e", q, 5) == [] and st.nearest("a", "other-encoder", q, 5) == []
    assert st.nearest("a", "e", q, 5, Filter(before_seq=0)) == []
    st.close()


def test_a_forgotten_scope_loses_its_vector_index(pg_location):
    rng = np.random.default_rng(9)
    st = PostgresStore(pg_location(), exact_below=0, auto_index=False)
    st.append("a", [vrow(f"t{i}", v) for i, v in enumerate(_clustered(rng, 50, 16))], encoder="e")
    [name] = st.build_index("a", "e", wait=True)
    st.forget("a")
    with raw(st) as conn:
        assert conn.execute("SELECT to_regclass(%s)", (f"{st.schema}.{name}",)).fetchone() == (None,)
    assert st.check() == []
    st.close()


def test_a_big_enough_scope_builds_its_index_in_the_background(pg_location):
    rng = np.random.default_rng(2)
    st = PostgresStore(pg_location(), exact_below=100)
    st.append("a", [vrow(f"t{i}", v) for i, v in enumerate(_clustered(rng, 150, 16))], encoder="e")
    first = st.nearest("a", "e", _clustered(rng, 1, 16)[0], 5)  # exact, while the build starts
    assert len(first) == 5
    for thread, _ in list(st._builds.values()):
        thread.join(timeout=60)
    st.nearest("a", "e", _clustered(rng, 1, 16)[0], 5)
    assert len(st._valid_indexes) == 1
    st.close()


# -- BM25 and forget ---------------------------------------------------------------------------------

PARITY = ["red cat sat on a mat", "blue dog ran in the park with a red ball",
          "green frog sat on a log in the pond", "red red red fox", "a cat and a dog met at the park",
          "old man sat by the sea", "the sea was calm and blue", "a frog can jump far",
          "big ship on the sea at dawn", "small cat on a big hat"]


@pytest.mark.parametrize("query", [["cat"], ["red", "fox"], ["sea", "ship"], ["frog", "log", "pond"],
                                   ["dog", "park", "ball"], ["the", "sea"], ["cat", "cat"]])
def test_bm25_scores_equal_the_sqlite_stores(pg, tmp_path, query):
    lite = SQLiteStore(tmp_path / "p.db")
    for st in (pg, lite):
        st.append("s", [row(t) for t in PARITY])
        st.append("other", [row(f"cat sea red {i}") for i in range(30)])  # not in "s"'s statistics
    ours, theirs = pg.bm25("s", query, 100), lite.bm25("s", query, 100)
    assert [(s, p) for s, p, _ in ours] == [(s, p) for s, p, _ in theirs]
    assert [x for _, _, x in ours] == pytest.approx([x for _, _, x in theirs], rel=1e-9)


MIXED = ["mail ana@example.com about the report", "dose 2.5 mg daily", "we met at the café in Porto",
         "saved taxes2023.pdf in /home/ana/docs", "path C:\\Users\\bo\\notes.txt",
         "a well-known snake_case name", "see https://docs.example.org/a?b=1",
         "plain words without marks"]


@pytest.mark.parametrize("query", [["example"], ["5"], ["cafe"], ["café"], ["pdf"], ["taxes2023"], ["docs"],
                                   ["known"], ["case"], ["ana"], ["org"], ["users"], ["notes"]])
def test_bm25_splits_addresses_numbers_and_accents_as_sqlite_does(pg, tmp_path, query):
    """PostgreSQL's parser keeps e-mails, hosts, file names and decimals whole and keeps accents;
    FTS5 splits at punctuation and drops accents. The store makes PostgreSQL see text as FTS5 does."""
    lite = SQLiteStore(tmp_path / "m.db")
    for st in (pg, lite):
        st.append("s", [row(t) for t in MIXED])
    ours, theirs = pg.bm25("s", query, 100), lite.bm25("s", query, 100)
    assert theirs, query
    assert [(s, p) for s, p, _ in ours] == [(s, p) for s, p, _ in theirs]
    assert [x for _, _, x in ours] == pytest.approx([x for _, _, x in theirs], rel=1e-9)


def test_a_version_1_store_is_parsed_again_on_open(pg_location, tmp_path):
    url = pg_location()
    lite = SQLiteStore(tmp_path / "v.db")
    lite.append("s", [row(t) for t in MIXED])
    st = PostgresStore(url)
    st.append("s", [row(t) for t in MIXED])
    st.close()
    with psycopg.connect(st._conninfo, autocommit=True) as conn:  # back to how version 1 parsed
        conn.execute(f"SET search_path = {st._search_path}")
        conn.execute(f"DROP FUNCTION {st.schema}.suffice_prep(text)")
        conn.execute("DELETE FROM postings; DELETE FROM terms;"
                     f" INSERT INTO terms (scope, lex) SELECT DISTINCT p.scope, l.lexeme FROM pieces p,"
                     f" unnest(to_tsvector('{st._tscfg}', p.body)) l;"
                     " INSERT INTO postings (tid, rid, idx, tf, dl) SELECT t.tid, p.rid, p.idx,"
                     f" cardinality(l.positions), p.dl FROM pieces p CROSS JOIN LATERAL"
                     f" unnest(to_tsvector('{st._tscfg}', p.body)) l"
                     " JOIN terms t ON t.scope = p.scope AND t.lex = l.lexeme;"
                     " UPDATE meta SET value = '1' WHERE key = 'schema_version'")
        assert conn.execute("SELECT count(*) FROM terms WHERE lex = 'example'").fetchone() == (0,)
    again = PostgresStore(url)
    try:
        assert again.schema_version == PG_SCHEMA_VERSION == 2
        for query in (["example"], ["cafe"], ["pdf", "docs"]):
            assert [(s, p) for s, p, _ in again.bm25("s", query, 10)] == [
                (s, p) for s, p, _ in lite.bm25("s", query, 10)], query
        assert again.check() == []
        again.forget("s", ids=[again.items("s")[0].id])
        assert again.check() == []  # forget found every posting of the re-derived parse
    finally:
        again.close()


def _table_text(st: PostgresStore) -> str:
    with raw(st) as conn:
        names = [r[0] for r in conn.execute(
            "SELECT relname FROM pg_class WHERE relnamespace = %s::regnamespace AND relkind = 'r'",
            (st.schema,))]
        return "\n".join(repr(conn.execute(f'SELECT * FROM "{n}"').fetchall()) for n in names)


def test_forget_leaves_no_trace_in_the_tables(pg):
    pg.append("ana", [row("zqalpha met zqbravo", id="zqid1", session="s1"), row("kept zqcharlie", id="k2"),
                      row("zqdelta alone", id="zqid3", session="s1", meta={"zqmeta": "zqvalue"})])
    pg.append("zqscope", [row("zqecho in its own scope", id="e")])
    pg.put_record("ana", 0, 0, 2, "record zqalpha", "rule", [(0, "content", 0.5)])
    assert pg.forget("ana", session="s1").checkpointed
    pg.forget("zqscope")
    text = _table_text(pg)
    for mark in ("zqalpha", "zqbravo", "zqdelta", "zqid1", "zqid3", "zqmeta", "zqvalue", "zqecho", "zqscope"):
        assert mark not in text, mark
    assert "zqcharli" in text  # the kept item and its lexeme are there to be found
    assert pg.check() == []


def test_check_finds_a_sound_store_sound_and_names_what_is_broken(pg):
    pg.append("a", [row("one", id="1"), row("two", id="2"), row("three", id="3")])
    pg.put_record("a", 0, 0, 1, "one two", "rule", [])
    assert pg.check() == []
    with raw(pg) as conn:
        conn.execute("DELETE FROM pieces WHERE rid = (SELECT rid FROM items WHERE id = '2')")
        conn.execute("DELETE FROM postings WHERE tid = (SELECT tid FROM terms WHERE lex = 'one')")
        conn.execute("UPDATE items SET seq = 7 WHERE id = '3'")
    problems = "\n".join(pg.check())
    for what in ("items without a piece", "postings that differ", "seqs have gaps", "counts differ",
                 "lexemes of no posting"):
        assert what in problems, what


# -- opening ----------------------------------------------------------------------------------------

def test_the_url_shown_never_holds_the_password():
    conninfo, schema, shown = split_url("postgresql://ana:s3cret@db.example:5433/mem?sslmode=require&schema=t1")
    assert "s3cret" not in shown and "s3cret" in conninfo and "schema" not in conninfo
    assert (schema, shown) == ("t1", "postgresql://ana@db.example:5433/mem?sslmode=require&schema=t1")
    assert "secret" not in split_url("postgres://h/db?password=secret")[2]
    assert "secret" not in split_url("postgres://h/db?sslpassword=secret&sslmode=verify-full")[2]
    # libpq reads %20 as a space and + as a plus: a space must go on as %20
    conninfo = split_url("postgresql://h/db?options=-c%20statement_timeout%3D5000&application_name=my%20app")[0]
    assert "options=-c%20statement_timeout%3D5000" in conninfo and "my%20app" in conninfo
    assert "+" not in conninfo
    with pytest.raises(StoreError, match="lower-case identifier"):
        split_url("postgresql://h/db?schema=Bad-Name")


def test_opening_refuses_what_is_not_a_store(pg_location):
    url = pg_location()
    for word in ("order", "user", "select"):  # keywords: refused by name, not a syntax error
        with pytest.raises(StoreError, match=f"schema '{word}' is an SQL keyword"):
            PostgresStore(re.sub(r"schema=\w+", f"schema={word}", url))
    with pytest.raises(StoreError, match="no store at"):
        PostgresStore(url, create=False)
    st = PostgresStore(url)
    assert st.schema_version == PG_SCHEMA_VERSION
    with raw(st) as conn:
        conn.execute("CREATE SCHEMA other_things")
        conn.execute("CREATE TABLE other_things.notes (x int)")
        conn.execute("UPDATE meta SET value = '99' WHERE key = 'schema_version'")
    try:
        with pytest.raises(StoreError, match="not a suffice store"):
            PostgresStore(url.replace(f"schema={st.schema}", "schema=other_things"))
        with pytest.raises(StoreError, match="newer than this suffice"):
            PostgresStore(url)
    finally:
        with raw(st) as conn:
            conn.execute("DROP SCHEMA other_things CASCADE")
        st.close()
    with pytest.raises(StoreError, match="cannot open store"):
        PostgresStore("postgresql://nobody@/nowhere?host=/nonexistent-dir&connect_timeout=2")


def test_open_store_picks_the_backend_by_location(pg_location, tmp_path, monkeypatch):
    url = pg_location()
    st = open_store(url)
    assert isinstance(st, PostgresStore)
    st.close()
    lite = open_store(tmp_path / "x.db")
    assert isinstance(lite, SQLiteStore)
    lite.close()
    monkeypatch.setitem(sys.modules, "psycopg", None)  # as if the extra were not installed
    monkeypatch.delitem(sys.modules, "suffice._store.postgres")
    with pytest.raises(MissingExtraError, match=r"suffice\[postgres\]"):
        open_store(url)


def test_memory_over_a_postgres_url_adds_searches_and_forgets(pg_location):
    url = pg_location()
    mem = Memory(url, embedder=HashEmbedder())
    mem.add([NewItem("I moved to Lisbon in May.", id="a1", session="s1"),
             NewItem("My sister Rosa lives in Porto.", id="a2", session="s1"),
             NewItem("We adopted a cat called Miso.", id="a3", session="s2")], user_id="ana")
    mem.add("Bo likes kayaking on the Douro.", user_id="bo")
    assert "@" not in mem.path or ":" not in mem.path.split("@")[0][len("postgresql://"):]
    hits = mem.search("Where does her sister live?", user_id="ana").hits
    assert hits and hits[0].item.id == "a2" and all(h.item.scope == "user:ana" for h in hits)
    assert [h.item.id for h in mem.search("cat Miso", user_id="ana", method="bm25").hits][:1] == ["a3"]
    assert mem.forget(user_id="ana", ids=["a2"]).items == 1
    assert "a2" not in [h.item.id for h in mem.search("sister Porto", user_id="ana").hits]
    assert mem.stats().items == 3
    mem.close()
    again = Memory(url, embedder=None, create=False)
    assert [e.counts["items"] for e in again.audit()] == [1]
    assert [i.id for i in again.items(user_id="ana")] == ["a1", "a3"]
    assert again.store.check() == []
    again.close()


def test_a_meta_value_postgresql_cannot_hold_is_refused_by_name(pg):
    from suffice import InvalidItemError
    with pytest.raises(InvalidItemError, match="meta contains a NUL"):
        pg.append("a", [row("x", meta={"k": "a\x00b"})])
    with pytest.raises(InvalidItemError, match="session contains a NUL"):
        pg.append("a", [row("x", session="s\x00")])
    assert pg.stats().items == 0 and json.dumps(pg.find("a")) == "[]"


def test_a_dense_search_as_of_a_seq_never_sees_later_items_even_just_after_a_write(pg):
    """The scope's item count is remembered for a second; a bound past that count still cuts."""
    rng = np.random.default_rng(0)
    pg.append("a", [vrow(f"t{i}", rng.standard_normal(8).astype(np.float32)) for i in range(10)], encoder="e")
    q = rng.standard_normal(8).astype(np.float32)
    assert len(pg.nearest("a", "e", q, 5)) == 5  # remembers 10 items
    pg.append("a", [vrow(f"u{i}", q + 0.01 * i) for i in range(10)], encoder="e")  # closest of all
    got = [s for s, _ in pg.nearest("a", "e", q, 5, Filter(before_seq=10))]
    assert len(got) == 5 and max(got) < 10


def test_equal_distances_give_the_newest_items_first(pg):
    pg.append("a", [vrow(f"same {i}", vec(1, 0)) for i in range(30)], encoder="e")
    assert [s for s, _ in pg.nearest("a", "e", vec(1, 0), 3)] == [29, 28, 27]


def test_odd_encoder_names_and_vectors_pgvector_cannot_hold(pg):
    for name in ("minilm-100%", "x%(q)s", "x%s"):
        pg.append(name, [vrow("one", vec(1, 0)), vrow("two", vec(0, 1))], encoder=name)
        assert [s for s, _ in pg.nearest(name, name, vec(1, 0), 2)] == [0, 1], name
    pg.append("z", [vrow("zero", np.zeros(2, dtype=np.float32))], encoder="e")
    assert pg.nearest("z", "e", vec(1, 0), 1) == [(0, 0.0)]  # no direction: no similarity, not NaN
    for bad in (np.zeros(0, dtype=np.float32), np.ones(16001, dtype=np.float32)):
        with pytest.raises(StoreError, match="pgvector holds 1 to 16,000"):
            pg.append("big", [vrow("v", bad)], encoder="e")
    assert not pg.has_scope("big")


def test_vectors_too_wide_for_hnsw_are_searched_exactly_without_building(pg_location):
    st = PostgresStore(pg_location(), exact_below=2)
    try:
        wide = [np.eye(1, 2001, i, dtype=np.float32)[0] for i in range(3)]
        st.append("w", [vrow(f"w{i}", v) for i, v in enumerate(wide)], encoder="e")
        assert [s for s, _ in st.nearest("w", "e", wide[2], 1)] == [2]
        assert st.build_index("w", "e") == [] and not st._builds
        assert st.check() == []
    finally:
        st.close()


def test_forget_drops_the_forgotten_values_from_the_planner_statistics(pg):
    pg.append("ana", [row(f"zqsecret{i % 3}", id=f"zqid{i}", session="zqsess") for i in range(60)])
    pg.append("ana", [row("kept", id="keep")])
    with raw(pg) as conn:
        conn.execute("ANALYZE items")
    pg.forget("ana", session="zqsess")
    with raw(pg) as conn:
        stats = repr(conn.execute("SELECT most_common_vals::text, histogram_bounds::text FROM pg_stats"
                                  " WHERE schemaname = %s", (pg.schema,)).fetchall())
    assert "zqsecret" not in stats and "zqsess" not in stats and "zqid" not in stats


def test_vectors_of_two_sizes_never_meet(pg):
    pg.append("a", [vrow("small", vec(1, 0)), vrow("big", vec(1, 0, 0))], encoder="e")
    assert [s for s, _ in pg.nearest("a", "e", vec(1, 0), 5)] == [0]
    assert [s for s, _ in pg.nearest("a", "e", vec(1, 0, 0), 5)] == [1]


SCOPED_TABLES = re.compile(r"\b(items|pieces|terms|postings|embeddings|records|links|scopes)\b")
BOUND = re.compile(r"\b(scope|name) = %|\bsid = (\d+|%|\(SELECT sid FROM scopes WHERE name = %)"
                   r"|^INSERT INTO \w+ \((scope|name)\b")
"""A scope (or its id) in a condition, or an insert whose first column is the scope."""


def test_every_statement_of_a_scoped_call_is_bound_to_its_scope(pg, monkeypatch):
    """A guard on this module's SQL: whatever a per-scope call sends names its scope (or the
    scope's id), so no statement can read or change another tenant's rows by omission."""
    sent: list[str] = []
    execute = psycopg.Connection.execute

    def spy(self, query, params=None, **kw):
        sent.append(query.as_string(self) if isinstance(query, psycopg.sql.Composable) else
                    query.decode() if isinstance(query, bytes) else str(query))
        return execute(self, query, params, **kw)

    pg.append("b", [row("other tenant", id="x")])
    monkeypatch.setattr(psycopg.Connection, "execute", spy)
    pg.append("a", [vrow(f"t{i} river", vec(1, i), id=f"k{i}", session=f"s{i % 2}") for i in range(6)],
              encoder="e")
    pg.check_ids("a", [NewItem("t0 river", id="k0", session="s0")])
    pg.put_embeddings("a", "f", [0, 1], np.stack([vec(1, 0), vec(0, 1)]))
    pg.put_record("a", 0, 0, 1, "r", "rule", [(0, "content", 0.5)])
    pg.rebuild_pieces("a", [(0, [(0, 2)], ["t0"])])
    for flt in (None, Filter(session="s1", before_seq=5, meta={"m": 1})):
        pg.bm25("a", ["river"], 5, flt)
        pg.nearest("a", "e", vec(1, 1), 3, flt)
        pg.find("a", flt)
    pg.filter_seqs("a", Filter(session="s0"))
    pg.has_scope("a"), pg.max_seq("a"), pg.items("a"), pg.items("a", [1, 2]), pg.get("a", "k1")
    pg.layout("a"), pg.pieces("a", [0]), pg.piece_bodies("a", [0]), pg.embeddings("a", "e")
    pg.encoders("a"), pg.missing_embeddings("a", "f"), pg.records("a"), pg.links("a"), pg.stats("a")
    pg.forget("a", ids=["k2"])
    pg.forget("a", session="s1")
    pg.drop_records("a")
    pg.forget("a")
    monkeypatch.undo()
    scoped = [q for q in sent if SCOPED_TABLES.search(q) and not q.startswith("VACUUM")]
    assert len(scoped) > 40
    unbound = [q for q in scoped if not BOUND.search(q)]
    assert unbound == [], "\n\n".join(unbound)
    assert [i.text for i in pg.items("b")] == ["other tenant"]


def test_nearest_sees_a_scope_forgotten_and_written_anew_by_another_process(pg_location):
    url = pg_location()
    reader, writer = PostgresStore(url), PostgresStore(url)
    writer.append("a", [vrow("old", vec(1, 0))], encoder="e")
    assert [s for s, _ in reader.nearest("a", "e", vec(1, 0), 5)] == [0]  # the reader remembers the scope
    writer.forget("a")
    writer.append("a", [vrow("new one", vec(0, 1)), vrow("new two", vec(1, 1))], encoder="e")  # a new id
    assert [s for s, _ in reader.nearest("a", "e", vec(0, 1), 5)] == [0, 1]
    reader.close()
    writer.close()


def test_a_memory_on_postgresql_takes_up_another_processs_rebuild_within_its_poll(pg_location):
    from suffice import StoreConfig

    url = pg_location()
    server = Memory(url, embedder=HashEmbedder())
    assert server.store.config_poll_s > 0  # a round trip: not read on every call
    server.add(NewItem("the river gauge read 3.1 metres", session="s"), scope="x")
    Memory(url, store_config=StoreConfig(piece_max_tokens=8), embedder=HashEmbedder(), rebuild=True).close()
    threading.Event().wait(server.store.config_poll_s + 0.05)  # let the poll interval pass
    long = "one two three four five six seven eight nine ten eleven twelve thirteen fourteen"
    seq = server.add(NewItem(long, session="s"), scope="x")[0].seq
    assert server.store_config.piece_max_tokens == 8
    assert len(server.store.pieces("x", [seq])[seq]) > 1
    server.close()
