"""Our BM25 (SQLite FTS5, and the postings held in memory for large scopes) gives the same
scores as rank_bm25's Okapi BM25 on the same tokens."""

import pytest

from suffice._store import ItemRow, SQLiteStore
from suffice._types import NewItem

rank_bm25 = pytest.importorskip("rank_bm25")

# Words chosen so that the porter stemmer leaves them unchanged: both sides see the same tokens.
CORPUS = [
    "red cat sat on a mat",
    "blue dog ran in the park with a red ball",
    "green frog sat on a log in the pond",
    "red red red fox",
    "a cat and a dog met at the park",
    "old man sat by the sea",
    "the sea was calm and blue",
    "a frog can jump far",
    "big ship on the sea at dawn",
    "small cat on a big hat",
]
QUERIES = [["cat"], ["red", "fox"], ["sea", "ship"], ["frog", "log", "pond"], ["dog", "park", "ball"]]


@pytest.fixture(params=["fts5", "postings"])
def store(request, tmp_path):
    """The corpus in a store whose BM25 is FTS5's, or the in-memory postings' (built now)."""
    st = SQLiteStore(tmp_path / "p.db", lexical_index_items=None if request.param == "fts5" else 1)
    st.append("s", [ItemRow(NewItem(text=t), "", None, 1, [(0, len(t))], [t])
                    for t in CORPUS])
    if request.param == "postings":
        assert st.prepare_lexical("s")
    yield st
    st.close()


@pytest.mark.parametrize("query", QUERIES, ids=lambda q: "+".join(q))
def test_scores_match_rank_bm25(store, query):
    ours = {seq: score for seq, _, score in store.bm25("s", query, limit=100)}
    ref = rank_bm25.BM25Okapi([t.split() for t in CORPUS], k1=1.2, b=0.75).get_scores(query)
    expected = {i: s for i, s in enumerate(ref) if s > 0}
    assert set(ours) == set(expected)
    for seq, score in expected.items():
        assert ours[seq] == pytest.approx(score, rel=1e-6)


def test_ranking_order_matches(store):
    ref = rank_bm25.BM25Okapi([t.split() for t in CORPUS], k1=1.2, b=0.75).get_scores(["sea", "blue"])
    ours = [seq for seq, _, _ in store.bm25("s", ["sea", "blue"], limit=100)]
    assert ours == sorted((i for i, s in enumerate(ref) if s > 0), key=lambda i: -ref[i])
