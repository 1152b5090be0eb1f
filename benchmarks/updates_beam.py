"""The ``updates`` lever on BEAM's knowledge-update questions: where it fires, and what it does
to the answer.

    python benchmarks/updates_beam.py --store runs/beam_all.db --cache runs/llm_cache_updates.db \\
        --out runs/updates_beam.jsonl --json docs/results/updates_beam.json

Every conversation of BEAM's 100K tier goes into one store (idempotent). For every question,
the fast context (the engine's 1k render) is checked for a revision on the question's topic
(no model call): the rule's firing rate per ability, so false alarms on other abilities show.
Then each knowledge-update question is answered on the fast path by the local reader twice,
with the lever (the default) and without (``EngineConfig(state_updates=False)``); where the
lever does not fire the two prompts are the same and the second is a cache hit. Scored by token
F1 against the reference answer and by whether the answer holds the value the rubric asks for
("LLM response should state: 250ms"), case-folded. Calls are cached by (model, prompt), and the
records are appended per question, so a rerun resumes.
"""

from __future__ import annotations

import argparse
import json
import re
from collections import Counter
from pathlib import Path

from suffice import EngineConfig, Memory
from suffice._bench.metrics import token_f1
from suffice._cli import cached_reader
from suffice._datasets.beam import default_path, load_beam
from suffice._route.features import context_seqs
from suffice._updates import find_revision

_STATE = re.compile(r"should (?:state|mention|include|say)[^:]*:\s*(.+)", re.IGNORECASE)


def rubric_values(folder: Path) -> dict[str, list[str]]:
    """question -> the values its rubric says the answer should state."""
    raw = json.loads((folder / "probing_questions.json").read_text(encoding="utf-8"))
    out: dict[str, list[str]] = {}
    for q in raw.get("knowledge_update", []):
        vals = [m.group(1).strip().rstrip(".") for r in q.get("rubric", []) if (m := _STATE.search(str(r)))]
        out[str(q["question"])] = vals
    return out


def holds(answer: str, values: list[str]) -> bool | None:
    if not values:
        return None
    return all(v.lower() in answer.lower() for v in values)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--store", type=Path, default=Path("runs/beam_all.db"))
    ap.add_argument("--cache", type=Path, default=Path("runs/llm_cache_updates.db"))
    ap.add_argument("--model", default=None, help="local GGUF (default: the 0.5B reader)")
    ap.add_argument("--out", type=Path, default=Path("runs/updates_beam.jsonl"))
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    convs = load_beam()
    mem = Memory(args.store)
    for c in convs:
        mem.add(list(c.items), scope=c.scope)
    fired: Counter[str] = Counter()
    asked: Counter[str] = Counter()
    for c in convs:
        for q in c.questions:
            ctx = mem.render(q.question, 1000, scope=c.scope)
            seqs = context_seqs(ctx.parts)
            asked[q.ability] += 1
            fired[q.ability] += find_revision(q.question, mem.store.items(c.scope, seqs)) is not None
    print("fires on the 1k context, by ability:",
          {a: f"{fired[a]}/{asked[a]}" for a in sorted(asked)}, flush=True)
    done = {json.loads(x)["key"] for x in args.out.read_text().splitlines()} if args.out.exists() else set()
    llm = cached_reader("local", args.model, None, args.cache)
    with args.out.open("a", encoding="utf-8") as f:
        for c in convs:
            rubric = rubric_values(default_path() / c.conv_id)
            for i, q in enumerate(x for x in c.questions if x.ability == "knowledge_update"):
                key = f"{c.scope}#{i}"
                if key in done:
                    continue
                row: dict[str, object] = {"key": key, "question": q.question, "answer": q.answer,
                                          "values": rubric.get(q.question, [])}
                for name, cfg in (("with", EngineConfig()), ("without", EngineConfig(state_updates=False))):
                    a = mem.ask(q.question, scope=c.scope, llm=llm, mode="fast", engine=cfg)
                    row[name] = {"text": a.text, "f1": token_f1(a.text, q.answer),
                                 "holds": holds(a.text, rubric.get(q.question, [])),
                                 "fired": any("latest value" in n for n in a.receipt.notes)}
                f.write(json.dumps(row) + "\n")
                f.flush()
                print(key, row["with"]["fired"], repr(row["with"]["text"])[:60],  # type: ignore[index]
                      repr(row["without"]["text"])[:60], flush=True)  # type: ignore[index]
    rows = [json.loads(x) for x in args.out.read_text().splitlines()]
    summary = {"n": len(rows), "fired": sum(r["with"]["fired"] for r in rows),
               "fires_by_ability": {a: [fired[a], asked[a]] for a in sorted(asked)}}
    for name in ("with", "without"):
        summary[name] = {"f1": 100 * sum(r[name]["f1"] for r in rows) / max(len(rows), 1),
                         "holds": sum(bool(r[name]["holds"]) for r in rows)}
        summary[f"{name}_where_fired"] = {
            "f1": 100 * sum(r[name]["f1"] for r in rows if r["with"]["fired"]) / max(summary["fired"], 1),
            "holds": sum(bool(r[name]["holds"]) for r in rows if r["with"]["fired"])}
    print(json.dumps(summary, indent=1))
    if args.json is not None:
        args.json.write_text(json.dumps({"benchmark": "updates_beam", "summary": summary}, indent=1) + "\n")
    mem.close()


if __name__ == "__main__":
    main()
