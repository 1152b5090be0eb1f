"""Cross-validated retrieval: train an encoder on K-1 folds of conversations, judge it on the
held-out fold, and put every held-out question's result beside the untrained prefix's.

Every figure this produces for a trained model is on conversations the model never saw, neither
as positives nor as hard negatives. Hard negatives are mined with the untrained fused prefix.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from .._api import Memory
from .._datasets.locomo import LocomoConversation
from .._embed.minilm import load_encoder
from .._retrieve import Method
from .._train.encoder import TrainConfig, export, steps, train
from .._train.pairs import folds, locomo_pairs
from .report import paired_bootstrap
from .retrieval import BUDGETS, CATEGORIES, METHODS, score, summarise

TUNED: tuple[Method, ...] = ("dense", "fused")


def run(base: Memory, convs: Sequence[LocomoConversation], k: int, workdir: Path, *,
        config: TrainConfig | None = None, hard: int = 4,
        progress: Callable[[str, int, int], None] | None = None) -> dict[str, Any]:
    """``base`` holds every conversation (one scope each) embedded with the default encoder.
    ``progress(stage, done, total)`` is called as training steps and questions complete."""
    config = config or TrainConfig()
    base_records, _ = score(base, convs, METHODS)
    held_records: list[dict[str, Any]] = []
    fold_info = []
    for f, held in enumerate(folds([c.scope for c in convs], k)):
        train_convs = [c for c in convs if c.scope not in held]
        test_convs = [c for c in convs if c.scope in held]
        t0 = time.perf_counter()
        pairs = locomo_pairs(base, train_convs, hard=hard, seed=f)
        total = steps(len(pairs), config)
        done = [0]

        def tick(n: int, _total: int = total, _f: int = f, _done: list[int] = done) -> None:
            _done[0] += n
            if progress is not None:
                progress(f"fold {_f + 1}/{k} training", _done[0], _total)

        model, report = train(pairs, config, tick)
        enc_dir = export(model, workdir / f"encoder_fold{f}", {
            "name_prefix": f"minilm-locomo-fold{f}", "trained_on": sorted(c.scope for c in train_convs),
            "held_out": sorted(held), "pairs": len(pairs), "steps": report.steps,
            "train_s": round(report.seconds, 1),
            "licence": "trained on LoCoMo (CC BY-NC 4.0): non-commercial use only"})
        del model
        mem = Memory(workdir / f"fold{f}.db", embedder=load_encoder(enc_dir))
        for conv in test_convs:
            mem.add(list(conv.items), scope=conv.scope)
        recs, _ = score(mem, test_convs, TUNED)
        mem.close()
        held_records += recs
        fold_info.append({"held_out": held, "train_pairs": len(pairs), "steps": report.steps,
                          "train_s": report.seconds, "wall_s": time.perf_counter() - t0,
                          "first_loss": report.losses[0] if report.losses else None,
                          "last_loss": sum(report.losses[-10:]) / max(1, len(report.losses[-10:]))})
    # Join: the base records gain "<method>-tuned" entries from the held-out runs.
    key = {(r["scope"], r["q"]): r for r in base_records}
    for r in held_records:
        for m in TUNED:
            key[(r["scope"], r["q"])][f"{m}-tuned"] = r[m]
    methods = [*METHODS, *(f"{m}-tuned" for m in TUNED)]
    return {"methods": summarise(base_records, methods), "folds": fold_info, "k": k,
            "train_config": {f: getattr(config, f) for f in config.__dataclass_fields__},
            "paired": paired_gains(base_records), "questions": len(base_records),
            "records_compact": compact(base_records, methods)}


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
        for c in ("overall", *map(str, CATEGORIES)):
            sel = [r for r in records if c == "overall" or str(r["category"]) == c]
            for b in BUDGETS:
                a = [100.0 * r[f"{m}-tuned"]["all_in"][b] for r in sel]
                z = [100.0 * r[m]["all_in"][b] for r in sel]
                out.setdefault(f"{m}-tuned vs {m}", {})[f"{c} all@{b}"] = list(paired_bootstrap(a, z))
    return out


def format_gains(res: dict[str, Any]) -> str:
    from .report import markdown_table
    rows = []
    for name, cells in res["paired"].items():
        for cell, (d, lo, hi) in cells.items():
            rows.append([name, cell, f"{d:+.1f}", f"[{lo:+.1f}, {hi:+.1f}]"])
    return markdown_table(["comparison", "group", "gain (points)", "95% interval"], rows)

