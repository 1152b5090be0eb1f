"""The store is append-only, atomic per batch, idempotent with client ids, partitioned by scope."""

import multiprocessing as mp
import sqlite3

import pytest

from suffice import ConflictError, InvalidItemError, NewItem, UnknownScopeError
from suffice.store import SCHEMA_VERSION, SQLiteStore
from suffice.store.sqlite import ItemRow


def row(text: str, **kw) -> ItemRow:
    return ItemRow(NewItem(text=text, **kw), tokens=len(text.split()), pieces=[(0, len(text))],
                   piece_bodies=[text])


def test_items_get_consecutive_seqs_per_scope(tmp_path):
    st = SQLiteStore(tmp_path / "s.db")
    a = st.append("a", [row("one"), row("two")])
    b = st.append("b", [row("three")])
    c = st.append("a", [row("four")])
    assert [i.seq for i in a + c] == [0, 1, 2]
    assert b[0].seq == 0


def test_there_is_no_update_and_the_database_refuses_one(tmp_path):
    st = SQLiteStore(tmp_path / "s.db")
    st.append("a", [row("original")])
    assert not any(name.startswith("update") for name in dir(st))
    with pytest.raises(sqlite3.IntegrityError, match="immutable"):
        st._conn.execute("UPDATE items SET text = 'changed'")
    assert st.items("a")[0].text == "original"


def test_a_bad_item_rejects_the_whole_batch(tmp_path):
    st = SQLiteStore(tmp_path / "s.db")
    with pytest.raises(InvalidItemError, match="item 1.*empty"):
        st.append("a", [row("fine"), row("   ")])
    assert st.stats().items == 0


def test_client_ids_make_adds_idempotent(tmp_path):
    st = SQLiteStore(tmp_path / "s.db")
    first = st.append("a", [row("x", id="k1"), row("y", id="k2")])
    again = st.append("a", [row("x", id="k1"), row("y", id="k2"), row("z", id="k3")])
    assert [i.seq for i in again] == [0, 1, 2]
    assert again[:2] == first
    assert st.stats().items == 3


def test_same_id_with_other_text_is_a_conflict_and_writes_nothing(tmp_path):
    st = SQLiteStore(tmp_path / "s.db")
    st.append("a", [row("x", id="k1")])
    with pytest.raises(ConflictError, match="k1"):
        st.append("a", [row("new", id="k9"), row("changed", id="k1")])
    assert [i.text for i in st.items("a")] == ["x"]


def test_scopes_are_hard_partitions(tmp_path):
    st = SQLiteStore(tmp_path / "s.db")
    st.append("alice", [row("alice secret plan")])
    st.append("bob", [row("bob plan")])
    assert [s for s, _, _ in st.bm25("bob", ["secret", "plan"], 10)] == [0]
    assert all(i.scope == "bob" for i in st.items("bob"))
    with pytest.raises(UnknownScopeError, match="carol"):
        st.require_scope("carol")


def test_schema_version_is_recorded_and_persists(tmp_path):
    path = tmp_path / "s.db"
    SQLiteStore(path).append("a", [row("kept")])
    st = SQLiteStore(path)
    assert st.schema_version == SCHEMA_VERSION
    assert st.items("a")[0].text == "kept"


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


def test_client_ids_are_per_scope_and_errors_name_no_other_scope(tmp_path):
    st = SQLiteStore(tmp_path / "s.db")
    st.append("tenant-a", [row("a's turn", id="turn-1")])
    st.append("tenant-b", [row("b's turn", id="turn-1")])
    assert st.items("tenant-b")[0].text == "b's turn"
    with pytest.raises(UnknownScopeError) as err:
        st.require_scope("tenant-c")
    assert "tenant-a" not in str(err.value)


def test_idempotency_compares_every_field(tmp_path):
    st = SQLiteStore(tmp_path / "s.db")
    st.append("a", [row("x", id="k", observed_at="2024-01-01", meta={"n": 1})])
    with pytest.raises(ConflictError):
        st.append("a", [row("x", id="k", observed_at="2024-01-02", meta={"n": 1})])
    with pytest.raises(ConflictError):
        st.append("a", [row("x", id="k", observed_at="2024-01-01", meta={"n": 2})])


@pytest.mark.parametrize(("item", "message"), [
    (NewItem(text="x", meta="not a dict"), "meta must be a mapping"),
    (NewItem(text="bad \ud800 surrogate"), "not valid unicode"),
])
def test_malformed_fields_are_invalid_items(tmp_path, item, message):
    st = SQLiteStore(tmp_path / "s.db")
    with pytest.raises(InvalidItemError, match=message):
        st.append("a", [ItemRow(item, 1, [(0, 1)], ["x"])])


def test_a_v1_store_is_migrated_in_place(tmp_path):
    path = tmp_path / "old.db"
    con = sqlite3.connect(path)
    con.executescript(
        "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);"
        "CREATE TABLE items (rowid INTEGER PRIMARY KEY, id TEXT NOT NULL UNIQUE, scope TEXT NOT NULL,"
        " seq INTEGER NOT NULL, session TEXT NOT NULL, speaker TEXT NOT NULL, role TEXT NOT NULL,"
        " kind TEXT NOT NULL, observed_at TEXT NOT NULL, text TEXT NOT NULL, meta TEXT NOT NULL,"
        " tokens INTEGER NOT NULL, created_at REAL NOT NULL, UNIQUE (scope, seq));"
        "INSERT INTO meta VALUES ('schema_version', '1');"
        "INSERT INTO items VALUES (1, 'k1', 'a', 0, '', '', '', 'message', '', 'kept', '{}', 1, 0);")
    con.commit()
    con.close()
    st = SQLiteStore(path)
    assert st.schema_version == SCHEMA_VERSION == 2
    assert st.items("a")[0].text == "kept"
    st.append("b", [row("same id, other scope", id="k1")])
    with pytest.raises(sqlite3.IntegrityError, match="immutable"):
        st._conn.execute("UPDATE items SET text = 'changed'")
