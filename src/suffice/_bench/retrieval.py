"""Retrieval benchmark: does the shared prefix put the gold evidence where a reader sees it?

For each question (LoCoMo categories 1-4 with evidence) and each method (bm25, dense, fused,
recency) it reports evidence recall@k over items, and the share of questions whose gold items
all land in a B-token context filled greedily from the ranking. The fill skips an item that
does not fit and keeps going (measured better than stopping on long-turn histories).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._api import Memory
from .._datasets.locomo import LocomoConversation, load_locomo
from .._errors import InvalidInputError
from .._retrieve import Method
from .._tokens import count_tokens, fill_in_order
from .._train.pairs import Question, locomo_questions
from .._types import Item, NewItem
from .report import paired_bootstrap

METHODS: tuple[Method, ...] = ("bm25", "dense", "fused", "recency")
KS = (5, 10, 20)
BUDGETS = (1000, 2000, 4000, 8000)
CATEGORIES = (1, 2, 3, 4)
TUNED: tuple[Method, ...] = ("dense", "fused")
"""Methods a trained encoder changes."""


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


def measure(ranking: Sequence[int], gold: Sequence[Collection[int]], cost: Sequence[int]) -> dict[str, Any]:
    """One question's figures for one ranking of the whole history. ``gold`` holds the pieces of
    evidence, each present when any of its items is: recall@k, whether every piece is in a
    B-token context filled from the ranking, and the share of pieces that is."""
    def share(seen: set[int]) -> float:
        return sum(1 for g in gold if seen.intersection(g)) / len(gold)
    out: dict[str, Any] = {"recall_at": {k: share(set(ranking[:k])) for k in KS}}
    filled = {b: share(fill(ranking, cost, b)) for b in BUDGETS}
    out["all_in"] = {b: v == 1.0 for b, v in filled.items()}
    out["recall_in"] = filled
    return out


def costs(items: Sequence[Item]) -> list[int]:
    """Each item's tokens in a context (``items`` are a whole scope, so the list is indexed by seq)."""
    return [count_tokens(it.render()) + 1 for it in items]


def evaluate(mem: Memory, questions: Sequence[Question], methods: Sequence[Method] = METHODS,
             progress: Callable[[int], None] | None = None) -> tuple[list[dict[str, Any]], dict[str, float]]:
    """One record per question (scope, question index, category; per method: recall@k, all@B,
    recall_in@B) and the seconds each method spent ranking."""
    records: list[dict[str, Any]] = []
    times: dict[str, float] = {m: 0.0 for m in methods}
    cost: dict[str, list[int]] = {}
    for q in questions:
        if q.scope not in cost:
            cost[q.scope] = costs(mem.items(scope=q.scope, limit=None))
        depth = len(cost[q.scope])
        rec: dict[str, Any] = {"scope": q.scope, "q": q.index, "category": q.category}
        for m in methods:
            t = time.perf_counter()
            ranking = complete(mem.retriever.rank(q.scope, q.query, mem.retrieval, method=m,
                                                  depth=depth).seqs, depth)
            times[m] += time.perf_counter() - t
            rec[m] = measure(ranking, q.gold, cost[q.scope])
        records.append(rec)
        if progress is not None:
            progress(1)
    return records, times


def score(mem: Memory, convs: Sequence[LocomoConversation], methods: Sequence[Method] = METHODS,
          progress: Callable[[int], None] | None = None) -> tuple[list[dict[str, Any]], dict[str, float]]:
    """``evaluate`` on LoCoMo's questions of categories 1-4 with evidence."""
    return evaluate(mem, locomo_questions(mem, convs, CATEGORIES), methods, progress)


def summarise(records: Sequence[dict[str, Any]],
              methods: Sequence[str]) -> dict[str, dict[str, dict[str, float]]]:
    cats = sorted({str(r["category"]) for r in records})
    tallies = {m: {c: Tally() for c in ("overall", *cats)} for m in methods}
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


DATASETS = ("locomo", "beam", "ama", "hotpotqa", "hotpotqa-train")


@dataclass(frozen=True)
class EvidenceSet:
    """A dataset as histories to ingest (scope, items) and a way to read its evidence-annotated
    questions off a memory that holds them."""

    name: str
    source: str
    histories: list[tuple[str, list[NewItem]]]
    questions: Callable[[Memory], list[Question]]


def load_set(dataset: str, data: str | Path | None = None) -> EvidenceSet:
    """One of ``DATASETS`` from ``data`` (default: the shared copy)."""
    if dataset == "locomo":
        from .._datasets.locomo import default_path as locomo_path
        convs = load_locomo(data)
        return EvidenceSet(dataset, str(data or locomo_path()), [(c.scope, list(c.items)) for c in convs],
                           lambda mem: locomo_questions(mem, convs, CATEGORIES))
    if dataset == "beam":
        from .._datasets.beam import default_path as beam_path
        from .._datasets.beam import load_beam
        from .._train.pairs import beam_questions
        beam = load_beam(data)
        return EvidenceSet(dataset, str(data or beam_path()), [(c.scope, list(c.items)) for c in beam],
                           lambda mem: beam_questions(mem, beam))
    if dataset == "ama":
        from .._datasets.ama import default_path as ama_path
        from .._datasets.ama import load_ama
        from .._train.pairs import ama_questions
        eps = load_ama(data)
        return EvidenceSet(dataset, str(data or ama_path()), [(e.scope, list(e.items)) for e in eps],
                           lambda mem: ama_questions(mem, eps))
    if dataset in ("hotpotqa", "hotpotqa-train"):
        from .._datasets.hotpotqa import default_path as hotpot_path
        from .._datasets.hotpotqa import items_of, load_hotpotqa
        from .._train.pairs import hotpot_questions
        split = "train" if dataset == "hotpotqa-train" else "dev"
        entries = load_hotpotqa(data, split)
        prefix = f"hotpot-{split}"
        return EvidenceSet(dataset, str(data or hotpot_path(split)),
                           [(f"{prefix}-{n}", items_of(e)) for n, e in enumerate(entries)],
                           lambda mem: hotpot_questions(mem, entries, prefix))
    raise InvalidInputError(f"unknown dataset {dataset!r}; use one of {', '.join(DATASETS)}")


def run_set(mem: Memory, questions: Sequence[Question], tuned: Memory | None = None,
            progress: Callable[[int], None] | None = None) -> dict[str, Any]:
    """``evaluate`` every method on ``mem``; with ``tuned`` (the same histories embedded by a
    trained encoder), also its dense and fused rankings as "-tuned" rows, with paired gains."""
    records, times = evaluate(mem, questions, METHODS, progress)
    methods: list[str] = list(METHODS)
    res: dict[str, Any] = {"questions": len(records), "ks": list(KS), "budgets": list(BUDGETS),
                           "ms_per_query": {m: 1e3 * times[m] / max(len(records), 1) for m in METHODS}}
    if tuned is not None:
        extra, _ = evaluate(tuned, questions, ("dense", "fused"), progress)
        for r, e in zip(records, extra, strict=True):
            r["dense-tuned"], r["fused-tuned"] = e["dense"], e["fused"]
        methods += ["dense-tuned", "fused-tuned"]
        res["paired"] = paired_gains(records)
        res["records_compact"] = compact(records, methods)
    res["methods"] = summarise(records, methods)
    return res


def format_results(res: dict[str, Any]) -> str:
    from .report import markdown_table

    header = ["method", "category", "n", *[f"R@{k}" for k in KS], *[f"all@{b}" for b in BUDGETS]]
    rows = []
    for m, cats in res["methods"].items():
        for c in (*sorted(k for k in cats if k != "overall"), "overall"):
            s = cats[c]
            rows.append([m, c, int(s["n"]), *[s[f"recall@{k}"] for k in KS],
                         *[s[f"all@{b}"] for b in BUDGETS]])
    return markdown_table(header, rows)


def compact(records: Sequence[dict[str, Any]], methods: Sequence[str]) -> dict[str, Any]:
    """Per question, all-evidence-in-B of each method as one string of bits (one per budget):
    enough to recompute every all@B figure and interval, at a twentieth of the size."""
    budgets = "/".join(map(str, BUDGETS))
    return {"fields": ["scope", "q", "category", *(f"{m} all@{budgets}" for m in methods)],
            "rows": [[r["scope"], r["q"], r["category"],
                      *("".join("1" if r[m]["all_in"][b] else "0" for b in BUDGETS) for m in methods)]
                     for r in records]}


def paired_gains(records: Sequence[dict[str, Any]]) -> dict[str, dict[str, list[float]]]:
    """Tuned minus untrained, per question, all-evidence-in-B: mean and 95% bootstrap interval
    in points, overall and per category."""
    out: dict[str, dict[str, list[float]]] = {}
    for m in TUNED:
        for c in ("overall", *sorted({str(r["category"]) for r in records})):
            sel = [r for r in records if c == "overall" or str(r["category"]) == c]
            for b in BUDGETS:
                a = [100.0 * r[f"{m}-tuned"]["all_in"][b] for r in sel]
                z = [100.0 * r[m]["all_in"][b] for r in sel]
                out.setdefault(f"{m}-tuned vs {m}", {})[f"{c} all@{b}"] = list(paired_bootstrap(a, z))
    return out
