"""Auto whose early stops the deep model answers (``stop_reader="deep"``), composed from records.

Inputs, all per-question JSONL:

* ``--runs``: a ``suffice bench progressive`` run (fast and deep results, every router's score and
  tau, and the evidence label ``fast_has_all_gold``);
* ``--stop``: the stop path on the same questions, as ``benchmarks/deep_variant.py --set
  deep_scale=1 --deep-model MODEL`` records it (the deep model over the fast budget, with dates);
* ``--deep-sample`` (optional): the deep path rerun on some of those questions on the same
  machine and day as ``--stop`` (``deep_variant.py --every N --deep-model MODEL``), so the stop
  path's time can be put against deep's on one machine; a line with ``stop_t_e2e_ms`` brings
  the stop path's time of the same question, timed beside it.

``--router DIR`` (repeatable) scores the same questions with a trained router on the current
code (``--store`` must hold the conversations; no model call), so a router trained after the
run, e.g. with ``--stop-rate``, is composed at its own calibrated tau too.

It also labels every question by *width* (does the render at twice the reader's budget show
more of the gold evidence than the fast context?), the target of ``suffice train router
--target width``, and reports each router's AUC against it and the auto of a router perfect on
it.

Per router and tau it reports auto's F1 with fast stops (today's default) and with deep-model
stops, the stop rate, and paired intervals against deep. Where the sample exists it also gives
the time as a share of deep's: ``s * r + (1 - s)``, with ``s`` the stop rate and ``r`` the stop
path's mean time over deep's on the sampled questions (a projection from that ratio, not a timed
auto run; the routers' own few milliseconds are left out).

    python benchmarks/stop_auto.py --runs docs/results/progressive_router.jsonl \\
        --stop runs/stop_deep.jsonl --deep-sample runs/deep_sample.jsonl --json docs/results/stop_auto.json
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path
from typing import Any

from suffice._bench.progressive import MAX_F1_LOSS, MIN_SPEEDUP, auc
from suffice._bench.report import envelope, markdown_table, paired_bootstrap, read_results, write_json

TAUS = (0.3, 0.4, 0.5, 0.6, 0.7)


def compose(recs: dict[str, dict[str, Any]], stop: dict[str, dict[str, Any]], r: float | None,
            wider: dict[str, bool] | None = None) -> dict[str, Any]:
    keys = [k for k in recs if k in stop]
    deep = [100 * recs[k]["deep"]["f1"] for k in keys]
    fast = [100 * recs[k]["fast"]["f1"] for k in keys]
    stopped = [100 * stop[k]["f1"] for k in keys]
    rows: list[dict[str, Any]] = []

    def row(name: str, early: list[bool]) -> None:
        s = sum(early) / len(early)
        by_fast = [f if e else d for f, d, e in zip(fast, deep, early, strict=True)]
        by_deep = [x if e else d for x, d, e in zip(stopped, deep, early, strict=True)]
        rows.append({
            "run": name, "stop_rate": 100 * s,
            "f1_fast_stops": statistics.fmean(by_fast), "f1_deep_model_stops": statistics.fmean(by_deep),
            "deep_model_stops_minus_deep": paired_bootstrap(by_deep, deep),
            "time_share_of_deep": None if r is None else s * r + (1 - s),
        })

    names = sorted({n for k in keys for n in recs[k]["routers"]})
    for name in names:
        scores = [recs[k]["routers"][name] for k in keys]
        taus = {f"tau={t}": t for t in TAUS}
        own = {d.get("tau") for d in scores}
        if len(own) == 1 and (t := own.pop()) is not None and not name.startswith(("retrieval", "lm-")):
            taus[f"tau=calibrated({t:.2f})"] = t
        for label, t in taus.items():
            row(f"auto[{name}] {label}", [bool(d["ok"] and d["score"] >= t) for d in scores])
    row("oracle on the evidence label", [bool(recs[k].get("fast_has_all_gold")) for k in keys])
    if wider:
        row("oracle on the width label", [not wider.get(k, False) for k in keys])
    return {"n": len(keys), "f1": {"fast": statistics.fmean(fast), "deep": statistics.fmean(deep),
                                   "stop_path": statistics.fmean(stopped)},
            "stop_path_minus_deep": paired_bootstrap(stopped, deep),
            "stop_path_minus_fast": paired_bootstrap(stopped, fast), "time_ratio_stop_over_deep": r,
            "rows": rows}


def rescore(recs: dict[str, dict[str, Any]], folders: list[Path], store: Path) -> dict[str, bool]:
    """Add each router's score on every recorded question, made as auto makes it now; return the
    width label of every question with gold evidence (does the render at twice the reader's
    budget show more of it?), which the recorded run predates. No model call."""
    import time

    from suffice import Memory
    from suffice._bench.progressive import holds_all_gold, wider_adds
    from suffice._bench.qa import gold_finder, items_by_key
    from suffice._engine import Engine
    from suffice._llm.base import Ledger
    from suffice._route.sufficiency import router_tau
    from suffice._route.trained import TrainedRouter

    by_key = items_by_key()
    mem = Memory(store, create=False)
    engine = Engine(mem.store, mem.retriever, mem.renderer, None)  # type: ignore[arg-type]
    config = mem.engine_config
    gold = gold_finder(mem, {by_key[k].scope for k in recs})
    # What auto's router reads for each question, made once and read by every router.
    inputs = {key: engine.route_input(by_key[key].q.question, scope=by_key[key].scope, config=config,
                                      retrieval=mem.retrieval, render=mem.render_config)
              for key in recs}
    same = 0
    for key, rec in recs.items():  # is the fast context still the one the run recorded?
        same += holds_all_gold(inputs[key], gold(by_key[key]), mem) == bool(rec.get("fast_has_all_gold"))
    print(f"evidence label today vs recorded: {same} of {len(recs)} agree")
    wider = {key: wider_adds(engine, mem, by_key[key].q.question, by_key[key].scope, config, inputs[key], g)
             for key in recs if (g := gold(by_key[key]))}
    for folder in folders:
        rt = TrainedRouter(folder)
        for key, rec in recs.items():
            t = time.perf_counter()
            d = rt.score(inputs[key], ledger=Ledger())
            # Named by folder: two folders may hold one network with different taus.
            rec["routers"][f"trained:{folder.name}"] = {
                "score": d.score, "ok": d.ok, "ms": (time.perf_counter() - t) * 1e3, "cost_usd": 0.0,
                "tau": router_tau(rt)}
    mem.close()
    return wider


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=Path, required=True)
    ap.add_argument("--stop", type=Path, required=True)
    ap.add_argument("--deep-sample", type=Path)
    ap.add_argument("--router", type=Path, action="append", default=[], help="trained router folder")
    ap.add_argument("--store", type=Path, default=Path("runs/locomo.db"))
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    recs = {r["key"]: r for r in read_results(args.runs)}
    wider = rescore(recs, args.router, args.store)
    stop = {r["key"]: r for r in read_results(args.stop)}
    ratio = None
    if args.deep_sample is not None:
        sample = {r["key"]: r for r in read_results(args.deep_sample)}
        # A sample line may carry its own stop time, timed next to its deep answer: the
        # cleaner pair when the stop run shared the machine with other work.
        shared = [k for k in sample if k in stop or "stop_t_e2e_ms" in sample[k]]
        if shared:
            ratio = (statistics.fmean(sample[k].get("stop_t_e2e_ms") or stop[k]["receipt"]["t_e2e_ms"]
                                      for k in shared)
                     / statistics.fmean(sample[k]["receipt"]["t_e2e_ms"] for k in shared))
            print(f"time ratio stop/deep on {len(shared)} questions: {ratio:.3f}")
    print(f"the 2x render shows more gold on {sum(wider.values())} of {len(wider)} questions")
    res = compose(recs, stop, ratio, wider)
    labelled = [r for r in recs.values() if r.get("n_gold", 1) > 0]
    res["auc_fast_has_all_gold"] = {
        name: auc([r["routers"][name]["score"] for r in labelled],
                  [bool(r.get("fast_has_all_gold")) for r in labelled])
        for name in sorted({n for r in labelled for n in r["routers"]})}
    print("AUC vs the fast context holds all gold (all recorded questions):",
          {k: None if v is None else round(v, 3) for k, v in res["auc_fast_has_all_gold"].items()})
    known = [k for k in recs if k in wider]
    res["auc_width_adds_nothing"] = {
        name: auc([recs[k]["routers"][name]["score"] for k in known], [not wider[k] for k in known])
        for name in sorted({n for k in known for n in recs[k]["routers"]})}
    print("AUC vs the 2x render shows no more gold:",
          {k: None if v is None else round(v, 3) for k, v in res["auc_width_adds_nothing"].items()})
    print(f"n={res['n']}  F1 fast {res['f1']['fast']:.1f}  stop path {res['f1']['stop_path']:.1f}  "
          f"deep {res['f1']['deep']:.1f}")

    def ci(x: tuple[float, float, float]) -> str:
        return f"{x[0]:+.1f} [{x[1]:+.1f}, {x[2]:+.1f}]"

    print(markdown_table(
        ["run", "stops %", "F1, fast stops", "F1, deep-model stops", "− deep", "time / deep's"],
        [[r["run"], r["stop_rate"], r["f1_fast_stops"], r["f1_deep_model_stops"],
          ci(r["deep_model_stops_minus_deep"]),
          "-" if r["time_share_of_deep"] is None else f"{r['time_share_of_deep']:.2f}"]
         for r in res["rows"]]))
    passing = [r["run"] for r in res["rows"] if r["time_share_of_deep"] is not None
               and r["time_share_of_deep"] <= 1 - MIN_SPEEDUP
               and res["f1"]["deep"] - r["f1_deep_model_stops"] <= MAX_F1_LOSS]
    print("meets the target (within 1 F1 of deep at <= 70% of its time):", passing or "none")
    if args.json:
        write_json(args.json, envelope("stop_auto", "locomo", str(args.runs),
                                       {"stop": str(args.stop), "deep_sample": str(args.deep_sample)},
                                       {**res, "passing": passing}))


if __name__ == "__main__":
    main()
