"""The main job: ingest a small multi-session history, then ask it questions.

Run with ``make demo``. Everything is local: SQLite, the MiniLM embedder and (when the [local]
extra is installed) a small llama.cpp model shipped on PyPI. Questions are asked in auto mode:
for each, the router's score against its threshold shows whether the memory judged the fast
context enough or went deep, and what that cost.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path

from suffice import Memory, NewItem

HERE = Path(__file__).resolve().parent


def main() -> int:
    work = HERE.parent / ".suffice"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    rows = [json.loads(x) for x in (HERE / "history.jsonl").read_text().splitlines() if x.strip()]
    questions = [q for q in (HERE / "questions.txt").read_text().splitlines() if q.strip()]

    t0 = time.perf_counter()
    mem = Memory(work / "demo.db")
    load_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    stored = mem.add([NewItem(**r, id=f"demo-{i}") for i, r in enumerate(rows)], scope="dana")
    add_s = time.perf_counter() - t0
    sessions = len({it.session for it in stored})
    print(f"stored {len(stored)} turns from {sessions} sessions in {add_s * 1e3:.0f} ms "
          f"(models loaded in {load_s:.1f} s) -> {mem.path}\n")

    answer = _answerer(mem)
    for q in questions:
        ev = mem.search(q, scope="dana", k=3)
        print(f"Q: {q}")
        for it in ev.items:
            print(f"   {it.render()}")
        print(f"   [prefix {ev.timings_ms['total_ms']:.1f} ms: "
              + ", ".join(f"{k[:-3]} {v:.1f}" for k, v in ev.timings_ms.items() if k != "total_ms")
              + "]")
        if answer is not None:
            answer(q)
        print()
    mem.close()
    return 0


def _answerer(mem: Memory):  # type: ignore[no-untyped-def]
    """Auto-mode ``Memory.ask`` with the local model when the [local] extra is installed, else
    None. With the [judge] extra too (``make demo`` installs it), the 1.5B model writes the
    answers: on the deep path, and on an early stop over the fast context (the engine's
    ``stop_reader="deep"``); without it the 0.5B answers both ways and deep only reads wider."""
    ask = getattr(mem, "ask", None)
    if ask is None:
        return None
    try:
        from suffice import make_llm
        llm = make_llm("local")
    except Exception as exc:  # missing extra or model: say so and keep the retrieval demo
        print(f"(no local model: {exc}; showing retrieval only)\n")
        return None
    try:
        deep = make_llm("local", model_path="qwen2.5-1.5b")
    except Exception:  # the [judge] extra is not installed: deep reads wider with the same model
        deep = None
    router = mem.router
    model = getattr(router, "model", "")
    print(f"auto mode: router {getattr(router, 'name', 'retrieval-signals')}"
          + (f" ({model})" if model else "")
          + f"; fast model {llm.model}, deep model {(deep or llm).model}\n")

    def run(q: str) -> None:
        ans = ask(q, scope="dana", llm=llm, deep_llm=deep, mode="auto")
        r = ans.receipt
        verdict = ("enough: answer from the fast context" if r.path == "fast"
                   else "not enough: go deep, read wider")
        print(f"   router {r.router}: score {r.router_score:.2f} vs tau {r.tau:.2f} -> {verdict}"
              if r.router_score is not None else f"   router {r.router}: no score -> deep")
        print(f"A: {ans.text}")
        print(f"   [receipt: path {r.path}, {r.input_tokens}+{r.output_tokens} tokens, "
              f"{r.t_e2e_ms / 1e3:.1f} s end to end ({r.t_mem_ms:.0f} ms memory work), "
              f"models {', '.join(sorted({c.model for c in r.calls})) or 'none'}]")
        for lv in r.levers:
            print(f"   [deep lever {lv.name}: {lv.detail}]")
        for n in r.notes:
            if not any(n in lv.detail for lv in r.levers):  # a lever's own note is shown above
                print(f"   [note: {n}]")
    return run


if __name__ == "__main__":
    sys.exit(main())
