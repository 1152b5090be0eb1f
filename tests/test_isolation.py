"""Scopes are hard partitions, checked where it matters: at the store, with random tenants.

Whatever another tenant writes or forgets, every read of a scope (items, ids, filters, BM25
ranking and scores, vectors, records) gives exactly what a store holding that scope alone gives.
"""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from store_contract import row

from suffice import Filter
from suffice._store import Store, open_store

WORDS = "river gauge flood cat kayak tea wedding October red blue".split()
text = st.lists(st.sampled_from(WORDS), min_size=1, max_size=8).map(" ".join)
op = st.one_of(
    st.tuples(st.just("add"), st.sampled_from(["a", "b", "c"]), st.lists(text, min_size=1, max_size=4),
              st.sampled_from(["s1", "s2"])),
    st.tuples(st.just("forget"), st.sampled_from(["b", "c"]), st.integers(0, 5),
              st.sampled_from(["s1", "s2"])),
)


def reads(st_: Store, scope: str) -> tuple[object, ...]:
    seqs, vecs = st_.embeddings(scope, "e")
    return (
        [(i.seq, i.id, i.text, i.session) for i in st_.items(scope)],
        st_.find(scope, Filter(session="s1")),
        [st_.bm25(scope, [w], 50) for w in WORDS],
        st_.filter_seqs(scope, Filter(session="s2")).tolist(),
        seqs.tolist(), vecs.tolist(),
        st_.records(scope), st_.max_seq(scope), st_.stats(scope).items if st_.has_scope(scope) else 0,
    )


@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(op, max_size=12))
def test_what_other_tenants_do_never_shows_in_a_scope(store_location, ops):
    shared = open_store(store_location("shared"))
    alone = open_store(store_location("alone"))
    try:
        _replay(shared, alone, ops)
    finally:
        shared.close()
        alone.close()


def _replay(shared: Store, alone: Store, ops: list) -> None:
    n = 0
    for kind, scope, arg, session in ops:
        if kind == "add":
            rows = []
            for t in arg:
                n += 1
                r = row(f"{t} {n}", id=f"{scope}-{n}", session=session)
                rows.append(type(r)(r.item, r.observed_at, r.observed_ts, r.tokens, r.pieces, r.piece_bodies,
                                    np.ones(4, np.float32) * (n % 7 + 1)))
            shared.append(scope, rows, encoder="e")
            if scope == "a":
                alone.append(scope, rows, encoder="e")
        else:
            ids = [i.id for i in shared.items(scope)][:arg]
            shared.forget(scope, ids=ids) if ids else shared.forget(scope, session=session)
        shared.put_record("a", 0, 0, 0, "a's first record", "rule") if shared.has_scope("a") else None
        alone.put_record("a", 0, 0, 0, "a's first record", "rule") if alone.has_scope("a") else None
        assert reads(shared, "a") == reads(alone, "a")
    assert shared.check() == [] and alone.check() == []


def test_a_forget_in_one_scope_does_not_fail_a_read_in_flight_in_another(tmp_path):
    """Every forget anywhere failed other tenants' reads in flight ("a forget changed the store
    while this query read it"), and told them that someone had deleted something."""
    import pytest

    from suffice import Memory, StoreError

    with Memory(tmp_path / "m.db", embedder=None) as mem:
        mem.add(["Ana moved to Lisbon.", "Ana adopted a cat."], user_id="ana")
        mem.add(["Bob lives in Porto."], user_id="bob")
        retriever = mem._retriever
        idx = retriever.index("user:ana")  # Ana's read has numbered her items
        mem.forget(user_id="bob", everything=True)
        retriever.check_unchanged(idx)  # Bob's forget renumbers nothing of Ana's
        mem.forget(user_id="ana", ids=[mem.items(user_id="ana")[0].id])
        with pytest.raises(StoreError, match="run the query again"):
            retriever.check_unchanged(idx)  # her own scope's did
        idx = retriever.index("user:ana")
        mem.store.rebuild_pieces("user:ana", [])  # a rebuild of her pieces counts too
        with pytest.raises(StoreError, match="run the query again"):
            retriever.check_unchanged(idx)


def test_forgets_in_another_scope_during_every_read_do_not_fail_a_tenants_query(tmp_path):
    """The index sync retried on any forget anywhere and gave up after five."""
    from suffice import Memory

    with Memory(tmp_path / "m.db", embedder=None) as mem:
        mem.add(["Ana moved to Lisbon."], user_id="ana")
        mem.add([f"Bob note {i}" for i in range(20)], user_id="bob")
        real = mem.store.layout
        bob = [it.id for it in mem.items(user_id="bob")]

        def layout_while_bob_forgets(scope, **kw):  # type: ignore[no-untyped-def]
            if scope == "user:ana" and bob:
                mem.store.forget("user:bob", ids=[bob.pop()])  # the store's own, no cache reset
            return real(scope, **kw)

        mem.store.layout = layout_while_bob_forgets  # type: ignore[method-assign]
        assert mem.search("Lisbon", user_id="ana").hits
