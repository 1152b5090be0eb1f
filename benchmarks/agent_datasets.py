"""What the agent datasets hold once imported, and how many checkpoint questions each yields.

Reads the four shared agent sources (or a folder given per dataset), prints per dataset the runs,
items, items per kind, checkpoints per kind and the distribution of the gap between a
checkpoint and its evidence (steps for SWE and AMA, messages for τ / τ²), with the variants of
the builders' rules beside the defaults. No store and no model: seconds.

    python benchmarks/agent_datasets.py [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

from suffice._datasets.ama import load_ama
from suffice._datasets.checkpoints import (
    Checkpoint,
    ama_checkpoints,
    swe_discovered_values,
    swe_re_views,
    tau_value_reuses,
)
from suffice._datasets.trajectories import KINDS, Trajectory, ama_trajectory, load_swe, load_tau, load_tau2


def gaps(cps: Sequence[Checkpoint]) -> dict[str, Any]:
    g = sorted(c.gap for c in cps)
    if not g:
        return {"n": 0}
    return {"n": len(g), "runs": len({c.trajectory for c in cps}), "median": statistics.median(g),
            "p90": g[int(0.9 * (len(g) - 1))], "max": g[-1], "gap>=1": sum(x >= 1 for x in g),
            "gap>=5": sum(x >= 5 for x in g), "gap>=10": sum(x >= 10 for x in g)}


def items_table(trajs: Sequence[Trajectory]) -> dict[str, Any]:
    kinds = Counter(it.kind for t in trajs for it in t.items)
    steps = [len({it.meta["step"] for it in t.items}) for t in trajs]
    return {"runs": len(trajs), "items": sum(kinds.values()), "steps_median": statistics.median(steps),
            "kinds": {k: kinds[k] for k in KINDS if kinds[k]}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", help="Write the figures here.")
    args = ap.parse_args()
    t0 = time.perf_counter()
    eps = load_ama()
    data = {"ama": [ama_trajectory(e) for e in eps], "swe": load_swe(), "tau": load_tau(),
            "tau2": load_tau2()}
    report: dict[str, Any] = {name: items_table(ts) for name, ts in data.items()}
    cps: dict[str, dict[str, list[Checkpoint]]] = {
        "swe": {"re_view": [c for t in data["swe"] for c in swe_re_views(t)],
                "re_view (same file, any lines)": [c for t in data["swe"]
                                                   for c in swe_re_views(t, same_lines=False)]},
        "tau": {}, "tau2": {}, "ama": {}}
    found = [c for t in data["swe"] for c in swe_discovered_values(t)]
    every = [c for t in data["swe"] for c in swe_discovered_values(t, first_use=False)]
    for kind in ("discovered_path", "discovered_line"):
        cps["swe"][kind] = [c for c in found if c.kind == kind]
        cps["swe"][f"{kind} (every use)"] = [c for c in every if c.kind == kind]
    for name in ("tau", "tau2"):
        cps[name]["value_reuse"] = [c for t in data[name] for c in tau_value_reuses(t)]
        cps[name]["value_reuse (every use)"] = [c for t in data[name]
                                                for c in tau_value_reuses(t, first_use=False)]
    ama = [c for e in eps for c in ama_checkpoints(e)]
    cps["ama"]["ama (cited steps)"] = ama
    cps["ama"]["ama step-range (type A)"] = [c for c in ama if c.detail["step_range"]]
    for name, by_kind in cps.items():
        report[name]["checkpoints"] = {k: gaps(v) for k, v in by_kind.items()}
    for name, r in report.items():
        print(f"\n## {name}: {r['runs']} runs, {r['items']} items (median {r['steps_median']} steps)")
        print("items per kind: " + ", ".join(f"{k} {v}" for k, v in r["kinds"].items()))
        print("| checkpoints | n | runs | gap median | p90 | max | gap ≥ 1 | gap ≥ 5 | gap ≥ 10 |")
        print("|---|---|---|---|---|---|---|---|---|")
        for k, g in r["checkpoints"].items():
            if g["n"]:
                print(f"| {k} | {g['n']} | {g['runs']} | {g['median']} | {g['p90']} | {g['max']} | "
                      f"{g['gap>=1']} | {g['gap>=5']} | {g['gap>=10']} |")
            else:
                print(f"| {k} | 0 | | | | | | | |")
    print(f"\n({time.perf_counter() - t0:.1f} s)")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(report, fh, indent=1)


if __name__ == "__main__":
    main()
