"""Router training variants on one set of examples: cross-validated by conversation on the
training conversations, and scored on the acceptance conversation's natural contexts.

    python benchmarks/router_variants.py A:0: B:0:promote C:0.5: D:0.5:promote \\
        --work runs/router_variants --json docs/results/router_variants.json
    python benchmarks/router_variants.py A:0: E:0::beam --work runs/router_variants

Each variant is ``name:beta:kinds to leave out[:extra datasets]`` (comma-separated
``SufficiencyExample.kind`` values; extra datasets, comma-separated names of
``suffice._bench.retrieval.load_set``, are added to every training set, never to a validation
or test fold, so the figures stay LoCoMo's). The examples of all LoCoMo conversations are
built once and kept in ``WORK/examples.pkl`` (a rerun reuses them); each variant runs
``cross_validate`` with four folds over every conversation but the acceptance one, then
trains one router the way ``suffice train router`` does (one validation conversation) and
reports its AUC against "the 1k context holds all gold" on the acceptance conversation
(docs/benchmarks.md section 7).
"""

from __future__ import annotations

import argparse
import json
import pickle
import time
from pathlib import Path

from suffice._bench import retrieval
from suffice._train import router as rt
from suffice._train import sufficiency_data as sd


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("variants", nargs="+", help="name:beta:kinds-to-leave-out")
    ap.add_argument("--work", type=Path, default=Path("runs/router_variants"))
    ap.add_argument("--acceptance", default="conv-26")
    ap.add_argument("--folds", type=int, default=4)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    cached = args.work / "examples.pkl"
    if cached.exists():
        examples = pickle.loads(cached.read_bytes())
    else:
        t = time.perf_counter()
        examples = sd.from_datasets([retrieval.load_set("locomo")], [], args.work, sd.DataConfig())
        cached.write_bytes(pickle.dumps(examples))
        print(f"built {len(examples)} contexts in {time.perf_counter() - t:.0f} s", flush=True)
    extras: dict[str, list[sd.SufficiencyExample]] = {}

    def extra(name: str) -> list[sd.SufficiencyExample]:
        if name not in extras:
            path = args.work / f"examples_{name}.pkl"
            if path.exists():
                extras[name] = pickle.loads(path.read_bytes())
            else:
                t = time.perf_counter()
                extras[name] = sd.from_datasets([retrieval.load_set(name)], [], args.work, sd.DataConfig())
                path.write_bytes(pickle.dumps(extras[name]))
                print(f"built {len(extras[name])} {name} contexts in {time.perf_counter() - t:.0f} s",
                      flush=True)
        return extras[name]

    train_ex = [e for e in examples if e.group != args.acceptance]
    locomo_groups = sorted({e.group for e in train_ex})
    acceptance = rt.judged([e for e in examples if e.group == args.acceptance], 1000)
    out: dict[str, dict[str, object]] = {}
    for spec in args.variants:
        name, beta, drop, *more = spec.split(":")
        left_out = set(drop.split(",")) if drop else set()
        added = [d for d in (more[0].split(",") if more else []) if d]
        always = [e for d in added for e in extra(d) if e.kind not in left_out]
        use = [e for e in train_ex if e.kind not in left_out]
        cfg = rt.RouterTrainConfig(beta=float(beta), calibrate_on="width")
        t = time.perf_counter()
        cv = rt.cross_validate(use + always, args.folds, cfg, groups=locomo_groups)
        tr_g, va_g = rt.split_groups([e.group for e in use])
        net, rep = rt.train([e for e in use if e.group in set(tr_g)] + always,
                            [e for e in use if e.group in set(va_g)], cfg)
        score = rt.auc(rt.predict(net, acceptance).tolist(), [e.label for e in acceptance])
        out[name] = {"beta": float(beta), "left_out": sorted(left_out), "extra": added,
                     "extra_contexts": len(always), "cv_mean": cv["mean_auc"],
                     "cv_pooled": cv["pooled_auc"], "folds": [f["auc"] for f in cv["folds"]],
                     "acceptance_auc": score, "n_acceptance": len(acceptance), "val_auc": rep.val_auc,
                     "seconds": round(time.perf_counter() - t)}
        print(name, json.dumps(out[name]), flush=True)
    if args.json is not None:
        args.json.write_text(json.dumps({"benchmark": "router_variants", "acceptance": args.acceptance,
                                         "variants": out}, indent=1) + "\n")


if __name__ == "__main__":
    main()
