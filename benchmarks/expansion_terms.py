"""A second retrieval round seeded by the words of the first round's hits, on the trained prefix.

The first round is the library's fused prefix with a fold encoder that never saw the
conversation (``--stores DIR``: the stores and encoders kept by ``suffice bench retrieval
--folds 4 --keep DIR``) at ``dense_weight=3``. The second round is one more BM25 query: the
question's content words plus the names, numbers and rarer words of the first round's top ``m``
items (speakers included), at most ``t`` of them, most frequent first. Its ranking joins the
first round's BM25 and dense rankings in weighted RRF. No model call; the same question is never
used to choose a variant and to judge it (every variant is reported, none is picked here).

    python benchmarks/expansion_terms.py --stores DIR --json docs/results/expansion_terms_locomo.json
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter
from pathlib import Path

from expansion import gains, rrf

from suffice import Memory, RetrievalConfig, load_encoder
from suffice._bench import retrieval as R
from suffice._bench.report import envelope, markdown_table, write_json
from suffice._text import STOPWORDS, query_terms
from suffice._train.pairs import folds
from suffice._types import Filter, Item

BUDGETS = (2000, 4000)
NAME = re.compile(r"\b(?:[A-Z][a-z]{2,}|\d{2,4})\b")


def seed_terms(texts: list[str], question: list[str], t: int) -> list[str]:
    """Up to ``t`` words of the hits that the question lacks: capitalised words and numbers
    first (names, years, dates), most frequent first."""
    names: Counter[str] = Counter()
    for x in texts:
        for w in NAME.findall(x):
            w = w.lower()
            if w not in STOPWORDS and w not in question:
                names[w] += 1
    return [w for w, _ in names.most_common(t)]


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--stores", type=Path, required=True)
    ap.add_argument("--seeds", default="3,5")
    ap.add_argument("--terms", default="4,8")
    ap.add_argument("--weights", default="0.5,1")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    convs = R.load(None)
    variants = [(int(m), int(t), float(w)) for m in args.seeds.split(",") for t in args.terms.split(",")
                for w in args.weights.split(",")]
    config = RetrievalConfig(dense_weight=3.0)
    ok: dict[str, list[tuple[int, bool]]] = {}
    histories: dict[str, tuple[list[Item], list[int]]] = {}
    for f, held in enumerate(folds([c.scope for c in convs], 4)):
        mem = Memory(args.stores / f"fold{f}.db", embedder=load_encoder(args.stores / f"encoder_fold{f}"),
                     create=False)
        for q in R.locomo_questions(mem, [c for c in convs if c.scope in held], R.CATEGORIES):
            if q.scope not in histories:  # read once per conversation, not per question
                scope_items = mem.items(scope=q.scope, limit=None)
                histories[q.scope] = (scope_items, R.costs(scope_items))
            items, cost = histories[q.scope]
            n = len(items)
            rk = mem.retriever.rank(q.scope, q.query, config, depth=n)
            bm = list(dict.fromkeys(s for s, _, _ in rk.pieces))[:100]
            dense = [s for s, _ in rk.dense[:100]]
            out = {"fused (dense x3)": rrf([bm, dense], [1.0, 3.0])}
            qt = query_terms(q.query)
            for m, t, w in variants:
                hits = [f"{items[s].speaker} {items[s].text}" for s in rk.seqs[:m]]
                extra = seed_terms(hits, qt, t)
                pieces = mem.store.bm25(q.scope, qt + extra, 300, Filter(before_seq=n)) if extra else []
                second = list(dict.fromkeys(s for s, _, _ in pieces))[:100]
                out[f"terms m={m} t={t} w={w:g}"] = rrf([bm, dense, second], [1.0, 3.0, w])
            for name, ranking in out.items():
                ranking = R.complete(ranking, n)
                got = R.measure(ranking, q.gold, cost)["all_in"]
                for b in BUDGETS:
                    ok.setdefault(f"{name}|{b}", []).append((int(q.category), got[b]))
        mem.close()
    results = gains(ok, "fused (dense x3)")
    rows = []
    for key, cell in results.items():
        name, b = key.split("|")
        fmt = "{:+.1f} [{:+.1f}, {:+.1f}]"
        rows.append([name, b, f"{cell['overall']['all']:.1f}", fmt.format(*cell["overall"]["gain"]),
                     f"{cell['1']['all']:.1f}", fmt.format(*cell["1"]["gain"])])
    print(markdown_table(["ranking", "B", "all@B", "gain", "multi-hop all@B", "multi-hop gain"], rows))
    if args.json:
        from suffice._datasets.locomo import default_path
        doc = envelope("expansion_terms", "locomo", str(default_path()),
                       {"seeds": args.seeds, "terms": args.terms, "weights": args.weights}, results)
        doc["command"] = "python benchmarks/expansion_terms.py --stores DIR --json " + str(args.json)
        write_json(args.json, doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
