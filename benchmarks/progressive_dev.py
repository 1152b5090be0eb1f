"""Fast against deep on LoCoMo conversations kept apart from the acceptance run, for tuning.

The acceptance run of ``bench progressive`` uses the first 150 questions, all from the first
conversation. Changes to the deep path are tried here first, on later conversations, so the
acceptance figures are not tuned on the questions they report. Per-question JSONL (resumable),
then F1 per path and the paired difference.

    python benchmarks/progressive_dev.py --convs 1 --limit 40 --out runs/dev_locomo.jsonl
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from deep_variant import configs

from suffice._bench.metrics import score_locomo
from suffice._bench.qa import conversation_questions, load_done, open_append, receipt_summary
from suffice._bench.report import paired_bootstrap, read_results
from suffice._llm import make_llm


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--convs", default="1", 
                    help="comma list of conversation indexes (0 is the acceptance one)")
    ap.add_argument("--limit", type=int, default=40, help="questions per conversation")
    ap.add_argument("--store", type=Path, default=Path("runs/locomo_dev.db"))
    ap.add_argument("--set", dest="sets", action="append", default=[], help="name=value for deep")
    ap.add_argument("--budget", type=int, default=1000)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--fast-from", type=Path, default=None,
                    help="reuse the fast answers of an earlier dev run (fast does not depend "
                         "on deep settings); questions missing there are run fast here")
    args = ap.parse_args()

    indexes = [int(i) for i in args.convs.split(",")]
    if 0 in indexes:
        ap.error("conversation 0 holds the acceptance questions; tune on others")
    mem, items = conversation_questions(args.store, indexes, args.limit)
    engine, render = configs(args.sets, mem)
    llm = make_llm("local")
    done = {k for _, k in load_done(args.out)}
    reused = ({r["key"]: r["fast"] for r in read_results(args.fast_from)}
              if args.fast_from else {})
    with open_append(args.out) as fh:
        for it in items:
            if it.key in done:
                continue
            rec = {"variant": "dev", "key": it.key, "category": it.q.category}
            if it.key in reused:
                rec["fast"] = reused[it.key]
            for mode in ("fast", "deep"):
                if mode in rec:
                    continue
                ans = mem.ask(it.q.question, scope=it.scope, llm=llm, mode=mode, budget=args.budget,
                              engine=engine, render=render)
                rec[mode] = {"answer": ans.text, "f1": score_locomo(ans.text, it.q.answer, it.q.category),
                             "receipt": receipt_summary(ans.receipt)}
            fh.write(json.dumps(rec, ensure_ascii=False) + "\n")
            fh.flush()
            print(it.key, it.q.category, f"{rec['fast']['f1']:.2f} {rec['deep']['f1']:.2f}",
                  rec["fast"]["answer"][:30], "|", rec["deep"]["answer"][:30], flush=True)

    recs = list(read_results(args.out))
    fast = [100 * r["fast"]["f1"] for r in recs]
    deep = [100 * r["deep"]["f1"] for r in recs]
    print(json.dumps({"n": len(recs), "overrides": args.sets,
                      "f1": {"fast": statistics.fmean(fast), "deep": statistics.fmean(deep)},
                      "deep_minus_fast": paired_bootstrap(deep, fast)}, indent=2))


if __name__ == "__main__":
    main()
