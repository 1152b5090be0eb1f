"""Our BM25 (SQLite FTS5) gives the same scores as rank_bm25's Okapi BM25 on the same tokens."""

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


@pytest.mark.parametrize("query", QUERIES, ids=lambda q: "+".join(q))
def test_scores_match_rank_bm25(tmp_path, query):
    st = SQLiteStore(tmp_path / "p.db")
    st.append("s", [ItemRow(NewItem(text=t), "", None, 1, [(0, len(t))], [t])
                    for t in CORPUS])
    ours = {seq: score for seq, _, score in st.bm25("s", query, limit=100)}
    ref = rank_bm25.BM25Okapi([t.split() for t in CORPUS], k1=1.2, b=0.75).get_scores(query)
    expected = {i: s for i, s in enumerate(ref) if s > 0}
    assert set(ours) == set(expected)
    for seq, score in expected.items():
        assert ours[seq] == pytest.approx(score, rel=1e-6)


def test_ranking_order_matches(tmp_path):
    st = SQLiteStore(tmp_path / "p.db")
    st.append("s", [ItemRow(NewItem(text=t), "", None, 1, [(0, len(t))], [t])
                    for t in CORPUS])
    ref = rank_bm25.BM25Okapi([t.split() for t in CORPUS], k1=1.2, b=0.75).get_scores(["sea", "blue"])
    ours = [seq for seq, _, _ in st.bm25("s", ["sea", "blue"], limit=100)]
    assert ours == sorted((i for i, s in enumerate(ref) if s > 0), key=lambda i: -ref[i])
