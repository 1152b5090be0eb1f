"""Which fusion suits a trained encoder? Chosen per fold on the other folds, judged on its own.

Reads the fold stores and encoders that ``suffice bench retrieval --folds K --keep DIR`` kept
(``DIR/fold<f>.db`` holds fold f's held-out conversations, embedded by the encoder that never
saw them). Every variant ranks every question once. Then, for each fold, the variant with the
best mean all@2000 + all@4000 on the *other* folds' questions is applied to this fold's
questions, so no question helps choose the setting it is judged with.

    python benchmarks/fusion_cv.py --keep DIR --json docs/results/fusion_cv.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

from expansion import rrf

from suffice import Memory, load_encoder
from suffice._bench import retrieval as R
from suffice._bench.report import envelope, markdown_table, paired_bootstrap, write_json
from suffice._tokens import count_tokens

WEIGHTS = (0.0, 1.0, 1.5, 2.0, 3.0, None)  # dense weight in RRF; None: dense alone
BUDGETS = (1000, 2000, 4000, 8000)


def name(w: float | None) -> str:
    return "dense only" if w is None else "bm25 only" if w == 0.0 else f"rrf dense x{w:g}"


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--keep", type=Path, required=True)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    convs = {c.scope: c for c in R.load(None)}
    rows: list[dict[str, Any]] = []  # one per question: fold, category, all@B per variant
    for card in sorted(args.keep.glob("encoder_fold*/card.json")):
        fold = int(card.parent.name.removeprefix("encoder_fold"))
        held = json.loads(card.read_text(encoding="utf-8"))["held_out"]
        mem = Memory(args.keep / f"fold{fold}.db", embedder=load_encoder(card.parent), create=False)
        for scope in held:
            items = mem.items(scope=scope, limit=None)
            by_dia = {str(it.meta.get("dia_id")): it.seq for it in items}
            cost = [count_tokens(it.render()) + 1 for it in items]
            n = len(items)
            for q in convs[scope].questions:
                gold = {by_dia[d] for d in q.evidence if d in by_dia}
                if q.category not in R.CATEGORIES or not gold:
                    continue
                rk = mem.retriever.rank(scope, q.question, mem.retrieval, depth=n)
                bm = list(dict.fromkeys(s for s, _, _ in rk.pieces))[:100]
                dense = [s for s, _ in rk.dense[:100]]
                row: dict[str, Any] = {"fold": fold, "category": q.category}
                for w in WEIGHTS:
                    ranking = dense if w is None else rrf([bm, dense], [1.0, w])
                    ranking = R.complete(ranking, n)
                    row[name(w)] = {b: gold <= R.fill(ranking, cost, b) for b in BUDGETS}
                rows.append(row)
        mem.close()
    folds = sorted({r["fold"] for r in rows})
    chosen: dict[int, str] = {}
    for f in folds:
        others = [r for r in rows if r["fold"] != f]
        chosen[f] = max((name(w) for w in WEIGHTS),
                        key=lambda v: statistics.mean(r[v][2000] + r[v][4000] for r in others))
    table = []
    results: dict[str, Any] = {"chosen_per_fold": chosen}
    picks: list[tuple[str, Any]] = [(name(w), None) for w in WEIGHTS]
    picks.append(("chosen on the other folds", "chosen"))
    for label, how in picks:
        def pick(r: dict[str, Any], _label: str = label, _how: Any = how) -> str:
            return chosen[r["fold"]] if _how == "chosen" else _label
        cells = {}
        for group in ("overall", "1"):
            sel = [r for r in rows if group == "overall" or str(r["category"]) == group]
            for b in BUDGETS:
                a = [100.0 * r[pick(r)][b] for r in sel]
                z = [100.0 * r[name(1.0)][b] for r in sel]
                cells[f"{group} all@{b}"] = [sum(a) / len(a), *paired_bootstrap(a, z)]
        results[label] = cells
        table.append([label, *(f"{cells[f'overall all@{b}'][0]:.1f}" for b in BUDGETS),
                      *(f"{cells[f'1 all@{b}'][0]:.1f}" for b in (2000, 4000))])
    header = ["ranking", *(f"all@{b}" for b in BUDGETS), "multi-hop @2k", "multi-hop @4k"]
    print(markdown_table(header, table))
    print("chosen per fold:", chosen)
    if args.json:
        doc = envelope("fusion_cv", "locomo", "../shared/data/locomo/locomo_shared.json",
                       {"weights": [name(w) for w in WEIGHTS]}, results)
        doc["command"] = f"python benchmarks/fusion_cv.py --keep DIR --json {args.json}"
        write_json(args.json, doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
