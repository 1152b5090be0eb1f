"""How well the deep path's memory agents find the gold evidence, without the reader.

For LoCoMo questions kept apart from the acceptance run, the deep path's blocks are chosen from
the prefix hits as the engine does, one agent reads each block, and the items the agents cite
are compared with the dataset's gold evidence turns: block recall (gold turns inside the chosen
blocks), agent recall (gold turns cited), how many items are cited, and how often no block
yields anything (the engine then falls back to the fast path).

    python benchmarks/agent_recall.py --convs 1,2 --limit 10 --agent copy
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import time
from collections.abc import Sequence
from typing import Any

from suffice._bench.qa import conversation_questions, gold_finder
from suffice._deep import AgentNote, LLMBlockReader, choose_blocks, run_agents
from suffice._llm import make_llm
from suffice._llm.base import LLM, Ledger, Message
from suffice._tokens import truncate
from suffice._types import Block, Item


class NumberedBlockReader:
    """Exploratory agent: the block's lines are numbered and the model names line numbers.

    Naming numbers leaves no room to write a sentence of its own, which is how the copying
    agent goes wrong; whether a 0.5B model picks the right numbers is what this measures.
    """

    def __init__(self, llm: LLM, max_block_tokens: int = 1800, max_tokens: int = 24) -> None:
        self.llm, self.max_block_tokens, self.max_tokens = llm, max_block_tokens, max_tokens

    def read(self, question: str, block: Block, items: Sequence[Item], hit_seqs: set[int],
             *, ledger: Ledger | None = None, deadline: float | None = None) -> AgentNote:
        t0 = time.perf_counter()
        text = truncate("\n".join(f"{i}. {it.render()}" for i, it in enumerate(items, 1)),
                        self.max_block_tokens)
        messages: list[Message] = [
            {"role": "system", "content": "You pick the lines of an excerpt that help answer a "
             "question. Reply with the numbers of at most three lines, separated by commas, "
             "most useful first, or NONE if no line helps. Write nothing else."},
            {"role": "user", "content": f"Excerpt:\n{text}\n\nQuestion: {question}\n\n"
             "Numbers of the lines that help:"}]
        out = self.llm.chat(messages, max_tokens=self.max_tokens, stage="block_agent",
                            ledger=ledger, deadline=deadline).text
        picked: list[Item] = []
        for n in re.findall(r"\d+", out)[:3]:
            i = int(n) - 1
            if 0 <= i < len(items) and items[i] not in picked:
                picked.append(items[i])
        picked.sort(key=lambda it: it.seq)
        return AgentNote.quoting(block, picked, (time.perf_counter() - t0) * 1e3)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--convs", default="1,2")
    ap.add_argument("--limit", type=int, default=10, help="questions per conversation")
    ap.add_argument("--store", default="runs/locomo_dev.db")
    ap.add_argument("--agent", choices=("copy", "numbers"), default="copy")
    args = ap.parse_args()

    indexes = [int(i) for i in args.convs.split(",")]
    if 0 in indexes:
        ap.error("conversation 0 holds the acceptance questions; measure on others")
    mem, items = conversation_questions(args.store, indexes, args.limit)
    llm = make_llm("local")
    agent = LLMBlockReader(llm) if args.agent == "copy" else NumberedBlockReader(llm)
    s = mem.engine_config
    gold_of = gold_finder(mem, {it.scope for it in items})
    by_scope = {scope: {x.seq: x for x in mem.items(scope=scope)} for scope in {it.scope for it in items}}
    rows: list[dict[str, Any]] = []
    for it in items:
        gold = gold_of(it)
        ev = mem.search(it.q.question, scope=it.scope)
        views = mem.retriever.index(it.scope).views
        chosen = choose_blocks(ev.hits, views, s)
        by_seq = by_scope[it.scope]
        block_items = {c.block.index: [by_seq[q] for q in range(c.block.first_seq, c.block.last_seq + 1)]
                       for c in chosen}
        in_blocks = {q for c in chosen for q in range(c.block.first_seq, c.block.last_seq + 1)}
        notes = run_agents(agent, it.q.question, chosen, block_items, {h.seq for h in ev.hits},
                           concurrency=s.concurrency)
        cited = {q for n in notes for q in n.seqs}
        rows.append({"key": it.key, "category": it.q.category, "gold": len(gold),
                     "gold_in_blocks": len(gold & in_blocks), "gold_cited": len(gold & cited),
                     "gold_in_prefix": len(gold & {h.seq for h in ev.hits}),
                     "cited": len(cited), "nothing": not cited})
        print(json.dumps(rows[-1]), flush=True)
    has_gold = [r for r in rows if r["gold"]]
    def frac(key: str) -> float:
        return 100.0 * sum(int(r[key]) for r in has_gold) / sum(int(r["gold"]) for r in has_gold)
    print(json.dumps({"agent": args.agent, "n": len(rows), "gold_turns": sum(r["gold"] for r in has_gold),
                      "recall_prefix_%": frac("gold_in_prefix"), "recall_blocks_%": frac("gold_in_blocks"),
                      "recall_cited_%": frac("gold_cited"),
                      "cited_per_q": statistics.fmean(r["cited"] for r in rows),
                      "nothing_%": 100 * statistics.fmean(r["nothing"] for r in rows)}, indent=1))


if __name__ == "__main__":
    main()
