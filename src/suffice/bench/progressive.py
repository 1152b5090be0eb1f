"""Progressive-execution benchmark: fast, deep and auto(tau) on the same questions.

For every question the fast path and the deep path are each run once with the same reader,
and every router scores the same prefix evidence once. ``auto(tau)`` takes the fast result when
the router's score reaches tau and the deep result otherwise, adding the router's own time and
cost: with greedy decoding an auto run makes exactly those calls, so this is what it would
return (``--verify N`` re-runs auto for real on N questions and reports how many agree).
Per-question records go to a JSONL file; a rerun resumes where it stopped.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ..api import Memory
from ..engine import Engine
from ..llm.base import LLM, Ledger
from ..route.sufficiency import LMRouter, ScoreRouter, SufficiencyRouter
from .judge import judge
from .metrics import score_locomo
from .qa import QAItem, load_done, open_append, read_results, receipt_summary
from .report import markdown_table

TAUS = (0.1, 0.3, 0.5, 0.7, 0.9)


def routers(llm: LLM) -> list[SufficiencyRouter]:
    return [LMRouter(llm), ScoreRouter()]


def run(mem: Memory, llm: LLM, items: Sequence[QAItem], out: Path, *, budget: int,
        gold_seqs: Callable[[QAItem], set[int]], judge_llm: LLM | None = None,
        progress: Callable[[int], None] | None = None) -> None:
    done = {k for _, k in load_done(out)}
    engine = Engine(mem, llm)
    rts = routers(llm)
    with open_append(out) as fh:
        for item in items:
            if item.key in done:
                if progress:
                    progress(1)
                continue
            q = item.q
            rec: dict[str, Any] = {"variant": "progressive", "key": item.key,
                                   "category": q.category, "question": q.question, "gold": q.answer}
            for mode in ("fast", "deep"):
                ans = engine.ask(q.question, scope=item.scope, mode=mode, budget=budget)
                r: dict[str, Any] = {"answer": ans.text, "receipt": receipt_summary(ans.receipt),
                                     "f1": score_locomo(ans.text, q.answer, q.category)}
                if judge_llm is not None:
                    v = judge(judge_llm, q.question, q.answer, ans.text, ledger=Ledger())
                    r["judge"] = v.score if v.ok else None
                rec[mode] = r
            ev = mem.retriever.prefix(item.scope, q.question, k=mem.settings.prefix_k)
            gold = gold_seqs(item)
            rec["prefix_has_all_gold"] = bool(gold) and gold <= {h.seq for h in ev.hits}
            rec["routers"] = {}
            for rt in rts:
                ledger = Ledger()
                t = time.perf_counter()
                d = rt.score(q.question, ev, ledger=ledger)
                rec["routers"][rt.name] = {
                    "score": d.score, "ok": d.ok, "reason": d.reason,
                    "ms": (time.perf_counter() - t) * 1e3, "cost_usd": ledger.cost_usd,
                    "tokens": ledger.input_tokens + ledger.output_tokens,
                }
            fh.write(json.dumps(rec, ensure_ascii=False) + "\n")
            fh.flush()
            if progress:
                progress(1)


def auc(scores: Sequence[float], labels: Sequence[bool]) -> float | None:
    """Area under the ROC curve (Mann-Whitney), ties counted half; None if one class is empty."""
    pos = [s for s, y in zip(scores, labels, strict=True) if y]
    neg = [s for s, y in zip(scores, labels, strict=True) if not y]
    if not pos or not neg:
        return None
    wins = sum(1.0 if p > n else 0.5 if p == n else 0.0 for p in pos for n in neg)
    return wins / (len(pos) * len(neg))


Pick = Callable[[dict[str, Any]], tuple[dict[str, Any], float, float, bool]]
"""Chooses, for one question record, (result, extra ms, extra cost, stopped early)."""


def _row(recs: list[dict[str, Any]], pick: Pick) -> dict[str, float | None]:
    f1 = judge_sum = judged = t_mem = t_e2e = tokens = cost = early = 0.0
    for rec in recs:
        res, extra_ms, extra_cost, is_early = pick(rec)
        rc = res["receipt"]
        f1 += res["f1"]
        if res.get("judge") is not None:
            judge_sum += res["judge"]
            judged += 1
        t_mem += rc["t_mem_ms"] + extra_ms
        t_e2e += rc["t_e2e_ms"] + extra_ms
        tokens += rc["input_tokens"] + rc["output_tokens"]
        cost += rc["cost_usd"] + extra_cost
        early += 1.0 if is_early else 0.0
    n = max(len(recs), 1)
    return {"n": len(recs), "f1": 100 * f1 / n, "judge": 100 * judge_sum / judged if judged else None,
            "early_rate": 100 * early / n, "t_mem_ms": t_mem / n, "t_e2e_ms": t_e2e / n,
            "tokens": tokens / n, "cost_usd": cost}


def summarize(path: Path, taus: Sequence[float] = TAUS, keys: set[str] | None = None) -> dict[str, Any]:
    recs = [r for r in read_results(path) if keys is None or r["key"] in keys]
    out: dict[str, Any] = {"n": len(recs), "rows": {}, "auc": {}}
    out["rows"]["fast"] = _row(recs, lambda r: (r["fast"], 0.0, 0.0, True))
    out["rows"]["deep"] = _row(recs, lambda r: (r["deep"], 0.0, 0.0, False))
    names = sorted({n for r in recs for n in r["routers"]})
    for name in names:
        for tau in taus:
            def pick(r: dict[str, Any], name: str = name, tau: float = tau
                     ) -> tuple[dict[str, Any], float, float, bool]:
                d = r["routers"][name]
                early = d["ok"] and d["score"] >= tau
                return (r["fast"] if early else r["deep"]), d["ms"], d["cost_usd"], early
            out["rows"][f"auto[{name}] tau={tau}"] = _row(recs, pick)
        scores = [r["routers"][name]["score"] for r in recs]
        out["auc"][name] = {
            "fast_correct_f1>=0.5": auc(scores, [r["fast"]["f1"] >= 0.5 for r in recs]),
            "fast_judged_correct": (
                auc(scores, [(r["fast"].get("judge") or 0) >= 1.0 for r in recs])
                if any(r["fast"].get("judge") is not None for r in recs) else None),
            "prefix_has_all_gold": auc(scores, [r["prefix_has_all_gold"] for r in recs]),
        }
    return out


def format_summary(s: dict[str, Any]) -> str:
    header = ["run", "n", "F1", "judge", "early %", "T_mem ms", "T_e2e ms", "tokens/q", "cost $"]
    rows = [[name, r["n"], r["f1"], "-" if r["judge"] is None else r["judge"], r["early_rate"],
             round(r["t_mem_ms"]), round(r["t_e2e_ms"]), round(r["tokens"]), f"{r['cost_usd']:.4f}"]
            for name, r in s["rows"].items()]
    text = markdown_table(header, rows)
    auc_rows = [[name, *("-" if v is None else f"{v:.3f}" for v in a.values())]
                for name, a in s["auc"].items()]
    if auc_rows:
        first = next(iter(s["auc"].values()))
        text += "\n\n" + markdown_table(["router", *[f"AUC vs {k}" for k in first]], auc_rows)
    return text


def plot(s: dict[str, Any], png: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    rows = s["rows"]
    for name in ("fast", "deep"):
        ax.scatter(rows[name]["t_e2e_ms"] / 1e3, rows[name]["f1"], s=60, label=name, zorder=3)
    routers_seen = sorted({k[len("auto["):k.index("]")] for k in rows if k.startswith("auto[")})
    for rt in routers_seen:
        pts = sorted((float(k.split("tau=")[1]), v) for k, v in rows.items()
                     if k.startswith(f"auto[{rt}]"))
        ax.plot([v["t_e2e_ms"] / 1e3 for _, v in pts], [v["f1"] for _, v in pts], marker="o",
                label=f"auto ({rt})")
        for tau, v in pts:
            ax.annotate(f"{tau}", (v["t_e2e_ms"] / 1e3, v["f1"]), fontsize=7, xytext=(3, 3),
                        textcoords="offset points")
    ax.set_xlabel("mean end-to-end time per question (s)")
    ax.set_ylabel("F1 (LoCoMo, cat 1-4)")
    ax.set_title(f"Quality vs latency, {s['n']} questions")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(png, dpi=120)
    plt.close(fig)
