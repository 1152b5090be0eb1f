"""BM25 from postings in memory gives FTS5's answers: the same rows with the same scores, through
appends, bounds, forgets and closes."""

from __future__ import annotations

import random
import threading
import time

import pytest

from suffice import Filter, InvalidQueryError, Memory, NewItem, SQLiteStore, StoreConfig
from suffice._embed.hashing import HashEmbedder
from suffice._store import lexical

# Words that porter folds together, case and diacritics that unicode61 folds, numbers; then a
# long tail of rarer words, drawn by a Zipf-like law so that most terms have a positive idf.
SPECIAL = ("run running runs runner River river RIVERS café cafe Café flood flooded flooding "
           "2024 42 Lisbon lisbon forecast forecasts forecasting").split()
TAIL = [a + b for a in ("ka", "lo", "mi", "nu", "pe", "ri", "so", "tu", "ve", "za")
        for b in ("bar", "dim", "gol", "hex", "jun", "kip", "lom", "mur", "nox", "pil",
                  "quo", "rad", "sev", "tam", "vek")]
VOCAB = SPECIAL + TAIL
WEIGHTS = [1 / (i + 1) for i in range(len(VOCAB))]


def _items(rnd: random.Random, n: int, start: int = 0) -> list[NewItem]:
    out = []
    for i in range(start, start + n):
        size = rnd.choice([3, 8, 20, 60, 200])  # some long enough to be cut into pieces
        text = " ".join(rnd.choices(VOCAB, WEIGHTS, k=size)) + "."
        out.append(NewItem(text=text, id=f"i{i}", session=f"s{i % 3}"))
    return out


@pytest.fixture
def pair(tmp_path):
    """make(seed, n): a memory of ``n`` random items whose store answers from a built index,
    FTS5 alone on the same file, and the random source for queries; both closed afterwards."""
    opened = []

    def make(seed: int, n: int) -> tuple[Memory, SQLiteStore, random.Random]:
        rnd = random.Random(seed)
        path = tmp_path / f"m{seed}.db"
        mem = Memory(SQLiteStore(path, lexical_index_items=1), embedder=HashEmbedder(),
                     store_config=StoreConfig(unit_tokens=80))
        mem.add(_items(rnd, n), scope="a")
        fts = SQLiteStore(path, lexical_index_items=None)
        opened.extend([mem, fts])
        assert mem.store.prepare_lexical("a")
        return mem, fts, rnd

    yield make
    for x in opened:
        x.close()


def _indexes(mem: Memory) -> dict[str, lexical.LexicalIndex]:
    postings = mem.store._postings
    assert postings is not None
    return postings._indexes


def _queries(rnd: random.Random, k: int) -> list[list[str]]:
    return [[w.lower() for w in rnd.sample(VOCAB, rnd.randint(1, 5))] for _ in range(k)]


def _agree(mem: Memory, fts: SQLiteStore, rnd: random.Random, n: int, limits=(10_000,), flt=None) -> None:
    """``n`` random queries get the same BM25 list from the memory's store and from FTS5."""
    for terms in _queries(rnd, n):
        for limit in limits:
            _same(mem.store.bm25("a", terms, limit, flt), fts.bm25("a", terms, limit, flt))


def _same(got: list[tuple[int, int, float]], want: list[tuple[int, int, float]]) -> None:
    assert len(got) == len(want)
    assert [s for *_, s in got] == pytest.approx([s for *_, s in want], rel=1e-9, abs=1e-12)
    # Rows of equal score may come in another order; every row of a score the list holds in
    # full must be there.
    cut = want[-1][2] if want else 0.0
    assert {(q, i) for q, i, s in got if s > cut + 1e-9} == {(q, i) for q, i, s in want if s > cut + 1e-9}


def test_most_test_terms_are_not_at_the_idf_floor(pair):
    mem, fts, rnd = pair(0, 120)
    best = [max((s for *_, s in fts.bm25("a", terms, 10_000)), default=0.0) for terms in _queries(rnd, 30)]
    assert sum(b > 0.5 for b in best) > 0.8 * len(best)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_index_scores_every_match_as_fts5_does(pair, seed):
    mem, fts, rnd = pair(seed, 120)
    _agree(mem, fts, rnd, 40, limits=(5, 50, 10_000))


def test_items_added_after_the_build_are_indexed_at_the_next_query(pair):
    mem, fts, rnd = pair(7, 60)
    for start in (60, 61, 90):  # one item, then a batch
        mem.add(_items(rnd, 1 if start == 60 else 29, start), scope="a")
        _agree(mem, fts, rnd, 15)
    index = _indexes(mem)["a"]
    assert index.covered == 119 and index.extra  # extended, not rebuilt


def test_a_bound_on_seq_filters_but_every_row_counts_as_in_fts5(pair):
    mem, fts, rnd = pair(3, 80)
    mem.add(_items(rnd, 20, 80), scope="a")  # newer than the build: in FTS5's row count
    for bound in (40, 90, 10**6):  # a bound past the log must not stop later items being indexed
        _agree(mem, fts, rnd, 10, flt=Filter(before_seq=bound))
    mem.add(_items(rnd, 15, 100), scope="a")
    _agree(mem, fts, rnd, 10)
    assert _indexes(mem)["a"].covered == 115


def test_filters_and_phrases_fts5_must_read_give_fts5s_answer_and_bad_filters_its_error(pair):
    mem, fts, rnd = pair(4, 80)
    session = Filter(session="s1")  # a filter on items: FTS5 answers
    for terms in _queries(rnd, 10):
        assert mem.store.bm25("a", terms, 10_000, session) == fts.bm25("a", terms, 10_000, session)
    # A term FTS5 splits into a phrase of two tokens cannot be read from unigram postings.
    assert lexical.phrases(mem.store._postings._tokenizer, ["river_flood"]) is None
    assert mem.store.bm25("a", ["river_flood"], 50) == fts.bm25("a", ["river_flood"], 50)
    for bad in ("5", 2.5, True):
        with pytest.raises(InvalidQueryError):
            fts.bm25("a", ["river"], 10, Filter(before_seq=bad))  # type: ignore[arg-type]
        with pytest.raises(InvalidQueryError):
            mem.store.bm25("a", ["river"], 10, Filter(before_seq=bad))  # type: ignore[arg-type]


def test_a_forget_drops_every_index_at_once_and_the_next_one_is_built_from_what_remains(pair):
    mem, fts, rnd = pair(5, 90)
    mem.forget("a", session="s0")
    assert _indexes(mem) == {}  # at once, not at the next query: it held the forgotten terms
    _agree(mem, fts, rnd, 10)  # FTS5 answers (a first query starts a new build)
    assert mem.store.prepare_lexical("a")
    (pieces,) = fts._read("SELECT COUNT(*) FROM pieces WHERE scope = 'a'")[0]
    assert _indexes(mem)["a"].n_rows == pieces
    assert _indexes(mem)["a"].generation == mem.store.generation()
    _agree(mem, fts, rnd, 15)


def _slow(started: threading.Event):
    """A build that first spends up to 20 s in short statements on its snapshot, as a large
    one does, stopping when asked."""
    real = lexical.build

    def slow_build(conn, *args, stop):
        started.set()
        for _ in range(500):
            if stop():
                raise lexical.BuildStopped
            conn.execute("WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 200000)"
                         " SELECT COUNT(*) FROM n").fetchone()
        return real(conn, *args, stop=stop)

    return slow_build


def test_a_forget_during_a_build_stops_it_so_the_log_can_be_emptied(pair, monkeypatch):
    mem, fts, rnd = pair(6, 60)
    started = threading.Event()
    slow_build = _slow(started)

    monkeypatch.setattr(lexical, "build", slow_build)
    mem.forget("a", ids=["i0"])  # drops the index built by the fixture
    builder = threading.Thread(target=mem.store.prepare_lexical, args=("a",))
    builder.start()
    assert started.wait(10)
    t0 = time.monotonic()
    report = mem.forget("a", ids=["i1"])
    builder.join(10)
    assert report.checkpointed and report.scrubbed and time.monotonic() - t0 < 10
    assert not builder.is_alive() and _indexes(mem) == {}
    monkeypatch.undo()
    assert mem.store.prepare_lexical("a")
    _agree(mem, fts, rnd, 10)


def test_closing_the_store_stops_a_build_and_installs_nothing(tmp_path, monkeypatch):
    started = threading.Event()
    slow_build = _slow(started)

    monkeypatch.setattr(lexical, "build", slow_build)
    mem = Memory(SQLiteStore(tmp_path / "m.db", lexical_index_items=10), embedder=HashEmbedder())
    mem.add(_items(random.Random(1), 30), scope="a")
    mem.store.bm25("a", ["river"], 10)  # large enough: starts a build on its thread
    assert started.wait(10)
    postings = mem.store._postings
    mem.close()
    assert postings._indexes == {} and postings._threads == set() and postings._conns == set()


def test_a_large_scope_gets_its_index_on_a_thread_and_fts5_answers_meanwhile(tmp_path):
    rnd = random.Random(11)
    mem = Memory(SQLiteStore(tmp_path / "m.db", lexical_index_items=50), embedder=HashEmbedder())
    mem.add(_items(rnd, 40), scope="a")
    mem.store.bm25("a", ["river"], 10)
    assert _indexes(mem) == {} and mem.store._postings._building == {}  # too small
    mem.add(_items(rnd, 20, 40), scope="a")
    first = mem.store.bm25("a", ["river"], 10)  # starts the build; FTS5 answers this one
    deadline = time.monotonic() + 30
    while "a" not in _indexes(mem) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert "a" in _indexes(mem)
    _same(mem.store.bm25("a", ["river"], 10), first)
    mem.close()


def test_many_small_adds_after_the_build_are_folded_into_one_slice_per_term(pair, monkeypatch):
    monkeypatch.setattr(lexical, "FOLD_AT", 50)
    mem, fts, rnd = pair(13, 30)
    index = _indexes(mem)["a"]
    before = index.post_rows.size
    for start in range(30, 70):  # one item per add, a query after each
        mem.add(_items(rnd, 1, start), scope="a")
        mem.store.bm25("a", ["river"], 5)
    assert index.post_rows.size > before and index.n_extra <= max(50, index.post_rows.size // 8)
    _agree(mem, fts, rnd, 20)


def test_rows_tied_at_the_cut_are_the_oldest_as_fts5_keeps_them(tmp_path):
    """argpartition picked among equal scores at the cut arbitrarily, so a large scope could
    return other rows than FTS5 (and PostgreSQL) for the same query."""
    path = tmp_path / "t.db"
    mem = Memory(SQLiteStore(path, lexical_index_items=1), embedder=None)
    fts = SQLiteStore(path, lexical_index_items=None)
    try:
        rnd = random.Random(3)
        kinds = ["the grey cat", "the cat sat", "grey grey cat", "a grey owl"]
        texts = [rnd.choice(kinds) for _ in range(400)]
        mem.add(texts, scope="a")
        assert mem.store.prepare_lexical("a")
        for limit in (5, 10, 17, 120, 150):
            got = [(q, i) for q, i, _ in mem.store.bm25("a", ["grey"], limit)]
            want = [(q, i) for q, i, _ in fts.bm25("a", ["grey"], limit)]
            assert got == want
    finally:
        mem.close()
        fts.close()
