"""What the rewrite after a forget costs: forget the latest item of a copy of a store, with and without
``vacuum_on_forget``, and time each (the copy is made fresh for every run).

    python benchmarks/forget_cost.py runs/locomo_all.db runs/scale_100000.db --runs 3
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from suffice import Memory, SQLiteStore


def one(src: Path, vacuum: bool) -> tuple[float, int, int]:
    with tempfile.TemporaryDirectory(dir=src.parent) as tmp:
        path = Path(tmp) / src.name
        shutil.copyfile(src, path)
        mem = Memory(SQLiteStore(path, vacuum_on_forget=vacuum), embedder=None)
        scope = mem.store.scopes()[0]
        victim = mem.items(scope=scope)[-1].id  # the latest: no seq renumbering to time
        before = path.stat().st_size
        t0 = time.perf_counter()
        report = mem.forget(scope, ids=[victim])
        took = time.perf_counter() - t0
        mem.close()
        assert report.items == 1 and report.scrubbed is vacuum
        return took, before, path.stat().st_size


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("stores", nargs="+", type=Path)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    rows = []
    for src in args.stores:
        for vacuum in (False, True):  # interleaved runs would share the page cache the same way
            runs = [one(src, vacuum) for _ in range(args.runs)]
            row = {"store": src.name, "vacuum_on_forget": vacuum, "runs": args.runs,
                   "forget_s_median": statistics.median(r[0] for r in runs),
                   "forget_s_all": [round(r[0], 4) for r in runs],
                   "size_mb_before": runs[0][1] / 1e6, "size_mb_after": runs[0][2] / 1e6}
            rows.append(row)
            print(json.dumps(row), flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
