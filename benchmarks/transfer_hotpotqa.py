"""Does an encoder trained on conversations help on encyclopedic multi-hop questions?

HotpotQA's 103 shared dev items (distractor setting): each item's 10 paragraphs become one
scope whose items are sentences (the paragraph title as speaker); a question's evidence is its
supporting sentences. The shipped encoder and a trained one (``--encoder``) rank the same items
with the same BM25; reported are recall@k of the supporting sentences and the share of
questions with all of them in the top k, with paired bootstrap intervals.

    python benchmarks/transfer_hotpotqa.py --encoder ENC --json docs/results/transfer_hotpotqa.json
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from suffice import Memory, load_encoder
from suffice._bench.report import envelope, markdown_table, paired_bootstrap, write_json
from suffice._datasets.hotpotqa import default_path, items_of, load_hotpotqa

KS = (2, 5, 10)


def score(mem: Memory, data: list[dict[str, Any]], method: str) -> list[dict[int, tuple[float, bool]]]:
    out = []
    for n, entry in enumerate(data):
        scope = f"h{n}"
        items = mem.items(scope=scope, limit=None)
        key = {(it.meta["title"], it.meta["sent"]): it.seq for it in items}
        gold = {key[(t, int(i))] for t, i in entry["supporting_facts"] if (t, int(i)) in key}
        ranking = list(mem.retriever.rank(scope, entry["question"], mem.retrieval, method=method,  # type: ignore[arg-type]
                                          depth=len(items)).seqs)
        out.append({k: (len(gold & set(ranking[:k])) / max(len(gold), 1), gold <= set(ranking[:k]))
                    for k in KS})
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--encoder", type=Path, required=True, help="a trained encoder folder")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    path = default_path("dev")
    data = load_hotpotqa(path)
    res: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        runs = {}
        for name, embedder in (("shipped", "default"), ("trained", load_encoder(args.encoder))):
            mem = Memory(Path(tmp) / f"{name}.db", embedder=embedder)
            for n, entry in enumerate(data):
                mem.add(items_of(entry), scope=f"h{n}")
            for method in ("dense", "fused"):
                runs[(name, method)] = score(mem, data, method)
            mem.close()
    rows = []
    for method in ("dense", "fused"):
        for k in KS:
            a = [100.0 * r[k][1] for r in runs[("trained", method)]]
            z = [100.0 * r[k][1] for r in runs[("shipped", method)]]
            rec_t = sum(r[k][0] for r in runs[("trained", method)]) / len(data) * 100
            rec_s = sum(r[k][0] for r in runs[("shipped", method)]) / len(data) * 100
            d, lo, hi = paired_bootstrap(a, z)
            res[f"{method} k={k}"] = {"recall_shipped": rec_s, "recall_trained": rec_t,
                                      "all_shipped": sum(z) / len(z), "all_trained": sum(a) / len(a),
                                      "all_gain": [d, lo, hi]}
            all_s, all_t = sum(z) / len(z), sum(a) / len(a)
            rows.append([method, k, f"{rec_s:.1f} → {rec_t:.1f}", f"{all_s:.1f} → {all_t:.1f}",
                         f"{d:+.1f} [{lo:+.1f}, {hi:+.1f}]"])
    header = ["ranking", "k", "recall@k (shipped → trained)", "all in top k", "gain (95%)"]
    print(markdown_table(header, rows))
    if args.json:
        card = json.loads((args.encoder / "card.json").read_text(encoding="utf-8"))
        doc = envelope("transfer_hotpotqa", "hotpotqa", str(path),
                       {"encoder": card.get("name"), "trained_on": card.get("trained_on")}, res)
        doc["command"] = "python benchmarks/transfer_hotpotqa.py --encoder ENC " + (
            f"--json {args.json}" if args.json else "")
        write_json(args.json, doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
