"""The HNSW index behind the dense ranker: it agrees with the exact scan, follows the log
(appends, forgets), keeps filters exact, persists beside the store only while valid, and a
store with its own nearest-neighbour search is asked instead."""

from __future__ import annotations

import hashlib
import logging
import re
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from suffice import Memory, NewItem, RetrievalConfig, _ann, _retrieve
from suffice._retrieve import NearestStore, Retriever
from suffice._types import Filter

pytest.importorskip("faiss")

TOPICS = 40
DIM = 48
EXACT = RetrievalConfig(dense_index_items=1_000_000_000)
SHIPPED_COST_RATIO = _retrieve.ANN_COST_RATIO
"""A threshold no test scope reaches: every vector scored."""


class TopicEmbedder:
    """Clustered vectors like sentence embeddings: a text "t<k> ..." lies near topic k's
    centre, with noise fixed by the text, so neighbours are real but not trivial."""

    name = "topic-48"
    dim = DIM

    def __init__(self) -> None:
        self.centres = np.random.default_rng(3).normal(size=(TOPICS, DIM)).astype(np.float32)

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        out = np.zeros((len(texts), DIM), dtype=np.float32)
        for i, text in enumerate(texts):
            words = text.split()
            topic = int(words[0][1:]) if words and words[0][:1] == "t" and words[0][1:].isdigit() else 0
            seed = int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")
            out[i] = self.centres[topic % TOPICS] + 0.9 * np.random.default_rng(seed).normal(size=DIM)
        out /= np.linalg.norm(out, axis=1, keepdims=True)
        return out

    def embed_query(self, text: str) -> np.ndarray:
        vec: np.ndarray = self.embed([text])[0]
        return vec


@pytest.fixture(autouse=True)
def small_scopes_use_the_index(monkeypatch: pytest.MonkeyPatch) -> None:
    """At a few thousand rows the exact scan is cheaper than any search of width 100 (the
    cost rule picks it); the tests want the index to answer, so the rule is relaxed here and
    tested on its own below."""
    monkeypatch.setattr(_retrieve, "ANN_COST_RATIO", 1)


def items(n: int, start: int = 0) -> list[NewItem]:
    """Topic ``i % 40``; session s0 or s1 by blocks of 40 (half of every topic in each); meta
    ``m`` = ``i % 5``."""
    return [NewItem(text=f"t{i % TOPICS} note {i} about thing {i * 7 % 101}", id=f"i{i}",
                    session=f"s{i // TOPICS % 2}", meta={"m": i % 5}) for i in range(start, start + n)]


def queries(n: int) -> list[str]:
    return [f"t{q % TOPICS} question {q}" for q in range(n)]


def dense(mem: Memory, q: str, config: RetrievalConfig, depth: int = 10,
          flt: Filter | None = None) -> list[tuple[int, float]]:
    return list(mem.retriever.rank("s", q, config, method="dense", depth=depth, flt=flt).dense[:depth])


def exact_top(mem: Memory, q: str, depth: int, keep: np.ndarray | None = None) -> list[tuple[int, float]]:
    """The exact answer computed here from the stored vectors: cosine, ties to the newer item."""
    seqs, mat = mem.store.embeddings("s", "topic-48")
    sims = mat @ TopicEmbedder().embed_query(q)
    order = sorted((i for i in range(len(seqs)) if keep is None or keep[i]),
                   key=lambda i: (-float(sims[i]), -int(seqs[i])))[:depth]
    return [(int(seqs[i]), float(sims[i])) for i in order]


def recall(got: list[tuple[int, float]], want: list[tuple[int, float]]) -> float:
    return len({s for s, _ in got} & {s for s, _ in want}) / max(1, len(want))


@pytest.fixture(scope="module")
def big(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Memory]:
    """3,000 items, queried with the index from 1,000 vectors up."""
    mem = Memory(tmp_path_factory.mktemp("ann") / "big.db", embedder=TopicEmbedder(), router=None)
    for b in range(0, 3000, 1000):
        mem.add(items(1000, b), scope="s")
    yield mem
    mem.close()


ANN = RetrievalConfig(dense_index_items=1000)


def test_above_the_threshold_the_index_agrees_with_the_exact_scan(big: Memory) -> None:
    got = [dense(big, q, ANN) for q in queries(40)]
    index = big.retriever.index("s").ann
    assert index is not None and index.count == 3000  # the index answered
    want = [exact_top(big, q, 10) for q in queries(40)]
    assert np.mean([recall(g, w) for g, w in zip(got, want, strict=True)]) >= 0.95
    # Candidates are rescored exactly: a shared item has the exact scan's cosine.
    exact = dict(want[0])
    assert all(c == pytest.approx(exact[s], abs=1e-6) for s, c in got[0] if s in exact)
    assert all(a[1] >= b[1] for g in got for a, b in zip(g, g[1:], strict=False))  # best first


def test_below_the_threshold_results_are_the_exact_scan(big: Memory) -> None:
    below = RetrievalConfig(dense_index_items=3001)  # one more than the scope holds
    for q in queries(5):
        got = dense(big, q, below, depth=20)
        assert got == dense(big, q, EXACT, depth=20)
        assert [s for s, _ in got] == [s for s, _ in exact_top(big, q, 20)]


def test_exact_ties_go_to_the_newer_item_below_the_threshold(tmp_path: Path) -> None:
    mem = Memory(tmp_path / "t.db", embedder=TopicEmbedder(), router=None)
    mem.add([NewItem(text="t1 same words", id=f"d{i}") for i in range(3)], scope="s")
    got = dense(mem, "t1 same words", RetrievalConfig(), depth=3)
    assert [s for s, _ in got] == [2, 1, 0]
    mem.close()


def test_repeated_texts_share_a_node_and_every_copy_is_returned(tmp_path: Path) -> None:
    mem = Memory(tmp_path / "d.db", embedder=TopicEmbedder(), router=None)
    mem.add(items(900), scope="s")
    mem.add([NewItem(text=it.text, session="again") for it in items(300)], scope="s")  # repeats
    cfg = RetrievalConfig(dense_index_items=500)
    q = "t3 note 3 about thing 21"  # item i3's text, stored twice (seqs 3 and 903)
    got = dense(mem, q, cfg, depth=5)
    assert [s for s, _ in got[:2]] == [903, 3]  # both copies, the newer first
    index = mem.retriever.index("s").ann
    assert index is not None and index.count == 1200 and index._index.ntotal == 900
    for query in queries(20):
        assert recall(dense(mem, query, cfg), exact_top(mem, query, 10)) >= 0.9
    # A filter that keeps only the second copy gets it from the shared node.
    only = dense(mem, q, RetrievalConfig(dense_index_items=200), depth=3, flt=Filter(session="again"))
    assert only[0][0] == 903 and all(mem.items(scope="s")[s].session == "again" for s, _ in only)
    mem.close()


def test_the_same_store_state_gives_the_same_results_however_the_items_arrived(tmp_path: Path) -> None:
    one = Memory(tmp_path / "one.db", embedder=TopicEmbedder(), router=None)
    one.add(items(1500), scope="s")
    two = Memory(tmp_path / "two.db", embedder=TopicEmbedder(), router=None)
    cfg = RetrievalConfig(dense_index_items=500)
    for b in range(0, 1500, 300):  # queried between batches: the index grows five times
        two.add(items(300, b), scope="s")
        dense(two, "t3 warm", cfg)
    for q in queries(15):
        assert dense(one, q, cfg, depth=30) == dense(two, q, cfg, depth=30)
    one.close()
    two.close()


def test_the_index_follows_appends(tmp_path: Path) -> None:
    mem = Memory(tmp_path / "a.db", embedder=TopicEmbedder(), router=None)
    mem.add(items(1200), scope="s")
    cfg = RetrievalConfig(dense_index_items=500)
    dense(mem, "t5 first", cfg)
    first = mem.retriever.index("s").ann
    assert first is not None and first.count == 1200
    new = mem.add([NewItem(text=f"t7 fresh {i}", id=f"n{i}") for i in range(5)], scope="s")
    got = dense(mem, "t7 fresh 2", cfg, depth=10)
    assert mem.retriever.index("s").ann is first and first.count == 1205  # extended, not rebuilt
    assert new[2].seq == got[0][0]  # the item just added is found by the index
    assert recall(got, exact_top(mem, "t7 fresh 2", 10)) >= 0.9
    mem.close()


def test_a_forget_rebuilds_the_index_and_the_forgotten_items_never_appear(tmp_path: Path) -> None:
    mem = Memory(tmp_path / "f.db", embedder=TopicEmbedder(), router=None)
    mem.add(items(1200), scope="s")
    cfg = RetrievalConfig(dense_index_items=500)
    q = "t9 note 9 about thing 63"  # item i9's own text
    before = mem.retriever.rank("s", q, cfg, method="dense", depth=10)
    assert mem.items(scope="s")[before.seqs[0]].id == "i9"
    old = mem.retriever.index("s").ann
    gone = {f"i{i}" for i in range(9, 1200, 40)}  # every item of topic 9
    mem.forget(scope="s", ids=sorted(gone))
    ev = mem.search(q, scope="s", k=10, method="dense", retrieval=cfg)
    assert not {h.item.id for h in ev.hits} & gone
    now = mem.retriever.index("s").ann
    assert now is not None and now is not old and now.count == 1200 - len(gone)
    # Another process forgets: this one sees the generation move and starts over as well.
    other = Memory(tmp_path / "f.db", embedder=TopicEmbedder(), router=None)
    other.forget(scope="s", ids=["i10"])
    other.close()
    assert "i10" not in {h.item.id for h in mem.search("t10 note 10 about thing 70", scope="s", k=10,
                                                        method="dense", retrieval=cfg).hits}
    mem.close()


def test_a_broad_filter_is_searched_in_the_index_and_stays_correct(big: Memory,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    flt = Filter(session="s0")  # half of the scope: 1,500 items, above the threshold
    cfg = ANN
    keep = np.array([it.session == "s0" for it in big.items(scope="s")])
    answered: list[bool] = []
    real = Retriever._from_index

    def from_index(self: Retriever, *args: Any) -> np.ndarray | None:
        rows = real(self, *args)
        answered.append(rows is not None)
        return rows
    monkeypatch.setattr(Retriever, "_from_index", from_index)
    got = [dense(big, q, cfg, flt=flt) for q in queries(20)]
    assert sum(answered) >= 18  # the index answered (the scan only where too few passed)
    assert all(keep[s] for g in got for s, _ in g)
    want = [exact_top(big, q, 10, keep) for q in queries(20)]
    assert np.mean([recall(g, w) for g, w in zip(got, want, strict=True)]) >= 0.95
    assert all(len(g) == 10 for g in got)


def test_a_narrow_filter_is_scanned_exactly(big: Memory) -> None:
    flt = Filter(meta={"m": 1})
    keep = np.array([it.meta["m"] == 1 for it in big.items(scope="s")])
    # 600 allowed rows < 1,000: below the threshold the allowed rows are scored one by one.
    for q in queries(5):
        assert [s for s, _ in dense(big, q, ANN, depth=15, flt=flt)] == \
            [s for s, _ in exact_top(big, q, 15, keep)]


def test_when_too_few_candidates_pass_the_filter_the_exact_scan_answers(tmp_path: Path) -> None:
    # Session "far" holds only topic-0 items; the query leans to topic 5. The index's
    # candidates are topic-5 items, none in "far": the answer must still be far's best items.
    mem = Memory(tmp_path / "w.db", embedder=TopicEmbedder(), router=None)
    mem.add([NewItem(text=f"t5 near {i}", session="near") for i in range(900)], scope="s")
    mem.add([NewItem(text=f"t0 far {i}", session="far") for i in range(900)], scope="s")
    keep = np.array([it.session == "far" for it in mem.items(scope="s")])
    cfg = RetrievalConfig(dense_index_items=500)
    got = dense(mem, "t5 near 3", cfg, depth=10, flt=Filter(session="far"))
    want = exact_top(mem, "t5 near 3", 10, keep)
    assert [s for s, _ in got] == [s for s, _ in want]
    assert [c for _, c in got] == pytest.approx([c for _, c in want], abs=1e-6)
    mem.close()


def test_a_search_wider_than_the_scan_it_replaces_is_left_to_the_scan(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_retrieve, "ANN_COST_RATIO", SHIPPED_COST_RATIO)  # 30 x width 128 > 3,000 rows
    mem = Memory(tmp_path / "c.db", embedder=TopicEmbedder(), router=None)
    mem.add(items(3000), scope="s")
    for q in queries(3):
        assert dense(mem, q, ANN) == dense(mem, q, EXACT)
    assert mem.retriever.index("s").ann is None  # never built
    mem.close()


def test_a_before_seq_bound_never_returns_a_later_item(big: Memory) -> None:
    got = dense(big, "t4 question", ANN, depth=10, flt=Filter(before_seq=2000))
    assert len(got) == 10 and all(s < 2000 for s, _ in got)


def test_the_index_is_saved_beside_the_store_and_used_only_while_it_matches(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Retriever, "persist_min_rows", 500)
    db = tmp_path / "p.db"
    mem = Memory(db, embedder=TopicEmbedder(), router=None)
    mem.add(items(1200), scope="s")
    cfg = RetrievalConfig(dense_index_items=500)
    want = [dense(mem, q, cfg) for q in queries(5)]
    files = sorted(p.name for p in (tmp_path / "p.db.ann").iterdir())
    assert len(files) == 3 and all(re.fullmatch(r"[0-9a-f]{24}\.(hnsw|json|rows\.npz)", f) for f in files)
    mem.close()

    again = Memory(db, embedder=TopicEmbedder(), router=None)
    added: list[int] = []
    real_extend = _ann.DenseIndex.extend

    def extend(self: _ann.DenseIndex, matrix: np.ndarray) -> int:
        added.append(real_extend(self, matrix))
        return added[-1]
    monkeypatch.setattr(_ann.DenseIndex, "extend", extend)
    assert [dense(again, q, cfg) for q in queries(5)] == want
    assert added == [0] * 5  # loaded whole: nothing was inserted again

    # Vectors that differ from the saved ones (another store at the same path) are not trusted.
    header = db.with_name("p.db.ann")
    meta = next(header.glob("*.json"))
    meta.write_text(meta.read_text().replace('"digest": "', '"digest": "0'))
    third = Memory(db, embedder=TopicEmbedder(), router=None)
    added.clear()
    assert [dense(third, q, cfg) for q in queries(5)] == want
    assert added == [1200] + [0] * 4  # rebuilt from the store's vectors
    third.close()

    # A forget deletes the saved copy: it holds the forgotten items' vectors.
    again.forget(scope="s", ids=["i3"])
    assert not any(header.iterdir())
    again.close()


def test_without_faiss_the_scan_answers_and_one_warning_says_why(
        big: Memory, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(_ann, "_available", None)
    monkeypatch.setitem(sys.modules, "faiss", None)  # import fails
    fresh = Retriever(big.store, big.embedder, big.retriever.config, persist_index=False)
    with caplog.at_level(logging.WARNING, logger="suffice"):
        got = [list(fresh.rank("s", q, ANN, method="dense", depth=10).dense[:10]) for q in queries(3)]
    assert got == [dense(big, q, EXACT) for q in queries(3)]
    assert fresh.index("s").ann is None
    assert sum("faiss is not installed" in r.message for r in caplog.records) == 1
    fresh.close()


class NearestWrapper:
    """A store that answers dense queries itself, as a pgvector backend does; everything
    else goes to the wrapped store. The exact search is done here so the answer is known."""

    def __init__(self, store: Any) -> None:
        self._store = store
        self.calls: list[tuple[str, str, int, Filter | None]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def nearest(self, scope: str, encoder: str, qvec: np.ndarray, limit: int,
                flt: Filter | None = None) -> list[tuple[int, float]]:
        self.calls.append((scope, encoder, limit, flt))
        seqs, mat = self._store.embeddings(scope, encoder)
        sims = mat @ qvec
        bound = flt.before_seq if flt is not None and flt.before_seq is not None else len(seqs)
        ok = [i for i in range(len(seqs)) if seqs[i] < bound]
        best = sorted(ok, key=lambda i: -float(sims[i]))[:limit]
        return [(int(seqs[i]), float(sims[i])) for i in reversed(best)]  # deliberately worst first


def test_a_store_with_its_own_nearest_search_is_asked_instead_of_the_scan(
        big: Memory, monkeypatch: pytest.MonkeyPatch) -> None:
    wrapper = NearestWrapper(big.store)
    assert isinstance(wrapper, NearestStore)
    retriever = Retriever(wrapper, big.embedder, big.retriever.config)
    monkeypatch.setattr(_ann.DenseIndex, "search", lambda *a: pytest.fail("the index was asked"))
    q = "t2 question 2"
    mine = retriever.rank("s", q, ANN, method="fused", depth=10)
    ref = big.retriever.rank("s", q, EXACT, method="fused", depth=10)
    assert wrapper.calls and wrapper.calls[0][:3] == ("s", "topic-48", 100)
    assert wrapper.calls[0][3] is not None and wrapper.calls[0][3].before_seq == 3000
    # The store's answer, put best first, is the dense ranking; the rest is the same prefix.
    assert [s for s, _ in mine.dense] == [s for s, _ in ref.dense]
    assert mine.seqs == ref.seqs and mine.pieces == ref.pieces and mine.unit_cos is None
    assert retriever.index("s").ann is None
    retriever.close()
