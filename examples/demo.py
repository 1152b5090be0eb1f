"""The main job: ingest a small multi-session history, then ask it questions.

Run with ``make demo``. Everything is local: SQLite, the MiniLM embedder and (when the [local]
extra is installed) a small llama.cpp model shipped on PyPI.
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
    """``Memory.ask`` with the local model when the [local] extra is installed, else None."""
    ask = getattr(mem, "ask", None)
    if ask is None:
        return None
    try:
        from suffice import make_llm
        llm = make_llm("local")
    except Exception as exc:  # missing extra or model: say so and keep the retrieval demo
        print(f"(no local model: {exc}; showing retrieval only)\n")
        return None

    def run(q: str) -> None:
        ans = ask(q, scope="dana", llm=llm)
        r = ans.receipt
        print(f"A: {ans.text}")
        print(f"   [receipt: path {r.path}, {r.input_tokens}+{r.output_tokens} tokens, "
              f"${r.cost_usd:.4f}, {r.t_e2e_ms:.0f} ms end to end, model {r.model}]")
    return run


if __name__ == "__main__":
    sys.exit(main())
