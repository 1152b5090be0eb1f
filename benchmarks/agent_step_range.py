"""Step-range questions of AMA-Bench read against what a context of B tokens can hold at all.

`suffice bench agent evidence` records, per question, method and budget, whether the cited items
are inside. Some questions cite more text than any context of B tokens holds whole; this script
counts them (the ceiling of the strict reading), gives each method's share among the questions
that do fit, the same for the steps the question itself names (against the render's cap), and
the split by where the answer's evidence lies. It reads the records and the store; no model.

    python benchmarks/agent_step_range.py --records runs/agent/evidence_ama.jsonl --store runs/agent/ama.db
"""

from __future__ import annotations

import argparse
from collections import Counter
from pathlib import Path

from suffice._bench.agent import ama_questions, build_store
from suffice._bench.report import envelope, read_results, write_json
from suffice._config import RenderConfig
from suffice._datasets.ama import default_path, load_ama
from suffice._datasets.trajectories import LOADERS
from suffice._steps import cited_steps

METHODS = ("suffice", "prefix fill", "truncation")
CAP = RenderConfig.for_agent().prompt_cap  # the render's share of B; the baselines get all of B


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", default="runs/agent/evidence_ama.jsonl")
    ap.add_argument("--store", default="runs/agent/ama.db")
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args()
    recs = {r["key"]: r for r in read_results(Path(args.records))}
    episodes = load_ama()
    by_scope = {ep.scope: ep for ep in episodes}
    mem = build_store(args.store, LOADERS["ama"](None))
    rows = []
    try:
        for data, q in ama_questions(mem, episodes):
            if not q.groups["step_range"] or q.key not in recs:
                continue
            aq = by_scope[q.scope].questions[int(q.key.split("#")[1])]
            named_steps = set(cited_steps(aq.question))
            named = [s for s in q.evidence if data.items[s].meta.get("step") in named_steps]
            other = set(aq.steps) - named_steps
            where = ("all named" if not other else
                     "named or up to 2 before" if all(any(0 < n - s <= 2 for n in named_steps) for s in other)
                     else "other steps too")
            rows.append({"key": q.key, "cost": sum(data.cost[s] for s in q.evidence),
                         "named_cost": sum(data.cost[s] for s in named), "where": where,
                         "methods": recs[q.key]["methods"]})
    finally:
        mem.close()
    out: dict[str, object] = {"questions": len(rows), "budgets": {}}
    print(f"{len(rows)} step-range questions")
    print("| B | fit (ceiling) | " + " | ".join(f"{m}: all / among fit" for m in METHODS)
          + " | named whole, among fit in cap |")
    print("|---|---|" + "---|" * len(METHODS) + "---|")
    for b in ("2000", "4000", "8000"):
        fit = [r for r in rows if r["cost"] <= int(b)]
        named_fit = [r for r in rows if r["named_cost"] <= int(CAP * int(b))]
        fig = {"fit": len(fit), "ceiling_pct": 100 * len(fit) / len(rows)}
        cells = []
        for m in METHODS:
            a = 100 * sum(r["methods"][m][b]["all"] for r in rows) / len(rows)
            f = 100 * sum(r["methods"][m][b]["all"] for r in fit) / max(1, len(fit))
            fig[m] = {"all_pct": a, "among_fit_pct": f}
            cells.append(f"{a:.1f} / {f:.1f}")
        nf = 100 * sum(r["methods"]["suffice"][b]["named_all"] for r in named_fit) / max(1, len(named_fit))
        fig["named_among_fit_pct"], fig["named_fit"] = nf, len(named_fit)
        out["budgets"][b] = fig  # type: ignore[index]
        print(f"| {b} | {len(fit)} ({fig['ceiling_pct']:.1f}%) | " + " | ".join(cells)
              + f" | {nf:.1f} ({len(named_fit)}) |")
    split: dict[str, Counter[str]] = {}
    for r in rows:
        c = split.setdefault(r["where"], Counter())
        c["n"] += 1
        for m in METHODS:
            c[m] += r["methods"][m]["4000"]["all"]
    out["by_where_4k"] = {k: {m: 100 * v[m] / v["n"] for m in METHODS} | {"n": v["n"]}
                          for k, v in split.items()}
    print("\n| evidence steps (4k) | n | " + " | ".join(METHODS) + " |\n|---|---|" + "---|" * len(METHODS))
    for k, v in split.items():
        print(f"| {k} | {v['n']} | " + " | ".join(f"{100 * v[m] / v['n']:.1f}" for m in METHODS) + " |")
    if args.json:
        settings = {"records": args.records, "store": args.store}
        write_json(args.json, envelope("agent_step_range", "ama", str(default_path()), settings, out))


if __name__ == "__main__":
    main()
