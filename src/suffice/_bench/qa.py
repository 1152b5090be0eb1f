"""QA benchmark: answer LoCoMo questions from memory and score them (F1, judge, EM).

Variants, same reader and same budget, same run:
  * ``fast``      the shared prefix, filled to the budget in rank order, shown in time order;
  * ``render``    the budgeted memory of ``Memory.render`` (timeline + detail);
  * ``recency``   the newest items that fit the budget (truncation);
  * ``no-memory`` the question alone.
Per-question results go to a JSONL file, one line per (variant, question); a rerun skips
what is already there, so an interrupted run resumes.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from .._api import Memory
from .._datasets.locomo import LocomoConversation, LocomoQuestion, load_locomo
from .._engine import Answer, Receipt
from .._errors import ConfigError, ProviderError
from .._llm.base import LLM, Ledger
from .._llm.cache import replayed_ms
from .._llm.parse import extract_answer
from .._prompts import PROMPTS_FINGERPRINT, answer_messages, choose_style, no_memory_messages
from .._tokens import count_tokens
from .._types import NewItem
from .judge import judge
from .metrics import exact_match, score_locomo
from .report import current, digest, markdown_table, percentile, read_results

VARIANTS = ("fast", "render", "recency", "no-memory")
CATEGORIES = (1, 2, 3, 4)


@dataclass(frozen=True, slots=True)
class QAItem:
    key: str
    scope: str
    index: int
    q: LocomoQuestion


def select(convs: Sequence[LocomoConversation], limit: int | None,
           categories: Sequence[int] = CATEGORIES) -> list[QAItem]:
    """The first ``limit`` questions of the given categories, in file order."""
    out = []
    for conv in convs:
        for i, q in enumerate(conv.questions):
            if q.category in categories:
                out.append(QAItem(f"{conv.sample_id}#{i}", conv.scope, i, q))
                if limit is not None and len(out) >= limit:
                    return out
    return out


def items_by_key() -> dict[str, QAItem]:
    """Every scored LoCoMo question of the shared copy by its record key (``conv-26#19``): how
    the scripts that rework recorded runs find a question's text, gold and scope."""
    return {it.key: it for it in select(load_locomo(None), None)}


def gold_finder(mem: Memory, scopes: Iterable[str]) -> Callable[[QAItem], set[int]]:
    """The gold evidence turns of a question as item seqs, from LoCoMo's dialogue ids.

    Each scope's ids are read once, here, not once per question.
    """
    dia = {s: {str(it.meta.get("dia_id")): it.seq for it in mem.items(scope=s)} for s in set(scopes)}

    def gold(item: QAItem) -> set[int]:
        ids = dia[item.scope]
        return {ids[d] for d in item.q.evidence if d in ids}
    return gold


def conversation_questions(store: str | Path, indexes: Sequence[int],
                           limit: int | None) -> tuple[Memory, list[QAItem]]:
    """The first ``limit`` questions (categories 1-4) of each chosen LoCoMo conversation, by
    index in the shared file, and a Memory at ``store`` that holds those conversations."""
    convs = load_locomo()
    picked = [convs[i] for i in indexes]
    items = [it for c in picked for it in select([c], limit)]
    mem = Memory(store)
    ingest(mem, picked, {it.scope for it in items})
    return mem, items


def ingest(mem: Memory, convs: Sequence[LocomoConversation], scopes: set[str],
           progress: Callable[[int], None] | None = None) -> None:
    """Add the conversations that questions need (:func:`ingest_scope`)."""
    for conv in convs:
        if conv.scope in scopes:
            ingest_scope(mem, conv.scope, conv.items, progress=progress)


def ingest_scope(mem: Memory, scope: str, items: Sequence[NewItem],
                 progress: Callable[[int], None] | None = None) -> bool:
    """Make ``scope`` hold exactly a dataset's ``items``; True when some had to be added.

    Every item is offered, not only those past the store's count: client ids make a stored
    item a read (a fraction of a second for a conversation), an item stored under its id with
    other text (a store made from another copy of the data) is refused, and so is a scope
    holding more items than the dataset gives it. So a benchmark never answers from a history
    other than its questions', whatever store ``--store`` names."""
    new = mem.store.max_seq(scope) + 1 < len(items)
    mem.add(list(items), scope=scope, progress=progress)
    held = mem.store.max_seq(scope) + 1
    if held != len(items):
        raise ConfigError(
            f"{mem.path}: scope {scope!r} holds {held} items where the data has {len(items)}: this "
            "store was not made from this data; name another store")
    return new


def questions_of(items: Iterable[QAItem]) -> dict[str, dict[str, Any]]:
    """Each item's key with what says which question it is (text and gold answer): a record
    under that key counts for the item only if they match (:func:`.report.same_question`)."""
    return {it.key: {"question": it.q.question, "gold": it.q.answer} for it in items}


def load_done(path: Path, fingerprints: Mapping[str, str] | None = None,
              questions: Mapping[str, Mapping[str, Any]] | None = None) -> set[tuple[str, str]]:
    """The (variant, key) pairs recorded in ``path``; with ``fingerprints`` (variant ->
    fingerprint), only those recorded under the current settings, and with ``questions``
    (:func:`questions_of`) only those of the questions as asked now. A line cut by a kill does
    not count: that question is redone."""
    return set(current(read_results(path), fingerprints, questions)) if path.exists() else set()


def fingerprints(mem: Memory, llm: LLM, budget: int, variants: Sequence[str]) -> dict[str, str]:
    """What each variant's answer depends on, hashed: the reader, the budget, the prompts and
    every config of the memory. A record made under another fingerprint is answered again."""
    common = {"reader": llm.model, "budget": budget, "prompts": PROMPTS_FINGERPRINT,
              "store": mem.store_config.model_dump(), "retrieval": mem.retrieval.model_dump(),
              "render": mem.render_config.model_dump(),
              "engine": mem.engine_config.model_dump(exclude={"timeout_s", "tau"})}
    return {v: digest({**common, "variant": v}) for v in variants}


def open_append(path: Path) -> TextIO:
    """Open a JSONL file for appending, first ending a line that a kill left half-written."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists() and path.stat().st_size:
        with path.open("rb") as fh:
            fh.seek(-1, 2)
            last = fh.read(1)
        if last != b"\n":
            with path.open("a", encoding="utf-8") as fh:
                fh.write("\n")
    return path.open("a", encoding="utf-8")


def receipt_summary(r: Receipt) -> dict[str, Any]:
    return {
        "path": r.path, "mode": r.mode, "model": r.model, "context_tokens": r.context_tokens,
        "input_tokens": r.input_tokens, "output_tokens": r.output_tokens, "cost_usd": r.cost_usd,
        "calls": len(r.calls), "stages_ms": r.stages_ms, "t_mem_ms": r.t_mem_ms,
        "t_e2e_ms": r.t_e2e_ms, "router_score": r.router_score, "tau": r.tau,
        "router_reason": r.router_reason, "degraded": r.degraded, "notes": list(r.notes),
        "blocks": [b.block for b in r.blocks], "hits": [h.seq for h in r.hits],
        "levers": [{"name": lv.name, "detail": lv.detail, "ms": lv.latency_ms, "tokens": lv.tokens,
                    "cost_usd": lv.cost_usd} for lv in r.levers],
        "models": sorted({c.model for c in r.calls}),
        "replayed_ms": replayed_ms(r.calls),
    }


def _plain(llm: LLM, messages: Any, t0: float, mem_ms: float, context_tokens: int,
           mode: str) -> dict[str, Any]:
    ledger = Ledger()
    degraded, notes = False, []
    t = time.perf_counter()
    try:
        text = extract_answer(llm.chat(messages, max_tokens=48, stage="answer", ledger=ledger).text)
    except ProviderError as exc:
        text, degraded, notes = "", True, [f"answer call failed: {exc}"]
    ans_ms = (time.perf_counter() - t) * 1e3
    return {"answer": text, "receipt": {
        "path": mode, "mode": mode, "model": llm.model, "context_tokens": context_tokens,
        "input_tokens": ledger.input_tokens, "output_tokens": ledger.output_tokens,
        "cost_usd": ledger.cost_usd, "calls": ledger.calls,
        "stages_ms": {"context": mem_ms, "answer": ans_ms}, "t_mem_ms": mem_ms,
        "t_e2e_ms": (time.perf_counter() - t0) * 1e3, "degraded": degraded, "notes": notes}}


def recency_context(mem: Memory, scope: str, budget: int) -> str:
    """The newest items that fit the budget, in time order: plain truncation."""
    cap = int(mem.render_config.prompt_cap * budget)
    top = mem.store.max_seq(scope)
    chosen: list[str] = []
    used = 0
    for it in reversed(mem.store.items(scope, start=max(0, top - 400), end=top + 1)):
        n = count_tokens(it.render()) + 1
        if used + n > cap:
            break
        chosen.append(it.render())
        used += n
    return "\n".join(reversed(chosen))


def answer_one(variant: str, mem: Memory, llm: LLM, item: QAItem, budget: int) -> dict[str, Any]:
    q = item.q.question
    t0 = time.perf_counter()
    if variant in ("fast", "render"):
        config = mem.engine_config.replace(context="render" if variant == "render" else "prefix")
        ans: Answer = mem.ask(q, scope=item.scope, llm=llm, mode="fast", budget=budget, engine=config)
        return {"answer": ans.text, "receipt": receipt_summary(ans.receipt)}
    if variant == "recency":
        ctx = recency_context(mem, item.scope, budget)
        mem_ms = (time.perf_counter() - t0) * 1e3
        return _plain(llm, answer_messages(q, ctx, choose_style(q)), t0, mem_ms,
                      count_tokens(ctx), "recency")
    if variant == "no-memory":
        return _plain(llm, no_memory_messages(q), t0, 0.0, 0, "no-memory")
    raise ConfigError(f"unknown variant {variant!r}; use {', '.join(VARIANTS)}")


def run(mem: Memory, llm: LLM, items: Sequence[QAItem], variants: Sequence[str], budget: int,
        out: Path, judge_llm: LLM | None = None,
        progress: Callable[[int], None] | None = None) -> None:
    """Answer and score every (variant, question) not yet in ``out`` under the current settings
    (:func:`fingerprints`); append as we go."""
    prints = fingerprints(mem, llm, budget, variants)
    done = load_done(out, prints, questions_of(items))
    with open_append(out) as fh:
        for item in items:
            for v in variants:
                if (v, item.key) in done:
                    continue
                res = answer_one(v, mem, llm, item, budget)
                pred = res["answer"]
                rec: dict[str, Any] = {
                    "variant": v, "key": item.key, "category": item.q.category,
                    "question": item.q.question, "gold": item.q.answer, "prediction": pred,
                    "f1": score_locomo(pred, item.q.answer, item.q.category),
                    "em": exact_match(pred, item.q.answer), "budget": budget, **res,
                    "fingerprint": prints[v],
                }
                if judge_llm is not None:
                    jl = Ledger()
                    verdict = judge(judge_llm, item.q.question, item.q.answer, pred, ledger=jl)
                    rec["judge"] = verdict.score if verdict.ok else None
                    rec["judge_reason"] = verdict.reason
                    rec["judge_cost_usd"] = jl.cost_usd
                fh.write(json.dumps(rec, ensure_ascii=False) + "\n")
                fh.flush()
            if progress is not None:
                progress(1)


def summarize(path: Path, questions: Mapping[str, Mapping[str, Any]] | None = None,
              fingerprints: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Per variant and category: n, F1, judge, EM, tokens, cost, latency p50/p95 (ms). One
    record per (variant, question), the newest (with ``fingerprints``, the newest made under
    them; with ``questions`` (:func:`questions_of`), of those questions as asked now)."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for rec in current(read_results(path), fingerprints, questions).values():
        for cat in (str(rec["category"]), "overall"):
            groups.setdefault((rec["variant"], cat), []).append(rec)
    out: dict[str, Any] = {}
    for (v, cat), recs in sorted(groups.items()):
        lat = [r["receipt"]["t_e2e_ms"] for r in recs]
        judged = [r["judge"] for r in recs if r.get("judge") is not None]
        out.setdefault(v, {})[cat] = {
            "n": len(recs),
            "f1": 100 * sum(r["f1"] for r in recs) / len(recs),
            "judge": 100 * sum(judged) / len(judged) if judged else None, "judged": len(judged),
            "em": 100 * sum(r["em"] for r in recs) / len(recs),
            "input_tokens": sum(r["receipt"]["input_tokens"] for r in recs) / len(recs),
            "output_tokens": sum(r["receipt"]["output_tokens"] for r in recs) / len(recs),
            "cost_usd": sum(r["receipt"]["cost_usd"] for r in recs),
            "p50_ms": percentile(lat, 0.5), "p95_ms": percentile(lat, 0.95),
            "degraded": sum(1 for r in recs if r["receipt"].get("degraded")),
        }
    return out


def format_summary(summary: dict[str, Any]) -> str:
    header = ["variant", "category", "n", "F1", "judge", "EM", "in tok", "out tok", "cost $",
              "p50 ms", "p95 ms"]
    rows = []
    for v, cats in summary.items():
        for cat in ("1", "2", "3", "4", "overall"):
            if cat not in cats:
                continue
            s = cats[cat]
            judge: Any = "-" if s["judge"] is None else s["judge"]
            if s["judge"] is not None and s.get("judged", s["n"]) < s["n"]:  # a mean over part of the rows
                judge = f"{s['judge']:.1f} ({s['judged']} of {s['n']})"
            rows.append([v, cat, s["n"], s["f1"], judge, s["em"],
                         round(s["input_tokens"]), round(s["output_tokens"]), f"{s['cost_usd']:.4f}",
                         round(s["p50_ms"]), round(s["p95_ms"])])
    return markdown_table(header, rows)
