"""Render latency at 10k and 100k short items, B = 8000, query embedding included.

Items are short real texts (package summaries from the environment's PyPI list when it is there,
else LoCoMo turns), 200 per session, as in ``prefix_scale.py``. Each query (three content words
from another item) is used once, so the query-embedding cache never helps. Baseline in the same
run: prefix-ranked greedy fill, i.e. the shared prefix's fused hits rendered as item lines and
taken in rank order while they fit B, the simplest budgeted context the library could hand over.

    python benchmarks/render_scale.py --sizes 10000,100000 --json docs/results/render_scale.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from prefix_scale import PYPI_LIST, corpus, queries

from suffice import Memory, NewItem
from suffice._bench.report import envelope, percentile, write_json
from suffice._tokens import count_tokens, fill_in_order


def prefix_fill(mem: Memory, scope: str, query: str, budget: int) -> str:
    """The fused prefix, deep enough to fill ``budget``, greedily packed as item lines."""
    ev = mem.search(query, scope=scope, k=max(100, budget // 16))
    lines = [hit.item.render() for hit in ev.hits]
    return "\n".join(lines[i] for i in fill_in_order((count_tokens(x) + 1 for x in lines), budget))


def build(n: int, workdir: Path) -> tuple[Memory, list[str], float]:
    """The store of ``n`` items (reused when ``workdir`` already holds it) and its texts."""
    texts = corpus(n)
    mem = Memory(workdir / f"render_{n}.db")
    t0 = time.perf_counter()
    have = mem.store.max_seq("bench") + 1
    for b in range(have, n, 512):
        mem.add([NewItem(text=t, session=f"s{(b + i) // 200}") for i, t in enumerate(texts[b:b + 512])],
                scope="bench")
    return mem, texts, time.perf_counter() - t0


def run_size(n: int, n_queries: int, budget: int, workdir: Path, modes: list[str]) -> dict[str, object]:
    mem, texts, ingest_s = build(n, workdir)
    qs = queries(texts, n_queries * (len(modes) + 1), seed=23)
    mem.render("warm up the caches", budget, scope="bench")
    prefix_fill(mem, "bench", "warm up the caches", budget)
    out: dict[str, object] = {"items": n, "units": len(mem.retriever.index("bench").views.units),
                              "records": len(mem.store.records("bench")), "budget": budget,
                              "queries": n_queries, "ingest_s": ingest_s}
    for mi, mode in enumerate(modes):
        totals: list[float] = []
        stages: dict[str, list[float]] = {}
        tokens: list[int] = []
        for q in qs[mi * n_queries:(mi + 1) * n_queries]:
            t = time.perf_counter()
            ctx = mem.render(q, budget, scope="bench", mode=mode)  # type: ignore[arg-type]
            totals.append((time.perf_counter() - t) * 1e3)
            tokens.append(ctx.tokens)
            for k, v in ctx.timings_ms.items():
                if k != "total_ms":
                    stages.setdefault(k, []).append(v)
        out[f"render_{mode}"] = {"p50_ms": statistics.median(totals), "p95_ms": percentile(totals, 0.95),
                                 "mean_tokens": statistics.mean(tokens),
                                 "stage_p50_ms": {k: statistics.median(v) for k, v in stages.items()}}
    base: list[float] = []
    for q in qs[len(modes) * n_queries:]:
        t = time.perf_counter()
        prefix_fill(mem, "bench", q, budget)
        base.append((time.perf_counter() - t) * 1e3)
    out["prefix_fill"] = {"p50_ms": statistics.median(base), "p95_ms": percentile(base, 0.95)}
    first = out[f"render_{modes[0]}"]
    assert isinstance(first, dict)
    out["ratio_render_to_prefix_fill_p50"] = first["p50_ms"] / statistics.median(base)
    mem.close()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--sizes", default="10000,100000")
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--budget", type=int, default=8000)
    ap.add_argument("--modes", default="unit,piece,unit+piece")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--store-dir", type=Path, help="Keep and reuse the stores here (default: temporary).")
    ap.add_argument("--build-only", action="store_true", help="Build the stores and stop.")
    args = ap.parse_args()
    modes = args.modes.split(",")
    sizes = [int(x) for x in args.sizes.split(",")]
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        workdir = args.store_dir or Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        if args.build_only:
            for n in sizes:
                mem, _texts, secs = build(n, workdir)
                mem.close()
                print(f"{n} items in {secs:.0f} s", flush=True)
            return 0
        for n in sizes:
            r = run_size(n, args.queries, args.budget, workdir, modes)
            results.append(r)
            print(json.dumps(r, indent=1), flush=True)
    if args.json:
        doc = envelope("render_scale", "pypi-summaries" if PYPI_LIST.exists() else "locomo-turns",
                       str(PYPI_LIST), {"sizes": args.sizes, "queries": args.queries,
                                        "budget": args.budget, "modes": modes}, results)
        doc["command"] = "python benchmarks/render_scale.py " + " ".join(sys.argv[1:])
        write_json(args.json, doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
