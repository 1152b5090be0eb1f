"""Retrieval benchmark: does the shared prefix put the gold evidence where a reader sees it?

For each question (LoCoMo categories 1-4 with evidence) and each method (bm25, dense, fused,
recency) it reports evidence recall@k over items, and the share of questions whose gold items
all land in a B-token context filled greedily from the ranking. The fill skips an item that
does not fit and keeps going (measured better than stopping on long-turn histories).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._api import Memory
from .._datasets.locomo import LocomoConversation, load_locomo
from .._retrieve import Method
from .._tokens import count_tokens, fill_in_order

METHODS: tuple[Method, ...] = ("bm25", "dense", "fused", "recency")
KS = (5, 10, 20)
BUDGETS = (1000, 2000, 4000, 8000)
CATEGORIES = (1, 2, 3, 4)


@dataclass
class Tally:
    n: int = 0
    recall_at: dict[int, float] = field(default_factory=dict)
    all_in: dict[int, float] = field(default_factory=dict)
    recall_in: dict[int, float] = field(default_factory=dict)

    def add(self, recall_at: dict[int, float], all_in: dict[int, bool], recall_in: dict[int, float]) -> None:
        self.n += 1
        for k, v in recall_at.items():
            self.recall_at[k] = self.recall_at.get(k, 0.0) + v
        for b, ok in all_in.items():
            self.all_in[b] = self.all_in.get(b, 0.0) + (1.0 if ok else 0.0)
        for b, v in recall_in.items():
            self.recall_in[b] = self.recall_in.get(b, 0.0) + v

    def summary(self) -> dict[str, float]:
        d = max(self.n, 1)
        out: dict[str, float] = {"n": float(self.n)}
        out.update({f"recall@{k}": 100 * v / d for k, v in sorted(self.recall_at.items())})
        out.update({f"all@{b}": 100 * v / d for b, v in sorted(self.all_in.items())})
        out.update({f"recall_in@{b}": 100 * v / d for b, v in sorted(self.recall_in.items())})
        return out


def fill(ranking: Sequence[int], cost: Sequence[int], budget: int) -> set[int]:
    """Items of ``ranking`` taken in order while they fit (``cost`` is indexed by seq)."""
    taken = fill_in_order((cost[seq] for seq in ranking), budget, min_cost=min(cost, default=0))
    return {ranking[i] for i in taken}


def complete(ranking: Sequence[int], n: int) -> list[int]:
    """``ranking`` followed by the items of ``0..n-1`` it left out (no BM25 term match, past a
    depth), newest first: every method then orders the whole history."""
    seen = set(ranking)
    return [*ranking, *(s for s in range(n - 1, -1, -1) if s not in seen)]


def score(mem: Memory, convs: Sequence[LocomoConversation], methods: Sequence[Method] = METHODS,
          progress: Callable[[int], None] | None = None) -> tuple[list[dict[str, Any]], dict[str, float]]:
    """One record per question (scope, question index, category; per method: recall@k, all@B,
    recall_in@B) and the seconds each method spent ranking."""
    records: list[dict[str, Any]] = []
    times: dict[str, float] = {m: 0.0 for m in methods}
    for conv in convs:
        scope = conv.scope
        items = mem.items(scope=scope)
        by_dia = {str(it.meta.get("dia_id")): it.seq for it in items}
        cost = [count_tokens(it.render()) + 1 for it in items]
        depth = len(items)
        for qi, q in enumerate(conv.questions):
            if q.category not in CATEGORIES or not q.evidence:
                continue
            gold = {by_dia[d] for d in q.evidence if d in by_dia}
            if not gold:
                continue
            rec: dict[str, Any] = {"scope": scope, "q": qi, "category": q.category}
            for m in methods:
                t = time.perf_counter()
                ranking = complete(mem.retriever.rank(scope, q.question, mem.retrieval,
                                                      method=m, depth=depth).seqs, depth)
                times[m] += time.perf_counter() - t
                filled = {b: fill(ranking, cost, b) for b in BUDGETS}
                rec[m] = {"recall_at": {k: len(gold & set(ranking[:k])) / len(gold) for k in KS},
                          "all_in": {b: gold <= filled[b] for b in BUDGETS},
                          "recall_in": {b: len(gold & filled[b]) / len(gold) for b in BUDGETS}}
            records.append(rec)
            if progress is not None:
                progress(1)
    return records, times


def summarise(records: Sequence[dict[str, Any]],
              methods: Sequence[str]) -> dict[str, dict[str, dict[str, float]]]:
    tallies = {m: {c: Tally() for c in ("overall", *map(str, CATEGORIES))} for m in methods}
    for rec in records:
        for m in methods:
            r = rec[m]
            for c in ("overall", str(rec["category"])):
                tallies[m][c].add(r["recall_at"], r["all_in"], r["recall_in"])
    return {m: {c: t.summary() for c, t in cats.items()} for m, cats in tallies.items()}


def run(mem: Memory, convs: Sequence[LocomoConversation],
        progress: Callable[[int], None] | None = None) -> dict[str, Any]:
    records, times = score(mem, convs, METHODS, progress)
    n = len(records)
    return {
        "methods": summarise(records, METHODS),
        "ms_per_query": {m: 1e3 * times[m] / max(n, 1) for m in METHODS},
        "questions": n,
        "ks": list(KS),
        "budgets": list(BUDGETS),
    }


def count_questions(convs: Sequence[LocomoConversation]) -> int:
    return sum(1 for c in convs for q in c.questions if q.category in CATEGORIES and q.evidence)


def load(data: str | Path | None) -> list[LocomoConversation]:
    return load_locomo(data)


def format_results(res: dict[str, Any]) -> str:
    from .report import markdown_table

    header = ["method", "category", "n", *[f"R@{k}" for k in KS], *[f"all@{b}" for b in BUDGETS]]
    rows = []
    for m, cats in res["methods"].items():
        for c in ("1", "2", "3", "4", "overall"):
            s = cats[c]
            rows.append([m, c, int(s["n"]), *[s[f"recall@{k}"] for k in KS],
                         *[s[f"all@{b}"] for b in BUDGETS]])
    return markdown_table(header, rows)
