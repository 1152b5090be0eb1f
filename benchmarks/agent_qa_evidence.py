"""How much of each AMA-Bench QA question's cited evidence the readers of ``suffice bench agent qa``
get, at the QA budget: the fast path's prompt (made by ``Memory.ask(mode="fast")`` itself, read
from the prompt a stand-in reader receives) and truncation's; also, for comparison, a plain
``Memory.render`` (the prefix ranked only ``k`` deep, which the engine's fast path ranks deeper)
and the agent render, which no QA variant uses. No model call.

The QA scores of the render and of truncation tie with the 0.5B reader; this says whether that is
because both contexts hold the same evidence (they do not) or because the reader makes little of
the difference.

    python benchmarks/agent_qa_evidence.py --store runs/agent_qa_ama.db --budget 1000
"""

from __future__ import annotations

import argparse

from suffice._bench.agent_qa import open_store, sample_ama, truncation_context
from suffice._bench.report import envelope, write_json
from suffice._config import RenderConfig
from suffice._datasets.ama import default_path, load_ama
from suffice._llm.scripted import ScriptedLLM


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--store", default="runs/agent_qa_ama.db", help="the QA run's store (--store there)")
    ap.add_argument("--budget", type=int, default=1000)
    ap.add_argument("--episodes", type=int, default=24)
    ap.add_argument("--per-episode", type=int, default=2)
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args()
    mem = open_store(args.store)
    agent = RenderConfig.for_agent()
    methods = ("fast path", "truncation", "plain render", "agent render")
    reader = ScriptedLLM("-")  # records the prompt it is sent: the fast path's exact input
    whole = dict.fromkeys(methods, 0)
    share = dict.fromkeys(methods, 0.0)
    n = 0
    try:
        for ep, qs in sample_ama(load_ama(), n_episodes=args.episodes, per_episode=args.per_episode):
            for q in qs:
                cited = set(ep.questions[int(q.key.split("#")[1])].steps)
                evidence = [it.text for it in ep.items if it.meta["step"] in cited]
                if not evidence:
                    continue
                n += 1
                mem.ask(q.question, scope=q.scope, llm=reader, mode="fast", budget=args.budget)
                contexts = {
                    "fast path": "\n".join(m["content"] for m in reader.calls[-1]),
                    "plain render": mem.render(q.question, args.budget, scope=q.scope).text,
                    "agent render": mem.render(q.question, args.budget, scope=q.scope, agent=True,
                                               render=agent).text,
                    "truncation": truncation_context(mem, q.scope, args.budget),
                }
                for m, text in contexts.items():
                    inside = [t in text for t in evidence]
                    whole[m] += all(inside)
                    share[m] += sum(inside) / len(inside)
    finally:
        mem.close()
    out = {"budget": args.budget, "questions": n,
           "methods": {m: {"all_whole_pct": 100 * whole[m] / n, "mean_share_pct": 100 * share[m] / n}
                       for m in methods}}
    print(f"{n} sampled questions that cite steps, budget {args.budget}")
    print("| context | all cited items whole | mean share of cited items whole |\n|---|---|---|")
    for m, v in out["methods"].items():
        print(f"| {m} | {v['all_whole_pct']:.1f}% | {v['mean_share_pct']:.1f}% |")
    if args.json:
        settings = {"budget": args.budget, "store": args.store}
        write_json(args.json, envelope("agent_qa_evidence", "ama", str(default_path()), settings, out))


if __name__ == "__main__":
    main()
