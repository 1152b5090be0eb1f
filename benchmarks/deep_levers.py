"""Which deep-path levers pay, measured on LoCoMo conversations kept apart from the acceptance set.

Each variant is a deep-path setting (engine overrides, and optionally a stronger model that
writes the deep answer); every variant answers the same questions with the same store, and
``fast`` is the baseline. Model calls go through a call cache (``--cache``), so rerunning a
variant, or a variant that shares calls with another (the same agents, say), costs nothing
new; per-question records are appended to ``--out`` and a rerun resumes.

    python benchmarks/deep_levers.py --convs 1,2,3 --limit 20 --out runs/levers.jsonl \\
        --variant fast --variant 'ev3k:deep_scale=3' --variant 'm15_2k:deep_scale=2@qwen2.5-1.5b' \\
        --variant 'm15_1k:deep_scale=1@qwen2.5-1.5b' --variant 'fast15@qwen2.5-1.5b'

A variant is ``NAME[:KEY=VALUE,...][@MODEL]``: overrides of EngineConfig, and the shipped model
(or GGUF path) that writes the deep answer. A variant whose name starts with ``fast`` answers on
the fast path, its model (default: the shipped 0.5B) reading the fast context.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any, Literal

from suffice import EngineConfig
from suffice._bench.metrics import score_locomo
from suffice._bench.qa import conversation_questions, open_append, receipt_summary
from suffice._bench.report import paired_bootstrap, read_results
from suffice._config import parse_overrides
from suffice._llm import make_llm
from suffice._llm.cache import CachedLLM, replayed_ms


def parse_variant(text: str) -> tuple[str, dict[str, Any], str | None]:
    name, _, rest = text.partition(":")
    rest, _, model = rest.partition("@")
    if "@" in name:
        name, _, model = name.partition("@")
    overrides = parse_overrides([kv for kv in rest.split(",") if kv.strip()]) if rest else {}
    return name, overrides, model or None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--convs", default="1,2,3", help="comma list of conversation indexes (not 0)")
    ap.add_argument("--limit", type=int, default=20, help="questions per conversation")
    ap.add_argument("--store", type=Path, default=Path("runs/locomo_dev.db"))
    ap.add_argument("--variant", action="append", required=True)
    ap.add_argument("--budget", type=int, default=1000)
    ap.add_argument("--cache", type=Path, default=Path("runs/llm_cache.db"))
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--json", type=Path, help="write the summary here")
    args = ap.parse_args()

    indexes = [int(i) for i in args.convs.split(",")]
    if 0 in indexes:
        ap.error("conversation 0 holds the acceptance questions; tune on others")
    mem, items = conversation_questions(args.store, indexes, args.limit)
    variants = [parse_variant(v) for v in args.variant]
    models: dict[str | None, Any] = {}

    def model(name: str | None) -> Any:
        if name not in models:
            base = make_llm("local", **({"model_path": name} if name else {}))
            models[name] = CachedLLM(base, args.cache)
        return models[name]

    reader = model(None)
    done = {(r["variant"], r["key"]) for r in read_results(args.out)} if args.out.exists() else set()
    with open_append(args.out) as fh:
        for name, overrides, deep_model in variants:
            engine = EngineConfig(**overrides)
            for it in items:
                if (name, it.key) in done:
                    continue
                # A variant named fast... answers on the fast path, with its model as the reader.
                mode: Literal["fast", "deep"] = "fast" if name.startswith("fast") else "deep"
                ans = mem.ask(it.q.question, scope=it.scope,
                              llm=model(deep_model) if mode == "fast" and deep_model else reader,
                              mode=mode, budget=args.budget, engine=engine.replace(reader_budget=args.budget),
                              deep_llm=model(deep_model) if deep_model and mode == "deep" else None)
                rc = ans.receipt
                rec = {"variant": name, "key": it.key, "category": it.q.category,
                       "overrides": overrides, "deep_model": deep_model, "answer": ans.text,
                       "f1": score_locomo(ans.text, it.q.answer, it.q.category),
                       "t_e2e_ms": rc.t_e2e_ms + replayed_ms(rc.calls),
                       "receipt": receipt_summary(rc)}
                fh.write(json.dumps(rec, ensure_ascii=False) + "\n")
                fh.flush()
                print(name, it.key, it.q.category, f"{rec['f1']:.2f}", f"{rc.t_e2e_ms / 1e3:.1f}s",
                      ans.text[:40], flush=True)

    recs = list(read_results(args.out))
    by: dict[str, dict[str, dict[str, Any]]] = {}
    for r in recs:
        by.setdefault(r["variant"], {})[r["key"]] = r
    base = by.get("fast", {})
    out: dict[str, Any] = {"questions": len(items), "variants": {}}
    for name, rs in by.items():
        keys = sorted(k for k in rs if k in base) if base else sorted(rs)  # paired with fast
        f1 = [100 * rs[k]["f1"] for k in keys]
        row: dict[str, Any] = {"n": len(keys), "f1": statistics.fmean(f1) if f1 else None,
                               "fast_f1": (statistics.fmean(100 * base[k]["f1"] for k in keys)
                                           if base and keys else None),
                               "t_e2e_s": (statistics.fmean(rs[k]["t_e2e_ms"] for k in keys) / 1e3
                                           if keys else None)}
        if base and name != "fast" and keys:
            row["minus_fast"] = paired_bootstrap(f1, [100 * base[k]["f1"] for k in keys])
        out["variants"][name] = row
    if args.json is not None:
        args.json.write_text(json.dumps(out, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
