"""Which share of the gold evidence the deep path's blocks contain, per block-choice setting.

No model is called: for each LoCoMo question the prefix hits are mapped to blocks as the engine
does (``choose_blocks``) under a few settings, and the gold evidence turns inside the chosen
blocks are counted, next to those in the prefix hits themselves. A memory agent can only cite
what its block holds, so this bounds what the deep path can add.

    python benchmarks/block_recall.py --store runs/locomo.db --convs 0 --limit 150
    python benchmarks/block_recall.py --store runs/locomo_dev.db --convs 1,2 --limit 20
"""

from __future__ import annotations

import argparse
import json

from suffice._bench.qa import conversation_questions, gold_finder
from suffice._deep import choose_blocks

CHOICES = {  # name -> anchor_blocks, with max_blocks at its default of 4
    "2 anchors + neighbours (default)": 2,
    "3 anchors + neighbours": 3,
    "4 anchors": 4,
    "1 anchor + neighbours": 1,
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--store", default="runs/locomo.db")
    ap.add_argument("--convs", default="0")
    ap.add_argument("--limit", type=int, default=150, help="questions per conversation")
    args = ap.parse_args()
    mem, items = conversation_questions(args.store, [int(i) for i in args.convs.split(",")],
                                        args.limit)
    gold_turns = in_prefix = 0
    in_blocks = dict.fromkeys(CHOICES, 0)
    gold_of = gold_finder(mem, {it.scope for it in items})
    for it in items:
        gold = gold_of(it)
        hits = mem.search(it.q.question, scope=it.scope).hits
        views = mem.retriever.index(it.scope).views
        gold_turns += len(gold)
        in_prefix += len(gold & {h.seq for h in hits})
        for name, anchors in CHOICES.items():
            chosen = choose_blocks(hits, views, mem.engine_config.replace(anchor_blocks=anchors))
            seqs = {q for c in chosen for q in range(c.block.first_seq, c.block.last_seq + 1)}
            in_blocks[name] += len(gold & seqs)
    print(json.dumps({"questions": len(items), "gold_turns": gold_turns,
                      "recall_prefix_%": round(100 * in_prefix / gold_turns, 1),
                      "recall_blocks_%": {k: round(100 * v / gold_turns, 1) for k, v in in_blocks.items()}},
                     indent=1))


if __name__ == "__main__":
    main()
