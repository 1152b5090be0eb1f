"""Prefix latency and ingest rate at 10k and 100k items (query embedding included), and the
cost of the optional stages (cross-encoder rerank, a second retrieval round) as ratios to the
plain prefix measured in the same run.

Items are short real texts: package summaries from the environment's PyPI list when it is
there, else LoCoMo turns. Queries are three content words drawn from other items, each used
once, so the query-embedding cache never helps. Baseline in the same run: a brute-force
scan that scores every item with Python's ``in`` over words, the naive memory lookup.

    python benchmarks/prefix_scale.py --sizes 10000,100000 --json docs/results/prefix_scale.json
    python benchmarks/prefix_scale.py --sizes 10000 --encoder ENC --reranker RR --expansion

Dense search at scale (``--vector-cache DIR``): item vectors come from a cache of MiniLM vectors
(``DIR/chunk_*.{json,npy}``: texts and their vectors, as ``benchmarks/ann_compare.py`` reads
them); a text with no cached vector gets a perturbed copy of a cached one (cosine about 0.8
to it, the source picked by a hash of the text), so a million items need not be embedded
here. Queries are still embedded by the real model, one at a time, never cached. Each size
then times three dense searches on the same queries, in rotation: the exact scan of every
vector, the unit-narrowed scan (the default without an index), and the HNSW index, with each
one's recall@10 against the exact scan and the index's build, save and load times.

    python benchmarks/prefix_scale.py --sizes 100000,1000000 --vector-cache runs/prefix_vecs \
        --store-dir runs --json docs/results/prefix_scale_ann.json

BM25 from postings in memory (``--lexical``; with a vector cache the three dense searches are
skipped, the HNSW index serves as by default): the build, a check of 100 queries' BM25 lists
against FTS5's, and the prefix timed with and without the postings, query by query.

    python benchmarks/prefix_scale.py --sizes 100000,1000000 --vector-cache runs/prefix_vecs \
        --store-dir runs --lexical --json docs/results/prefix_scale_lexical.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from expansion import rocchio, rrf

from suffice import Memory, MiniLMEmbedder, NewItem, RetrievalConfig, load_encoder, load_reranker
from suffice._bench.report import envelope, percentile, write_json
from suffice._datasets.paths import shared_data_dir
from suffice._text import query_terms

PYPI_LIST = Path("/work/.library/env/packages/pypi.tsv")


def corpus(n: int) -> list[str]:
    texts: list[str] = []
    if PYPI_LIST.exists():
        for line in PYPI_LIST.read_text(encoding="utf-8", errors="replace").splitlines()[1:]:
            parts = line.split("\t")
            if len(parts) >= 5 and len(parts[4].split()) >= 4:
                texts.append(parts[4].strip())
    if len(texts) < n:
        from suffice._datasets.locomo import load_locomo
        turns = [it.text for c in load_locomo(shared_data_dir() / "locomo" / "locomo_shared.json")
                 for it in c.items]
        i = 0
        while len(texts) < n:
            texts.append(f"{turns[i % len(turns)]} (note {i})")
            i += 1
    random.Random(7).shuffle(texts)
    return texts[:n]


def queries(texts: list[str], n: int, seed: int = 11) -> list[str]:
    rng = random.Random(seed)
    out: set[str] = set()
    while len(out) < n:
        words = query_terms(rng.choice(texts))
        if len(words) >= 3:
            out.add(" ".join(rng.sample(words, 3)))
    return sorted(out)


class CachedVectors:
    """An embedder that serves item vectors from a cache (a perturbed copy of a cached vector
    for a text not in it) and embeds queries with the real model, uncached."""

    name = "all-MiniLM-L6-v2-int8"
    dim = 384

    def __init__(self, cache: Path, model: MiniLMEmbedder) -> None:
        texts: list[str] = []
        mats = []
        for f in sorted(cache.glob("chunk_*.npy")):
            if f.name.endswith(".tmp.npy") or not f.with_suffix(".json").exists():
                continue
            texts += json.loads(f.with_suffix(".json").read_text())
            mats.append(np.load(f))
        self.matrix = np.concatenate(mats).astype(np.float32)
        self.row = {t: i for i, t in enumerate(texts)}
        self.model = model
        self.name = model.name
        self.synthetic = 0

    def embed(self, texts: Any) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for i, t in enumerate(texts):
            r = self.row.get(t)
            if r is not None:
                out[i] = self.matrix[r]
                continue
            seed = int.from_bytes(hashlib.blake2b(t.encode(), digest_size=8).digest(), "little")
            rng = np.random.default_rng(seed)
            src = self.matrix[int(rng.integers(self.matrix.shape[0]))]
            v = src + 0.75 * rng.normal(size=self.dim).astype(np.float32) / np.sqrt(self.dim)
            out[i] = v / np.linalg.norm(v)
            self.synthetic += 1
        return out

    def embed_query(self, text: str) -> np.ndarray:
        vec: np.ndarray = self.model.embed_query(text)  # the model's query session, as Memory uses it
        return vec


DENSE_VARIANTS = {
    "exact": RetrievalConfig(rerank=0, dense_index_items=10**9, dense_scan_items=10**9),
    "units": RetrievalConfig(rerank=0, dense_index_items=10**9),
    "index": RetrievalConfig(rerank=0),
}
"""Exact scan of every vector; the unit-narrowed scan (default without an index above
dense_scan_items); the HNSW index (the default)."""


def dense_variants(mem: Memory, qs: list[str]) -> dict[str, Any]:
    """Prefix p50/p95 and stage medians for each dense search, timed query by query in
    rotation, with recall@10 of the dense top-10 against the exact scan's."""
    names = list(DENSE_VARIANTS)
    totals: dict[str, list[float]] = {v: [] for v in names}
    stages: dict[str, dict[str, list[float]]] = {v: {} for v in names}
    top: dict[str, list[list[tuple[int, float]]]] = {v: [] for v in names}
    for i, q in enumerate(qs):
        for name in names[i % len(names):] + names[:i % len(names)]:
            t = time.perf_counter()
            ev = mem.search(q, scope="bench", k=10, retrieval=DENSE_VARIANTS[name])
            totals[name].append((time.perf_counter() - t) * 1e3)
            for k, v in ev.timings_ms.items():
                if k != "total_ms":
                    stages[name].setdefault(k, []).append(v)
            rk = mem.retriever.rank("bench", q, DENSE_VARIANTS[name], method="dense", depth=10)
            top[name].append(list(rk.dense[:10]))
    out: dict[str, Any] = {}
    for name in names:
        # By item: the share of the exact top-10 items found. By score: the share of the ten
        # found whose cosine reaches the exact 10th (duplicate texts tie, and any of the tied
        # copies is as right as another).
        by_item = [len({s for s, _ in a} & {s for s, _ in b}) / max(1, len(b))
                   for a, b in zip(top[name], top["exact"], strict=True)]
        by_score = [sum(c >= b[-1][1] - 1e-6 for _, c in a) / max(1, len(b))
                    for a, b in zip(top[name], top["exact"], strict=True) if b]
        out[name] = {"prefix_p50_ms": statistics.median(totals[name]),
                     "prefix_p95_ms": percentile(totals[name], 0.95),
                     "stage_p50_ms": {k: statistics.median(v) for k, v in stages[name].items()},
                     "recall@10_vs_exact": float(np.mean(by_item)),
                     "recall@10_vs_exact_by_score": float(np.mean(by_score))}
    for name in names:
        out[name]["prefix_ratio_to_exact"] = out[name]["prefix_p50_ms"] / out["exact"]["prefix_p50_ms"]
        d, e = out[name]["stage_p50_ms"].get("dense_ms"), out["exact"]["stage_p50_ms"].get("dense_ms")
        out[name]["dense_ratio_to_exact"] = d / e if d and e else None
    return out


def index_times(mem: Memory, path: Path, embedder: Any) -> tuple[Memory, dict[str, Any]]:
    """Build (or load) the HNSW index, save it (close), reopen the store and load it: seconds each."""
    t = time.perf_counter()
    mem.retriever.index("bench")
    sync_s = time.perf_counter() - t
    folder = path.with_name(path.name + ".ann")
    built = not any(folder.glob("*.hnsw"))  # no saved index yet: this builds one
    t = time.perf_counter()
    ann = mem.retriever.dense_index("bench")
    first_s = time.perf_counter() - t
    t = time.perf_counter()
    mem.close()
    close_s = time.perf_counter() - t
    mem = Memory(path, embedder=embedder, router=None)
    t = time.perf_counter()
    mem.retriever.index("bench")
    reopen_sync_s = time.perf_counter() - t
    t = time.perf_counter()
    mem.retriever.dense_index("bench")
    load_s = time.perf_counter() - t
    size = sum(f.stat().st_size for f in folder.glob("*.hnsw")) if folder.exists() else 0
    return mem, {"vectors_load_s": sync_s, ("index_build_s" if built else "index_first_load_s"): first_s,
                 "index_save_s_at_close": close_s, "vectors_reload_s": reopen_sync_s,
                 "index_load_s": load_s, "index_file_mb": size / 2**20,
                 "index_rows": ann.count if ann is not None else 0}


def naive_scan(texts: list[str], q: str) -> list[int]:
    terms = set(q.split())
    scored = [(sum(t in set(x.lower().split()) for t in terms), i) for i, x in enumerate(texts)]
    scored.sort(reverse=True)
    return [i for _, i in scored[:10]]


def extra_stages(mem: Memory, qs: list[str], rerank_depths: list[int], expansion: bool) -> dict[str, Any]:
    """p50 of the prefix with each optional stage, timed query by query beside the plain prefix
    (the order of the variants rotates per query), and its ratio to the plain prefix's p50."""
    variants: dict[str, Any] = {"plain": None}
    variants.update({f"rerank {d}": d for d in rerank_depths})
    if expansion:
        variants["expansion m=5 beta=0.6"] = "rocchio"
    times: dict[str, list[float]] = {v: [] for v in variants}
    names = list(variants)
    for i, q in enumerate(qs):
        for name in names[i % len(names):] + names[:i % len(names)]:
            how = variants[name]
            t = time.perf_counter()
            if how == "rocchio":
                rk = mem.retriever.rank("bench", q, RetrievalConfig(rerank=0), depth=100)
                seqs_all, matrix = mem.retriever.index("bench").vectors()
                assert rk.qvec is not None
                second = rocchio(matrix, seqs_all, rk.qvec, list(rk.seqs[:5]), 0.6)
                bm = list(dict.fromkeys(s for s, _, _ in rk.pieces))[:100]
                rrf([bm, [s for s, _ in rk.dense[:100]], second])
            else:
                mem.search(q, scope="bench", k=10, retrieval=RetrievalConfig(rerank=how or 0))
            times[name].append((time.perf_counter() - t) * 1e3)
    plain = statistics.median(times["plain"])
    return {name: {"p50_ms": statistics.median(v), "p95_ms": percentile(v, 0.95),
                   "ratio_to_plain": statistics.median(v) / plain} for name, v in times.items()}


def lexical_compare(mem: Memory, texts: list[str], n_queries: int) -> dict[str, Any]:
    """Build the in-memory BM25 postings (timed), check them against FTS5 and time the whole
    prefix with and without them: queries alternate between the two, each query used once (so
    no query vector is cached for the second)."""
    store = mem.store
    on = store.lexical_index_items
    t = time.perf_counter()
    built = store.prepare_lexical("bench")
    build_s = time.perf_counter() - t
    index = store._postings._indexes.get("bench") if store._postings else None
    arrays = (index.post_rows, index.post_tf, index.seqs, index.idxs, index.lengths) if index else ()
    size = sum(a.nbytes for a in arrays)
    same = 0
    checked = queries(texts, 100, seed=41)
    for q in checked:  # the store's BM25 lists: same rows above the last score, same scores
        terms = query_terms(q)
        store.lexical_index_items = None
        want = store.bm25("bench", terms, 310)
        store.lexical_index_items = on
        got = store.bm25("bench", terms, 310)
        cut = want[-1][2] if want else 0.0
        same += (len(got) == len(want)
                 and all(abs(a[2] - b[2]) <= 1e-9 * max(1.0, b[2]) for a, b in zip(got, want, strict=True))
                 and {g[:2] for g in got if g[2] > cut + 1e-9} == {w[:2] for w in want if w[2] > cut + 1e-9})
    times: dict[str, list[float]] = {"fts5": [], "lexical": []}
    bm25: dict[str, list[float]] = {"fts5": [], "lexical": []}
    for i, q in enumerate(queries(texts, 2 * n_queries, seed=31)):
        mode = ("fts5", "lexical")[(i + i // 2) % 2]  # fts5, lexical, lexical, fts5, ...
        store.lexical_index_items = on if mode == "lexical" else None
        t = time.perf_counter()
        ev = mem.search(q, scope="bench", k=10, retrieval=RetrievalConfig(rerank=0))
        times[mode].append((time.perf_counter() - t) * 1e3)
        bm25[mode].append(ev.timings_ms.get("bm25_ms", 0.0))
    store.lexical_index_items = on
    p50 = {m: statistics.median(v) for m, v in times.items()}
    return {"built": built, "build_s": build_s, "index_mb": size / 2**20,
            "rows": index.n_rows if index else 0, "postings": int(index.post_rows.size) if index else 0,
            "bm25_lists_same_as_fts5": f"{same}/{len(checked)}",
            "prefix_p50_ms": p50, "prefix_p95_ms": {m: percentile(v, 0.95) for m, v in times.items()},
            "bm25_wait_p50_ms": {m: statistics.median(v) for m, v in bm25.items()},
            "prefix_ratio_lexical_to_fts5": p50["lexical"] / p50["fts5"],
            "queries_per_mode": len(times["fts5"])}


def run_size(n: int, n_queries: int, workdir: Path, reuse: Path | None = None,
             embedder: Any = "default", reranker: Any = None, rerank_depths: list[int] | None = None,
             expansion: bool = False, dense_scale: bool = False, lexical: bool = False) -> dict[str, object]:
    """Ingest ``n`` items (timed) and time prefix queries; ``reuse`` skips ingest if it exists.
    ``dense_scale``: also time the three dense searches and the index (see the module doc);
    ``lexical``: the in-memory BM25 postings against FTS5 (then the main timing uses them)."""
    texts = corpus(n)
    ingest_s: float | None = None
    path = reuse or workdir / f"scale_{n}.db"
    if reuse is not None and reuse.exists():
        mem = Memory(reuse, embedder=embedder, reranker=reranker)
        if mem.store.max_seq("bench") + 1 != n:
            raise SystemExit(f"{reuse} does not hold {n} items in scope 'bench'")
    else:
        mem = Memory(path, embedder=embedder, reranker=reranker)
        t0 = time.perf_counter()
        batch = 512
        for b in range(0, n, batch):
            mem.add([NewItem(text=t, session=f"s{(b + i) // 200}")
                     for i, t in enumerate(texts[b:b + batch])], scope="bench")
        ingest_s = time.perf_counter() - t0
    qs = queries(texts, n_queries)
    scale: dict[str, Any] = {}
    if dense_scale:
        mem, scale["index"] = index_times(mem, path, embedder)
        scale["synthetic_vectors"] = getattr(embedder, "synthetic", None)
        mem.search("warm up the caches", scope="bench")
        scale["dense"] = dense_variants(mem, queries(texts, n_queries, seed=21))
    if lexical:
        scale["lexical"] = lexical_compare(mem, texts, n_queries)
    else:
        mem.store.lexical_index_items = None  # FTS5 only, as before the in-memory postings
    mem.search("warm up the caches", scope="bench")
    totals: list[float] = []
    stages: dict[str, list[float]] = {}
    for q in qs:
        t = time.perf_counter()
        ev = mem.search(q, scope="bench", k=10, retrieval=RetrievalConfig(rerank=0))
        totals.append((time.perf_counter() - t) * 1e3)
        for k, v in ev.timings_ms.items():
            if k != "total_ms":
                stages.setdefault(k, []).append(v)
    naive = []
    for q in qs[:20 if n <= 200_000 else 5]:
        t = time.perf_counter()
        naive_scan(texts, q)
        naive.append((time.perf_counter() - t) * 1e3)
    fresh = queries(texts, max(20, len(qs) // 4), seed=12)  # not in the query-vector cache
    stages_extra = (extra_stages(mem, fresh, rerank_depths or [], expansion)
                    if rerank_depths or expansion else None)
    p50 = statistics.median(totals)
    stage_p50 = {k: statistics.median(v) for k, v in stages.items()}
    share = {k: 100 * v / max(sum(stage_p50.values()), 1e-9) for k, v in stage_p50.items()}
    mem.close()
    return {
        "items": n, "queries": len(qs), "ingest_s": ingest_s,
        "ingest_items_per_s": n / ingest_s if ingest_s else None,
        "prefix_p50_ms": p50, "prefix_p95_ms": percentile(totals, 0.95),
        "stage_p50_ms": stage_p50, "stage_share_pct": share,
        "naive_scan_p50_ms": statistics.median(naive), "speedup_vs_naive": statistics.median(naive) / p50,
        **({"optional_stages": stages_extra} if stages_extra else {}),
        **scale,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="10000,100000")
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--store-dir", type=Path,
                    help="keep stores here (render_<n>.db) and reuse them: query timing only")
    ap.add_argument("--encoder", type=Path, help=(
        "a trained encoder folder; a kept store must have been re-embedded with it "
        "(suffice --encoder DIR --db STORE rebuild)"))
    ap.add_argument("--reranker", type=Path, help="a trained reranker folder: time the prefix with it")
    ap.add_argument("--rerank-depths", default="10,30", help="candidates reranked, one row each")
    ap.add_argument("--expansion", action="store_true",
                    help="time the prefix with the model-free second round of benchmarks/expansion.py")
    ap.add_argument("--lexical", action="store_true", help=(
        "hold BM25 postings in memory: time their build, check them against FTS5 and time the "
        "prefix with and without them (the main timing then uses them)"))
    ap.add_argument("--vector-cache", type=Path, help=(
        "item vectors from this cache (perturbed copies past it); time exact scan, unit scan "
        "and the HNSW index side by side"))
    args = ap.parse_args()
    embedder: Any = load_encoder(args.encoder) if args.encoder else "default"
    embed_rate = None
    if args.vector_cache:
        model = load_encoder(args.encoder) if args.encoder else MiniLMEmbedder(query_cache=0)
        sample = corpus(2000)
        model.embed(sample[:50])
        t = time.perf_counter()
        model.embed(sample)
        embed_rate = len(sample) / (time.perf_counter() - t)
        print(f"embedding rate {embed_rate:.0f} texts/s", flush=True)
        embedder = CachedVectors(args.vector_cache, model)
    reranker = load_reranker(args.reranker) if args.reranker else None
    depths = [int(x) for x in args.rerank_depths.split(",")] if reranker else []
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in (int(x) for x in args.sizes.split(",")):
            name = "scale" if args.vector_cache else "render"
            reuse = args.store_dir / f"{name}_{n}.db" if args.store_dir else None
            r = run_size(n, args.queries, Path(tmp), reuse, embedder, reranker, depths, args.expansion,
                         dense_scale=args.vector_cache is not None and not args.lexical,
                         lexical=args.lexical)
            if embed_rate is not None:
                r["embed_texts_per_s"] = embed_rate
            results.append(r)
            print(json.dumps(r, indent=1), flush=True)
    if args.json:
        doc = envelope("prefix_scale", "pypi-summaries" if PYPI_LIST.exists() else "locomo-turns",
                       str(PYPI_LIST), {"sizes": args.sizes, "queries": args.queries,
                        "encoder": str(args.encoder or "default"),
                        "reranker": str(args.reranker or "none"),
                        "vector_cache": str(args.vector_cache or "none"),
                        "lexical": args.lexical}, results)
        doc["command"] = "python benchmarks/prefix_scale.py " + " ".join(sys.argv[1:])
        write_json(args.json, doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
