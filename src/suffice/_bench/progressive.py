"""Progressive-execution benchmark: fast, deep and auto(tau) on the same questions.

For every question the fast path and the deep path are each run once with the same reader,
and every router scores the same input once: what the fast reader would read (the engine's own
:meth:`~suffice._engine.Engine.route_input`). ``auto(tau)`` takes the fast result when the
router's score reaches tau and the deep result otherwise, adding the router's own time and
cost (and, for a query sent deep, the fast context it had to render first): with greedy
decoding an auto run makes exactly those calls, so this is what it would return (``--verify N``
runs auto for real on N recorded questions and reports how many agree).

With ``stop_path``, a third path is recorded: the deep model over the fast budget (with dates),
which is what auto answers on an early stop under ``EngineConfig(stop_reader="deep")``; the
summary then composes auto both ways (``... stop=deep`` rows use it; the engine's default).

Two evidence labels are kept per question, both by looking, with no model call: does the fast
context show all the gold evidence (``fast_has_all_gold``), and does the render at twice its
budget show more of it (``wider_adds``, the width label: all that a deep-model stop gives up).
Routers are scored against both, and a router perfect on each is composed as an oracle row.

Per-question records go to a JSONL file. A rerun reuses what is recorded: each path's result is
kept while its fingerprint (models, budget, configs, prompt version) is unchanged and run again
otherwise, and a router that has not scored a question yet scores it, so adding a router costs
no answer call at all.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from .._api import Memory
from .._config import EngineConfig
from .._engine import Engine
from .._llm.base import LLM, Ledger
from .._llm.cache import replayed_ms
from .._prompts import PROMPTS_FINGERPRINT
from .._route.sufficiency import (
    LMRouter,
    RouterInput,
    ScoreRouter,
    SufficiencyRouter,
    router_identity,
    router_tau,
)
from .judge import judge
from .metrics import score_locomo
from .qa import QAItem, open_append, questions_of, receipt_summary
from .report import digest, markdown_table, paired_bootstrap, percentile, read_results, same_question

TAUS = (0.1, 0.3, 0.5, 0.7, 0.9)


def routers(llm: LLM, extra: Sequence[SufficiencyRouter] = ()) -> list[SufficiencyRouter]:
    """The routers compared in one run: the trained ones given, retrieval signals, zero-shot LM."""
    return [*extra, ScoreRouter(), LMRouter(llm)]


def fingerprints(mem: Memory, llm: LLM, deep_llm: LLM | None, budget: int) -> dict[str, str]:
    """What each path's answer depends on, hashed: a path whose fingerprint is unchanged need
    not run again."""
    engine = mem.engine_config.replace(reader_budget=budget, tau=None)
    common = {"reader": llm.model, "budget": budget, "prompts": PROMPTS_FINGERPRINT,
              "store": mem.store_config.model_dump(), "retrieval": mem.retrieval.model_dump(),
              "render": mem.render_config.model_dump(),
              "fast": {k: getattr(engine, k) for k in ("context", "context_depth", "answer_max_tokens",
                                                       "request_max_tokens")}}
    deep = {**common, "engine": engine.model_dump(exclude={"timeout_s", "tau"}),
            "deep_model": deep_llm.model if deep_llm is not None else llm.model}
    stop = {**deep, "engine": engine.stop_config().model_dump(exclude={"timeout_s", "tau"})}
    return {"fast": digest(common), "deep": digest(deep), "stop": digest(stop)}


def run(mem: Memory, llm: LLM, items: Sequence[QAItem], out: Path, *, budget: int,
        gold_seqs: Callable[[QAItem], set[int]], judge_llm: LLM | None = None,
        deep_llm: LLM | None = None, extra_routers: Sequence[SufficiencyRouter] = (),
        stop_path: bool = False, progress: Callable[[int], None] | None = None) -> dict[str, int]:
    """Record fast, deep (and with ``stop_path`` the deep model over the fast budget) and every
    router for each question; reuse what is recorded (see the module's docstring). Returns how
    many path results were computed and reused."""
    prints = fingerprints(mem, llm, deep_llm, budget)
    tmp = out.with_suffix(out.suffix + ".tmp")
    old = {r["key"]: r for r in read_results(out)} if out.exists() else {}
    if tmp.exists():  # a run that was stopped: what it recorded is newer
        old.update({r["key"]: r for r in read_results(tmp)})
        tmp.unlink()
    rts = routers(llm, extra_routers)
    # A score is reused for the same router reading the same input: the router's settings and
    # weights, and what the fast reader reads (budget and configs).
    rprints = {rt.name: digest({"router": router_identity(rt), "input": prints["fast"]}) for rt in rts}
    asked = questions_of(items)
    engine = Engine(mem.store, mem.retriever, mem.renderer, llm)
    config = mem.engine_config.replace(reader_budget=budget)
    stop_config = mem.engine_config.stop_config()
    counts = {"ran": 0, "reused": 0, "routers_scored": 0}
    fresh: dict[str, dict[str, Any]] = {}
    with open_append(tmp) as fh:
        for item in items:
            q = item.q
            prev_rec = old.get(item.key)
            if prev_rec is not None and not same_question(prev_rec, asked):
                prev_rec = None  # the key's question or gold changed: nothing recorded is its
            rec: dict[str, Any] = dict(prev_rec or {"variant": "progressive", "key": item.key,
                                                     "category": q.category})
            rec["question"], rec["gold"] = q.question, q.answer
            if not stop_path and rec.get("stop", {}).get("fingerprint") not in (None, prints["stop"]):
                del rec["stop"]  # made under other settings, and not run again this time
            if mem.embedder is not None and "embed_ms" not in rec:
                # Embed once up front, so neither path pays for it by running first; the time
                # is recorded and added back to every row (a real query pays it once).
                t = time.perf_counter()
                mem.embedder.embed_query(q.question)
                rec["embed_ms"] = (time.perf_counter() - t) * 1e3
            for path in ("fast", "deep", "stop") if stop_path else ("fast", "deep"):
                prev = rec.get(path)
                if prev is not None and prev.get("fingerprint") == prints[path]:
                    counts["reused"] += 1
                    continue
                # "stop": the deep path's answer step over the fast budget, as auto answers an
                # early stop with stop_reader="deep".
                ans = mem.ask(q.question, scope=item.scope, llm=llm, budget=budget,
                              mode="fast" if path == "fast" else "deep",
                              deep_llm=deep_llm if path != "fast" else None,
                              engine=stop_config if path == "stop" else None)
                r: dict[str, Any] = {"answer": ans.text, "receipt": receipt_summary(ans.receipt),
                                     "f1": score_locomo(ans.text, q.answer, q.category),
                                     "fingerprint": prints[path]}
                if judge_llm is not None:
                    v = judge(judge_llm, q.question, q.answer, ans.text, ledger=Ledger())
                    r["judge"] = v.score if v.ok else None
                rec[path] = r
                counts["ran"] += 1
            inp = engine.route_input(q.question, scope=item.scope, config=config, retrieval=mem.retrieval,
                                     render=mem.render_config)
            gold = gold_seqs(item)
            rec["n_gold"] = len(gold)
            rec["fast_has_all_gold"] = holds_all_gold(inp, gold, mem)
            rec["prefix_has_all_gold"] = bool(gold) and gold <= {h.seq for h in inp.evidence.hits}
            rec["wider_adds"] = wider_adds(engine, mem, q.question, item.scope, config, inp, gold)
            rec["context_ms"] = rec["fast"]["receipt"]["stages_ms"].get("context", 0.0)
            scored = rec.setdefault("routers", {})
            for rt in rts:
                rprint = rprints[rt.name]
                if scored.get(rt.name, {}).get("fingerprint") == rprint:
                    continue
                ledger = Ledger()
                t = time.perf_counter()
                d = rt.score(inp, ledger=ledger)
                ms = (time.perf_counter() - t) * 1e3 + replayed_ms(ledger.records)
                scored[rt.name] = {"score": d.score, "ok": d.ok, "reason": d.reason, "ms": ms,
                                   "cost_usd": ledger.cost_usd,
                                   "tokens": ledger.input_tokens + ledger.output_tokens,
                                   "model": getattr(rt, "model", ""), "tau": router_tau(rt),
                                   "fingerprint": rprint}
                counts["routers_scored"] += 1
            fresh[item.key] = rec
            fh.write(json.dumps(rec, ensure_ascii=False) + "\n")
            fh.flush()
            if progress:
                progress(1)
    # Questions of the old file that this run did not cover are kept as they were.
    with open_append(tmp) as fh:
        for key, rec in old.items():
            if key not in fresh:
                fh.write(json.dumps(rec, ensure_ascii=False) + "\n")
    tmp.replace(out)
    return counts


def holds_all_gold(inp: RouterInput, gold: set[int], mem: Memory) -> bool:
    """The issue's label: the fast context shows every gold evidence item."""
    return bool(gold) and all(_shown(inp, s, mem) for s in gold)


def wider_adds(engine: Engine, mem: Memory, question: str, scope: str, config: EngineConfig,
               fast: RouterInput, gold: set[int]) -> bool:
    """The width label: does the render at twice ``config``'s reader budget show more of the
    gold evidence items than ``fast``, the fast context? The one thing an early stop that the
    deep model answers gives up."""
    wide = engine.route_input(question, scope=scope, retrieval=mem.retrieval, render=mem.render_config,
                              config=config.replace(reader_budget=2 * config.reader_budget))
    return sum(_shown(wide, s, mem) for s in gold) > sum(_shown(fast, s, mem) for s in gold)


def _shown(inp: RouterInput, seq: int, mem: Memory) -> bool:
    """Is item ``seq`` in the fast context: its whole text, or (too long to show whole) a piece?"""
    from .._train.sufficiency_data import shown

    item = inp.items.get(seq)
    if item is None:
        return False
    seen = {q for p in inp.parts for q in p.seqs}
    return shown(inp.text, seen, item, mem.render_config.piece_whole_item_tokens)


def verify(mem: Memory, llm: LLM, items: Sequence[QAItem], path: Path, *, n: int, tau: float,
           budget: int, router: SufficiencyRouter | None = None,
           deep_llm: LLM | None = None) -> dict[str, Any]:
    """Run auto(tau) for real on ``n`` recorded questions (spread over the run) and compare.

    The table composes auto from the recorded fast and deep results; with greedy decoding a
    real auto run must take the same path and give the same answer. A mismatch means the
    composition is wrong, decoding is not deterministic, or the code changed since the
    records were written. With ``deep_llm`` (the run's deep model), an early stop is checked
    against the recorded stop path where there is one (``stop_reader="deep"``), else against
    the fast path (auto is then run with ``stop_reader="fast"``).
    """
    rt = router or ScoreRouter()
    recs = {r["key"]: r for r in read_results(path)}
    done = [it for it in items if it.key in recs and rt.name in recs[it.key]["routers"]]
    step = max(1, len(done) // max(n, 1))
    chosen = done[::step][:n]
    out: dict[str, Any] = {"n": len(chosen), "tau": tau, "router": rt.name, "same_path": 0,
                           "same_answer": 0, "mismatches": []}
    pick = _auto_pick(rt.name, tau)
    for it in chosen:
        rec = recs[it.key]
        early = pick(rec)[3]
        by_deep = early and deep_llm is not None and "stop" in rec
        mode = "stop" if by_deep else "fast" if early else "deep"
        # The recorded path, not the mode: a deep run whose agents found nothing was answered
        # by the fast path, and says so on its receipt. A stop is on the fast path whoever reads.
        want = "fast" if by_deep else rec[mode]["receipt"]["path"]
        engine = mem.engine_config.replace(stop_reader="deep" if by_deep else "fast")
        ans = mem.ask(it.q.question, scope=it.scope, llm=llm, mode="auto", router=rt, tau=tau, budget=budget,
                      deep_llm=deep_llm, engine=engine)
        same_path = ans.receipt.path == want
        same_answer = ans.text == rec[mode]["answer"]
        out["same_path"] += same_path
        out["same_answer"] += same_answer
        if not (same_path and same_answer):
            out["mismatches"].append({"key": it.key, "path": ans.receipt.path, "expected_path": want,
                                      "answer": ans.text, "recorded": rec[mode]["answer"]})
    return out


def auc(scores: Sequence[float], labels: Sequence[bool]) -> float | None:
    """Area under the ROC curve (Mann-Whitney), ties counted half; None if one class is empty."""
    pos = [s for s, y in zip(scores, labels, strict=True) if y]
    neg = [s for s, y in zip(scores, labels, strict=True) if not y]
    if not pos or not neg:
        return None
    wins = sum(1.0 if p > n else 0.5 if p == n else 0.0 for p in pos for n in neg)
    return wins / (len(pos) * len(neg))


Pick = Callable[[dict[str, Any]], tuple[dict[str, Any], float, float, bool, int]]
"""Chooses, for one question record, (result, extra ms, extra cost, stopped early, extra tokens):
the extras are the router's."""


def _row(recs: list[dict[str, Any]], pick: Pick) -> dict[str, float | None]:
    f1 = judge_sum = judged = t_mem = t_e2e = tokens = cost = early = 0.0
    for rec in recs:
        res, extra_ms, extra_cost, is_early, extra_tokens = pick(rec)
        rc = res["receipt"]
        f1 += res["f1"]
        if res.get("judge") is not None:
            judge_sum += res["judge"]
            judged += 1
        t_mem += rc["t_mem_ms"] + extra_ms + rec.get("embed_ms", 0.0)
        t_e2e += rc["t_e2e_ms"] + extra_ms + rec.get("embed_ms", 0.0)
        tokens += rc["input_tokens"] + rc["output_tokens"] + extra_tokens
        cost += rc["cost_usd"] + extra_cost
        early += 1.0 if is_early else 0.0
    n = max(len(recs), 1)
    return {"n": len(recs), "f1": 100 * f1 / n, "judge": 100 * judge_sum / judged if judged else None,
            "early_rate": 100 * early / n, "t_mem_ms": t_mem / n, "t_e2e_ms": t_e2e / n,
            "tokens": tokens / n, "cost_usd": cost}


def _auto_pick(name: str, tau: float | None, stop: str = "fast") -> Pick:
    """auto at ``tau`` (None: the router's own calibrated tau, as recorded): a query sent deep
    also paid for the fast context the router read. ``stop`` is the recorded path an early stop
    answers with: "fast", or "stop" (the deep model over the fast budget), which also paid for
    that context."""
    def pick(r: dict[str, Any]) -> tuple[dict[str, Any], float, float, bool, int]:
        d = r["routers"][name]
        t = d.get("tau", 0.5) if tau is None else tau
        early = d["ok"] and d["score"] >= t
        extra = d["ms"] + (0.0 if early and stop == "fast" else r.get("context_ms", 0.0))
        return (r[stop] if early else r["deep"]), extra, d["cost_usd"], early, d.get("tokens", 0)
    return pick


def _oracle(r: dict[str, Any]) -> tuple[dict[str, Any], float, float, bool, int]:
    """The best of the two paths per question (fast on a tie): what a perfect router earns."""
    early = r["fast"]["f1"] >= r["deep"]["f1"]
    return (r["fast"] if early else r["deep"]), 0.0, 0.0, early, 0


def _width_oracle(stop: str = "fast") -> Pick:
    """A router never wrong about the width label: it stops unless the render at twice the
    budget shows more of the gold evidence."""
    def pick(r: dict[str, Any]) -> tuple[dict[str, Any], float, float, bool, int]:
        early = not r.get("wider_adds", False)
        return (r[stop] if early else r["deep"]), 0.0, 0.0, early, 0
    return pick


def _evidence_oracle(stop: str = "fast") -> Pick:
    """A router that is never wrong about the evidence label: it stops exactly where the fast
    context holds all the gold evidence. What an AUC of 1.0 on that label would earn, so a run
    shows whether the label can carry the auto target at all."""
    def pick(r: dict[str, Any]) -> tuple[dict[str, Any], float, float, bool, int]:
        early = bool(r.get("fast_has_all_gold"))
        return (r[stop] if early else r["deep"]), 0.0, 0.0, early, 0
    return pick


ORACLE = "oracle (best path per question)"
EVIDENCE_ORACLE = "oracle on the evidence label (stop where the fast context holds all gold)"
WIDTH_ORACLE = "oracle on the width label (stop unless twice the budget shows more gold)"
STOP_DEEP = "stop=deep"
"""Marks the rows whose early stops the deep model answers over the fast budget."""
MAX_F1_LOSS = 1.0
"""Acceptance: auto may lose at most this many F1 points against deep ..."""
MIN_SPEEDUP = 0.3
"""... while its mean T_e2e is at least this fraction below deep's (at most 70% of it)."""


def summarize(path: Path, taus: Sequence[float] = TAUS,
              questions: Mapping[str, Mapping[str, Any]] | None = None) -> dict[str, Any]:
    """The rows (fast, deep, auto per router and τ, oracles), router AUCs and paired differences
    over the recorded questions; with ``questions`` (:func:`.qa.questions_of`) over those, as
    asked now."""
    recs = [r for r in read_results(path) if questions is None or same_question(r, questions)]
    out: dict[str, Any] = {"n": len(recs), "rows": {}, "auc": {}, "compare": [], "acceptance": {}}
    picks: dict[str, Pick] = {"fast": lambda r: (r["fast"], 0.0, 0.0, True, 0),
                              "deep": lambda r: (r["deep"], 0.0, 0.0, False, 0)}
    names = sorted({n for r in recs for n in r["routers"]})
    calibrated: dict[str, float] = {}
    for name in names:
        for tau in taus:
            picks[f"auto[{name}] tau={tau}"] = _auto_pick(name, tau)
        own = {r["routers"][name].get("tau") for r in recs if name in r["routers"]}
        fixed = ("retrieval-signals", "lm-zero-shot")
        if len(own) == 1 and (t := own.pop()) is not None and name not in fixed:
            calibrated[name] = float(t)
            picks[f"auto[{name}] tau=calibrated({t:.2f})"] = _auto_pick(name, None)
    picks[ORACLE] = _oracle
    labelled = any("fast_has_all_gold" in r for r in recs)
    widths = bool(recs) and all("wider_adds" in r for r in recs)
    if labelled:
        picks[EVIDENCE_ORACLE] = _evidence_oracle()
    if widths:
        picks[WIDTH_ORACLE] = _width_oracle()
    # Auto whose early stops the deep model answers (stop_reader="deep"), where recorded.
    both = bool(recs) and all("stop" in r for r in recs)
    if both:
        for name in names:
            for tau in taus:
                picks[f"auto[{name}] tau={tau} {STOP_DEEP}"] = _auto_pick(name, tau, "stop")
            if name in calibrated:
                picks[f"auto[{name}] tau=calibrated({calibrated[name]:.2f}) {STOP_DEEP}"] = \
                    _auto_pick(name, None, "stop")
        if labelled:
            picks[f"{EVIDENCE_ORACLE} {STOP_DEEP}"] = _evidence_oracle("stop")
        if widths:
            picks[f"{WIDTH_ORACLE} {STOP_DEEP}"] = _width_oracle("stop")
    for run_name, pick in picks.items():
        out["rows"][run_name] = _row(recs, pick)
    # Labels only where they are known: a failed judge verdict, or a question whose gold
    # evidence is not in the store, says nothing about the router.
    judged = [r for r in recs if r["fast"].get("judge") is not None]
    with_gold = [r for r in recs if r.get("n_gold", 1) > 0]
    for name in names:
        def scored(rs: list[dict[str, Any]], name: str = name) -> list[float]:
            return [r["routers"][name]["score"] for r in rs]
        out["auc"][name] = {
            "fast_correct_f1>=0.5": auc(scored(recs), [r["fast"]["f1"] >= 0.5 for r in recs]),
            "fast_judged_correct": (auc(scored(judged), [r["fast"]["judge"] >= 1.0 for r in judged])
                                    if judged else None),
            "fast_has_all_gold": auc(scored(with_gold),
                                     [bool(r.get("fast_has_all_gold")) for r in with_gold]),
            "prefix_has_all_gold": auc(scored(with_gold),
                                       [r["prefix_has_all_gold"] for r in with_gold]),
        }
        if widths:
            out["auc"][name]["wider_adds_nothing"] = auc(scored(with_gold),
                                                         [not r["wider_adds"] for r in with_gold])
        ms = [r["routers"][name]["ms"] for r in recs if name in r["routers"]]
        out.setdefault("router_ms", {})[name] = {"p50": percentile(ms, 0.5), "p95": percentile(ms, 0.95)}
    prefix = [r["fast"]["receipt"].get("stages_ms", {}).get("prefix", 0.0) for r in recs]
    out["prefix_ms"] = {"p50": percentile(prefix, 0.5), "p95": percentile(prefix, 0.95)}
    out["calibrated_tau"] = calibrated

    def f1s(pick: Pick) -> list[float]:
        return [100 * pick(r)[0]["f1"] for r in recs]

    def compare(a: str, b: str) -> None:
        diff, lo, hi = paired_bootstrap(f1s(picks[a]), f1s(picks[b]))
        out["compare"].append({"a": a, "b": b, "f1_diff": diff, "ci95": [lo, hi]})

    if recs:
        compare("deep", "fast")
        deep = out["rows"]["deep"]
        for oracle in (EVIDENCE_ORACLE, f"{EVIDENCE_ORACLE} {STOP_DEEP}",
                       WIDTH_ORACLE, f"{WIDTH_ORACLE} {STOP_DEEP}"):
            if oracle in picks:
                out["acceptance"][oracle] = acceptance({oracle: out["rows"][oracle]}, deep)
                compare(oracle, "deep")
        for name in names:
            for suffix in ("", f" {STOP_DEEP}") if both else ("",):
                runs = {k: v for k, v in out["rows"].items()
                        if k.startswith(f"auto[{name}]") and k.endswith(STOP_DEEP) == bool(suffix)}
                key = name + suffix
                out["acceptance"][key] = acceptance(runs, deep)
                if name in calibrated:
                    cal = f"auto[{name}] tau=calibrated({calibrated[name]:.2f}){suffix}"
                    out["acceptance"][key]["calibrated"] = acceptance({cal: runs[cal]}, deep)
                    compare(cal, "deep")
                acc = out["acceptance"][key]
                for run_name in dict.fromkeys((acc["best"], acc["routed"])):
                    if run_name:
                        compare(run_name, "deep")
    return out


def acceptance(runs: dict[str, dict[str, Any]], deep: dict[str, Any]) -> dict[str, Any]:
    """Does some tau meet the target (at most 70% of deep's time, at most 1 F1 lost)? If not,
    how far off.

    ``best`` is the passing run with the highest F1, else None; ``closest_in_time`` is the
    run with the least F1 loss among those fast enough, ``closest_in_f1`` the fastest run among
    those accurate enough, each with its F1 loss and its time as a fraction of deep's.
    """
    def loss(v: dict[str, Any]) -> float:
        return float(deep["f1"] - v["f1"])

    def ratio(v: dict[str, Any]) -> float:
        return float(v["t_e2e_ms"] / deep["t_e2e_ms"]) if deep["t_e2e_ms"] else 1.0

    fast_enough = {k: v for k, v in runs.items() if ratio(v) <= 1 - MIN_SPEEDUP}
    good_enough = {k: v for k, v in runs.items() if loss(v) <= MAX_F1_LOSS}
    passing = sorted(set(fast_enough) & set(good_enough), key=lambda k: (-runs[k]["f1"], k))
    by_loss = min(fast_enough, key=lambda k: (loss(runs[k]), k), default=None)
    by_time = min(good_enough, key=lambda k: (ratio(runs[k]), k), default=None)
    routed = [k for k in passing if runs[k]["early_rate"] < 100.0]
    return {
        "passed": bool(passing),
        "best": passing[0] if passing else None,
        # The best passing run that sends some questions deep: a run that stops early on every
        # question is just the fast path, which passes whenever fast is within 2 F1 of deep.
        "routed": routed[0] if routed else None,
        "closest_in_time": None if by_loss is None else
        {"run": by_loss, "f1_loss": loss(runs[by_loss]), "time_ratio": ratio(runs[by_loss])},
        "closest_in_f1": None if by_time is None else
        {"run": by_time, "f1_loss": loss(runs[by_time]), "time_ratio": ratio(runs[by_time])},
    }


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
    if s.get("compare"):
        text += "\n\n" + markdown_table(
            ["F1 difference", "points", "95% CI (paired bootstrap)"],
            [[f"{c['a']} - {c['b']}", f"{c['f1_diff']:+.1f}",
              f"[{c['ci95'][0]:+.1f}, {c['ci95'][1]:+.1f}]"] for c in s["compare"]])
    if s.get("router_ms"):
        text += "\n\n" + markdown_table(
            ["router", "p50 ms", "p95 ms"],
            [[n, f"{v['p50']:.2f}", f"{v['p95']:.2f}"] for n, v in s["router_ms"].items()]
            + [["(prefix, for scale)", f"{s['prefix_ms']['p50']:.2f}", f"{s['prefix_ms']['p95']:.2f}"]])
    for name, a in s.get("acceptance", {}).items():
        router = name.partition(f" {STOP_DEEP}")[0]
        cal_run = next((k for k in s["rows"] if k.startswith(f"auto[{router}] tau=calibrated")
                        and k.endswith(STOP_DEEP) == (name != router)), None)
        if cal_run is not None and s["rows"]["deep"]["t_e2e_ms"]:
            v, deep = s["rows"][cal_run], s["rows"]["deep"]
            ok = a.get("calibrated", {}).get("passed", False)
            text += (f"\n\n{cal_run}: {'target met' if ok else 'target not met'}; loses "
                     f"{deep['f1'] - v['f1']:.1f} F1 against deep at "
                     f"{100 * v['t_e2e_ms'] / deep['t_e2e_ms']:.0f}% "
                     f"of its time, stopping early on {v['early_rate']:.0f}% of questions")
        if a["passed"]:
            text += f"\n\n{name}: target met by {a['best']}"
            if a["routed"] is None:
                text += " (which stops early on every question: the fast path itself)"
            elif a["routed"] != a["best"]:
                text += f"; best run that sends some questions deep: {a['routed']}"
        else:
            near = [f"{c['run']} loses {c['f1_loss']:.1f} F1 at {100 * c['time_ratio']:.0f}% of deep's time"
                    for c in (a["closest_in_time"], a["closest_in_f1"]) if c]
            text += f"\n\n{name}: target not met" + (f"; closest: {'; '.join(near)}" if near else "")
    return text


def plot(s: dict[str, Any], png: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    rows = s["rows"]
    for name, marker, color in (("fast", "s", "black"), ("deep", "D", "tab:red"),
                                (ORACLE, "*", "tab:green"), (EVIDENCE_ORACLE, "X", "tab:olive")):
        if name in rows:
            ax.scatter(rows[name]["t_e2e_ms"] / 1e3, rows[name]["f1"], s=90, marker=marker,
                       color=color, label=name, zorder=3)
    routers_seen = sorted({k[len("auto["):k.index("]")] for k in rows if k.startswith("auto[")})
    for rt in routers_seen:
        pts = sorted((float(k.split("tau=")[1]), v) for k, v in rows.items()
                     if k.startswith(f"auto[{rt}]") and "calibrated" not in k)
        cal = [v for k, v in rows.items() if k.startswith(f"auto[{rt}]") and "calibrated" in k]
        for v in cal:
            ax.scatter(v["t_e2e_ms"] / 1e3, v["f1"], s=120, marker="P", color="tab:purple", zorder=4,
                       label=f"auto ({rt}) at its calibrated tau")
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
