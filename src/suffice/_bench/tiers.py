"""``suffice bench tiers``: quality against cost for tier policies and fixed pipelines.

Every configuration answers the same questions through ``Memory.ask(mode="deep",
agent="tiered")`` with the real reader. Cost and time are the pipeline's, as measured when each
module call was first made (a replay keeps them); ``t_e2e_ms`` in the records is wall time,
which a replayed answer call shortens, so the summary does not use it. A record per
(configuration, question) goes to a JSONL file, so a run resumes where it stopped and a
configuration added later costs only its own calls; the cost axis is the same on a rerun.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from .._config import EngineConfig
from .._errors import ConfigError
from .._llm.base import LLM
from .._pipeline import MODULES, TIERS, TierSource
from .._prompts import PROMPTS_FINGERPRINT
from .._route.tiers import FixedTiers, HeuristicTiers, TierPolicy
from .metrics import score_locomo
from .qa import QAItem, load_done, open_append, questions_of
from .report import current, digest, read_results

if TYPE_CHECKING:
    from .._api import Memory

__all__ = ["fingerprints", "plot", "run", "summarize"]


def _identity(src: TierSource) -> dict[str, Any]:
    """What a tier source decides by: a policy by its weights (a policy retrained at the same
    lambda keeps its name but not its answers), a fixed pipeline by its tiers, the heuristic by
    its rules."""
    if isinstance(src, TierPolicy):
        return {"policy": src.digest, "lam": src.lam}
    if isinstance(src, FixedTiers):
        return {"fixed": dict(src.tiers)}
    if isinstance(src, HeuristicTiers):
        return {"heuristic": src.rules()}
    return {"source": type(src).__name__, "name": src.name}


def fingerprints(mem: Memory, llm: LLM, sources: Sequence[TierSource], *, budget: int) -> dict[str, str]:
    """Per configuration name, a hash of what its answers depend on: the reader, budget,
    prompts, the memory's configs, the pipeline's settings and models, and the source itself."""
    models = sorted((k, m.model) for k, m in (mem.tier_models or {}).items())
    common = {"reader": llm.model, "budget": budget, "prompts": PROMPTS_FINGERPRINT,
              "store": mem.store_config.model_dump(), "retrieval": mem.retrieval.model_dump(),
              "render": mem.render_config.model_dump(), "tier_settings": asdict(mem.tier_settings),
              "tier_models": models}
    return {src.name: digest({**common, "source": _identity(src)}) for src in sources}


def run(mem: Memory, llm: LLM, items: Sequence[QAItem], sources: Sequence[TierSource], out: Path, *,
        budget: int, progress: Callable[[int], None] | None = None) -> dict[str, int]:
    """Answer every item with every source; skip (source, question) pairs already recorded
    under the same settings (:func:`fingerprints`)."""
    names = [s.name for s in sources]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ConfigError(f"tier sources named {', '.join(twice)} more than once: records are kept by name")
    prints = fingerprints(mem, llm, sources, budget=budget)
    done = load_done(out, prints, questions_of(items))
    ran = 0
    config = EngineConfig(reader_budget=budget, deep_scale=1.0)
    with open_append(out) as f:
        for it in items:  # question by question: a partial run compares every source on it
            for src in sources:
                if (src.name, it.key) in done:
                    if progress is not None:
                        progress(1)
                    continue
                ans = mem.ask(it.q.question, scope=it.scope, llm=llm, mode="deep", agent="tiered",
                              tiers=src, engine=config)
                r = ans.receipt
                rec = {
                    "variant": src.name, "key": it.key, "category": it.q.category,
                    "question": it.q.question, "gold": it.q.answer, "prediction": ans.text,
                    "f1": score_locomo(ans.text, it.q.answer, it.q.category),
                    "path": r.path, "degraded": r.degraded,
                    "pipeline_usd": sum(m.cost_usd for m in r.modules),
                    "pipeline_ms": sum(m.latency_ms for m in r.modules),
                    "cost_usd": r.cost_usd, "t_e2e_ms": r.t_e2e_ms, "t_mem_ms": r.t_mem_ms,
                    "tokens": r.input_tokens + r.output_tokens,
                    "tiers": {m.module: m.asked for m in r.modules},
                    "answered_at": {m.module: m.tier for m in r.modules},
                    "notes": list(r.notes),
                    "fingerprint": prints[src.name],
                }
                f.write(json.dumps(rec) + "\n")
                f.flush()
                ran += 1
                if progress is not None:
                    progress(1)
    return {"ran": ran, "reused": len(sources) * len(items) - ran}


def _ci(values: Sequence[float], n: int = 2000, seed: int = 0) -> tuple[float, float]:
    if not values:
        return (float("nan"), float("nan"))
    rng = random.Random(seed)
    arr = list(values)
    means = sorted(sum(rng.choice(arr) for _ in arr) / len(arr) for _ in range(n))
    return means[int(0.025 * n)], means[int(0.975 * n) - 1]


def summarize(path: Path, questions: Mapping[str, Mapping[str, Any]] | None = None,
              fingerprints: dict[str, str] | None = None) -> dict[str, Any]:
    """Per configuration: F1 (with a bootstrap 95% interval), pipeline cost and time, T_e2e,
    and each module's tier shares; only questions every configuration answered count. One
    record per (configuration, question), the newest (with ``fingerprints``, the newest made
    under them; with ``questions``, see :func:`.qa.questions_of`, of those questions as asked
    now)."""
    by: dict[str, dict[str, dict[str, Any]]] = {}
    for r in current(read_results(path), fingerprints, questions).values():
        by.setdefault(r["variant"], {})[r["key"]] = r
    common = set.intersection(*(set(v) for v in by.values())) if by else set()
    rows: dict[str, Any] = {}
    for name, rs in by.items():
        got = [rs[k] for k in sorted(common)]
        if not got:
            continue
        f1 = [100 * r["f1"] for r in got]
        shares = {m: {t: sum(r["tiers"].get(m) == t for r in got) / len(got) for t in TIERS}
                  for m in MODULES}
        rows[name] = {
            "n": len(got), "f1": float(np.mean(f1)), "f1_ci": _ci(f1),
            "pipeline_usd": float(np.mean([r["pipeline_usd"] for r in got])),
            "pipeline_ms": float(np.mean([r["pipeline_ms"] for r in got])),
            "t_e2e_ms": float(np.mean([r["t_e2e_ms"] for r in got])),
            "fell_back": sum(any(a != r["tiers"][m] for m, a in r["answered_at"].items()) for r in got),
            "degraded": sum(bool(r["degraded"]) for r in got),
            "tiers": shares,
        }
    fixed = {n: r for n, r in rows.items() if n.startswith("all-")}
    best = max(fixed, key=lambda n: fixed[n]["f1"]) if fixed else None
    if best is not None:
        shared = sorted(common)
        for name, r in rows.items():
            diffs = [100 * (by[name][k]["f1"] - by[best][k]["f1"]) for k in shared]
            r["vs_best_fixed"] = {"config": best, "delta_f1": float(np.mean(diffs)), "ci": _ci(diffs)}
        for name, r in rows.items():
            if not name.startswith("all-"):
                r["vs_fixed_line"] = {space: _vs_line(by, fixed, name, r["pipeline_usd"], shared, space)
                                      for space in ("linear", "log")}
    return {"n_common": len(common), "configs": rows, "best_fixed": best}


def _vs_line(by: dict[str, dict[str, dict[str, Any]]], fixed: dict[str, Any], name: str, cost: float,
             keys: Sequence[str], space: str) -> dict[str, Any] | None:
    """How far a configuration lies above the line joining the two fixed pipelines whose costs
    bracket its own, in cost (``linear``) or log cost (``log``), with a paired interval: each
    question's mark minus the same mix of the two pipelines' marks on that question. None when
    no two fixed pipelines bracket its cost."""
    pts = sorted((r["pipeline_usd"], n) for n, r in fixed.items())
    for (ca, a), (cb, b) in zip(pts, pts[1:], strict=False):
        if not ca <= cost <= cb or cb <= ca:
            continue
        if space == "log":
            if ca <= 0:
                return None
            w = (math.log(cb) - math.log(cost)) / (math.log(cb) - math.log(ca))
        else:
            w = (cb - cost) / (cb - ca)
        gaps = [100 * (by[name][k]["f1"] - w * by[a][k]["f1"] - (1 - w) * by[b][k]["f1"]) for k in keys]
        line = w * fixed[a]["f1"] + (1 - w) * fixed[b]["f1"]
        return {"between": [a, b], "weight_first": w, "line_f1": line,
                "above": float(np.mean(gaps)), "ci": _ci(gaps)}
    return None


def format_summary(s: dict[str, Any]) -> str:
    lines = [f"{s['n_common']} questions answered by every configuration",
             f"{'config':<22}{'F1':>7}  {'95% CI':<15}{'pipeline $':>12}{'pipeline s':>11}"
             f"{'fell back':>10}  {'vs best fixed':<22}{'above fixed line':<22}"
             "tiers (share Low/Mid/High per module)"]
    for name, r in sorted(s["configs"].items(), key=lambda kv: kv[1]["pipeline_usd"]):
        lo, hi = r["f1_ci"]
        tiers = " ".join(f"{m[:3]}:" + "/".join(f"{r['tiers'][m][t]:.0%}" for t in TIERS) for m in MODULES)
        v = r.get("vs_best_fixed")
        vs = f"{v['delta_f1']:+.1f} [{v['ci'][0]:+.1f},{v['ci'][1]:+.1f}]" if v else ""
        ln = (r.get("vs_fixed_line") or {}).get("linear")
        above = f"{ln['above']:+.1f} [{ln['ci'][0]:+.1f},{ln['ci'][1]:+.1f}]" if ln else ""
        lines.append(f"{name:<22}{r['f1']:>7.1f}  [{lo:5.1f},{hi:5.1f}]  {r['pipeline_usd']:>12.2e}"
                     f"{r['pipeline_ms'] / 1e3:>11.2f}{r['fell_back']:>10}  {vs:<22}{above:<22}{tiers}")
    return "\n".join(lines)


def plot(s: dict[str, Any], png: Path) -> None:
    """F1 against pipeline cost (fixed pipelines joined by a line, policies as points), and
    each policy's tier shares per module."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = s["configs"]
    fixed = sorted((r["pipeline_usd"], r["f1"], n) for n, r in rows.items() if n.startswith("all-"))
    learned = sorted((r["pipeline_usd"], r["f1"], n) for n, r in rows.items() if not n.startswith("all-"))
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(12, 4.5), gridspec_kw={"width_ratios": [1.2, 1]})
    if fixed:
        ax.plot([c for c, _, _ in fixed], [f for _, f, _ in fixed], "s--", color="grey", label="fixed tiers")
        for c, f, n in fixed:
            ax.annotate(n, (c, f), textcoords="offset points", xytext=(4, -10), fontsize=8)
    for c, f, n in learned:
        ax.plot([c], [f], "o", label=n)
    ax.set_xscale("log")
    ax.set_xlabel("pipeline cost per question (USD, tokens + CPU time)")
    ax.set_ylabel("token F1")
    ax.set_title(f"Quality vs cost ({s['n_common']} questions)")
    ax.legend(fontsize=7)
    names = [n for _, _, n in learned]
    width = 0.8 / max(len(names), 1)
    ticks, labels = [], []
    for j, n in enumerate(names):
        low = [rows[n]["tiers"][m]["low"] for m in MODULES]
        mid = [rows[n]["tiers"][m]["mid"] for m in MODULES]
        high = [rows[n]["tiers"][m]["high"] for m in MODULES]
        xs = np.arange(len(MODULES)) + j * width
        bx.bar(xs, low, width, color="#c6dbef", edgecolor="k", linewidth=0.3, label="Low" if j == 0 else None)
        bx.bar(xs, mid, width, bottom=low, color="#4292c6", edgecolor="k", linewidth=0.3,
               label="Mid" if j == 0 else None)
        bx.bar(xs, high, width, bottom=np.add(low, mid), color="#08306b", edgecolor="k", linewidth=0.3,
               label="High" if j == 0 else None)
        ticks += list(xs)
        labels += [n.replace("policy ", "").replace("heuristic", "heur.")] * len(MODULES)
    bx.set_xticks(ticks, labels, rotation=90, fontsize=6)
    for i, m in enumerate(MODULES):
        bx.text(i + 0.4 - width / 2, 1.02, m, ha="center", fontsize=8)
    bx.set_ylabel("share of questions")
    bx.set_ylim(0, 1.1)
    bx.legend(fontsize=7, loc="lower right")
    bx.set_title("Tiers chosen, per module and configuration", fontsize=9, pad=14)
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110)
    plt.close(fig)
