"""Render benchmark: does a budgeted memory hold the gold evidence of a question?

For each question with annotated evidence and each budget B, a method builds a context of at
most B tokens; the question counts as covered when the text of every evidence item is in it, verbatim and
whole (a piece of an item does not count). Methods: the renderer's four modes, three
ablations of unit recovery (no timeline, no excerpts, no links), recency truncation, and
prefix-ranked greedy fill (the fused BM25 + dense ranking filled item by item, as in
``bench retrieval``). The fills get the whole B (and, as a check, the prefix fill also at the
renderer's cap 0.95*B); the renderer keeps to its cap.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._api import Memory
from .._config import RenderConfig, RenderMode, StoreConfig
from .._embed.minilm import load_encoder
from .._errors import InvalidInputError
from .._tokens import count_tokens
from .._types import NewItem
from .report import envelope, markdown_table, write_json
from .retrieval import fill

LOCOMO_BUDGETS = (1000, 2000, 4000, 8000)
BEAM_BUDGETS = (1000, 2000, 4000, 8000, 16000)


@dataclass(frozen=True, slots=True)
class Variant:
    """A named way to build a context: a render mode with setting overrides, or a fill baseline."""

    name: str
    mode: RenderMode | None = None
    fill: str = ""
    """'' for a render; 'recency' or 'prefix' for a greedy fill baseline."""
    overrides: dict[str, Any] = field(default_factory=dict)


VARIANTS: tuple[Variant, ...] = (
    Variant("unit", "unit"),
    Variant("piece", "piece"),
    Variant("unit+piece", "unit+piece"),
    Variant("timeline", "timeline"),
    Variant("recency", fill="recency"),
    Variant("prefix fill", fill="prefix"),
    Variant("prefix fill at cap", fill="prefix", overrides={"prompt_cap": 0.95}),
    Variant("unit, no timeline", "unit", overrides={"timeline_share": 0.0}),
    Variant("unit, no excerpts", "unit", overrides={"excerpts": False}),
    Variant("unit, no links", "unit", overrides={"link_discount": 0.0}),
    Variant("unit, raw first", "unit", overrides={"raw_first": True}),
    Variant("piece, whole items", "piece", overrides={"piece_whole_item_tokens": 1_000_000}),
)


@dataclass(frozen=True, slots=True)
class Conversation:
    scope: str
    items: tuple[NewItem, ...]
    questions: tuple[tuple[str, str, tuple[str, ...]], ...]
    """(question, category, evidence keys) with at least one evidence key."""
    key: str
    """The ``meta`` field that evidence keys refer to (``dia_id`` or ``chat_id``)."""


def load(dataset: str, data: str | Path | None, limit: int | None = None) -> list[Conversation]:
    """Conversations of ``dataset`` with the questions that have evidence (LoCoMo: cats 1-4)."""
    out: list[Conversation] = []
    if dataset == "locomo":
        from .._datasets.locomo import load_locomo
        for c in load_locomo(data):
            qs = tuple((q.question, str(q.category), q.evidence) for q in c.questions
                       if q.category in (1, 2, 3, 4) and q.evidence)
            out.append(Conversation(c.scope, c.items, qs, "dia_id"))
    elif dataset == "beam":
        from .._datasets.beam import load_beam
        for b in load_beam(data):
            qs = tuple((q.question, q.ability, q.evidence) for q in b.questions if q.evidence)
            out.append(Conversation(b.scope, b.items, qs, "chat_id"))
    else:
        from .._errors import ConfigError
        raise ConfigError(f"unknown dataset {dataset!r}; use locomo or beam")
    return out[:limit] if limit is not None else out


def default_data(dataset: str) -> Path:
    if dataset == "locomo":
        from .._datasets.locomo import default_path
        return default_path()
    from .._datasets.beam import default_path as beam_path
    return beam_path()


@dataclass
class _Tally:
    n: int = 0
    full: dict[int, int] = field(default_factory=dict)
    recall: dict[int, float] = field(default_factory=dict)
    tokens: dict[int, int] = field(default_factory=dict)

    def add(self, b: int, hit: int, total: int, tokens: int) -> None:
        self.full[b] = self.full.get(b, 0) + (hit == total)
        self.recall[b] = self.recall.get(b, 0.0) + hit / total
        self.tokens[b] = self.tokens.get(b, 0) + tokens

    def summary(self, n: int) -> dict[str, float]:
        d = max(n, 1)
        out: dict[str, float] = {"n": float(n)}
        for b in sorted(self.full):
            out[f"full@{b}"] = 100 * self.full[b] / d
            out[f"recall@{b}"] = 100 * self.recall[b] / d
            out[f"tokens@{b}"] = self.tokens[b] / d
        return out


def run(mem: Memory, convs: Sequence[Conversation], budgets: Sequence[int],
        variants: Sequence[Variant] = VARIANTS,
        progress: Callable[[int], None] | None = None) -> dict[str, Any]:
    """Score every variant at every budget on every question; conversations must be ingested."""
    tallies: dict[str, dict[str, _Tally]] = {v.name: {} for v in variants}
    counts: dict[str, int] = {}
    ms: dict[str, list[float]] = {v.name: [] for v in variants}
    configs = {v.name: mem.render_config.replace(**v.overrides) for v in variants}
    for conv in convs:
        items = mem.items(scope=conv.scope)
        by_key = {str(it.meta.get(conv.key)): it for it in items}
        cost = [count_tokens(it.render()) + 1 for it in items]
        newest_first = list(range(len(items) - 1, -1, -1))
        for question, category, evidence in conv.questions:
            gold = [by_key[k] for k in evidence if k in by_key]
            if not gold:
                continue
            lines = [it.text for it in gold]
            gold_seqs = {it.seq for it in gold}
            for cat in ("overall", category):
                counts[cat] = counts.get(cat, 0) + 1
            ranking: list[int] = []
            for v in variants:
                per = tallies[v.name]
                for b in budgets:
                    t = time.perf_counter()
                    if v.fill:
                        if v.fill == "prefix":
                            if not ranking:
                                ranked = list(mem.retriever.rank(conv.scope, question, mem.retrieval,
                                                                 depth=len(items)).seqs)
                                seen = set(ranked)
                                ranking = ranked + [s for s in newest_first if s not in seen]
                            cap = b if not v.overrides else int(b * configs[v.name].prompt_cap)
                            chosen = fill(ranking, cost, cap)
                        else:
                            chosen = fill(newest_first, cost, b)
                        hit = len(gold_seqs & chosen)
                        used = sum(cost[s] for s in chosen)
                    else:
                        config = configs[v.name] if v.mode is None else configs[v.name].replace(mode=v.mode)
                        ctx = mem.render(question, b, scope=conv.scope, render=config)
                        hit = sum(line in ctx.text for line in lines)
                        used = ctx.tokens
                    ms[v.name].append((time.perf_counter() - t) * 1e3)
                    for cat in ("overall", category):
                        per.setdefault(cat, _Tally()).add(b, hit, len(gold), used)
            if progress is not None:
                progress(1)
    return {
        "budgets": list(budgets),
        "questions": counts.get("overall", 0),
        "methods": {name: {cat: t.summary(counts[cat]) for cat, t in per.items()}
                    for name, per in tallies.items()},
        "ms_per_context": {name: sum(x) / max(len(x), 1) for name, x in ms.items()},
        "variants": [{"name": v.name, "mode": v.mode, "fill": v.fill, "overrides": v.overrides}
                     for v in variants],
    }


def format_results(res: dict[str, Any]) -> str:
    """Two narrow tables (full evidence, recall; % of questions) so a terminal does not wrap them."""
    budgets = res["budgets"]
    out = [f"{res['questions']} questions"]
    for metric in ("full", "recall"):
        header = [f"{metric} (%)", *[f"{b // 1000}k" for b in budgets]]
        if metric == "full":
            header.append("ms")
        rows = []
        for name, cats in res["methods"].items():
            s = cats["overall"]
            row: list[Any] = [name, *[s[f"{metric}@{b}"] for b in budgets]]
            if metric == "full":
                row.append(res["ms_per_context"][name])
            rows.append(row)
        out.append(markdown_table(header, rows))
    return "\n\n".join(out)


def plot_results(res: dict[str, Any], path: str | Path, title: str) -> None:
    """Share of questions with full evidence against budget, one line per method."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    budgets = res["budgets"]
    fig, ax = plt.subplots(figsize=(7.5, 4.8), dpi=120)
    for name, cats in res["methods"].items():
        s = cats["overall"]
        style = "--" if name.startswith(("recency", "prefix fill")) else (":" if "," in name else "-")
        ax.plot(budgets, [s[f"full@{b}"] for b in budgets], style, marker="o", ms=3, label=name)
    ax.set_xscale("log", base=2)
    ax.set_xticks(budgets, [f"{b // 1000}k" for b in budgets])
    ax.set_xlabel("budget B (o200k tokens)")
    ax.set_ylabel("questions with all gold evidence in context (%)")
    ax.set_ylim(0, 100)
    ax.grid(alpha=0.3)
    ax.set_title(title)
    ax.legend(fontsize=7, loc="upper left", ncol=2)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)


def ingest(mem: Memory, convs: Sequence[Conversation], progress: Callable[[int], None] | None = None
           ) -> float:
    """Add each conversation its scope does not hold yet (:func:`.qa.ingest_scope`: a store
    reused with ``db`` is read back, one made from other data refused); returns the seconds."""
    from .qa import ingest_scope
    t0 = time.perf_counter()
    for conv in convs:
        ingest_scope(mem, conv.scope, conv.items, progress=progress)
    return time.perf_counter() - t0


def held_out_encoders(folder: Path, convs: Sequence[Conversation]) -> list[tuple[Path, list[Conversation]]]:
    """The fold encoders a cross-validated retrieval run kept (``encoder_fold*/card.json``), each
    with the conversations it never saw; together they must cover every conversation once."""
    out: list[tuple[Path, list[Conversation]]] = []
    seen: set[str] = set()
    for card in sorted(folder.glob("encoder_fold*/card.json")):
        held = set(json.loads(card.read_text(encoding="utf-8")).get("held_out", []))
        out.append((card.parent, [c for c in convs if c.scope in held]))
        seen |= held
    missing = sorted(c.scope for c in convs if c.scope not in seen)
    if not out or missing:
        raise InvalidInputError(f"{folder}: no fold encoder holds out {', '.join(missing) or 'anything'} "
                                "(make them with: suffice bench retrieval --folds K --keep DIR)")
    return out


def merge(parts: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Results of disjoint question sets as one: every mean weighted by its question count."""
    first = parts[0]
    methods: dict[str, dict[str, dict[str, float]]] = {}
    for name in first["methods"]:
        cats = {cat for p in parts for cat in p["methods"][name]}
        methods[name] = {}
        for cat in cats:
            rows = [p["methods"][name][cat] for p in parts if cat in p["methods"][name]]
            n = sum(r["n"] for r in rows)
            methods[name][cat] = {k: (n if k == "n" else sum(r[k] * r["n"] for r in rows) / max(n, 1))
                                  for k in rows[0]}
    total = sum(p["questions"] for p in parts)
    return {**first, "questions": total, "methods": methods,
            "ms_per_context": {k: sum(p["ms_per_context"][k] * p["questions"] for p in parts) / max(total, 1)
                               for k in first["ms_per_context"]}}


def main(dataset: str = "locomo", data: str | Path | None = None, json_out: str | Path | None = None,
         plot: str | Path | None = None, limit: int | None = None, db: str | Path | None = None,
         store_config: StoreConfig | None = None, render: RenderConfig | None = None,
         encoders_from: Path | None = None, embedder: Any = "default") -> str:
    """Ingest into a temporary store (or ``db``), score every variant, write JSON and the plot.
    With ``encoders_from``, each conversation is embedded by the fold encoder that never saw it."""
    convs = load(dataset, data, limit)
    budgets = LOCOMO_BUDGETS if dataset == "locomo" else BEAM_BUDGETS
    n_q = sum(len(c.questions) for c in convs)
    done = [0]

    def tick(n: int) -> None:
        done[0] += n
        if done[0] % 100 == 0 or done[0] == n_q:
            print(f"  {done[0]}/{n_q} questions", file=sys.stderr, flush=True)

    runs = ([(None, convs)] if encoders_from is None else
            [(enc, held) for enc, held in held_out_encoders(encoders_from, convs) if held])
    parts = []
    encoders: list[str] = []
    ingest_s = run_s = 0.0
    with tempfile.TemporaryDirectory() as tmp:
        for i, (enc, part) in enumerate(runs):
            mem = Memory(db if enc is None and db else Path(tmp) / f"bench{i}.db",
                         embedder=load_encoder(enc) if enc is not None else embedder,
                         store_config=store_config, render=render)
            try:
                ingest_s += ingest(mem, part)
                t0 = time.perf_counter()
                parts.append(run(mem, part, budgets, progress=tick))
                run_s += time.perf_counter() - t0
                encoders.append(mem.store_config.encoder)
                used_settings: dict[str, Any] = {"store": mem.store_config.model_dump(),
                                 "retrieval": mem.retrieval.model_dump(),
                                 "render": mem.render_config.model_dump()}
            finally:
                mem.close()
    used_settings.update(encoders_from=str(encoders_from) if encoders_from else None, encoders=encoders)
    res = merge(parts)
    res["run_s"], res["ingest_s"] = run_s, ingest_s
    text = format_results(res)
    if json_out is not None:
        write_json(json_out, envelope("render", dataset, str(data or default_data(dataset)),
                                      used_settings, res))
        text += f"\nwrote {json_out}"
    if plot is None:  # written only where asked: a default under docs/ overwrote the repo's figure
        return text
    plot_results(res, plot, f"{dataset}: full gold evidence in a B-token context")
    return text + f"\nwrote {plot}"
