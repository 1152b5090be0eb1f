"""HNSW libraries side by side on the same real MiniLM vectors: build time, single-query
latency and recall against the exact scan (what picked the dense index's library).

Vectors come from a cache written by ``benchmarks/prefix_scale.py --vector-cache DIR`` (item
vectors of the benchmark corpus, in corpus order). Queries are the prefix benchmark's own
(three content words of other items), embedded here, one at a time as the prefix asks them.
Each library builds with M=16 and the same construction effort, on the same threads.

    python benchmarks/ann_compare.py --cache runs/prefix_vecs --items 100000 --json runs/ann_compare.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from suffice._bench.report import percentile


def load_cache(cache: Path, n: int) -> np.ndarray:
    """The first ``n`` vectors of the cache's chunks, in chunk order."""
    parts, have = [], 0
    for f in sorted(cache.glob("chunk_*.npy")):
        if f.name.endswith(".tmp.npy"):
            continue
        parts.append(np.load(f))
        have += parts[-1].shape[0]
        if have >= n:
            break
    if have < n:
        raise SystemExit(f"{cache} holds {have} vectors, fewer than {n}")
    return np.ascontiguousarray(np.concatenate(parts)[:n], dtype=np.float32)


def exact_top(matrix: np.ndarray, q: np.ndarray, k: int) -> np.ndarray:
    sims = matrix @ q
    top = np.argpartition(-sims, k - 1)[:k]
    return top[np.argsort(-sims[top])]


def time_queries(search: Callable[[np.ndarray, int], np.ndarray], qs: np.ndarray, k: int,
                 truth: list[np.ndarray]) -> dict[str, float]:
    search(qs[0], k)
    times, r10, rk = [], [], []
    for q, t in zip(qs, truth, strict=True):
        t0 = time.perf_counter()
        got = search(q, k)
        times.append((time.perf_counter() - t0) * 1e3)
        r10.append(len(set(got[:10].tolist()) & set(t[:10].tolist())) / 10)
        rk.append(len(set(got[:k].tolist()) & set(t[:k].tolist())) / k)
    return {"p50_ms": statistics.median(times), "p95_ms": percentile(times, 0.95),
            "recall@10": float(np.mean(r10)), f"recall@{k}": float(np.mean(rk))}


def run(matrix: np.ndarray, qs: np.ndarray, k: int, efs: list[int], threads: int,
        libs: list[str]) -> list[dict[str, Any]]:
    n, dim = matrix.shape
    truth = [exact_top(matrix, q, k) for q in qs]
    rows: list[dict[str, Any]] = []

    def exact(q: np.ndarray, kk: int) -> np.ndarray:
        sims = np.einsum("ij,j->i", matrix, q)
        top = np.argpartition(-sims, kk - 1)[:kk]
        return top[np.argsort(-sims[top])]
    rows.append({"library": "exact (einsum)", **time_queries(exact, qs, k, truth)})
    print(rows[-1], flush=True)

    if "hnswlib" in libs:
        import hnswlib
        t0 = time.perf_counter()
        h = hnswlib.Index(space="ip", dim=dim)
        h.init_index(max_elements=n, ef_construction=128, M=16, random_seed=7)
        h.add_items(matrix, np.arange(n), num_threads=threads)
        build = time.perf_counter() - t0
        for ef in efs:
            h.set_ef(max(ef, k))
            rows.append({"library": "hnswlib 0.8.0", "ef": max(ef, k), "build_s": build,
                         **time_queries(lambda q, kk: h.knn_query(q, kk, num_threads=1)[0][0], qs, k, truth)})
            print(rows[-1], flush=True)
        del h
    if "usearch" in libs:
        from usearch.index import Index
        for dtype in ("f32", "f16", "i8"):
            t0 = time.perf_counter()
            u = Index(ndim=dim, metric="ip", dtype=dtype, connectivity=16, expansion_add=128)
            u.add(np.arange(n), matrix, threads=threads)
            build = time.perf_counter() - t0
            for ef in efs:
                u.expansion_search = max(ef, k)
                rows.append({"library": f"usearch 2.26.6 {dtype}", "ef": max(ef, k), "build_s": build,
                             **time_queries(lambda q, kk, u=u: u.search(q, kk, threads=1).keys,
                                            qs, k, truth)})
                print(rows[-1], flush=True)
            del u
    if "faiss" in libs:
        import faiss
        faiss.omp_set_num_threads(threads)
        t0 = time.perf_counter()
        f = faiss.IndexHNSWFlat(dim, 16, faiss.METRIC_INNER_PRODUCT)
        f.hnsw.efConstruction = 128
        f.add(matrix)
        build = time.perf_counter() - t0
        faiss.omp_set_num_threads(1)
        for ef in efs:
            f.hnsw.efSearch = max(ef, k)
            rows.append({"library": "faiss-cpu 1.15.1", "ef": max(ef, k), "build_s": build,
                         **time_queries(lambda q, kk: f.search(q[None, :], kk)[1][0], qs, k, truth)})
            print(rows[-1], flush=True)
    if "shipped" in libs:  # what suffice uses: faiss HNSW over float16, rows added one by one
        from suffice._ann import DenseIndex
        t0 = time.perf_counter()
        d = DenseIndex(dim)
        d.extend(matrix)
        build = time.perf_counter() - t0
        for ef in efs:
            rows.append({"library": "suffice DenseIndex (faiss HNSWSQ fp16, one by one)", "ef": max(ef, k),
                         "build_s": build,
                         **time_queries(lambda q, kk, ef=ef: d.search(q, kk, ef), qs, k, truth)})
            print(rows[-1], flush=True)
    return rows


def crossover(matrix: np.ndarray, qs: np.ndarray, sizes: list[int], k: int, ef: int) -> list[dict[str, Any]]:
    """Exact scan (einsum + top-k, as the ranker does it) against the shipped index (search +
    exact rescoring of its rows) on the first n vectors: where does the index start to win?"""
    from suffice._ann import DenseIndex
    out = []
    for n in sizes:
        sub = np.ascontiguousarray(matrix[:n])
        d = DenseIndex(sub.shape[1])
        d.extend(sub)

        def exact(q: np.ndarray, kk: int, sub: np.ndarray = sub) -> np.ndarray:
            sims = np.einsum("ij,j->i", sub, q)
            top = np.argpartition(-sims, kk - 1)[:kk]
            return top[np.argsort(-sims[top])]

        def index(q: np.ndarray, kk: int, d: DenseIndex = d, sub: np.ndarray = sub) -> np.ndarray:
            rows = d.search(q, kk, ef)
            sims = np.einsum("ij,j->i", sub[rows], q)
            return rows[np.argsort(-sims)]
        truth = [exact_top(sub, q, k) for q in qs]
        row = {"items": n, "exact": time_queries(exact, qs, k, truth),
               "index": time_queries(index, qs, k, truth)}
        row["index_over_exact"] = row["index"]["p50_ms"] / row["exact"]["p50_ms"]
        print(row, flush=True)
        out.append(row)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cache", type=Path, required=True)
    ap.add_argument("--items", type=int, default=100_000)
    ap.add_argument("--queries", type=int, default=300)
    ap.add_argument("--k", type=int, default=100)
    ap.add_argument("--ef", default="100,200")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--libs", default="hnswlib,usearch,faiss,shipped")
    ap.add_argument("--crossover", default="", help="sizes for the exact-vs-index crossover, e.g. 2000,5000")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    matrix = load_cache(args.cache, args.items)
    from prefix_scale import corpus, queries

    from suffice import MiniLMEmbedder
    emb = MiniLMEmbedder()
    qs = np.stack([emb.embed_query(q) for q in queries(corpus(args.items), args.queries, seed=13)])
    rows = run(matrix, qs, args.k, [int(x) for x in args.ef.split(",")], args.threads,
               args.libs.split(",")) if args.libs else []
    cross = crossover(matrix, qs, [int(x) for x in args.crossover.split(",")], args.k,
                      int(args.ef.split(",")[0])) if args.crossover else []
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"items": args.items, "queries": args.queries, "k": args.k,
                                         "threads": args.threads, "command": " ".join(sys.argv),
                                         "rows": rows, "crossover": cross}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
