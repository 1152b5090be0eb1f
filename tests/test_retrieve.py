"""The shared prefix finds the right turn, reports where it sits, and respects scopes."""

import numpy as np
import pytest

from suffice import ConflictError, InvalidQueryError, Memory, NewItem, RetrievalConfig, UnknownScopeError
from suffice._store import ItemRow


def test_prefix_finds_the_turn_that_answers(memory):
    ev = memory.search("What is the name of the cat Dana adopted?", scope="dana", k=5)
    assert any("Figo" in it.text for it in ev.items)
    top = ev.hits[0]
    assert top.source == "fused" and top.rank == 0 and top.item_id
    assert top.blocks and top.unit >= 0


def test_evidence_is_in_time_order_with_time_and_speaker(memory):
    ev = memory.search("Kyoto trip", scope="dana", k=6)
    seqs = [it.seq for it in ev.items]
    assert seqs == sorted(seqs)
    first = ev.text.splitlines()[0]
    assert first.startswith("[2025-") and "Dana:" in first or "Assistant:" in first


@pytest.mark.parametrize("method", ["bm25", "dense", "fused", "recency"])
def test_every_method_returns_k_hits(memory, method):
    ev = memory.search("rainfall model peak error", scope="dana", k=4, method=method)
    assert len(ev.hits) == 4
    assert {h.source for h in ev.hits} == {method}


def test_a_query_never_sees_another_scope(memory):
    memory.add("Dana's secret password is tangerine", scope="other")
    ev = memory.search("secret password", scope="dana", k=30)
    assert all(it.scope == "dana" for it in ev.items)
    assert not any("tangerine" in it.text for it in ev.items)


def test_unknown_scope_and_empty_query_are_clear_errors(memory):
    with pytest.raises(UnknownScopeError, match="nobody"):
        memory.search("anything", scope="nobody")
    with pytest.raises(InvalidQueryError, match="empty"):
        memory.search("  ", scope="dana")
    with pytest.raises(InvalidQueryError, match="k must not be negative"):
        memory.search("cat", scope="dana", k=-1)


class CountingEmbedder:
    def __init__(self, inner):
        self.inner, self.name, self.dim, self.texts = inner, inner.name, inner.dim, 0

    def embed(self, texts):
        self.texts += len(texts)
        return self.inner.embed(texts)

    def embed_query(self, text):
        return self.inner.embed_query(text)


def test_a_query_is_embedded_as_the_same_text_stored_would_be(embedder):
    # Queries go through a single-threaded session of their own; the vector must not change.
    texts = ["When did Caroline go to the LGBTQ support group?", "the ferry leaves at nine"]
    stored = embedder.embed(texts)
    for text, vec in zip(texts, stored, strict=True):
        assert np.allclose(embedder.embed_query(text), vec, atol=1e-6)


def test_embeddings_persist_and_are_computed_once_per_item(tmp_path, embedder):
    path = tmp_path / "m.db"
    counting = CountingEmbedder(embedder)
    mem = Memory(path, embedder=counting)
    counting.texts = 0  # a new store's encoder first embeds one probe text, no item
    mem.add(["first fact about gauges", "second fact about rain"], scope="s")
    mem.search("rain", scope="s")
    assert counting.texts == 2
    mem.close()
    again = CountingEmbedder(embedder)
    mem2 = Memory(path, embedder=again)
    mem2.search("rain", scope="s")
    assert again.texts == 0
    seqs, mat = mem2.store.embeddings("s", embedder.name)
    assert list(seqs) == [0, 1] and np.allclose(np.linalg.norm(mat, axis=1), 1, atol=1e-4)


def test_items_written_without_vectors_are_embedded_at_first_query(tmp_path, embedder):
    path = tmp_path / "m.db"
    Memory(path, embedder=None).add(["the ferry leaves at nine", "lunch was soup"], scope="s")
    counting = CountingEmbedder(embedder)
    mem = Memory(path, embedder=counting)
    ev = mem.search("when does the boat depart", scope="s", k=1, method="dense")
    assert "ferry" in ev.items[0].text
    assert counting.texts == 2


def test_new_items_are_searchable_right_after_add(memory):
    memory.search("anything at all", scope="dana")
    memory.add("Dana bought a red kayak on Saturday.", scope="dana")
    ev = memory.search("kayak", scope="dana", k=3)
    assert any("kayak" in it.text for it in ev.items)


def test_a_conflict_in_a_later_batch_writes_nothing(memory):
    before = memory.stats("dana").items
    memory.add([{"text": "one", "id": "c1"}], scope="dana")
    items = [{"text": f"new {i}"} for i in range(5)] + [{"text": "changed", "id": "c1"}]
    with pytest.raises(ConflictError):
        memory.add(items, scope="dana", batch_size=2)
    assert memory.stats("dana").items == before + 1


def test_re_adding_stored_items_does_not_embed_them_again(tmp_path, embedder):
    counting = CountingEmbedder(embedder)
    mem = Memory(tmp_path / "m.db", embedder=counting)
    counting.texts = 0  # a new store's encoder first embeds one probe text, no item
    mem.add([{"text": "a fact", "id": "f1"}, {"text": "another", "id": "f2"}], scope="s")
    mem.add([{"text": "a fact", "id": "f1"}, {"text": "another", "id": "f2"}], scope="s")
    assert counting.texts == 2 and mem.stats("s").items == 2


def test_a_search_never_returns_an_item_the_views_have_not_seen(memory):
    # Another writer commits between the sync and the BM25 read: the hit must not crash.
    store = memory.store
    original = store.bm25

    def racing_bm25(*args, **kwargs):
        store.append("dana", [ItemRow(NewItem(text="apples and pears"), "", None, 3, [(0, 16)],
                                      ["apples and pears"])])
        return original(*args, **kwargs)

    store.bm25 = racing_bm25
    ev = memory.search("apples pears", scope="dana", method="bm25")
    assert all(h.seq < 31 for h in ev.hits)


def test_vectors_grow_in_place_and_old_views_stay_intact():
    from suffice import StoreConfig
    from suffice._retrieve import ScopeIndex
    from suffice._views import ScopeViews
    views = ScopeViews(StoreConfig())
    views.extend([(i, "s", 10) for i in range(4)])
    idx = ScopeIndex(views)
    rows = np.eye(4, dtype=np.float32)
    idx.append_vectors(np.arange(2), rows[:2])
    before = idx.matrix
    buffer = idx.buffer
    idx.append_vectors(np.arange(2, 4), rows[2:])
    assert idx.buffer is buffer  # no copy while capacity lasts
    assert np.array_equal(idx.matrix, rows) and list(idx.seqs) == [0, 1, 2, 3]
    assert np.array_equal(before, rows[:2])
    # The unit vector is the normalised mean of its items' vectors.
    assert np.allclose(idx.unit_vectors(1)[0], np.full(4, 0.5))


def test_one_ranking_keeps_every_sources_scores(memory):
    r = memory.retriever.rank("dana", "grey cat shelter", memory.retrieval, depth=5, piece_depth=50)
    assert len(r.seqs) == 5 and list(r.scores) == sorted(r.scores, reverse=True)
    assert r.pieces and all(score > 0 for _, _, score in r.pieces)
    assert len(r.dense) >= 50 or len(r.dense) == memory.stats("dana").items
    assert r.qvec is not None and r.size == memory.stats("dana").items
    # Fused order is reciprocal-rank fusion of the BM25 item order and the cosine order.
    bm_rank = {q: i for i, q in enumerate(dict.fromkeys(q for q, _, _ in r.pieces))}
    dn_rank = {q: i for i, (q, _) in enumerate(r.dense)}
    fused = {q: sum(1 / (61 + rk[q]) for rk in (bm_rank, dn_rank) if q in rk) for q in bm_rank | dn_rank}
    assert list(r.seqs) == sorted(fused, key=lambda q: (-fused[q], -q))[:5]


def test_search_filters_by_session_speaker_time_and_meta(memory):
    every = memory.items(scope="dana")
    session = every[0].session
    ev = memory.search("trip", scope="dana", k=50, session=session)
    assert ev.hits and all(h.item.session == session for h in ev.hits)
    ev = memory.search("trip", scope="dana", k=50, speaker="Assistant")
    assert ev.hits and all(h.item.speaker == "Assistant" for h in ev.hits)
    dated = sorted(it.observed_ts for it in every if it.observed_ts is not None)
    cut = dated[len(dated) // 2]
    for method in ("bm25", "dense", "fused", "recency"):
        ev = memory.search("trip", scope="dana", k=50, since=cut, method=method)
        assert ev.hits and all(h.item.observed_ts >= cut for h in ev.hits), method
    memory.add("Dana renewed her passport", scope="dana", meta={"topic": "travel"})
    ev = memory.search("passport", scope="dana", meta={"topic": "travel"})
    assert [h.item.text for h in ev.hits] == ["Dana renewed her passport"]


def test_hits_carry_their_items_and_iterate_in_rank_order(memory):
    ev = memory.search("Figo", scope="dana", k=3)
    assert [h.rank for h in ev] == [0, 1, 2] and len(ev) == 3
    assert all(h.item_id == h.item.id and h.seq == h.item.seq for h in ev)
    assert memory.get(ev.hits[0].item_id, scope="dana") == ev.hits[0].item


def test_a_large_scope_scans_only_the_units_nearest_the_query(memory):
    narrow = RetrievalConfig(dense_scan_items=5)
    full = memory.retriever.rank("dana", "grey cat shelter", memory.retrieval, method="dense", depth=3)
    two_stage = memory.retriever.rank("dana", "grey cat shelter", narrow, method="dense", depth=3)
    assert two_stage.unit_cos is not None and full.unit_cos is None
    assert len(two_stage.dense) < len(full.dense)
    assert two_stage.seqs[0] == full.seqs[0]  # the best item lies in the best unit here


def test_dense_weight_moves_the_fused_order_between_bm25_and_dense(memory):
    query = "What is the name of my cat?"
    rank = memory.retriever.rank

    def order(method, **cfg):
        return list(rank("dana", query, RetrievalConfig(k=8, **cfg), method=method).seqs)

    bm25, dense = order("bm25"), order("dense")
    assert bm25 != dense  # otherwise the weight could not show
    assert order("fused", dense_weight=0.0)[:len(bm25)][:3] == bm25[:3]
    assert order("fused", dense_weight=100.0)[:3] == dense[:3]
    assert order("fused") == order("fused", dense_weight=1.0)
