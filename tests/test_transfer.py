"""Backup, restore and migrate: ``suffice-jsonl`` round-trips a store exactly, a damaged file is
refused before anything is written, and every transfer ends by comparing counts and content
digests of both sides."""

from __future__ import annotations

import base64
import io
import json
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import numpy as np
import pytest
from conftest import history_items
from typer.testing import CliRunner

from suffice import (
    ConflictError,
    ImportFormatError,
    Item,
    Memory,
    NewItem,
    StoreConfig,
    StoreConfigError,
    StoreError,
)
from suffice._embed.hashing import HashEmbedder
from suffice._store import ItemRow, SQLiteStore, Store, open_store
from suffice._store.transfer import (
    FORMAT,
    TransferReport,
    check_jsonl,
    export_jsonl,
    import_jsonl,
    migrate,
    summarize,
)

CONFIG = StoreConfig(unit_tokens=120)
"""Small units, so a short history closes several of them: records and links to carry."""

ODD = [
    NewItem("Zoë говорит: 日本へ行く ☃ — “quoted” \\ back\\slash\ttab", session="ü", speaker="Zoë",
            observed_at="2024-02-29T10:00:00+01:00", id="u-1",
            meta={"tags": ["é", 1.5, None, True], "n": {"deep": [1, 2**40]}, "": "empty key"}),
    NewItem("line\u2028separator and\nnewline \U0001F600 emoji", session="ü", speaker="Zoë", role="user",
            kind="observation", agent="planner", observed_at="sometime, no date", id="u-2",
            meta={"float": 0.1, "neg": -0.0, "big": 1e300}),
    NewItem("a tool call with json args", session="t", kind="tool_call", role="tool",
            meta={"args": {"q": "weather", "k": 3}}),
]


def llm_writer(items: Sequence[Item]) -> str:
    return f"{len(items)} turns, first by {items[0].speaker or 'someone'}"


llm_writer.name = "fake-llm-v1"  # type: ignore[attr-defined]


def build(path: Path) -> None:
    """A store with what a backup must keep: several scopes (one with a unicode name), records
    written by an 'LLM', links, forgotten items and their audit lines, items without vectors,
    a second encoder's vectors, unicode and nested meta."""
    with Memory(path, store_config=CONFIG, embedder=HashEmbedder(), record_writer=llm_writer) as mem:
        mem.add(history_items(), scope="dana")
        mem.add(ODD, scope="zoë/日本")
        mem.add(history_items()[:6], scope="gone")
        mem.forget(scope="dana", ids=["h3", "h11"])
        mem.forget(scope="gone", everything=True)
    st = SQLiteStore(path)
    try:  # items that were never embedded, and a second encoder's vectors on some others
        st.append("raw", [ItemRow(NewItem(f"raw note {i}", id=f"r{i}"), "", None, 3, [(0, 3), (4, 8)],
                                  ["raw", f"note {i}"]) for i in range(5)])
        st.put_embeddings("dana", "other-enc", [0, 2], np.array([[0.5, -1.25, 3.0], [1e-30, 0.0, -2.0]],
                                                                dtype=np.float32))
    finally:
        st.close()


@pytest.fixture(scope="module")
def source_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("src") / "source.db"
    build(path)
    return path


@pytest.fixture
def source(source_path: Path) -> Iterator[SQLiteStore]:
    st = SQLiteStore(source_path, create=False)
    yield st
    st.close()


def export_bytes(store: SQLiteStore, **kw: object) -> bytes:
    buf = io.BytesIO()
    export_jsonl(store, buf, **kw)  # type: ignore[arg-type]
    return buf.getvalue()


def lines(data: bytes) -> list[dict]:  # type: ignore[type-arg]
    return [json.loads(x) for x in data.splitlines()]


def test_the_fixture_holds_what_a_backup_must_keep(source: SQLiteStore) -> None:
    assert source.scopes() == ["dana", "raw", "zoë/日本"]
    assert {r[4] for r in source.records("dana")} == {"fake-llm-v1"} and source.links("dana")
    assert len(source.audit()) == 2 and source.missing_embeddings("raw", "hash-64") == [0, 1, 2, 3, 4]
    assert source.encoders("dana") == ["hash-64", "other-enc"]


def test_export_import_export_is_byte_identical(source: SQLiteStore, tmp_path: Path) -> None:
    first = export_bytes(source)
    dst = SQLiteStore(tmp_path / "restored.db")
    report = import_jsonl(dst, io.BytesIO(first))
    assert report.ok, report.problems()
    assert export_bytes(dst) == first
    # ... and the restored store holds every field, not merely the same bytes
    for scope in source.scopes():
        assert dst.items(scope) == source.items(scope)
        n = source.max_seq(scope) + 1
        assert dst.pieces(scope, range(n)) == source.pieces(scope, range(n))
        assert dst.piece_bodies(scope, range(n)) == source.piece_bodies(scope, range(n))
        assert dst.records(scope) == source.records(scope) and dst.links(scope) == source.links(scope)
        for enc in source.encoders(scope):
            (a, x), (b, y) = source.embeddings(scope, enc), dst.embeddings(scope, enc)
            assert a.tolist() == b.tolist() and x.tobytes() == y.tobytes()
    assert dst.audit() == source.audit() and dst.load_config() == source.load_config()
    assert dst.check() == source.check()
    dst.close()


def test_the_format_is_readable_lines_with_a_checked_end(source: SQLiteStore) -> None:
    rows = lines(export_bytes(source))
    assert rows[0]["t"] == "header" and rows[0]["format"] == FORMAT and rows[0]["version"] == 1
    assert rows[0]["config"] == source.load_config()
    assert [r["scope"] for r in rows if r["t"] == "scope"] == ["dana", "raw", "zoë/日本"]
    item = next(r for r in rows if r["t"] == "item" and r["id"] == "u-1")
    assert item["meta"] == ODD[0].meta and item["observed_at"] == "2024-02-29T10:00:00+01:00"
    assert item["pieces"][0][2].startswith("Zoë 2024-02-29")  # the body as indexed, header and all
    vec = np.frombuffer(base64.b64decode(item["vectors"]["hash-64"]), dtype="<f4")
    assert vec.shape == (64,) and abs(float(np.linalg.norm(vec)) - 1) < 1e-6
    raw = [r for r in rows if r["t"] == "item" and r["id"].startswith("r")]
    assert len(raw) == 5 and all(r["vectors"] == {} for r in raw)
    assert {r["writer"] for r in rows if r["t"] == "record"} == {"fake-llm-v1"}
    assert sum(r["t"] == "audit" for r in rows) == 2
    assert "h3" not in json.dumps([r for r in rows if r["t"] == "audit"])  # digests, never ids
    end = rows[-1]
    assert end["t"] == "end" and end["lines"] == len(rows) - 1 and end["items"] == sum(
        r["t"] == "item" for r in rows)


def test_search_and_render_on_the_restored_store_equal_the_originals(source_path: Path,
                                                                      tmp_path: Path) -> None:
    with SQLiteStore(source_path, create=False) as src:
        data = export_bytes(src)
    with SQLiteStore(tmp_path / "r.db") as dst:
        assert import_jsonl(dst, io.BytesIO(data)).ok
    kw = {"store_config": CONFIG, "embedder": HashEmbedder(), "create": False}
    with Memory(source_path, **kw) as a, Memory(tmp_path / "r.db", **kw) as b:  # type: ignore[arg-type]
        for query in ("where does Dana work", "cat", "日本", "weather tool"):
            for scope in ("dana", "zoë/日本"):
                assert a.search(query, scope=scope).hits == b.search(query, scope=scope).hits
                ra, rb = a.render(query, 300, scope=scope), b.render(query, 300, scope=scope)
                assert (ra.text, ra.tokens, ra.parts) == (rb.text, rb.tokens, rb.parts)
        assert a.search("cat", scope="dana").hits  # the comparison is not of two empty lists


def test_export_of_chosen_scopes_keeps_only_their_audit_lines(source: SQLiteStore, tmp_path: Path) -> None:
    data = export_bytes(source, scopes=["zoë/日本", "dana"])
    rows = lines(data)
    assert [r["scope"] for r in rows if r["t"] == "scope"] == ["dana", "zoë/日本"]
    assert sum(r["t"] == "audit" for r in rows) == 1  # dana's forget, not the one of scope "gone"
    dst = SQLiteStore(tmp_path / "part.db")
    assert import_jsonl(dst, io.BytesIO(data)).ok and dst.scopes() == ["dana", "zoë/日本"]
    dst.close()


def test_content_digests_catch_one_changed_byte(source: SQLiteStore) -> None:
    data = export_bytes(source)
    assert summarize(source, "dana").sha256 == next(
        r["sha256"] for r in lines(data) if r["t"] == "scope_end" and r["scope"] == "dana")
    at = data.index(b"hydrologist")
    changed = data[:at] + b"H" + data[at + 1:]  # valid JSON, valid item: only the digests know
    with pytest.raises(ImportFormatError, match=r"line \d+: scope 'dana': content digest differs"):
        check_jsonl(io.BytesIO(changed))


def _damaged(data: bytes) -> list[tuple[str, bytes, str]]:
    rows = data.splitlines(keepends=True)
    item_at = next(i for i, r in enumerate(rows) if b'"t":"item"' in r)
    end = json.loads(rows[-1])
    fixed_end = [*rows[:-1], json.dumps({**end, "lines": end["lines"] - 1}).encode() + b"\n"]
    newer = [json.dumps({**json.loads(rows[0]), "version": 2}).encode() + b"\n", *rows[1:]]
    return [
        ("truncated", data[: len(data) // 2], "truncated"),
        ("no end line", b"".join(rows[:-1]), "truncated: no end line"),
        ("a line lost", b"".join(rows[:item_at] + rows[item_at + 1:]), "item seq 1 where 0"),
        ("a line lost, end adjusted", b"".join(fixed_end[:item_at] + fixed_end[item_at + 1:]),
         "item seq 1 where 0"),
        ("malformed JSON", b"".join([*rows[:item_at], b'{"t":"item",\n', *rows[item_at + 1:]]),
         f"line {item_at + 1}: not valid JSON"),
        ("newer version", b"".join(newer), "line 1: format version 2 is newer"),
        ("not an export", b'{"text": "hello"}\n', "line 1: not a suffice-jsonl file"),
        ("empty file", b"", "truncated"),
        ("content after the end", data + b'{"t":"audit"}\n', "content after the end line"),
        ("NaN", data.replace(b'"observed_ts":1740873600.0', b'"observed_ts":NaN', 1), "not valid JSON"),
    ]


@pytest.mark.parametrize("case", range(10))
def test_a_damaged_file_is_refused_naming_the_line_and_nothing_is_written(
        source: SQLiteStore, tmp_path: Path, case: int) -> None:
    name, data, message = _damaged(export_bytes(source))[case]
    dst = SQLiteStore(tmp_path / "d.db")
    with pytest.raises(ImportFormatError, match=message):
        import_jsonl(dst, io.BytesIO(data))
    assert dst.scopes() == [] and dst.load_config() is None and dst.audit() == [], name
    dst.close()


def test_an_edited_field_is_refused_even_with_matching_digests(source: SQLiteStore) -> None:
    """A hand-made file whose digests were recomputed still has to hold valid items."""
    rows = lines(export_bytes(source))
    item = next(i for i, r in enumerate(rows) if r["t"] == "item")
    rows[item]["pieces"] = [[0, 10**6, "beyond the text"]]
    body = b"".join(json.dumps(r).encode() + b"\n" for r in rows)
    with pytest.raises(ImportFormatError, match=rf"line {item + 1}: a piece must be"):
        check_jsonl(io.BytesIO(body))


def test_a_write_that_fails_midway_leaves_nothing(source: SQLiteStore, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    data = export_bytes(source)
    dst = SQLiteStore(tmp_path / "f.db")
    calls = {"n": 0}
    real = dst.put_record

    def flaky(*args: object, **kw: object) -> bool:
        calls["n"] += 1
        if calls["n"] == 3:
            raise OSError("disk full")
        return real(*args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(dst, "put_record", flaky)
    with pytest.raises(OSError, match="disk full"):
        import_jsonl(dst, io.BytesIO(data))
    assert dst.scopes() == [] and dst.stats().items == 0 and dst.records("dana") == []
    dst.close()


def test_import_refuses_scopes_the_store_holds_and_other_settings(source: SQLiteStore,
                                                                   tmp_path: Path) -> None:
    data = export_bytes(source, scopes=["raw"])
    dst = SQLiteStore(tmp_path / "busy.db")
    assert import_jsonl(dst, io.BytesIO(data)).ok
    with pytest.raises(ConflictError, match="already holds scope.*'raw'"):
        import_jsonl(dst, io.BytesIO(data))
    assert dst.stats().items == 5
    # other scopes may join a store built with the same settings ...
    assert import_jsonl(dst, io.BytesIO(export_bytes(source, scopes=["dana"]))).ok
    assert dst.scopes() == ["dana", "raw"]
    # ... but not one built with others: its pieces and records would not match
    with Memory(tmp_path / "other.db", store_config=StoreConfig(unit_tokens=999), embedder=None) as mem:
        mem.add([NewItem("x")], scope="elsewhere")
    other = SQLiteStore(tmp_path / "other.db")
    with pytest.raises(StoreConfigError, match="unit_tokens"):
        import_jsonl(other, io.BytesIO(data))
    assert other.scopes() == ["elsewhere"]
    other.close()
    dst.close()


def test_migrate_copies_everything_and_verifies_it(source: SQLiteStore, tmp_path: Path) -> None:
    dst = SQLiteStore(tmp_path / "m.db")
    report = migrate(source, dst, batch=7)  # small batches: the copy crosses batch boundaries
    assert report.ok, report.problems()
    assert [s.scope for s in report.found] == ["dana", "raw", "zoë/日本"]
    assert report.found == report.expected and report.audit_found == 2
    assert sum(s.items for s in report.found) == source.stats().items
    assert export_bytes(dst) == export_bytes(source)
    with pytest.raises(ConflictError):
        migrate(source, dst)
    dst.close()


def test_migrate_reports_a_loss(source: SQLiteStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """The verification reads the destination back: a backend that drops data fails it."""
    dst = SQLiteStore(":memory:")
    real = dst.put_embeddings
    monkeypatch.setattr(dst, "put_embeddings", lambda scope, enc, seqs, vecs: real(
        scope, enc, seqs[1:], vecs[1:]) if enc == "other-enc" else real(scope, enc, seqs, vecs))
    report = migrate(source, dst)
    n = summarize(source, "dana").vectors
    assert not report.ok
    assert report.problems() == [f"scope 'dana': vectors {n} in the source, {n - 1} in the destination",
                                 "scope 'dana': content digest differs"]
    assert report.lines()[-1] == "VERIFICATION FAILED"


def test_an_empty_store_round_trips(tmp_path: Path) -> None:
    with SQLiteStore(":memory:") as empty, SQLiteStore(":memory:") as dst:
        data = export_bytes(empty)
        assert import_jsonl(dst, io.BytesIO(data)).ok and export_bytes(dst) == data


def test_export_to_a_file_is_read_back_and_never_replaces_a_backup_on_failure(
        source: SQLiteStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "backup.jsonl"
    report = export_jsonl(source, out)
    assert report.ok and report.checked and out.read_bytes() == export_bytes(source)
    good = out.read_bytes()
    monkeypatch.setattr(source, "piece_bodies", lambda scope, seqs: {})  # a store that breaks midway
    with pytest.raises(Exception, match="pieces and their indexed bodies"):
        export_jsonl(source, out)
    assert out.read_bytes() == good and not list(tmp_path.glob("*.tmp"))  # nothing half-written left


# -- other writers, and a transfer killed midway -----------------------------------------------------


def _transfer(how: str, source: SQLiteStore) -> Callable[..., TransferReport]:
    """An import of ``source``'s export, or a migration from it: both write the same way."""
    data = export_bytes(source)
    if how == "import":
        return lambda dst, **kw: import_jsonl(dst, io.BytesIO(data), **kw)
    return lambda dst, **kw: migrate(source, dst, **kw)


@pytest.mark.parametrize("how", ["import", "migrate"])
def test_a_failed_transfer_removes_its_own_items_and_never_another_writers(
        source: SQLiteStore, store_location: Callable[[str], str], how: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """An application appends to a scope between two batches of a transfer into it: the
    transfer fails (it never merges two logs) and forgets what it wrote, by id; the
    application's item stays."""
    where = store_location("shared")
    dst, app = open_store(where), open_store(where)
    real, calls = dst.append, [0]

    def append(scope: str, rows: Sequence[ItemRow], **kw: object) -> list[Item]:
        calls[0] += 1
        if calls[0] == 2:  # after the transfer's first batch of 10, before its second
            app.append(scope, [ItemRow(NewItem("written by the app meanwhile", id="app-1"), "", None, 5,
                                       [(0, 7)], ["written"])])
        return real(scope, rows, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(dst, "append", append)
    try:
        with pytest.raises(StoreError) as failed:
            _transfer(how, source)(dst, batch=10)
        assert [it.id for it in app.items("dana")] == ["app-1"]  # the application's item is kept
        assert "another writer added items to scope 'dana'" in str(failed.value)
        assert dst.scopes() == ["dana"] and dst.records("dana") == []
        undo = dst.audit()[-1]  # both of the transfer's batches, by id, not the whole scope
        assert undo.action == "forget items" and undo.counts["items"] == 20
        assert dst.unfinished_transfers() == {}  # nothing of the transfer is left to complete
    finally:
        dst.close()
        app.close()


_KILLED = """
import os, signal, sys
from suffice._store import SQLiteStore, open_store
from suffice._store.transfer import import_jsonl, migrate
how, source, where = sys.argv[1:]
dst = open_store(where)
real, calls = dst.put_embeddings, [0]
def put_embeddings(*args, **kw):
    calls[0] += 1
    if calls[0] == 3:  # the second batch's items are written, its vectors not yet
        os.kill(os.getpid(), signal.SIGKILL)
    return real(*args, **kw)
dst.put_embeddings = put_embeddings
if how == "import":
    import_jsonl(dst, source, batch=10)
else:
    migrate(SQLiteStore(source, create=False), dst, batch=10)
"""


@pytest.mark.parametrize("how", ["import", "migrate"])
def test_a_killed_transfer_is_completed_by_running_it_again(
        source: SQLiteStore, source_path: Path, store_location: Callable[[str], str], how: str,
        tmp_path: Path) -> None:
    """SIGKILL between a batch's items and its vectors leaves a scope that would look sound (20
    of 28 items, 10 of them with vectors) but for the transfer's mark, which the store keeps
    until the same transfer, run again, has checked what is there and completed it; the result
    verifies against the source."""
    backup = tmp_path / "backup.jsonl"
    export_jsonl(source, backup)
    where = store_location("killed")
    child = subprocess.run([sys.executable, "-c", _KILLED, how,
                            str(backup if how == "import" else source_path), where],
                           capture_output=True, text=True, timeout=120)
    assert child.returncode == -9, child.stderr
    dst = open_store(where)
    try:
        assert dst.scopes() == ["dana"] and dst.stats().items == 20
        assert len(dst.embeddings("dana", "hash-64")[0]) == 10
        mark = dst.unfinished_transfers()
        assert list(mark) == ["dana"] and mark["dana"]["items"] == source.stats("dana").items
        assert mark["dana"]["source"] == (str(backup) if how == "import" else str(source_path))
        report = _transfer(how, source)(dst, batch=10)
        assert report.ok, report.problems()
        assert report.found == report.expected and report.audit_found == 2
        assert dst.unfinished_transfers() == {}
        assert [dst.items(s) for s in dst.scopes()] == [source.items(s) for s in source.scopes()]
    finally:
        dst.close()


def test_check_names_a_transfer_that_never_finished_until_its_scope_is_forgotten(tmp_path: Path) -> None:
    """A mark left by a killed transfer is a problem `suffice check` names, with the way out."""
    path = tmp_path / "marked.db"
    with Memory(path, store_config=CONFIG, embedder=HashEmbedder()) as mem:
        mem.add(history_items()[:4], scope="dana")
        mem.store.note_transfer("dana", {"source": "backup.jsonl", "items": 28,
                                         "started": "2026-12-04T12:00:00+00:00"})
        mem.store.note_transfer("zoë/日本", {"source": "backup.jsonl", "items": 3, "started": "x"})
        mem.store.note_transfer("zoë/日本", None)
        assert mem.check() == [
            "scope 'dana': a transfer from backup.jsonl began 2026-12-04T12:00:00+00:00 and did not "
            "finish (4 of 28 items are here): run the same import or migrate again to complete it, "
            "or forget the scope"]
        mem.forget(scope="dana", everything=True)
        assert mem.check() == [] and mem.store.unfinished_transfers() == {}


def _copy_items(src: Store, dst: Store, scope: str, n: int, *, pieces: bool = True) -> None:
    """The first ``n`` items of ``scope`` as a transfer writes them (as one piece if not ``pieces``)."""
    items = src.items(scope, start=0, end=n)
    spans, bodies = src.pieces(scope, range(n)), src.piece_bodies(scope, range(n))
    dst.append(scope, [ItemRow(NewItem(it.text, session=it.session, speaker=it.speaker, role=it.role,
                                       kind=it.kind, observed_at=it.observed_at, meta=it.meta, id=it.id,
                                       agent=it.agent), it.observed_at, it.observed_ts, it.tokens,
                               [(s, e) for _, s, e in spans[it.seq]] if pieces else [(0, len(it.text))],
                               bodies[it.seq] if pieces else [it.text])
                       for it in items])


def test_only_the_start_of_the_sources_own_log_is_completed(source: SQLiteStore, tmp_path: Path) -> None:
    """A scope holding the source's first items is completed; one holding anything else is
    refused before a thing is written, and so is a transfer already done."""
    data = export_bytes(source, scopes=["dana"])
    dst = SQLiteStore(tmp_path / "head.db")
    dst.save_config(source.load_config() or {})
    _copy_items(source, dst, "dana", 12)
    assert import_jsonl(dst, io.BytesIO(data), batch=5).ok
    with pytest.raises(ConflictError, match="already holds scope.*'dana' exactly as the source has them"):
        import_jsonl(dst, io.BytesIO(data))
    dst.close()
    note = ItemRow(NewItem("someone else's note", id="other"), "", None, 3, [(0, 4)], ["note"])
    for case, head, pieces, more in [("another log", 0, True, [note]),
                                     ("the start and more", 12, True, [note]),
                                     ("the start, other pieces", 12, False, [])]:
        dst = SQLiteStore(tmp_path / f"{case}.db")
        dst.save_config(source.load_config() or {})
        _copy_items(source, dst, "dana", head, pieces=pieces)
        dst.append("dana", more)
        with pytest.raises(ConflictError, match="already holds scope.*'dana' with other items"):
            import_jsonl(dst, io.BytesIO(data))
        assert dst.stats().items == head + len(more) and dst.audit() == [], case
        dst.close()


# -- the commands ------------------------------------------------------------------------------------

runner = CliRunner()


def test_cli_export_import_migrate_round_trip(source_path: Path, tmp_path: Path) -> None:
    from suffice._cli import app

    backup, restored, copied = tmp_path / "b.jsonl", tmp_path / "r.db", tmp_path / "c.db"
    r = runner.invoke(app, ["--db", str(source_path), "export", "--out", str(backup)])
    assert r.exit_code == 0, r.output
    assert "verified" in r.output and "dana" in r.output
    r = runner.invoke(app, ["import", "jsonl", str(backup), "--db", str(restored)])
    assert r.exit_code == 0, r.output
    assert "verified: counts and content digests are equal" in r.output
    r = runner.invoke(app, ["migrate", str(restored), str(copied)])
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, ["--db", str(copied), "export"])  # to standard output
    assert r.exit_code == 0
    assert r.stdout_bytes == backup.read_bytes()
    r = runner.invoke(app, ["--db", str(tmp_path / "s.db"), "import", "jsonl", "-"],
                      input=backup.read_bytes())
    assert r.exit_code == 0, r.output


def test_cli_refusals_are_one_line_errors(source_path: Path, tmp_path: Path) -> None:
    from suffice._cli import app

    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b'{"t":"header","config":null,"format":"suffice-jsonl","schema_version":4,"version":1}\n')
    r = runner.invoke(app, ["import", "jsonl", str(bad), "--db", str(tmp_path / "x.db")])
    assert r.exit_code == 2 and "truncated: no end line after line 1" in r.output
    assert r.output.count("\n") == 1 and not list(tmp_path.glob("x.db*"))  # no empty store left behind
    r = runner.invoke(app, ["migrate", str(source_path), str(source_path)])
    assert r.exit_code == 2 and "same store" in r.output
    r = runner.invoke(app, ["migrate", str(tmp_path / "missing.db"), str(tmp_path / "y.db")])
    assert r.exit_code == 2 and "no store" in r.output
    r = runner.invoke(app, ["--db", str(source_path), "export", "--scope", "nobody"])
    assert r.exit_code == 2 and "nobody" in r.output
    before = source_path.read_bytes()
    for out in (source_path, Path(f"{source_path}-wal"), tmp_path):  # the store itself, its WAL, a folder
        r = runner.invoke(app, ["--db", str(source_path), "export", "--out", str(out)])
        assert r.exit_code == 2 and r.output.count("\n") == 1, r.output
        assert "the store being exported" in r.output or "is a folder" in r.output
    assert source_path.read_bytes() == before
    blocked = tmp_path / "a-file"
    blocked.write_text("x")
    r = runner.invoke(app, ["--db", str(blocked / "x.db"), "add", "hi"])  # a file where its folder goes
    assert r.exit_code == 2 and "cannot create the folder" in r.output and r.output.count("\n") == 1


def test_a_refused_import_leaves_no_new_postgresql_schema_but_keeps_one_it_found(
        tmp_path: Path, pg_location, pg_server: str) -> None:  # type: ignore[no-untyped-def]
    from urllib.parse import parse_qs, urlsplit

    import psycopg

    from suffice._cli import app
    from suffice._store import open_store

    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b'{"t":"header","config":null,"format":"suffice-jsonl","schema_version":4,"version":1}\n')
    new, kept = pg_location(), pg_location()
    open_store(kept).close()  # a store that was there before the import

    def schemas() -> set[str]:
        with psycopg.connect(pg_server) as conn:
            return {r[0] for r in conn.execute("SELECT nspname FROM pg_namespace")}

    for url in (new, kept):
        r = runner.invoke(app, ["import", "jsonl", str(bad), "--db", url])
        assert r.exit_code == 2 and "truncated: no end line after line 1" in r.output
    name = {url: parse_qs(urlsplit(url).query)["schema"][0] for url in (new, kept)}
    assert schemas() & set(name.values()) == {name[kept]}


# -- across backends -------------------------------------------------------------------------------------


def test_sqlite_to_postgresql_and_back_loses_nothing(source: SQLiteStore, source_path: Path, tmp_path: Path,
                                                     pg_location) -> None:  # type: ignore[no-untyped-def]
    from suffice._cli import app
    from suffice._store import open_store

    pg = open_store(pg_location())
    try:
        report = migrate(source, pg, batch=16)
        assert report.ok, report.problems()
        assert sum(s.items for s in report.found) == source.stats().items and report.audit_found == 2
        # PostgreSQL exports the same content; only the header's schema version is the backend's own
        ours, theirs = lines(export_bytes(source)), lines(export_bytes(pg))
        strip = lambda rows: [r for r in rows if r["t"] not in ("header", "end")]  # noqa: E731
        assert strip(theirs) == strip(ours)
        assert {**theirs[0], "schema_version": 0} == {**ours[0], "schema_version": 0}
        back = SQLiteStore(tmp_path / "back.db")
        assert migrate(pg, back).ok
        assert export_bytes(back) == export_bytes(source)  # the round trip is exact, byte for byte
        back.close()
        # an export restored straight into PostgreSQL verifies the same way
        pg2 = open_store(pg_location())
        assert import_jsonl(pg2, io.BytesIO(export_bytes(source))).ok
        assert strip(lines(export_bytes(pg2))) == strip(ours)
        pg2.close()
    finally:
        pg.close()
    url = pg_location()
    r = runner.invoke(app, ["migrate", str(source_path), url])
    assert r.exit_code == 0, r.output
    assert "verified: counts and content digests are equal" in r.output
