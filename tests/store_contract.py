"""The store contract: what every backend must do, written once, run against each backend.

A backend's test module subclasses :class:`StoreContract` and provides a ``store`` fixture
(a new, empty store). Nothing here knows which backend it talks to.
"""

from __future__ import annotations

import numpy as np
import pytest

from suffice import ConflictError, Filter, InvalidInputError, InvalidItemError, InvalidQueryError, NewItem
from suffice._store import ItemRow, Store


def row(text: str, *, observed_ts: float | None = None, **kw) -> ItemRow:
    """One item as the store receives it: counted, one piece, time parsed."""
    new = NewItem(text=text, **kw)
    return ItemRow(new, str(new.observed_at), observed_ts, len(text.split()), [(0, len(text))], [text])


def vec(*xs: float) -> np.ndarray:
    v = np.asarray(xs, dtype=np.float32)
    return v / np.linalg.norm(v)


class StoreContract:
    """Every backend passes these."""

    # -- writes -------------------------------------------------------------------------------

    def test_items_get_consecutive_seqs_per_scope(self, store: Store):
        a = store.append("a", [row("one"), row("two")])
        b = store.append("b", [row("three")])
        c = store.append("a", [row("four")])
        assert [i.seq for i in a + c] == [0, 1, 2]
        assert b[0].seq == 0
        assert store.max_seq("a") == 2 and store.max_seq("nobody") == -1

    def test_there_is_no_call_that_changes_an_item(self, store: Store):
        assert not any(name.startswith(("update", "edit", "set_")) for name in dir(store))

    def test_a_bad_item_rejects_the_whole_batch(self, store: Store):
        with pytest.raises(InvalidItemError, match="item 1.*empty"):
            store.append("a", [row("fine"), row("   ")])
        assert store.stats().items == 0

    @pytest.mark.parametrize(("item", "message"), [
        (NewItem(text="x", meta="not a dict"), "meta must be a mapping"),  # type: ignore[arg-type]
        (NewItem(text="bad \ud800 surrogate"), "not valid unicode"),
        (NewItem(text="x", meta={"tool_call_id": "c\udc80"}), "meta is not valid unicode"),
        (NewItem(text="x", meta={"v": float("nan")}), "JSON"),
        (NewItem(text="nul \x00 inside"), "text contains a NUL"),
        (NewItem(text="x", speaker="A\x00"), "speaker contains a NUL"),
        (NewItem(text="x", session="s\x00"), "session contains a NUL"),
        (NewItem(text="x", id="a\x00b"), "id contains a NUL"),
        (NewItem(text="x", meta={"k": ["ok", {"deep": "a\x00"}]}), "meta contains a NUL"),
        (NewItem(text="x", meta={"k\x00": 1}), "meta contains a NUL"),
    ])
    def test_malformed_fields_are_invalid_items(self, store: Store, item, message):
        with pytest.raises(InvalidItemError, match=message):
            store.append("a", [ItemRow(item, "", None, 1, [(0, 1)], ["x"])])
        assert store.stats().items == 0

    def test_nul_is_refused_alike_by_every_backend_and_finds_nothing(self, store: Store):
        # A backslash and "u0000" in meta is text, not a NUL: it is stored as written.
        [it] = store.append("a", [row("x", id="k", meta={"code": 'printf("\\u0000")'})])
        assert store.get("a", "k").meta == {"code": 'printf("\\u0000")'} == it.meta
        assert store.get("a", "k\x00") is None
        assert store.forget("a", ids=["k\x00"]).items == 0
        assert store.check_ids("a", [NewItem("x", id="k\x00")]) == [None]
        with pytest.raises(InvalidQueryError, match="NUL"):
            store.find("a", Filter(session="s\x00"))
        for bad in (Filter(speaker="\ud83d"), Filter(meta={"k": "\ud83d"})):
            with pytest.raises(InvalidQueryError, match="lone surrogate"):
                store.find("a", bad)

    def test_client_ids_make_adds_idempotent(self, store: Store):
        first = store.append("a", [row("x", id="k1"), row("y", id="k2")])
        again = store.append("a", [row("x", id="k1"), row("y", id="k2"), row("z", id="k3")])
        assert [i.seq for i in again] == [0, 1, 2]
        assert again[:2] == first
        assert store.stats().items == 3
        assert store.check_ids("a", [NewItem("x", id="k1"), NewItem("new", id="k9"), NewItem("no id")]) == [
            first[0], None, None]  # the stored item itself: a re-sent batch needs no second read

    def test_same_id_with_other_content_is_a_conflict_and_writes_nothing(self, store: Store):
        store.append("a", [row("x", id="k1")])
        with pytest.raises(ConflictError, match="k1"):
            store.append("a", [row("new", id="k9"), row("changed", id="k1")])
        assert [i.text for i in store.items("a")] == ["x"]
        with pytest.raises(ConflictError):
            store.check_ids("a", [NewItem("changed", id="k1")])

    @pytest.mark.parametrize("change", [
        {"observed_at": "2024-01-02"}, {"meta": {"n": 2}}, {"speaker": "other"}, {"agent": "bot"},
        {"session": "s2"}, {"kind": "observation"}, {"role": "user"},
    ])
    def test_idempotency_compares_every_field(self, store: Store, change):
        base = {"id": "k", "observed_at": "2024-01-01", "meta": {"n": 1}}
        store.append("a", [row("x", **base)])
        with pytest.raises(ConflictError):
            store.append("a", [row("x", **{**base, **change})])

    def test_client_ids_are_per_scope(self, store: Store):
        store.append("tenant-a", [row("a's turn", id="turn-1")])
        store.append("tenant-b", [row("b's turn", id="turn-1")])
        assert store.get("tenant-b", "turn-1").text == "b's turn"
        assert store.get("tenant-a", "turn-1").text == "a's turn"
        assert store.get("tenant-c", "turn-1") is None

    def test_every_field_comes_back_as_written(self, store: Store):
        [it] = store.append("a", [row("hello there", id="h", session="s1", speaker="Ana", role="user",
                                      kind="message", observed_at="8 May 2023", meta={"k": [1, "x"]},
                                      agent="bot", observed_ts=1683504000.0)])
        got = store.get("a", "h")
        assert got == it
        assert (got.session, got.speaker, got.role, got.kind, got.observed_at, got.meta, got.agent,
                got.observed_ts, got.tokens) == ("s1", "Ana", "user", "message", "8 May 2023",
                                                  {"k": [1, "x"]}, "bot", 1683504000.0, 2)

    # -- scopes and reads -------------------------------------------------------------------------

    def test_scopes_are_hard_partitions(self, store: Store):
        store.append("alice", [row("alice secret plan", session="s")])
        store.append("bob", [row("bob plan", session="s")])
        assert [s for s, _, _ in store.bm25("bob", ["secret", "plan"], 10)] == [0]
        assert all(i.scope == "bob" for i in store.items("bob"))
        assert [i.text for i in store.find("bob", Filter(session="s"))] == ["bob plan"]
        assert store.filter_seqs("bob", Filter(session="s")).tolist() == [0]
        assert store.scopes() == ["alice", "bob"]
        assert store.has_scope("alice") and not store.has_scope("carol")

    def test_items_by_range_and_by_seqs(self, store: Store):
        store.append("a", [row(f"t{i}") for i in range(6)])
        assert [i.seq for i in store.items("a", start=2, end=4)] == [2, 3]
        assert [i.seq for i in store.items("a", [5, 1, 1])] == [1, 5]
        assert store.items("a", []) == []
        assert store.layout("a", after_seq=3) == [(4, "", 1), (5, "", 1)]

    def test_find_filters_and_pages(self, store: Store):
        store.append("a", [
            row("one", session="s1", speaker="Ana", kind="message", observed_ts=100.0,
                meta={"topic": "cats"}),
            row("two", session="s1", speaker="Bo", kind="tool_call", observed_ts=200.0, meta={"n": 2}),
            row("three", session="s2", speaker="Ana", role="user", observed_ts=300.0, meta={"flag": True}),
            row("four", session="s2", speaker="Ana", agent="bot", meta={"none": None, "obj": {"a": 1}}),
        ])
        texts = lambda flt, **kw: [i.text for i in store.find("a", flt, **kw)]  # noqa: E731
        assert texts(None) == ["one", "two", "three", "four"]
        assert texts(Filter(session="s2")) == ["three", "four"]
        assert texts(Filter(speaker="Ana", session="s1")) == ["one"]
        assert texts(Filter(kind="tool_call")) == ["two"]
        assert texts(Filter(role="user")) == ["three"]
        assert texts(Filter(agent="bot")) == ["four"]
        assert texts(Filter(since=150.0)) == ["two", "three"]  # an item with no time is outside any range
        assert texts(Filter(since=100.0, until=300.0)) == ["one", "two"]
        assert texts(Filter(meta={"topic": "cats"})) == ["one"]
        assert texts(Filter(meta={"n": 2})) == ["two"]
        assert texts(Filter(meta={"flag": True})) == ["three"]
        assert texts(Filter(meta={"none": None})) == ["four"]
        assert texts(Filter(meta={"obj": {"a": 1}})) == ["four"]
        assert texts(Filter(meta={"obj": {"a": 1.0}})) == []  # inside a container, JSON text decides
        assert texts(Filter(meta={"n": 2.0})) == ["two"]      # a number alone is compared by value
        assert texts(Filter(meta={"topic": "dogs"})) == []
        assert texts(None, offset=1, limit=2) == ["two", "three"]
        assert texts(None, newest_first=True, limit=2) == ["four", "three"]
        assert texts(Filter(before_seq=2)) == ["one", "two"]
        for flt in (Filter(session="s2"), Filter(since=150.0), Filter(meta={"n": 2})):
            assert store.filter_seqs("a", flt).tolist() == [i.seq for i in store.find("a", flt)]
            assert all(flt.matches(i) for i in store.find("a", flt))

    @pytest.mark.parametrize("flt", [
        Filter(since=5.0, until=5.0), Filter(session=3), Filter(since=float("inf")),  # type: ignore[arg-type]
        Filter(meta={"k": object()}), Filter(meta={1: "x"}),  # type: ignore[dict-item]
    ])
    def test_a_filter_no_store_can_apply_is_refused(self, store: Store, flt):
        store.append("a", [row("x")])
        with pytest.raises(InvalidQueryError):
            store.find("a", flt)

    def test_bm25_ranks_pieces_and_honours_a_filter(self, store: Store):
        store.append("a", [row("the red fox", session="s1"), row("a red red red car", session="s2"),
                           row("blue sky", session="s1")])
        ranked = store.bm25("a", ["red"], 10)
        assert [s for s, _, _ in ranked] == [1, 0]
        assert ranked[0][2] > ranked[1][2] > 0
        assert [s for s, _, _ in store.bm25("a", ["red"], 10, Filter(session="s1"))] == [0]
        assert [s for s, _, _ in store.bm25("a", ["red"], 10, Filter(before_seq=1))] == [0]
        assert store.bm25("a", [], 10) == []
        assert store.bm25("a", ['quote"d', "OR", "NEAR("], 10) == []  # query syntax is never parsed

    def test_pieces_are_rebuilt_without_touching_items(self, store: Store):
        store.append("a", [row("alpha beta")])
        store.rebuild_pieces("a", [(0, [(0, 5), (6, 10)], ["alpha", "beta"])])
        assert store.pieces("a", [0]) == {0: [(0, 0, 5), (1, 6, 10)]}
        assert [(s, p) for s, p, _ in store.bm25("a", ["beta"], 5)] == [(0, 1)]
        assert store.items("a")[0].text == "alpha beta"

    # -- vectors, records, links --------------------------------------------------------------------

    def test_vectors_by_encoder(self, store: Store):
        store.append("a", [ItemRow(NewItem("x"), "", None, 1, [(0, 1)], ["x"], vec(1, 0)),
                           row("y")], encoder="enc")
        assert store.missing_embeddings("a", "enc") == [1]
        store.put_embeddings("a", "enc", [1], np.stack([vec(0, 1)]))
        seqs, mat = store.embeddings("a", "enc")
        assert seqs.tolist() == [0, 1] and mat.shape == (2, 2)
        assert store.embeddings("a", "enc", after_seq=0)[0].tolist() == [1]
        assert store.stats("a").embedded == 2
        store.drop_embeddings()
        assert store.stats().embedded == 0 and store.missing_embeddings("a", "enc") == [0, 1]

    def test_piece_bodies_come_back_as_indexed(self, store: Store):
        store.append("a", [ItemRow(NewItem("alpha beta"), "", None, 2, [(0, 5), (6, 10)],
                                   ["Ana 2024 alpha", "Ana 2024 beta"]), row("gamma")])
        assert store.piece_bodies("a", [1, 0, 7]) == {0: ["Ana 2024 alpha", "Ana 2024 beta"], 1: ["gamma"]}
        assert store.piece_bodies("other", [0]) == {}

    def test_encoders_and_vector_ranges(self, store: Store):
        store.append("a", [ItemRow(NewItem(f"t{i}"), "", None, 1, [(0, 2)], [f"t{i}"], vec(1, i))
                           for i in range(4)], encoder="enc-b")
        store.put_embeddings("a", "enc-a", [2], np.stack([vec(0, 1)]))
        store.append("b", [row("x")])
        assert store.encoders("a") == ["enc-a", "enc-b"] and store.encoders("b") == []
        seqs, mat = store.embeddings("a", "enc-b", after_seq=0, before_seq=3)
        assert seqs.tolist() == [1, 2] and np.allclose(mat[1], vec(1, 2))
        assert store.embeddings("a", "enc-b", before_seq=0)[0].tolist() == []

    def test_audit_lines_are_restored_as_given(self, store: Store):
        from suffice._types import AuditEntry
        entries = [AuditEntry(1700000000.125, "forget items", "ab" * 32, ("cd" * 32, "ef" * 32),
                              {"items": 2, "pieces": 2, "vectors": 0, "records": 1, "links": 0}),
                   AuditEntry(1700000001.5, "forget scope", "12" * 32, (), {"items": 0})]
        store.put_audit(entries)
        assert store.audit() == entries
        store.append("a", [row("x", id="k")])
        store.forget("a", ids=["k"])
        assert store.audit()[:2] == entries and len(store.audit()) == 3

    def test_records_are_written_once_with_their_links(self, store: Store):
        store.append("a", [row(f"t{i}") for i in range(4)])
        assert store.put_record("a", 0, 0, 1, "first", "rule")
        assert store.put_record("a", 1, 2, 3, "second", "rule", [(0, "content", 0.5)])
        assert not store.put_record("a", 1, 2, 3, "other", "llm")
        assert store.records("a") == [(0, 0, 1, "first", "rule"), (1, 2, 3, "second", "rule")]
        assert store.links("a") == [(1, 0, "content", 0.5)]
        store.drop_records("a")
        assert store.records("a") == [] and store.links("a") == []

    # -- configuration and bookkeeping ----------------------------------------------------------------

    def test_config_is_saved_and_read_back(self, store: Store):
        assert store.load_config() is None
        store.save_config({"unit_tokens": 1000, "encoder": "x"})
        assert store.load_config() == {"unit_tokens": 1000, "encoder": "x"}

    def test_a_transfer_mark_stays_until_cleared_or_its_scope_is_forgotten(self, store: Store):
        assert store.unfinished_transfers() == {}
        note = {"source": "b.jsonl", "items": 3, "started": "2026-12-04T12:00:00+00:00"}
        for scope in ("a", "zoë/日本", "a%_b"):
            store.note_transfer(scope, note)
        store.append("a", [row("x", id="k")])
        store.note_transfer("zoë/日本", {**note, "items": 9})  # a re-run marks it afresh
        assert store.unfinished_transfers() == {"a": note, "a%_b": note, "zoë/日本": {**note, "items": 9}}
        store.forget("a", ids=["k"])  # forgetting items leaves the scope partial: the mark stays
        assert "a" in store.unfinished_transfers()
        store.forget("a")
        store.note_transfer("a%_b", None)
        assert store.unfinished_transfers() == {"zoë/日本": {**note, "items": 9}}
        with pytest.raises(InvalidInputError, match="normal form"):
            store.note_transfer(" a", note)

    def test_forget_and_rebuild_raise_the_generation(self, store: Store):
        g0 = store.generation()
        store.append("a", [row("x", id="k")])
        assert store.generation() == g0  # appends do not invalidate anything
        store.forget("a", ids=["k"])
        g1 = store.generation()
        assert g1 > g0
        store.drop_records("a")
        assert store.generation() > g1

    def test_stats_count_items_scopes_sessions_tokens(self, store: Store):
        store.append("a", [row("one two", session="s1"), row("three", session="s2")])
        store.append("b", [row("four", session="s1")])
        s = store.stats()
        assert (s.items, s.scopes, s.sessions, s.tokens) == (3, 2, 3, 4)
        assert store.stats("a").items == 2

    # -- forget ---------------------------------------------------------------------------------------

    def test_forget_by_id_removes_every_trace_and_closes_the_gap(self, store: Store):
        store.append("a", [ItemRow(NewItem(f"turn {w}", id=f"k{i}"), "", None, 2, [(0, 6)], [f"turn {w}"],
                                   vec(1, i)) for i, w in enumerate(["alpha", "bravo", "charlie", "delta"])],
                     encoder="enc")
        store.append("other", [row("turn bravo", id="k1")])
        store.put_record("a", 0, 0, 1, "alpha and bravo", "rule")
        store.put_record("a", 1, 2, 3, "charlie and delta", "rule", [(0, "content", 0.9)])
        report = store.forget("a", ids=["k1", "missing"])
        assert (report.items, report.pieces, report.vectors, report.records, report.links) == (1, 1, 1, 2, 1)
        assert [(i.seq, i.id) for i in store.items("a")] == [(0, "k0"), (1, "k2"), (2, "k3")]
        assert store.get("a", "k1") is None
        assert store.bm25("a", ["bravo"], 10) == []
        assert [s for s, _, _ in store.bm25("a", ["delta"], 10)] == [2]  # pieces moved with their item
        seqs, mat = store.embeddings("a", "enc")
        assert seqs.tolist() == [0, 1, 2]
        assert np.allclose(mat[2], vec(1, 3))  # vectors moved with their item
        assert store.records("a") == [] and store.links("a") == []
        assert [i.text for i in store.items("other")] == ["turn bravo"]  # other scopes untouched
        [entry] = store.audit()
        assert entry.action == "forget items" and entry.counts["items"] == 1
        assert len(entry.ids_sha256) == 1 and "k1" not in repr(entry) and "bravo" not in repr(entry)

    def test_forget_a_session_or_a_whole_scope(self, store: Store):
        store.append("a", [row("s1 one", session="s1"), row("s2 one", session="s2"),
                           row("s1 two", session="s1")])
        assert store.forget("a", session="s1").items == 2
        assert [(i.seq, i.text) for i in store.items("a")] == [(0, "s2 one")]
        assert store.forget("a").items == 1
        assert not store.has_scope("a") and store.scopes() == []
        assert [e.action for e in store.audit()] == ["forget session", "forget scope"]

    def test_forgetting_nothing_changes_nothing(self, store: Store):
        store.append("a", [row("x", id="k")])
        g = store.generation()
        report = store.forget("a", ids=["unknown"])
        assert report.items == 0 and store.audit() == [] and store.generation() == g
        with pytest.raises(InvalidItemError):
            store.forget("a", ids=["k"], session="s")
        assert store.forget("nobody").items == 0

    def test_seqs_continue_after_a_forget(self, store: Store):
        store.append("a", [row("one", id="1"), row("two", id="2")])
        store.forget("a", ids=["2"])
        [it] = store.append("a", [row("three", id="3")])
        assert it.seq == 1
        [again] = store.append("a", [row("two", id="2")])  # a forgotten id may be written anew
        assert again.seq == 2

    def test_meta_filters_compare_json_values_by_type(self, store: Store):
        store.append("a", [
            row("list", meta={"tags": ["café"], "o": {"x": "é", "n": 1}}),
            row("string", meta={"tags": "[\"café\"]", "flag": 1}),
            row("bool", meta={"flag": True, 'k"q': 2}),
        ])
        texts = lambda flt: [i.text for i in store.find("a", flt)]  # noqa: E731
        assert texts(Filter(meta={"tags": ["café"]})) == ["list"]  # not the string that looks like it
        assert texts(Filter(meta={"o": {"n": 1, "x": "é"}})) == ["list"]  # key order does not matter
        assert texts(Filter(meta={"flag": True})) == ["bool"]  # true is not 1
        assert texts(Filter(meta={"flag": 1})) == ["string"]
        assert texts(Filter(meta={"flag": 1.0})) == ["string"]  # numbers compare by value
        assert texts(Filter(meta={'k"q': 2})) == ["bool"]  # any key, quotes included
        for flt in (Filter(meta={"tags": ["café"]}), Filter(meta={"flag": True}), Filter(meta={"flag": 1})):
            assert [i.text for i in store.find("a") if flt.matches(i)] == texts(flt)
        with pytest.raises(InvalidQueryError, match="64-bit"):
            store.find("a", Filter(meta={"n": 2**70}))

    def test_forget_rederives_the_unit_an_item_ended(self, store: Store):
        # Unit 0 = [a1] closed only because b1 began another session; with b1 gone, a2 joins it.
        store.append("a", [row("a1", session="a"), row("b1", session="b", id="b1"), row("a2", session="a")])
        store.put_record("a", 0, 0, 0, "a1 only", "rule")
        store.put_record("a", 1, 1, 1, "b1 only", "rule")
        report = store.forget("a", ids=["b1"])
        assert report.records == 2 and store.records("a") == []

    def test_forgetting_the_same_id_twice_counts_it_once(self, store: Store):
        store.append("a", [row("x", id="k"), row("y")])
        report = store.forget("a", ids=["k"] + [f"other{i}" for i in range(600)] + ["k"])
        assert report.items == 1 and len(store.audit()[0].ids_sha256) == 1

    def test_one_scope_cannot_move_another_scopes_scores(self, store: Store):
        store.append("a", [row("the river gauge broke"), row("a gauge for rain"), row("sunny day")])
        before = store.bm25("a", ["gauge", "river"], 10)
        # Another tenant floods the same words: a shared index would change "a"'s term
        # statistics, and so its scores (and let "a" detect the other tenant's words).
        store.append("b", [row(f"gauge river gauge {i}") for i in range(50)])
        assert store.bm25("a", ["gauge", "river"], 10) == before
