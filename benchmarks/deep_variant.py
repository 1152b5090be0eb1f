"""Re-run only the deep path of a finished ``bench progressive`` run under other settings.

The progressive run records fast and deep per question; a change to the deep path alone
(e.g. ``notes_share``) does not need fast again. This runs deep with the overrides on the same
questions, store and reader, writes per-question JSONL (resumable), and compares F1 with the
recorded fast and deep results, paired by question.

    python benchmarks/deep_variant.py --runs runs/progressive_locomo.jsonl \
        --set notes_share=0.25 --out runs/deep_notes025.jsonl --json docs/results/deep_notes025.json

When the fast path and the routers are unchanged and only the deep path's code changed,
``--merge PATH`` writes the progressive records with their deep results replaced by this run's
(judge fields dropped, so ``suffice bench judge PATH`` grades the new answers); ``suffice bench
progressive --out PATH`` then summarises it like a fresh run.

``--mode fast`` reruns the fast path instead, to measure its time on the same day as a deep
rerun (the VM's speed drifts between days) and to check its answers still match.

``--deep-model`` names the model that writes the deep answer (as ``bench progressive
--deep-model``); ``--every N`` runs every Nth recorded question only (a same-day timing sample);
``--cache`` keeps every model call, so a stopped run loses at most the call under way;
``--limit N`` takes the first N questions and ``--asks-time`` only those that ask when and
whose prompt ``EngineConfig.date_room`` changes (the other answers stay as recorded). With
``--deep-model qwen2.5-1.5b --set deep_scale=1`` this records what auto answers an early stop
with under ``EngineConfig(stop_reader="deep")``: the deep model over the fast budget, with
dates (docs/benchmarks.md section 7).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from suffice import EngineConfig, Memory, RenderConfig, make_llm
from suffice._bench.metrics import score_locomo
from suffice._bench.qa import load_done, open_append, receipt_summary
from suffice._bench.report import envelope, paired_bootstrap, read_results, write_json
from suffice._config import apply_overrides, parse_overrides
from suffice._files import write_atomic
from suffice._timeref import asks_time


def configs(pairs: list[str], mem: Memory) -> tuple[EngineConfig, RenderConfig]:
    """The memory's engine and render configs with ``name=value`` overrides applied."""
    return apply_overrides(parse_overrides(pairs), mem.engine_config, mem.render_config)  # type: ignore[return-value]


def same_prompt(mem: Memory, question: str, scope: str, mode: str, budget: int, engine: EngineConfig,
                render: RenderConfig) -> bool:
    """Is the answer prompt the same with ``date_room`` on and off? (No model call.)"""
    from suffice._llm import ScriptedLLM

    prompts = []
    for room in (True, False):
        probe = ScriptedLLM("<answer>-</answer>")
        mem.ask(question, scope=scope, llm=probe, deep_llm=probe, mode=mode, budget=budget,  # type: ignore[arg-type]
                engine=engine.replace(date_room=room), render=render)
        prompts.append(probe.calls[-1])
    return prompts[0] == prompts[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=Path, default=Path("runs/progressive_locomo.jsonl"))
    ap.add_argument("--store", type=Path, default=Path("runs/locomo.db"))
    ap.add_argument("--set", dest="sets", action="append", default=[], help="name=value")
    ap.add_argument("--budget", type=int, default=1000)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--merge", type=Path, help="write progressive records with deep replaced")
    ap.add_argument("--mode", choices=("deep", "fast"), default="deep",
                    help="the path to rerun (fast: re-measure the fast path on the same day)")
    ap.add_argument("--deep-model", help="model that writes the deep answer (default: the reader)")
    ap.add_argument("--every", type=int, default=1, help="run every Nth recorded question only")
    ap.add_argument("--cache", type=Path, help="keep model calls here (resumable to the call)")
    ap.add_argument("--limit", type=int, help="the first N recorded questions only")
    ap.add_argument("--asks-time", action="store_true",
                    help="only questions that ask when and whose prompt EngineConfig.date_room changes")
    args = ap.parse_args()
    if args.merge and args.mode != "deep":
        ap.error("--merge replaces the deep results; it needs --mode deep")

    recs = {r["key"]: r for r in read_results(args.runs)}
    limit = args.limit or len(recs)
    if any("question" not in r for r in recs.values()):
        # Compact records (docs/results) leave out the text the dataset holds: take it from there.
        from suffice._bench.qa import items_by_key
        by_key = {key: it.q for key, it in items_by_key().items()}
        for key, r in recs.items():
            q = by_key[key]
            r.setdefault("question", q.question)
            r.setdefault("gold", q.answer)
            r.setdefault("category", q.category)
    mem = Memory(args.store)
    engine, render = configs(args.sets, mem)
    llm = make_llm("local")
    deep_llm = make_llm("local", model_path=args.deep_model) if args.deep_model else None
    if args.cache is not None:
        from suffice._llm.cache import CachedLLM
        llm = CachedLLM(llm, args.cache)
        deep_llm = CachedLLM(deep_llm, args.cache) if deep_llm is not None else None
    done = {k for _, k in load_done(args.out)}
    with open_append(args.out) as fh:
        for i, (key, rec) in enumerate(recs.items()):
            if key in done or i >= limit or i % args.every or \
                    (args.asks_time and not asks_time(rec["question"])):
                continue
            scope = key.split("#")[0]
            if mem.embedder is not None:  # embedded up front, as the progressive run does
                mem.embedder.embed_query(rec["question"])
            if args.asks_time and same_prompt(mem, rec["question"], scope, args.mode, args.budget,
                                              engine, render):
                continue  # date_room left this context as it was: the recorded answer stands
            ans = mem.ask(rec["question"], scope=scope, llm=llm, mode=args.mode, budget=args.budget,
                          engine=engine, render=render, deep_llm=deep_llm)
            out = {"variant": "deep-variant", "key": key, "answer": ans.text,
                   "f1": score_locomo(ans.text, rec["gold"], rec["category"]),
                   "receipt": receipt_summary(ans.receipt)}
            fh.write(json.dumps(out, ensure_ascii=False) + "\n")
            fh.flush()
            print(key, round(out["f1"], 2), rec["deep"]["answer"][:30], "->", ans.text[:30], flush=True)

    variant = {r["key"]: r for r in read_results(args.out)}
    keys = [k for k in recs if k in variant]
    v = [100 * variant[k]["f1"] for k in keys]
    fast = [100 * recs[k]["fast"]["f1"] for k in keys]
    deep = [100 * recs[k]["deep"]["f1"] for k in keys]
    results = {
        "n": len(keys), "overrides": args.sets,
        "f1": {"variant": statistics.fmean(v), "fast": statistics.fmean(fast),
               "deep": statistics.fmean(deep)},
        "t_e2e_ms": {"variant": statistics.fmean(variant[k]["receipt"]["t_e2e_ms"] for k in keys),
                     "deep": statistics.fmean(recs[k]["deep"]["receipt"]["t_e2e_ms"] for k in keys)},
        "f1_by_category": {
            str(c): {name: statistics.fmean(x for x, k in zip(vals, keys, strict=True)
                                            if recs[k]["category"] == c)
                     for name, vals in (("variant", v), ("fast", fast), ("deep", deep))}
            for c in sorted({recs[k]["category"] for k in keys})},
        "variant_minus_fast": paired_bootstrap(v, fast),
        "variant_minus_deep": paired_bootstrap(v, deep),
    }
    print(json.dumps(results, indent=2))
    if args.merge:
        merged = []
        for key, rec in recs.items():
            if key in variant:
                v = variant[key]
                rec = {**rec, "deep": {"answer": v["answer"], "receipt": v["receipt"], "f1": v["f1"]}}
            merged.append(json.dumps(rec, ensure_ascii=False))
        write_atomic(args.merge, "\n".join(merged) + "\n")
    if args.json:
        write_json(args.json, envelope("deep-variant", "locomo", str(args.runs),
                                       {"engine": engine.model_dump(), "render": render.model_dump()},
                                       results))


if __name__ == "__main__":
    main()
