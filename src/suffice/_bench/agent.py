"""Agent-memory recall benchmarks: is the evidence an agent needs inside a B-token context?

Two questions, no language model anywhere:

- **Evidence recall on AMA-Bench** (:func:`run_evidence`): each question is asked after its run;
  the evidence is the items of the steps it cites (:func:`~suffice._datasets.checkpoints.
  ama_evidence_ids`). At each budget B, is every (any) evidence item inside the context?
- **Checkpoint recall** on SWE-bench and τ / τ²-bench runs (:func:`run_checkpoints`): at a
  checkpoint just before step j only the items before it exist (``Filter(before_seq=at_item)``);
  is the earlier item the agent needs inside the context?

Methods, each measured on the same questions in the same run:

- ``suffice``: the agent render (``RenderConfig.for_agent()``, ``agent=True``: recent window,
  timeline, whole units), which resolves step references through the store (:mod:`suffice._steps`);
- ``truncation``: the newest items that fit (what a long-context agent keeps);
- ``masking``: every item, observations / tool results older than the newest few replaced by a
  one-line placeholder, then the newest that fit;
- ``prefix fill``: the fused prefix ranking (step references first) filled greedily.

An item counts as inside when its text is in the context verbatim and whole; ``piece`` also
counts an item any of whose pieces is there (a render may excerpt a long observation).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._api import Memory
from .._config import RenderConfig, StoreConfig
from .._steps import STEP_KEY, cited_steps
from .._tokens import count_tokens
from .._types import Filter, Item
from .report import digest, read_results, same_question

METHODS = ("suffice", "truncation", "masking", "prefix fill", "suffice, excerpts first",
           "suffice, window kept", "suffice, no steps", "prefix fill, no steps")
"""The first is compared with every other. ``no steps`` turns the step references off;
``excerpts first`` is the agent render with ``raw_first=False`` (every unit's excerpt before
whole units, the default outside agent mode); ``window kept`` keeps the whole recent window
when the query names steps (``steps_over_recent=False``)."""
EVIDENCE_BUDGETS = (2000, 4000, 8000)
CHECKPOINT_BUDGETS = (4000, 8000)
MASK_KEEP = 3
"""Observation masking keeps the newest this many observations whole (as agent harnesses that
mask old tool output do: the last few turns stay readable)."""
MASKED_KINDS = frozenset({"observation", "tool_result"})


def placeholder(item: Item) -> str:
    """What observation masking leaves of an old observation: its step, kind and size."""
    return f"[step {item.meta.get('step', '?')} {item.kind} omitted: {item.tokens} tokens]"


def build_store(db: str | Path, trajs: Iterable[Any], *, embedder: Any = None,
                progress: Callable[[str], None] | None = None) -> Memory:
    """Open (or create) the agent store at ``db`` and add every run not yet fully stored.

    Resumable: a run already stored is read back, one cut short is finished (its items carry
    stable ids, so the rows already written are not written again), and a store made from other
    data is refused (:func:`.qa.ingest_scope`). ``embedder`` None (the
    default here) stores no vectors: the shipped MiniLM embeds about 2-3 items a second on this
    loaded 2-core machine, hours for a dataset, so the recall runs rank by BM25 (and step
    references) only; pass ``"default"`` for a dense store."""
    from .qa import ingest_scope
    mem = Memory(db, store_config=StoreConfig.for_agent(), embedder=embedder)
    try:
        for t in trajs:
            t0 = time.perf_counter()
            if ingest_scope(mem, t.scope, t.items) and progress is not None:
                progress(f"{t.scope}: {len(t.items)} items in {time.perf_counter() - t0:.1f} s")
    except BaseException:
        mem.close()
        raise
    return mem


GAP_BUCKETS = ((1, 1), (2, 4), (5, 9), (10, 19), (20, 1 << 30))
WHOLE_FLOOR_TOKENS = 16
"""A history cut at the front shows the end of one more item when at least this many tokens
remain: that item is then inside at piece level (part of it), not whole."""


def gap_bucket(gap: int) -> str:
    for lo, hi in GAP_BUCKETS:
        if lo <= gap <= hi:
            return str(lo) if lo == hi else (f"{lo}-{hi}" if hi < 1 << 29 else f"{lo}+")
    return "0"


@dataclass(frozen=True, slots=True)
class Question:
    """One recall question: a scope, the history it may see, its evidence, what it is grouped by."""

    key: str
    scope: str
    question: str
    history: int
    """Items ``seq < history`` exist when it is asked."""
    evidence: tuple[int, ...]
    """Seqs of the evidence items."""
    groups: dict[str, Any]


@dataclass(slots=True)
class _Scope:
    """A scope's items and each item's line cost, read once and shared by its questions."""

    items: list[Item]
    cost: list[int]
    masked_cost: list[int]
    seq_of: dict[str, int]


def _scope_data(mem: Memory, scope: str) -> _Scope:
    items = mem.items(scope=scope, limit=None)
    cost = [count_tokens(it.render()) + 1 for it in items]
    masked = [count_tokens(f"{it.speaker}: {placeholder(it)}") + 1 if it.kind in MASKED_KINDS else c
              for it, c in zip(items, cost, strict=True)]
    return _Scope(items, cost, masked, {it.id: it.seq for it in items})


def suffix(cost: Sequence[int], n: int, budget: int) -> tuple[set[int], int | None, int]:
    """The newest items of ``0..n-1`` that fit ``budget`` whole, contiguously (a long-context
    agent drops its oldest turns first); the item cut at the front when enough room is left for
    part of it; tokens used."""
    used = 0
    taken: set[int] = set()
    for q in range(n - 1, -1, -1):
        if used + cost[q] > budget:
            return taken, (q if budget - used >= WHOLE_FLOOR_TOKENS else None), used
        used += cost[q]
        taken.add(q)
    return taken, None, used


def masked_view(items: Sequence[Item], n: int, keep: int = MASK_KEEP) -> set[int]:
    """Seqs of ``0..n-1`` that observation masking replaces by a placeholder: observations and
    tool results older than the newest ``keep`` of them."""
    obs = [q for q in range(n) if items[q].kind in MASKED_KINDS]
    return set(obs[:-keep] if keep else obs)


def greedy(order: Sequence[int], cost: Sequence[int], budget: int) -> tuple[set[int], int]:
    """Items of ``order`` taken whole while they fit, skipping those that do not (prefix fill)."""
    used = 0
    taken: set[int] = set()
    for q in order:
        if used + cost[q] <= budget:
            taken.add(q)
            used += cost[q]
    return taken, used


def _verdict(evidence: Sequence[int], whole: set[int], piece: set[int], tokens: int,
             named: Sequence[int] = ()) -> dict[str, Any]:
    """``named``: the evidence items of the steps the question itself names; ``named_all`` /
    ``named_piece_all`` say whether those are inside (whole / at least in part)."""
    w = [q in whole for q in evidence]
    p = [q in piece or q in whole for q in evidence]
    out = {"all": all(w), "any": any(w), "piece_all": all(p), "piece_any": any(p),
           "share": sum(w) / len(w), "tokens": tokens}
    if named:
        out["named_all"] = all(q in whole for q in named)
        out["named_piece_all"] = all(q in whole or q in piece for q in named)
    return out


def measure(mem: Memory, data: _Scope, q: Question, budgets: Sequence[int],
            methods: Sequence[str] = METHODS) -> dict[str, dict[str, Any]]:
    """Per method and budget: whether the evidence is inside (all / any, whole / piece), tokens."""
    out: dict[str, dict[str, Any]] = {m: {} for m in methods}
    n = q.history
    cited = set(cited_steps(q.question))
    named = [s for s in q.evidence if data.items[s].meta.get(STEP_KEY) in cited]
    flt = Filter(before_seq=n)
    config = RenderConfig.for_agent()
    orders: dict[str, list[int]] = {}
    for m in methods:
        if m.startswith("prefix fill"):
            retrieval = mem.retrieval.replace(step_refs="no steps" not in m)
            ranked = list(mem.retriever.rank(q.scope, q.question, retrieval, depth=n, flt=flt).seqs)
            seen = set(ranked)
            orders[m] = ranked + [s for s in range(n - 1, -1, -1) if s not in seen]
    masked = masked_view(data.items, n) if "masking" in methods else set()
    for b in budgets:
        for m in methods:
            if m.startswith("suffice"):
                retrieval = mem.retrieval.replace(step_refs="no steps" not in m)
                cfg = config
                if "excerpts first" in m:
                    cfg = cfg.replace(raw_first=False)
                if "window kept" in m:
                    cfg = cfg.replace(steps_over_recent=False)
                ctx = mem.renderer.render(q.scope, q.question, b, config=cfg, retrieval=retrieval, flt=flt,
                                          agent=True)
                whole = {s for s in q.evidence if data.items[s].text in ctx.text}
                piece = {s for p in ctx.parts if p.kind != "record" for s in p.seqs}
                out[m][str(b)] = _verdict(q.evidence, whole, piece, ctx.tokens, named)
            elif m == "truncation":
                taken, cut, used = suffix(data.cost, n, b)
                out[m][str(b)] = _verdict(q.evidence, taken, {cut} if cut is not None else set(), used, named)
            elif m == "masking":
                cost = [data.masked_cost[s] if s in masked else data.cost[s] for s in range(n)]
                taken, cut, used = suffix(cost, n, b)
                whole = taken - masked
                piece = {cut} - masked if cut is not None else set()
                out[m][str(b)] = _verdict(q.evidence, whole, piece, used, named)
            else:
                taken, used = greedy(orders[m], data.cost, b)
                out[m][str(b)] = _verdict(q.evidence, taken, set(), used, named)
    return out


# -- question sets ---------------------------------------------------------------------------------


def ama_questions(mem: Memory, episodes: Sequence[Any]) -> Iterable[tuple[_Scope, Question]]:
    """AMA-Bench questions that cite steps, asked after the whole run."""
    from .._datasets.checkpoints import ama_checkpoints
    for ep in episodes:
        data = _scope_data(mem, ep.scope)
        for cp in ama_checkpoints(ep):
            ev = tuple(data.seq_of[i] for i in cp.evidence_ids if i in data.seq_of)
            if not ev:
                continue
            groups = {"type": cp.detail["type"], "domain": ep.domain,
                      "step_range": bool(cp.detail["step_range"]), "steps": len(cp.detail["steps"])}
            yield data, Question(f"{ep.scope}#{cp.detail['index']}", ep.scope, cp.question, len(data.items),
                                 ev, groups)


def checkpoint_questions(mem: Memory, trajs: Sequence[Any], checkpoints: Sequence[Any]
                         ) -> Iterable[tuple[_Scope, Question]]:
    """Checkpoints of SWE / τ runs, each asked with only the items before it."""
    by_scope: dict[str, list[Any]] = {}
    for cp in checkpoints:
        by_scope.setdefault(cp.trajectory, []).append(cp)
    for t in trajs:
        cps = by_scope.get(t.scope, [])
        if not cps:
            continue
        data = _scope_data(mem, t.scope)
        for k, cp in enumerate(cps):
            at = (data.seq_of[str(t.items[cp.at_item].id)] if cp.at_item < len(t.items) else len(data.items))
            ev = tuple(data.seq_of[i] for i in cp.evidence_ids if i in data.seq_of)
            if not ev or max(ev) >= at:
                continue
            yield data, Question(f"{t.scope}#{k}", t.scope, cp.question, at, ev,
                                 {"kind": cp.kind, "gap": cp.gap, "gap_bucket": gap_bucket(cp.gap),
                                  "trajectory": t.scope})


# -- running and summing up ------------------------------------------------------------------------


def fingerprint(mem: Memory, budgets: Sequence[int], methods: Sequence[str]) -> str:
    """What a question's measurements depend on, hashed: the budgets and methods measured, the
    store, retrieval and agent render settings, the encoder and the masking window. A record
    made under another fingerprint is measured again and not summed up."""
    return digest({"budgets": list(budgets), "methods": list(methods), "store": mem.store_config.model_dump(),
                   "retrieval": mem.retrieval.model_dump(), "render": RenderConfig.for_agent().model_dump(),
                   "embedder": getattr(mem.embedder, "name", None), "mask_keep": MASK_KEEP,
                   "whole_floor": WHOLE_FLOOR_TOKENS})


def identity(q: Question) -> dict[str, Any]:
    """What says which question a record answers (:func:`.report.same_question`): keys are
    positions in the data, so another copy of the data can give a key another question."""
    return {"question": q.question, "history": q.history, "evidence": list(q.evidence)}


def recorded(path: Path, fingerprint: str | None = None,
             questions: Mapping[str, Mapping[str, Any]] | None = None) -> dict[str, dict[str, Any]]:
    """The newest record of each question in ``path``; with ``fingerprint`` only those made
    under it, with ``questions`` (key -> :func:`identity`) only those of the questions as asked
    now. A line cut by a kill does not count."""
    out: dict[str, dict[str, Any]] = {}
    for r in read_results(path) if path.exists() else ():
        if fingerprint is not None and r.get("fingerprint") != fingerprint:
            continue
        if questions is not None and not same_question(r, questions):
            continue
        out[r["key"]] = r
    return out


def run(mem: Memory, questions: Iterable[tuple[_Scope, Question]], out: Path, budgets: Sequence[int],
        methods: Sequence[str], *, limit: int | None = None, progress: Callable[[int], None] | None = None,
        asked: dict[str, dict[str, Any]] | None = None) -> int:
    """Measure each of the first ``limit`` questions (all by default) not yet recorded in
    ``out`` under the same settings (:func:`fingerprint`) and for the same question
    (:func:`identity`); JSONL, one line each, written as made. Returns how many were measured
    now; ``asked`` collects the identity of every question walked, for :func:`summarize`. A
    stopped run resumes where it stopped."""
    from .qa import open_append
    fp = fingerprint(mem, budgets, methods)
    have = recorded(out, fp)
    n = walked = 0
    with open_append(out) as fh:
        for data, q in questions:
            if limit is not None and walked >= limit:
                break
            walked += 1
            ident = identity(q)
            if asked is not None:
                asked[q.key] = ident
            if q.key in have and same_question(have[q.key], {q.key: ident}):
                continue
            t0 = time.perf_counter()
            res = measure(mem, data, q, budgets, methods)
            rec = {"key": q.key, "scope": q.scope, "question": q.question, "history": q.history,
                   "evidence": list(q.evidence), **q.groups, "methods": res,
                   "ms": round((time.perf_counter() - t0) * 1e3, 1), "fingerprint": fp}
            fh.write(json.dumps(rec, ensure_ascii=False) + "\n")
            fh.flush()
            n += 1
            if progress is not None:
                progress(n)
    return n


def cluster_bootstrap(diffs: dict[str, list[float]], rounds: int = 2000, seed: int = 0
                      ) -> tuple[float, float, float]:
    """Mean per-question difference and its 95% interval, resampling clusters (trajectories)
    with replacement: checkpoints of one run are not independent, so resampling them singly
    would give intervals too narrow."""
    import numpy as np
    keys = sorted(diffs)
    if not keys:
        return 0.0, 0.0, 0.0
    sums = np.array([sum(diffs[k]) for k in keys])
    counts = np.array([len(diffs[k]) for k in keys], dtype=np.float64)
    rng = np.random.default_rng(seed)
    pick = rng.integers(0, len(keys), size=(rounds, len(keys)))
    means = sums[pick].sum(axis=1) / np.maximum(counts[pick].sum(axis=1), 1)
    lo, hi = np.percentile(means, [2.5, 97.5])
    return float(sums.sum() / max(counts.sum(), 1)), float(lo), float(hi)


def _rates(recs: Sequence[dict[str, Any]], methods: Sequence[str], budgets: Sequence[int]
           ) -> dict[str, dict[str, dict[str, float]]]:
    out: dict[str, dict[str, dict[str, float]]] = {}
    for m in methods:
        out[m] = {}
        for b in budgets:
            rows = [r["methods"][m][str(b)] for r in recs if m in r["methods"]]
            d = max(len(rows), 1)
            out[m][str(b)] = {k: 100 * sum(bool(x[k]) for x in rows) / d
                              for k in ("all", "any", "piece_all", "piece_any")}
            out[m][str(b)]["tokens"] = sum(x["tokens"] for x in rows) / d
            named = [x for x in rows if "named_all" in x]  # questions that name evidence steps
            if named:
                out[m][str(b)].update({k: 100 * sum(bool(x[k]) for x in named) / len(named)
                                       for k in ("named_all", "named_piece_all")})
                out[m][str(b)]["named_n"] = len(named)
    return out


def summarize(path: Path, budgets: Sequence[int], methods: Sequence[str], groups: Sequence[str],
              cluster: str = "scope", *, fingerprint: str | None = None,
              questions: Mapping[str, Mapping[str, Any]] | None = None) -> dict[str, Any]:
    """Shares (%) per method and budget, overall and per group value, and the paired cluster
    bootstrap of suffice minus each other method (all evidence whole inside). One record per
    question, the newest (see :func:`recorded` for ``fingerprint`` and ``questions``)."""
    recs = list(recorded(path, fingerprint, questions).values())
    res: dict[str, Any] = {"questions": len(recs), "clusters": len({r[cluster] for r in recs}),
                           "budgets": list(budgets), "methods": list(methods),
                           "overall": _rates(recs, methods, budgets), "groups": {}}
    for g in groups:
        labels = [gap_bucket(lo) for lo, _ in GAP_BUCKETS]
        values = sorted({str(r.get(g)) for r in recs},
                        key=lambda v: (labels.index(v) if v in labels else len(labels), v))
        res["groups"][g] = {v: {"n": sum(str(r.get(g)) == v for r in recs),
                                **_rates([r for r in recs if str(r.get(g)) == v], methods, budgets)}
                            for v in values}
    base = methods[0]
    res["bootstrap"] = {}
    for m in methods[1:]:
        for b in budgets:
            diffs: dict[str, list[float]] = {}
            for r in recs:
                a, o = r["methods"][base][str(b)]["all"], r["methods"][m][str(b)]["all"]
                diffs.setdefault(r[cluster], []).append(100.0 * (float(a) - float(o)))
            mean, lo, hi = cluster_bootstrap(diffs)
            res["bootstrap"][f"{base} - {m} @{b}"] = {"mean": mean, "lo": lo, "hi": hi}
    return res


def format_summary(res: dict[str, Any], metric: str = "all", groups: Sequence[str] = ()) -> str:
    from .report import markdown_table
    budgets, methods = res["budgets"], res["methods"]
    out = [f"{res['questions']} questions in {res['clusters']} runs; % with the evidence inside ({metric})"]
    rows = [[m, *[res["overall"][m][str(b)][k] for b in budgets for k in ("all", "any", "piece_all")]]
            for m in methods]
    out.append(markdown_table(["method", *[f"{k}@{b // 1000}k" for b in budgets
                                           for k in ("all", "any", "piece")]], rows))
    for g in groups:
        for b in budgets:
            vals = res["groups"].get(g, {})
            header = [f"{g} @{b // 1000}k", "n", *methods]
            rows = [[v, d["n"], *[d[m][str(b)][metric] for m in methods]] for v, d in vals.items()]
            out.append(markdown_table(header, rows))
    named = [m for m in methods if "named_all" in res["overall"][m][str(budgets[0])]]
    if named:
        n = res["overall"][named[0]][str(budgets[0])]["named_n"]
        keys = ("named_all", "named_piece_all")
        rows = [[m, *[res["overall"][m][str(b)][k] for b in budgets for k in keys]] for m in named]
        out.append(f"{n} questions name steps they cite; % with those steps' items inside")
        out.append(markdown_table(["method", *[f"{k}@{b // 1000}k" for b in budgets
                                               for k in ("whole", "in part")]], rows))
    if res.get("bootstrap"):
        rows = [[k, v["mean"], v["lo"], v["hi"]] for k, v in res["bootstrap"].items()]
        out.append(markdown_table(["difference (points, all)", "mean", "95% lo", "95% hi"], rows))
    return "\n\n".join(out)


DATASETS = ("ama", "swe", "tau", "tau2")
EVIDENCE_GROUPS: tuple[str, ...] = ("type", "domain", "step_range")
CHECKPOINT_GROUPS: tuple[str, ...] = ("kind", "gap_bucket")


def _trajectories(dataset: str, data: str | Path | None) -> list[Any]:
    from .._datasets.trajectories import LOADERS
    return LOADERS[dataset](data)


def main(dataset: str, *, db: str | Path, out: str | Path, data: str | Path | None = None,
         budgets: Sequence[int] | None = None, methods: Sequence[str] = METHODS, limit: int | None = None,
         json_out: str | Path | None = None, embedder: Any = None) -> tuple[dict[str, Any], str]:
    """Build (or finish) the dataset's store at ``db``, measure every question not yet in
    ``out``, and sum up all of ``out``: evidence recall for ``ama``, checkpoint recall for the
    others. ``embedder`` (e.g. ``"default"``): rank with dense vectors too; items stored
    without vectors are embedded at their scope's first query."""
    from .report import envelope, write_json
    trajs = _trajectories(dataset, data)
    mem = build_store(db, trajs, embedder=embedder, progress=_log)
    t0 = time.perf_counter()
    try:
        path = Path(out)
        if dataset == "ama":
            from .._datasets.ama import load_ama
            budgets = tuple(budgets or EVIDENCE_BUDGETS)
            questions = ama_questions(mem, load_ama(data))
            groups, cluster = EVIDENCE_GROUPS, "scope"
        else:
            from .._datasets.checkpoints import swe_checkpoints, tau_checkpoints
            budgets = tuple(budgets or CHECKPOINT_BUDGETS)
            cps = swe_checkpoints(trajs) if dataset == "swe" else tau_checkpoints(trajs)
            questions = checkpoint_questions(mem, trajs, cps)
            groups, cluster = CHECKPOINT_GROUPS, "trajectory"

        def tick(n: int) -> None:
            if n % 50 == 0:
                _log(f"  {n} questions measured ({time.perf_counter() - t0:.0f} s)")

        asked: dict[str, dict[str, Any]] = {}
        measured = run(mem, questions, path, budgets, methods, limit=limit, progress=tick, asked=asked)
        res = summarize(path, budgets, methods, groups, cluster,
                        fingerprint=fingerprint(mem, budgets, methods), questions=asked)
        res["measured_now"], res["run_s"] = measured, time.perf_counter() - t0
        settings = {"store": mem.store_config.model_dump(), "retrieval": mem.retrieval.model_dump(),
                    "render": RenderConfig.for_agent().model_dump(),
                    "embedder": getattr(mem.embedder, "name", None),
                    "mask_keep": MASK_KEEP, "records": str(path)}
    finally:
        mem.close()
    text = format_summary(res, groups=groups)
    if json_out is not None:
        write_json(json_out, envelope("agent_recall", dataset, str(data or dataset), settings, res))
        text += f"\nwrote {json_out}"
    return res, text


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


