"""Cross-validated retrieval: train an encoder on K-1 folds of conversations, judge it on the
held-out fold, and put every held-out question's result beside the untrained prefix's.

Every figure this produces for a trained model is on conversations the model never saw, neither
as positives nor as hard negatives. Hard negatives are mined with the untrained fused prefix.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from .._api import Memory
from .._datasets.locomo import LocomoConversation
from .._embed.minilm import load_encoder
from .._errors import SufficeError
from .._train.encoder import TrainConfig, export, steps, train
from .._train.pairs import folds, locomo_pairs
from .retrieval import METHODS, TUNED, compact, paired_gains, score, summarise


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
        enc_dir, info = fold_encoder(base, train_convs, held, f, k, workdir, config, hard, progress)
        mem = held_out_memory(workdir, f, enc_dir, test_convs)
        recs, _ = score(mem, test_convs, TUNED)
        mem.close()
        held_records += recs
        fold_info.append({**info, "wall_s": time.perf_counter() - t0})
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


def fold_encoder(base: Memory, train_convs: Sequence[LocomoConversation], held: Sequence[str], f: int,
                 k: int, workdir: Path, config: TrainConfig, hard: int = 4,
                 progress: Callable[[str, int, int], None] | None = None) -> tuple[Path, dict[str, Any]]:
    """Fold ``f``'s encoder in ``workdir/encoder_fold{f}``: the one already there when its card
    says it was trained on exactly ``train_convs`` (a rerun resumes), else a new one."""
    enc_dir = workdir / f"encoder_fold{f}"
    trained_on = sorted(c.scope for c in train_convs)
    card = reusable(enc_dir, trained_on, held)
    if card:
        return enc_dir, {"held_out": list(held), "reused": card["name"], "train_pairs": card.get("pairs"),
                         "steps": card.get("steps"), "train_s": card.get("train_s")}
    pairs = locomo_pairs(base, train_convs, hard=hard, seed=f)
    tick = ticker(progress, f"fold {f + 1}/{k} training", steps(len(pairs), config))
    model, report = train(pairs, config, tick)
    export(model, enc_dir, {
        "name_prefix": f"minilm-locomo-fold{f}", "trained_on": trained_on,
        "held_out": sorted(held), "pairs": len(pairs), "steps": report.steps,
        "train_s": round(report.seconds, 1),
        "licence": "trained on LoCoMo (CC BY-NC 4.0): non-commercial use only"})
    return enc_dir, {"held_out": list(held), "train_pairs": len(pairs), **report.summary()}


def ticker(progress: Callable[[str, int, int], None] | None, stage: str,
           total: int) -> Callable[[int], None]:
    """A ``progress(n)`` callback that reports ``stage``'s running count out of ``total``."""
    done = [0]

    def tick(n: int) -> None:
        done[0] += n
        if progress is not None:
            progress(stage, done[0], total)
    return tick


def held_out_memory(workdir: Path, f: int, enc_dir: Path, test_convs: Sequence[LocomoConversation],
                    **kw: Any) -> Memory:
    """A store of the held-out conversations embedded by the fold's encoder (reused when a
    previous run left it complete; a store of another encoder is replaced)."""
    path = workdir / f"fold{f}.db"
    encoder = load_encoder(enc_dir)
    if path.exists():
        try:
            mem = Memory(path, embedder=encoder, **kw)
            if all(len(mem.items(scope=c.scope, limit=None)) == len(c.items) for c in test_convs):
                return mem
            mem.close()
        except SufficeError:
            pass
        for p in workdir.glob(f"fold{f}.db*"):
            p.unlink()
    mem = Memory(path, embedder=encoder, **kw)
    for conv in test_convs:
        mem.add(list(conv.items), scope=conv.scope)
    return mem


def reusable(folder: Path, trained_on: Sequence[str], held: Sequence[str]) -> dict[str, Any]:
    """The card of the model in ``folder`` when it was trained on exactly ``trained_on`` with
    ``held`` held out (a rerun may reuse it), else an empty dict."""
    card = read_card(folder)
    same = card.get("trained_on") == sorted(trained_on) and card.get("held_out") == sorted(held)
    return card if same else {}


def read_card(folder: Path) -> dict[str, Any]:
    try:
        card = json.loads((folder / "card.json").read_text(encoding="utf-8"))
        return card if isinstance(card, dict) else {}
    except (OSError, ValueError):
        return {}


def format_gains(res: dict[str, Any], only_overall: bool = False) -> str:
    from .report import markdown_table
    rows = []
    for name, cells in res["paired"].items():
        for cell, (d, lo, hi) in cells.items():
            if only_overall and not cell.startswith(("overall", "1 all@4000")):
                continue
            rows.append([name, cell, f"{d:+.1f}", f"[{lo:+.1f}, {hi:+.1f}]"])
    return markdown_table(["comparison", "group", "gain (points)", "95% interval"], rows)

