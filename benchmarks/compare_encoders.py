"""Two trained encoders on the same questions, from two `suffice bench retrieval --tuned-encoder`
JSON files: all-evidence-in-B of each (and of the untrained prefix) on the questions both hold,
with the paired gain of the second over the first.

    python benchmarks/compare_encoders.py docs/results/retrieval_beam_locomo_encoder.json \\
        docs/results/retrieval_beam_heldout_mixed_encoder.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from suffice._bench.report import markdown_table, paired_bootstrap


def records(path: Path) -> tuple[list[str], dict[tuple[str, int], dict[str, Any]]]:
    compact = json.loads(path.read_text(encoding="utf-8"))["results"]["records_compact"]
    fields = compact["fields"]
    return fields, {(r[0], r[1]): dict(zip(fields, r, strict=True)) for r in compact["rows"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("first", type=Path)
    ap.add_argument("second", type=Path)
    args = ap.parse_args()
    fields, a = records(args.first)
    _, b = records(args.second)
    keys = [k for k in b if k in a]
    budgets = fields[3].split("@")[1].split("/")
    rows = []
    for m in ("dense", "fused"):
        tuned = next(c for c in fields if c.startswith(f"{m}-tuned "))
        plain = next(c for c in fields if c.startswith(f"{m} all@"))
        for i, budget in enumerate(budgets):
            first = [100.0 * (a[k][tuned][i] == "1") for k in keys]
            second = [100.0 * (b[k][tuned][i] == "1") for k in keys]
            untrained = [100.0 * (b[k][plain][i] == "1") for k in keys]
            d, lo, hi = paired_bootstrap(second, first)
            rows.append([m, budget, f"{sum(untrained) / len(keys):.1f}", f"{sum(first) / len(keys):.1f}",
                         f"{sum(second) / len(keys):.1f}", f"{d:+.1f} [{lo:+.1f}, {hi:+.1f}]"])
    print(f"{len(keys)} questions in both files")
    print(markdown_table(["ranking", "B", "untrained", "first encoder", "second encoder",
                          "second − first (95%)"], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
