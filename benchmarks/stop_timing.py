"""Time a deep-model stop and a deep answer back to back on the same questions.

For ``benchmarks/stop_auto.py --deep-sample``: the stop path (the deep model over the fast
budget, ``deep_scale=1``) and the deep path (``deep_scale=2``) answer each named LoCoMo question
one after the other, with no cache, so their ratio is measured under the same load. Run it on an
otherwise idle machine; each line it appends carries both times.

    python benchmarks/stop_timing.py conv-26#19 conv-26#38 --out runs/deep_sample.jsonl

With ``--router DIR`` it times auto itself instead of the stop path: ``mode="auto"`` with that
trained router at its own tau and the engine's defaults (the deep model answers a stop), then
deep, each question back to back with no cache. Each line then carries ``auto_t_e2e_ms``, the
path auto took and both answers, so auto's time against deep's is measured, not projected:

    python benchmarks/stop_timing.py --router runs/router_b0_cw --every 15 --out runs/auto_timing.jsonl
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from suffice import EngineConfig, Memory, make_llm
from suffice._bench.qa import items_by_key


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("keys", nargs="*", help="question keys, e.g. conv-26#19")
    ap.add_argument("--every", type=int,
                    help="instead of keys: every Nth acceptance question (conv-26, first 150)")
    ap.add_argument("--router", type=Path, help="time auto with this trained router instead of the stop path")
    ap.add_argument("--store", type=Path, default=Path("runs/locomo.db"))
    ap.add_argument("--deep-model", default="qwen2.5-1.5b")
    ap.add_argument("--out", type=Path, default=Path("runs/deep_sample.jsonl"))
    args = ap.parse_args()
    items = items_by_key()
    if args.every:
        args.keys = [k for k in items if k.startswith("conv-26#")][:150:args.every]
    if not args.keys:
        ap.error("name question keys or give --every")
    unknown = [k for k in args.keys if k not in items]
    if unknown:
        ap.error(f"no such question: {', '.join(unknown)}")
    mem = Memory(args.store, create=False)
    model = make_llm("local", model_path=args.deep_model)
    model.chat([{"role": "user", "content": "Say ok."}], max_tokens=2)  # load it before timing
    if args.router is not None:
        return time_auto(args, items, mem, model)
    with args.out.open("a", encoding="utf-8") as out:
        for key in args.keys:
            it, ms = items[key], {}
            for scale in (1.0, 2.0):
                t0 = time.perf_counter()
                mem.ask(it.q.question, scope=it.scope, llm=model, deep_llm=model, mode="deep",
                        engine=EngineConfig(deep_scale=scale))
                ms[scale] = (time.perf_counter() - t0) * 1e3
            line = {"key": key, "receipt": {"t_e2e_ms": ms[2.0]}, "stop_t_e2e_ms": ms[1.0]}
            out.write(json.dumps(line) + "\n")
            out.flush()
            print(key, f"stop {ms[1.0] / 1e3:.1f} s, deep {ms[2.0] / 1e3:.1f} s", flush=True)
    mem.close()


def time_auto(args: argparse.Namespace, items: dict[str, Any], mem: Memory, model: Any) -> None:
    """Auto (the 0.5B fast reader, the deep model, the router at its tau) and deep, timed."""
    from suffice._bench.metrics import score_locomo
    from suffice._route.trained import TrainedRouter

    router = TrainedRouter(args.router)
    fast = make_llm("local")
    fast.chat([{"role": "user", "content": "Say ok."}], max_tokens=2)
    done = set()
    if args.out.exists():
        done = {json.loads(line)["key"] for line in args.out.read_text(encoding="utf-8").splitlines()}
    with args.out.open("a", encoding="utf-8") as out:
        for key in args.keys:
            if key in done:
                continue
            it, line = items[key], {"key": key, "router": router.model, "tau": router.tau}
            for mode in ("auto", "deep"):
                # llama.cpp reuses the longest prompt prefix it still holds: a deep answer right
                # after auto went deep would replay it in half a second. Each call starts cold.
                for llm in (fast, model):
                    llm._llm.reset()
                t0 = time.perf_counter()
                ans = mem.ask(it.q.question, scope=it.scope, llm=fast, deep_llm=model, mode=mode,
                              router=router if mode == "auto" else None)  # only auto routes
                line[f"{mode}_t_e2e_ms"] = (time.perf_counter() - t0) * 1e3
                line[f"{mode}_answer"] = ans.text
                line[f"{mode}_f1"] = score_locomo(ans.text, it.q.answer, it.q.category)
                if mode == "auto":
                    line["path"], line["score"] = ans.receipt.path, ans.receipt.router_score
            out.write(json.dumps(line) + "\n")
            out.flush()
            print(key, line["path"], f"auto {line['auto_t_e2e_ms'] / 1e3:.1f} s, "
                  f"deep {line['deep_t_e2e_ms'] / 1e3:.1f} s", flush=True)
    mem.close()


if __name__ == "__main__":
    main()
