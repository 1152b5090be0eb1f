"""Time a deep-model stop and a deep answer back to back on the same questions.

For ``benchmarks/stop_auto.py --deep-sample``: the stop path (the deep model over the fast
budget, ``deep_scale=1``) and the deep path (``deep_scale=2``) answer each named LoCoMo question
one after the other, with no cache, so their ratio is measured under the same load. Run it on an
otherwise idle machine; each line it appends carries both times.

    python benchmarks/stop_timing.py conv-26#19 conv-26#38 --out runs/deep_sample.jsonl
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from suffice import EngineConfig, Memory, make_llm
from suffice._bench.qa import items_by_key


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("keys", nargs="+", help="question keys, e.g. conv-26#19")
    ap.add_argument("--store", type=Path, default=Path("runs/locomo.db"))
    ap.add_argument("--deep-model", default="qwen2.5-1.5b")
    ap.add_argument("--out", type=Path, default=Path("runs/deep_sample.jsonl"))
    args = ap.parse_args()
    items = items_by_key()
    unknown = [k for k in args.keys if k not in items]
    if unknown:
        ap.error(f"no such question: {', '.join(unknown)}")
    mem = Memory(args.store, create=False)
    model = make_llm("local", model_path=args.deep_model)
    model.chat([{"role": "user", "content": "Say ok."}], max_tokens=2)  # load it before timing
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


if __name__ == "__main__":
    main()
