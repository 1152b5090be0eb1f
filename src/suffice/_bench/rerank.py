"""Cross-validated reranking: per fold, the trained prefix's first candidates reordered by a
cross-encoder that never saw the held-out conversations.

Each fold reuses (or trains) the fold's dense encoder, trains a reranker on the other folds'
questions, and scores every held-out question once over its first ``max(NS)`` candidates; the
orders for smaller N are read from the same scores, so every row of a fold comes from one
reranker pass, ordered by the ``rerank_order`` the retriever uses.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from .._api import Memory
from .._config import RetrievalConfig
from .._datasets.locomo import LocomoConversation
from .._embed.protocol import Reranker
from .._embed.rerank import load_reranker
from .._retrieve import rerank_order
from .._text import embedding_text
from .._train.encoder import TrainConfig, steps
from .._train.pairs import folds, locomo_pairs, locomo_questions
from .._train.reranker import RerankConfig, export_reranker, train_reranker
from .folds import fold_encoder, held_out_memory, reusable, ticker
from .report import paired_bootstrap
from .retrieval import BUDGETS, CATEGORIES, compact, complete, costs, measure, score, summarise

NS = (10, 20, 30)
"""Prefix depths reordered by the reranker, one row each."""
TUNED_RETRIEVAL = RetrievalConfig(dense_weight=3.0)
"""The trained prefix as recommended in docs/benchmarks.md section 6."""


def fold_reranker(base: Memory, train_convs: Sequence[LocomoConversation], held: Sequence[str], f: int,
                  k: int, workdir: Path, config: RerankConfig, hard: int,
                  progress: Callable[[str, int, int], None] | None = None) -> tuple[Path, dict[str, Any]]:
    """Fold ``f``'s reranker in ``workdir/reranker_fold{f}``, reused when trained on the same
    conversations."""
    out = workdir / f"reranker_fold{f}"
    trained_on = sorted(c.scope for c in train_convs)
    card = reusable(out, trained_on, held)
    if card:
        return out, {"reused": card["name"], "pairs": card.get("pairs"), "train_s": card.get("train_s")}
    pairs = [p for p in locomo_pairs(base, train_convs, hard=hard, seed=100 + f) if p.negatives]
    tick = ticker(progress, f"fold {f + 1}/{k} reranker", steps(len(pairs), config))
    model, report = train_reranker(pairs, config, tick)
    export_reranker(model, out, {
        "name_prefix": f"minilm-rerank-locomo-fold{f}", "trained_on": trained_on, "held_out": sorted(held),
        "pairs": len(pairs), "hard_negatives": hard, "steps": report.steps,
        "train_s": round(report.seconds, 1),
        "licence": "trained on LoCoMo (CC BY-NC 4.0): non-commercial use only"})
    return out, {"pairs": len(pairs), **report.summary()}


def score_reranked(mem: Memory, convs: Sequence[LocomoConversation], reranker: Reranker,
                   ns: Sequence[int] = NS, progress: Callable[[int], None] | None = None
                   ) -> tuple[list[dict[str, Any]], float, int]:
    """Records with "fused-tuned" and "fused-tuned+rerank{N}" entries; seconds the reranker
    spent, and candidates it scored."""
    records: list[dict[str, Any]] = []
    spent, scored = 0.0, 0
    for conv in convs:
        items = mem.items(scope=conv.scope, limit=None)
        cost = costs(items)
        depth = len(cost)
        texts = [embedding_text(it.speaker, it.text) for it in items]
        for q in locomo_questions(mem, [conv], CATEGORIES):
            ranking = complete(mem.retriever.rank(conv.scope, q.query, mem.retrieval,
                                                  method="fused", depth=depth).seqs, depth)
            head = ranking[:max(ns)]
            t = time.perf_counter()
            ce = reranker.score(q.query, [texts[s] for s in head])
            spent += time.perf_counter() - t
            scored += len(head)
            rec: dict[str, Any] = {"scope": conv.scope, "q": q.index, "category": q.category,
                                   "fused-tuned": measure(ranking, q.gold, cost)}
            for n in ns:
                rec[f"fused-tuned+rerank{n}"] = measure(rerank_order(ranking, ce.tolist(), n), q.gold, cost)
            records.append(rec)
            if progress is not None:
                progress(1)
    return records, spent, scored


def run(base: Memory, convs: Sequence[LocomoConversation], k: int, workdir: Path, *,
        encoder_config: TrainConfig | None = None, config: RerankConfig | None = None, hard: int = 7,
        progress: Callable[[str, int, int], None] | None = None) -> dict[str, Any]:
    """``base`` holds every conversation embedded with the default encoder (the untrained
    prefix, and the miner of hard negatives)."""
    config = config or RerankConfig()
    base_records, _ = score(base, convs, ("fused",))
    held: list[dict[str, Any]] = []
    fold_info = []
    spent, scored = 0.0, 0
    for f, held_out in enumerate(folds([c.scope for c in convs], k)):
        train_convs = [c for c in convs if c.scope not in held_out]
        test_convs = [c for c in convs if c.scope in held_out]
        t0 = time.perf_counter()
        enc_dir, enc_info = fold_encoder(base, train_convs, held_out, f, k, workdir,
                                         encoder_config or TrainConfig(), 4, progress)
        rr_dir, rr_info = fold_reranker(base, train_convs, held_out, f, k, workdir, config, hard, progress)
        mem = held_out_memory(workdir, f, enc_dir, test_convs, retrieval=TUNED_RETRIEVAL)
        n_questions = len(locomo_questions(mem, test_convs, CATEGORIES))
        tick = ticker(progress, f"fold {f + 1}/{k} scoring", n_questions)
        recs, s, c = score_reranked(mem, test_convs, load_reranker(rr_dir), NS, tick)
        mem.close()
        spent, scored = spent + s, scored + c
        held += recs
        fold_info.append({"held_out": held_out, "encoder": enc_info, "reranker": rr_info,
                          "wall_s": time.perf_counter() - t0})
    by_key = {(r["scope"], r["q"]): r for r in held}
    for r in base_records:
        r.update({m: v for m, v in by_key[(r["scope"], r["q"])].items() if m not in r})
    methods = ["fused", "fused-tuned", *(f"fused-tuned+rerank{n}" for n in NS)]
    return {"methods": summarise(base_records, methods), "folds": fold_info, "k": k,
            "retrieval": TUNED_RETRIEVAL.model_dump(),
            "rerank_config": {f: getattr(config, f) for f in config.__dataclass_fields__},
            "rerank_ms_per_candidate": 1e3 * spent / max(1, scored),
            "paired": gains(base_records), "questions": len(base_records),
            "records_compact": compact(base_records, methods)}


def gains(records: Sequence[dict[str, Any]]) -> dict[str, dict[str, list[float]]]:
    """Each reranked row against the trained prefix it reorders and against the untrained
    prefix: mean gain in points with a 95% paired bootstrap interval."""
    out: dict[str, dict[str, list[float]]] = {}
    pairs = [(f"fused-tuned+rerank{n}", ref) for n in NS for ref in ("fused-tuned", "fused")]
    for a_name, b_name in [("fused-tuned", "fused"), *pairs]:
        cells = out.setdefault(f"{a_name} vs {b_name}", {})
        for c in ("overall", *map(str, CATEGORIES)):
            sel = [r for r in records if c == "overall" or str(r["category"]) == c]
            for b in BUDGETS:
                a = [100.0 * r[a_name]["all_in"][b] for r in sel]
                z = [100.0 * r[b_name]["all_in"][b] for r in sel]
                cells[f"{c} all@{b}"] = list(paired_bootstrap(a, z))
    return out
