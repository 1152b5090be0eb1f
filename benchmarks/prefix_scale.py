"""Prefix latency and ingest rate at 10k and 100k items (query embedding included), and the
cost of the optional stages (cross-encoder rerank, a second retrieval round) as ratios to the
plain prefix measured in the same run.

Items are short real texts: package summaries from the environment's PyPI list when it is
there, else LoCoMo turns. Queries are three content words drawn from other items, each used
once, so the query-embedding cache never helps. Baseline in the same run: a brute-force
scan that scores every item with Python's ``in`` over words, the naive memory lookup.

    python benchmarks/prefix_scale.py --sizes 10000,100000 --json docs/results/prefix_scale.json
    python benchmarks/prefix_scale.py --sizes 10000 --encoder ENC --reranker RR --expansion
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from expansion import rocchio, rrf

from suffice import Memory, NewItem, RetrievalConfig, load_encoder, load_reranker
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


def run_size(n: int, n_queries: int, workdir: Path, reuse: Path | None = None,
             embedder: Any = "default", reranker: Any = None, rerank_depths: list[int] | None = None,
             expansion: bool = False) -> dict[str, object]:
    """Ingest ``n`` items (timed) and time prefix queries; ``reuse`` skips ingest if it exists."""
    texts = corpus(n)
    ingest_s: float | None = None
    if reuse is not None and reuse.exists():
        mem = Memory(reuse, embedder=embedder, reranker=reranker)
        if mem.store.max_seq("bench") + 1 != n:
            raise SystemExit(f"{reuse} does not hold {n} items in scope 'bench'")
    else:
        mem = Memory(reuse or workdir / f"scale_{n}.db", embedder=embedder, reranker=reranker)
        t0 = time.perf_counter()
        batch = 512
        for b in range(0, n, batch):
            mem.add([NewItem(text=t, session=f"s{(b + i) // 200}")
                     for i, t in enumerate(texts[b:b + batch])], scope="bench")
        ingest_s = time.perf_counter() - t0
    qs = queries(texts, n_queries)
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
    for q in qs[:20]:
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
    args = ap.parse_args()
    embedder: Any = load_encoder(args.encoder) if args.encoder else "default"
    reranker = load_reranker(args.reranker) if args.reranker else None
    depths = [int(x) for x in args.rerank_depths.split(",")] if reranker else []
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in (int(x) for x in args.sizes.split(",")):
            reuse = args.store_dir / f"render_{n}.db" if args.store_dir else None
            r = run_size(n, args.queries, Path(tmp), reuse, embedder, reranker, depths, args.expansion)
            results.append(r)
            print(json.dumps(r, indent=1), flush=True)
    if args.json:
        doc = envelope("prefix_scale", "pypi-summaries" if PYPI_LIST.exists() else "locomo-turns",
                       str(PYPI_LIST), {"sizes": args.sizes, "queries": args.queries,
                        "encoder": str(args.encoder or "default"),
                        "reranker": str(args.reranker or "none")}, results)
        doc["command"] = "python benchmarks/prefix_scale.py " + " ".join(sys.argv[1:])
        write_json(args.json, doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
