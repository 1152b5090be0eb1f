"""Does a second retrieval round seeded by the first one's hits help multi-hop questions?

The round tried here needs no model call and no second BM25 query: the query vector is moved
toward the mean vector of the first round's top ``m`` fused items (pseudo-relevance feedback,
Rocchio's rule with weight ``beta``), the item vectors are scanned again, and the new cosine
ranking joins BM25 and the first cosine ranking in reciprocal-rank fusion. Reported as
all-evidence-in-B on LoCoMo beside the plain fused prefix fused the same way (top 100 of each).

    python benchmarks/expansion.py --json docs/results/expansion_locomo.json
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from suffice import Memory, load_encoder
from suffice._bench import retrieval as R
from suffice._bench.report import envelope, markdown_table, paired_bootstrap, write_json
from suffice._tokens import count_tokens

BUDGETS = (2000, 4000)


def rrf(lists: list[list[int]], weights: list[float] | None = None, k: int = 60) -> list[int]:
    """Reciprocal-rank fusion of ``lists``, each weighted (default 1), best first."""
    score: dict[int, float] = {}
    for ranking, w in zip(lists, weights or [1.0] * len(lists), strict=True):
        for r, s in enumerate(ranking):
            score[s] = score.get(s, 0.0) + w / (k + r + 1)
    return sorted(score, key=lambda s: -score[s])


def rocchio(matrix: np.ndarray, seqs_all: np.ndarray, qvec: np.ndarray, top: list[int], beta: float,
            depth: int = 100) -> list[int]:
    """The second round: the query vector moved toward the mean of the ``top`` items' vectors,
    every item scored again by cosine, best ``depth`` first."""
    v = qvec + beta * matrix[np.searchsorted(seqs_all, top)].mean(0)
    sims = matrix @ (v / np.linalg.norm(v))
    return [int(seqs_all[i]) for i in np.argsort(-sims)[:depth]]


def gains(ok: dict[str, list[tuple[int, bool]]], base: str) -> dict[str, dict[str, Any]]:
    """Per "name|B" key of (category, all-in) results: the share all-in, overall and for
    multi-hop (category 1), and the paired gain over the ``base`` ranking at the same B."""
    results = {}
    for key, vals in ok.items():
        b = key.split("|")[1]
        ref = ok[f"{base}|{b}"]
        cell: dict[str, Any] = {}
        for group in ("overall", "1"):
            sel = [i for i, (c, _) in enumerate(vals) if group == "overall" or str(c) == group]
            a = [100.0 * vals[i][1] for i in sel]
            z = [100.0 * ref[i][1] for i in sel]
            cell[group] = {"all": float(np.mean(a)), "gain": list(paired_bootstrap(a, z))}
        results[key] = cell
    return results


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--seeds", default="3,5,10", help="values of m")
    ap.add_argument("--betas", default="0.3,0.6,1.0")
    ap.add_argument("--encoder", type=Path, help="a trained encoder folder (default: the shipped one)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    convs = R.load(None)
    variants = [(int(m), float(b)) for m in args.seeds.split(",") for b in args.betas.split(",")]
    ok: dict[str, list[tuple[int, bool]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        mem = Memory(Path(tmp) / "m.db", embedder=load_encoder(args.encoder) if args.encoder else "default")
        for conv in convs:
            mem.add(list(conv.items), scope=conv.scope)
        for conv in convs:
            items = mem.items(scope=conv.scope)
            by_dia = {str(it.meta.get("dia_id")): it.seq for it in items}
            cost = [count_tokens(it.render()) + 1 for it in items]
            n = len(items)
            seqs_all, matrix = mem.retriever.index(conv.scope).vectors()
            for q in conv.questions:
                gold = {by_dia[d] for d in q.evidence if d in by_dia}
                if q.category not in R.CATEGORIES or not gold:
                    continue
                rk = mem.retriever.rank(conv.scope, q.question, mem.retrieval, depth=n)
                assert rk.qvec is not None
                bm: list[int] = list(dict.fromkeys(s for s, _, _ in rk.pieces))[:100]
                dense = [s for s, _ in rk.dense[:100]]
                out = {"fused": rrf([bm, dense])}
                for m, beta in variants:
                    second = rocchio(matrix, seqs_all, rk.qvec, list(rk.seqs[:m]), beta)
                    out[f"expanded m={m} beta={beta}"] = rrf([bm, dense, second])
                for name, ranking in out.items():
                    ranking = R.complete(ranking, n)
                    for b in BUDGETS:
                        hit = gold <= R.fill(ranking, cost, b)
                        ok.setdefault(f"{name}|{b}", []).append((q.category, hit))
        mem.close()
    results = gains(ok, "fused")
    rows = []
    for key, cell in results.items():
        name, b = key.split("|")
        rows.append([name, b, cell["overall"]["all"], cell["1"]["all"],
                     "{:+.1f} [{:+.1f}, {:+.1f}]".format(*cell["1"]["gain"])])
    print(markdown_table(["ranking", "B", "all@B overall", "all@B multi-hop", "multi-hop gain (95%)"], rows))
    if args.json:
        from suffice._datasets.locomo import default_path
        settings = {**vars(args), "encoder": str(args.encoder), "json": str(args.json)}
        doc = envelope("expansion", "locomo", str(default_path()), settings, results)
        doc["command"] = "python benchmarks/expansion.py " + " ".join(sys.argv[1:])
        write_json(args.json, doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
