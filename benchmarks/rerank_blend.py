"""Does a weak cross-encoder help when its order is blended with the prefix's instead of replacing it?

For one fold of the cross-validated run (``--stores DIR``: the stores, encoders and rerankers
kept by ``suffice bench retrieval --folds 4 --rerank --keep DIR``), each held-out question's
trained prefix (dense weight 3) has its first ``n`` items scored by the fold's reranker. Rows:
the prefix, the reranker's order alone (what ``RetrievalConfig.rerank`` does), and weighted RRF
of the two orders. Exploratory (one fold, no variant chosen here).

    python benchmarks/rerank_blend.py --stores DIR --fold 0 --json docs/results/rerank_blend_fold0.json
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

from expansion import rrf

from suffice import Memory, load_encoder, load_reranker
from suffice._bench import retrieval as R
from suffice._bench.report import envelope, markdown_table, paired_bootstrap, write_json
from suffice._bench.rerank import TUNED_RETRIEVAL
from suffice._retrieve import rerank_order
from suffice._text import embedding_text
from suffice._train.pairs import folds
from suffice._types import Item


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--stores", type=Path, required=True)
    ap.add_argument("--fold", type=int, default=0)
    ap.add_argument("--n", type=int, default=20, help="candidates the reranker scores")
    ap.add_argument("--weights", default="0.25,0.5,1")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    convs = R.load(None)
    held = folds([c.scope for c in convs], 4)[args.fold]
    encoder = load_encoder(args.stores / f"encoder_fold{args.fold}")
    mem = Memory(args.stores / f"fold{args.fold}.db", embedder=encoder, retrieval=TUNED_RETRIEVAL,
                 create=False)
    reranker = load_reranker(args.stores / f"reranker_fold{args.fold}")
    got: dict[str, list[dict[str, Any]]] = {}
    histories: dict[str, tuple[list[Item], list[int]]] = {}
    for q in R.locomo_questions(mem, [c for c in convs if c.scope in held], R.CATEGORIES):
        if q.scope not in histories:  # read once per conversation, not per question
            scope_items = mem.items(scope=q.scope, limit=None)
            histories[q.scope] = (scope_items, R.costs(scope_items))
        items, cost = histories[q.scope]
        ranking = R.complete(mem.retriever.rank(q.scope, q.query, mem.retrieval, depth=len(items)).seqs,
                             len(items))
        head = ranking[:args.n]
        ce = reranker.score(q.query, [embedding_text(items[s].speaker, items[s].text) for s in head]).tolist()
        alone = rerank_order(ranking, ce, args.n)
        orders = {"prefix": ranking, f"reranker alone (top {args.n})": alone}
        for w in (float(x) for x in args.weights.split(",")):
            blend = rrf([head, alone[:len(head)]], [1.0, w])
            orders[f"rrf prefix + reranker x{w:g}"] = blend + ranking[args.n:]
        for name, order in orders.items():
            got.setdefault(name, []).append(R.measure(order, q.gold, cost))
    base = [100 * m["recall_at"][5] for m in got["prefix"]]
    rows, results = [], {}
    for name, ms in got.items():
        r5 = [100 * m["recall_at"][5] for m in ms]
        cell = {"n": len(ms), "R@5": statistics.mean(r5),
                "R@10": 100 * statistics.mean(m["recall_at"][10] for m in ms),
                "all@1000": 100 * statistics.mean(m["all_in"][1000] for m in ms),
                "R@5 gain": list(paired_bootstrap(r5, base))}
        results[name] = cell
        rows.append([name, cell["n"], f"{cell['R@5']:.1f}", f"{cell['R@10']:.1f}", f"{cell['all@1000']:.1f}",
                     "{:+.1f} [{:+.1f}, {:+.1f}]".format(*cell["R@5 gain"])])
    print(markdown_table(["order", "questions", "R@5", "R@10", "all@1000", "R@5 gain (95%)"], rows))
    if args.json:
        from suffice._datasets.locomo import default_path
        doc = envelope("rerank_blend", "locomo", str(default_path()),
                       {"fold": args.fold, "n": args.n, "weights": args.weights,
                        "reranker": reranker.name}, results)
        doc["command"] = (f"python benchmarks/rerank_blend.py --stores DIR --fold {args.fold} "
                          f"--json {args.json}")
        write_json(args.json, doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
