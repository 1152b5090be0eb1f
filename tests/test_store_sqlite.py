"""The SQLite store passes the store contract; and what only SQLite does: its immutability
trigger, several processes writing at once, schema migrations, refusing what is not a store."""

import multiprocessing as mp
import sqlite3

import pytest
from store_contract import StoreContract, row

from suffice import StoreError
from suffice._store import SCHEMA_VERSION, SQLiteStore


class TestSQLiteStore(StoreContract):
    @pytest.fixture
    def store(self, tmp_path):
        st = SQLiteStore(tmp_path / "s.db")
        yield st
        st.close()


def test_the_database_refuses_to_change_an_items_content(tmp_path):
    st = SQLiteStore(tmp_path / "s.db")
    st.append("a", [row("original")])
    for column, value in (("text", "'changed'"), ("meta", "'{}'"), ("id", "'other'"), ("scope", "'b'")):
        with pytest.raises(sqlite3.IntegrityError, match="immutable"):
            st._conn.execute(f"UPDATE items SET {column} = {value}")
    assert st.items("a")[0].text == "original"


def _writer(path: str, tag: str, n: int, batch: int, barrier) -> None:
    st = SQLiteStore(path)
    barrier.wait(timeout=60)  # start together so the writes really overlap
    for k, start in enumerate(range(0, n, batch)):
        st.append("shared", [row(f"{tag} item {i}", id=f"{tag}-{i}")
                             for i in range(start, min(n, start + batch))])
        if k < 2:  # lockstep for two batches: the writers interleave even on a busy machine
            barrier.wait(timeout=60)
    st.close()


def test_two_processes_writing_at_once_lose_and_double_nothing(tmp_path):
    path = str(tmp_path / "s.db")
    SQLiteStore(path).close()
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(2)
    procs = [ctx.Process(target=_writer, args=(path, tag, 5000, 50, barrier)) for tag in ("p", "q")]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=300)
        assert p.exitcode == 0
    st = SQLiteStore(path)
    items = st.items("shared")
    assert len(items) == 10_000
    assert len({i.id for i in items}) == 10_000
    assert [i.seq for i in items] == list(range(10_000))
    # The writers interleaved (p..q..p at least) rather than one running after the other.
    tags = [i.id[0] for i in items]
    assert sum(1 for x, y in zip(tags, tags[1:], strict=False) if x != y) >= 2


def test_schema_version_is_recorded_and_persists(tmp_path):
    path = tmp_path / "s.db"
    SQLiteStore(path).append("a", [row("kept")])
    st = SQLiteStore(path)
    assert st.schema_version == SCHEMA_VERSION == 4
    assert st.items("a")[0].text == "kept"


def _old_store(path, version: int, unique: str) -> None:
    con = sqlite3.connect(path)
    con.executescript(
        "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);"
        f"CREATE TABLE items (rowid INTEGER PRIMARY KEY, id TEXT NOT NULL {unique}, scope TEXT NOT NULL,"
        " seq INTEGER NOT NULL, session TEXT NOT NULL, speaker TEXT NOT NULL, role TEXT NOT NULL,"
        " kind TEXT NOT NULL, observed_at TEXT NOT NULL, text TEXT NOT NULL, meta TEXT NOT NULL,"
        " tokens INTEGER NOT NULL, created_at REAL NOT NULL, UNIQUE (scope, seq)"
        + (", UNIQUE (scope, id)" if version == 2 else "") + ");"
        f"INSERT INTO meta VALUES ('schema_version', '{version}');"
        "CREATE TRIGGER items_immutable BEFORE UPDATE ON items BEGIN SELECT RAISE(ABORT, 'no'); END;"
        "INSERT INTO items VALUES (1, 'k1', 'a', 0, '', '', '', 'message', '1:56 pm on 8 May, 2023',"
        " 'kept', '{}', 1, 0);")
    con.commit()
    con.close()


@pytest.mark.parametrize(("version", "unique"), [(1, "UNIQUE"), (2, "")])
def test_an_old_store_is_migrated_in_place_and_its_times_parsed(tmp_path, version, unique):
    path = tmp_path / "old.db"
    _old_store(path, version, unique)
    st = SQLiteStore(path)
    assert st.schema_version == SCHEMA_VERSION
    [it] = st.items("a")
    assert it.text == "kept" and it.agent == ""
    assert it.observed_ts == pytest.approx(1683554160.0)  # 2023-05-08 13:56 UTC
    st.append("b", [row("same id, other scope", id="k1")])
    with pytest.raises(sqlite3.IntegrityError, match="immutable"):
        st._conn.execute("UPDATE items SET text = 'changed'")
    st.close()
    assert SQLiteStore(path).schema_version == SCHEMA_VERSION  # opening again changes nothing


def test_a_file_that_is_not_a_store_is_refused_and_left_alone(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("just some notes, not a database\n" * 100)
    before = path.read_bytes()
    with pytest.raises(StoreError, match="cannot open store"):
        SQLiteStore(path)
    assert path.read_bytes() == before


@pytest.mark.parametrize("create", [True, False])
def test_another_applications_database_is_refused_and_left_as_it_was(tmp_path, create):
    path = tmp_path / "app.db"
    con = sqlite3.connect(path)
    con.executescript("CREATE TABLE notes (body TEXT); INSERT INTO notes VALUES ('mine');"
                      "CREATE TABLE meta (k TEXT, v TEXT);")  # a "meta" table of its own, too
    con.commit()
    con.close()
    before = path.read_bytes()
    with pytest.raises(StoreError, match="another application .*meta, notes"):
        SQLiteStore(path, create=create)
    assert path.read_bytes() == before  # no suffice table, and its journal mode unchanged


def test_a_foreign_database_whose_meta_looks_like_ours_is_still_refused(tmp_path):
    path = tmp_path / "app.db"
    con = sqlite3.connect(path)
    con.executescript("CREATE TABLE meta (key TEXT, value TEXT);"
                      "INSERT INTO meta VALUES ('schema_version', '3'); CREATE TABLE notes (body TEXT);")
    con.commit()
    con.close()
    with pytest.raises(StoreError, match="another application"):
        SQLiteStore(path)


def test_reading_an_empty_file_creates_no_store_there(tmp_path):
    path = tmp_path / "empty.db"
    path.touch()
    with pytest.raises(StoreError, match="no store at"):
        SQLiteStore(path, create=False)
    assert path.stat().st_size == 0
    SQLiteStore(path).close()  # a write may make it one
    assert SQLiteStore(path, create=False).schema_version == SCHEMA_VERSION


def test_reading_a_missing_store_creates_nothing(tmp_path):
    path = tmp_path / "typo" / "store.db"
    with pytest.raises(StoreError, match="no store at"):
        SQLiteStore(path, create=False)
    assert not path.parent.exists()
    with pytest.raises(StoreError, match="directory"):
        SQLiteStore(tmp_path)


def test_a_newer_schema_is_refused(tmp_path):
    path = tmp_path / "new.db"
    SQLiteStore(path).close()
    con = sqlite3.connect(path)
    con.execute("UPDATE meta SET value = '99' WHERE key = 'schema_version'")
    con.commit()
    con.close()
    with pytest.raises(StoreError, match="newer than this suffice"):
        SQLiteStore(path)


def test_a_forget_does_not_wait_long_for_readers_to_let_go_of_the_log(tmp_path):
    import time
    st = SQLiteStore(tmp_path / "s.db", busy_timeout_s=30)
    st.append("a", [row("x", id="k"), row("y")])
    reader = sqlite3.connect(tmp_path / "s.db")
    reader.execute("BEGIN")
    reader.execute("SELECT COUNT(*) FROM items").fetchone()  # holds a snapshot of the log
    t0 = time.monotonic()
    report = st.forget("a", ids=["k"])
    assert time.monotonic() - t0 < 5
    assert report.items == 1 and not report.checkpointed  # said, not hidden
    reader.close()
    assert st.forget("a", ids=["missing"]).items == 0
    assert st._checkpoint()  # the next checkpoint empties it


def test_a_migration_already_done_by_another_process_is_not_done_again(tmp_path):
    path = tmp_path / "old.db"
    _old_store(path, 1, "UNIQUE")
    st = SQLiteStore(path)
    st.append("a", [row("new", agent="bot")])
    st._migrate_v1()  # a second opener that read version 1 before the first one migrated
    assert [i.agent for i in st.items("a")] == ["", "bot"]


def test_check_finds_a_sound_store_sound_and_names_what_is_broken(tmp_path):
    st = SQLiteStore(tmp_path / "s.db")
    st.append("a", [row("one", id="1"), row("two", id="2"), row("three", id="3")])
    st.put_record("a", 0, 0, 1, "one two", "rule", [])
    assert st.check() == []
    st._conn.execute("DELETE FROM pieces WHERE seq = 1")  # a piece lost behind the store's back
    st._conn.execute("DROP TRIGGER items_immutable")
    st._conn.execute("UPDATE items SET seq = 7 WHERE seq = 2")
    problems = "\n".join(st.check())
    assert "items without a piece" in problems
    assert "full-text rows of no piece" in problems
    assert "seqs have gaps" in problems


def test_a_v3_store_gets_one_full_text_table_per_scope(tmp_path):
    from suffice._store.sqlite import fts_table
    path = tmp_path / "v3.db"
    st = SQLiteStore(path)
    st.append("a", [row("red fox"), row("blue sky")])
    st.append("b", [row("red car")])
    st.close()
    con = sqlite3.connect(path)  # back to version 3: one shared table
    con.executescript(
        "CREATE VIRTUAL TABLE pieces_fts USING fts5(body, tokenize = 'porter unicode61');"
        f"INSERT INTO pieces_fts (rowid, body) SELECT rowid, body FROM \"{fts_table('a')}\";"
        f"INSERT INTO pieces_fts (rowid, body) SELECT rowid, body FROM \"{fts_table('b')}\";"
        f"DROP TABLE \"{fts_table('a')}\"; DROP TABLE \"{fts_table('b')}\";"
        "UPDATE meta SET value = '3' WHERE key = 'schema_version';")
    con.close()
    st = SQLiteStore(path)
    assert st.schema_version == 4 and st.check() == []
    assert [q for q, _, _ in st.bm25("a", ["red"], 5)] == [0]
    assert [q for q, _, _ in st.bm25("b", ["red"], 5)] == [0]
    names = [r[0] for r in st._conn.execute("SELECT name FROM sqlite_master")]
    assert "pieces_fts" not in names and not any("a" == n or "b" == n for n in names)


def test_opening_a_current_store_writes_nothing_so_a_long_write_elsewhere_does_not_block_it(tmp_path):
    """A reader opens and reads while another process holds the write lock (a long import,
    a forget's rewrite): only a store that needs its schema made or migrated must write."""
    path = tmp_path / "m.db"
    store = SQLiteStore(path)
    store.close()
    writer = sqlite3.connect(path, isolation_level=None)
    writer.execute("BEGIN IMMEDIATE")  # held for the whole test
    reader = SQLiteStore(path, busy_timeout_s=0.2, max_retries=3)
    assert reader.stats(None).items == 0
    with pytest.raises(StoreError, match="kept it locked for 0.2 s"):
        reader.note_transfer("s", {"source": "x"})  # a write waits at most its timeout
    reader.close()
    writer.rollback()


def test_a_damaged_file_is_a_store_error_and_check_reports_it_instead_of_raising(tmp_path):
    """Raw sqlite3 errors escaped, from check() too: the one tool meant to diagnose this."""
    from suffice import Memory, StoreError

    path = tmp_path / "m.db"
    with Memory(path, embedder=None) as mem:
        mem.add([f"turn {i} " + "w " * 50 for i in range(300)], scope="u")
    size = path.stat().st_size
    with open(path, "r+b") as fh:  # a torn write in the middle of the file
        fh.seek(size // 2)
        fh.write(b"\xff" * 4096)
    with Memory(path, embedder=None) as mem:
        with pytest.raises(StoreError, match="malformed"):
            mem.items(scope="u")
        problems = mem.check()
        assert problems and any("malformed" in p for p in problems)


def test_a_write_that_fills_the_disk_is_a_store_error_and_keeps_nothing(tmp_path):
    import sqlite3

    from suffice import Memory, StoreError

    path = tmp_path / "m.db"
    with Memory(path, embedder=None) as mem:
        mem.add("a first note", scope="u")
    con = sqlite3.connect(path)
    pages = con.execute("PRAGMA page_count").fetchone()[0]
    con.close()
    with Memory(path, embedder=None) as mem:
        mem._store._conn.execute(f"PRAGMA max_page_count = {pages + 2}")  # the disk is nearly full
        with pytest.raises(StoreError, match="full"):
            mem.add(["x " * 3000 for _ in range(20)], scope="u")
        assert [it.text for it in mem.items(scope="u")] == ["a first note"]
