"""Open-ended QA on agent trajectories (AMA-Bench) and long chats (BEAM), progressive engine.

Each question is answered by the variants of :data:`VARIANTS`, all with the same reader and
the same budget:

- ``fast`` / ``deep`` / ``auto``: ``Memory.ask`` in that mode. ``auto`` is run for real, after
  fast and deep, through the same :class:`~suffice._llm.cache.CachedLLM`: when it stops early
  and its prompt is fast's, or it goes deep with deep's prompts, its calls are replays, so it
  costs little more than its router. Its times add the replayed calls' recorded latency back
  (as every variant's do), so they are those of a run with every call real.
- ``truncation``: what a long-context agent keeps, the newest items whole while they fit and
  then the end of the next older one, cut at the front; read with the fast path's prompt.
- ``prefix-fill``: the fused prefix's hits taken in rank order while they fit (the engine's
  ``context="prefix"``), read the same way.

AMA-Bench answers are scored by token F1 (always), by token F1 over the words the question
does not hold (:func:`~suffice._bench.metrics.novel_f1`: no credit for restating the question)
and, where a judge model is given, by the judge against the reference (0 / 0.5 / 1). BEAM
answers are scored by the judge against each of the question's rubric items (0 / 0.5 / 1 per
item, averaged), as BEAM grades them.

One JSONL line per (variant, question), written as soon as it is made: a rerun skips what is
there (while the reader, judge and budget are the same) and judges records that lack a
verdict, so a stopped run resumes where it stopped.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._api import Memory
from .._engine import ANSWER_STAGE
from .._errors import ProviderError
from .._files import write_atomic
from .._llm.base import LLM, Ledger, Message
from .._llm.cache import replayed_ms
from .._llm.parse import ask_parsed, extract_answer
from .._prompts import JUDGE_FORMAT, PROMPTS_FINGERPRINT, answer_messages, style_for_evidence
from .._render import CUT
from .._route.sufficiency import router_identity
from .._tokens import count_tokens, encode, encoding
from .judge import judge, parse_verdict
from .metrics import novel_f1, token_f1
from .qa import ingest_scope, open_append, receipt_summary
from .report import current, digest, markdown_table, paired_bootstrap, read_results

MODES = ("fast", "deep", "auto")
BASELINES = ("truncation", "prefix-fill")
VARIANTS = ("fast", "truncation", "prefix-fill", "deep", "auto")
"""Run order: auto comes after fast and deep so that its calls can be replays of theirs."""
AMA_TYPES = ("A", "B", "C", "D")
JUDGE_TOKENS = 24
"""The verdict's score comes first in the reply, so a short reply is enough to read it."""


@dataclass(frozen=True, slots=True)
class AgentQuestion:
    """One question of either dataset, with what the report groups it by."""

    key: str
    scope: str
    question: str
    answer: str
    group: str
    """AMA-Bench: the question type (A-D); BEAM: the ability."""
    domain: str = ""
    rubric: tuple[str, ...] = field(default=())
    """BEAM: the items a full answer must meet; empty for AMA-Bench."""


# -- sampling -----------------------------------------------------------------------------------

def _rank(text: str) -> str:
    """A stable, content-free order: sha256 of a name (the same on every machine)."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def sample_ama(episodes: Sequence[Any], *, n_episodes: int | None, per_episode: int
               ) -> list[tuple[Any, list[AgentQuestion]]]:
    """A deterministic sample balanced over domains and question types.

    Episodes are ordered by the hash of their name within each domain and taken round-robin
    over the domains (sorted by name) until ``n_episodes`` are chosen. Episode r of domain d
    asks for the types A-D starting at position ``(r * per_episode + d) % 4``, one per
    question, each the episode's first unused question of that type in hash order (the next
    type when it has none left). So two episodes per domain with two questions each give every
    domain one question of each type, and the domains rotate which types come first.
    """
    by_domain: dict[str, list[Any]] = {}
    for ep in episodes:
        by_domain.setdefault(ep.domain, []).append(ep)
    domains = sorted(by_domain)
    for d in domains:
        by_domain[d].sort(key=lambda ep: _rank(ep.name))
    order: list[tuple[int, int, Any]] = []
    depth = max((len(v) for v in by_domain.values()), default=0)
    for r in range(depth):
        for di, d in enumerate(domains):
            if r < len(by_domain[d]):
                order.append((di, r, by_domain[d][r]))
    if n_episodes is not None:
        order = order[:n_episodes]
    out = []
    for di, r, ep in order:
        pool = sorted(range(len(ep.questions)), key=lambda i: _rank(f"{ep.name}#{i}"))
        picked: list[int] = []
        start = (r * per_episode + di) % len(AMA_TYPES)
        for j in range(min(per_episode, len(pool))):
            for t in range(len(AMA_TYPES)):
                want = AMA_TYPES[(start + j + t) % len(AMA_TYPES)]
                i = next((i for i in pool if i not in picked and ep.questions[i].type == want), None)
                if i is not None:
                    picked.append(i)
                    break
            else:  # types outside A-D only
                rest = [i for i in pool if i not in picked]
                if rest:
                    picked.append(rest[0])
        qs = [AgentQuestion(f"{ep.name}#{i}", ep.scope, ep.questions[i].question, ep.questions[i].answer,
                            ep.questions[i].type, ep.domain) for i in picked]
        out.append((ep, qs))
    return out


def beam_rubrics(folder: Path) -> dict[tuple[str, int], tuple[str, ...]]:
    """(ability, index) -> rubric items of one BEAM conversation, read from its raw file (the
    loader keeps the gold answer and evidence only)."""
    raw = json.loads((folder / "probing_questions.json").read_text(encoding="utf-8"))
    out: dict[tuple[str, int], tuple[str, ...]] = {}
    for ability, qs in raw.items():
        for i, q in enumerate(qs if isinstance(qs, list) else []):
            rub = q.get("rubric") if isinstance(q, dict) else None
            if isinstance(rub, list):
                out[(str(ability), i)] = tuple(str(x) for x in rub if str(x).strip())
    return out


def sample_beam(convs: Sequence[Any], root: Path, *, n_convs: int | None, per_ability: int
                ) -> list[tuple[Any, list[AgentQuestion]]]:
    """The first ``per_ability`` questions of every ability in each of the first ``n_convs``
    conversations (in the tier's numeric order), with their rubric items."""
    out = []
    for conv in convs[:n_convs] if n_convs is not None else convs:
        rubrics = beam_rubrics(root / conv.conv_id)
        seen: dict[str, int] = {}
        qs = []
        for q in conv.questions:
            i = seen.get(q.ability, 0)
            seen[q.ability] = i + 1
            rub = rubrics.get((q.ability, i), ())
            if i < per_ability and rub:
                qs.append(AgentQuestion(f"beam-{conv.tier}-{conv.conv_id}#{q.ability}#{i}", conv.scope,
                                        q.question, q.answer, q.ability, conv.tier, rub))
        out.append((conv, qs))
    return out


def ingest(mem: Memory, sources: Iterable[tuple[Any, Sequence[AgentQuestion]]],
           progress: Callable[[str], None] | None = None) -> None:
    """Store the episodes (conversations) that have questions (:func:`.qa.ingest_scope`: a
    rerun reads them back, a store made from other data is refused)."""
    for src, qs in sources:
        if qs:
            t0 = time.perf_counter()
            if ingest_scope(mem, src.scope, src.items) and progress:
                progress(f"ingested {src.scope} ({len(src.items)} items, {time.perf_counter() - t0:.1f} s)")


def open_store(store: str | Path, embedder: Any = "default") -> Memory:
    """A memory for trajectories and long chats: the agentic store setting (units of about
    1,000 tokens), the default retrieval, render and engine."""
    from .._config import StoreConfig
    return Memory(store, store_config=StoreConfig.for_agent(), embedder=embedder)


def limited(sources: list[tuple[Any, list[AgentQuestion]]], limit: int | None
            ) -> list[tuple[Any, list[AgentQuestion]]]:
    """The first ``limit`` questions of the sample, in its order (sources left empty dropped)."""
    if limit is None:
        return sources
    out, left = [], limit
    for src, qs in sources:
        if left <= 0:
            break
        out.append((src, qs[:left]))
        left -= len(out[-1][1])
    return out


# -- answering ----------------------------------------------------------------------------------

def tail(text: str, max_tokens: int) -> str:
    """The longest end of ``text`` with at most ``max_tokens`` tokens, cut on a token edge."""
    if max_tokens <= 0:
        return ""
    ids = encode(text)
    if len(ids) <= max_tokens:
        return text
    return encoding().decode_bytes(ids[-max_tokens:]).decode("utf-8", "ignore")


def truncation_context(mem: Memory, scope: str, budget: int) -> str:
    """The newest items whole while they fit, then the end of the next older one, in time
    order: the context of an agent that drops its oldest history."""
    cap = int(mem.render_config.prompt_cap * budget)
    top = mem.store.max_seq(scope)
    chosen: list[str] = []
    used, end = 0, top + 1
    while end > 0 and used < cap:
        start = max(0, end - 64)
        for it in reversed(mem.store.items(scope, start=start, end=end)):
            text = it.render()
            n = count_tokens(text) + 1
            if used + n > cap:
                # The end of the item, after its head and a cut mark, as the render shows a
                # partly shown item: the reader still sees whose step it was.
                head = f"{it.header()} {CUT} " if it.header() else f"{CUT} "
                cut = tail(it.text, cap - used - 1 - count_tokens(head))
                if cut:
                    chosen.append(head + cut.lstrip())
                used = cap
                break
            chosen.append(text)
            used += n
        end = start
    return "\n".join(reversed(chosen))


def _truncation(mem: Memory, llm: LLM, q: AgentQuestion, budget: int) -> dict[str, Any]:
    """Answer from :func:`truncation_context` with the fast path's prompt and answer length."""
    t0 = time.perf_counter()
    ctx = truncation_context(mem, q.scope, budget)
    top = mem.store.max_seq(q.scope)  # the newest items are what truncation shows
    kinds = [it.kind for it in mem.store.items(q.scope, start=max(0, top - 31), end=top + 1)]
    mem_ms = (time.perf_counter() - t0) * 1e3
    ledger = Ledger()
    degraded, notes = False, []
    t = time.perf_counter()
    try:
        style = style_for_evidence(q.question, kinds)
        out = llm.chat(answer_messages(q.question, ctx, style),
                       max_tokens=mem.engine_config.answer_cap(style), stage="answer", ledger=ledger)
        text = extract_answer(out.text).strip()
    except ProviderError as exc:
        text, degraded, notes = "", True, [f"answer call failed: {exc}"]
    ans_ms = (time.perf_counter() - t) * 1e3
    return {"answer": text, "receipt": {
        "path": "truncation", "mode": "truncation", "model": llm.model, "context_tokens": count_tokens(ctx),
        "input_tokens": ledger.input_tokens, "output_tokens": ledger.output_tokens,
        "cost_usd": ledger.cost_usd, "calls": ledger.calls,
        "stages_ms": {"context": mem_ms, "answer": ans_ms},
        "t_mem_ms": mem_ms, "t_e2e_ms": (time.perf_counter() - t0) * 1e3, "degraded": degraded,
        "notes": notes, "blocks": [], "replayed_ms": replayed_ms(ledger.records)}}


def answer_one(variant: str, mem: Memory, llm: LLM, q: AgentQuestion, budget: int) -> dict[str, Any]:
    """One variant's answer and receipt summary; times include replayed calls' latency."""
    if variant == "truncation":
        res = _truncation(mem, llm, q, budget)
    else:
        engine = mem.engine_config.replace(context="prefix") if variant == "prefix-fill" else None
        mode = "fast" if variant == "prefix-fill" else variant
        ans = mem.ask(q.question, scope=q.scope, llm=llm, mode=mode, budget=budget,  # type: ignore[arg-type]
                      engine=engine)
        res = {"answer": ans.text, "receipt": receipt_summary(ans.receipt)}
        rc = res["receipt"]
        if ans.receipt.degraded and ans.evidence and ans.text == ans.evidence[0].text:
            # No reader answer: the engine returned its top hit. Truncation has no such fallback
            # and scores "" then, so the comparison scores this "" too (the text stays on record).
            res["answer"], rc["fallback_answer"] = "", ans.text
        rc["cached_calls"] = sum(1 for c in ans.receipt.calls if c.cached)
        # T_mem is every stage but the answer: a replayed agent or router call counts there too.
        answer_stage = ANSWER_STAGE.get(ans.receipt.path, "answer")
        rc["t_mem_ms"] += sum(c.latency_ms for c in ans.receipt.calls if c.cached and c.stage != answer_stage)
        if variant == "auto":
            router = mem.router
            rc["router"] = router.name if router is not None else "retrieval-signals"
    rc = res["receipt"]
    rc["t_e2e_ms"] += rc.get("replayed_ms", 0.0)
    if variant == "auto":
        rc["early"] = rc["path"] == "fast" and not rc.get("blocks")
    return res


# -- judging ------------------------------------------------------------------------------------

def rubric_messages(question: str, requirement: str, response: str) -> list[Message]:
    """Ask whether a response meets one rubric requirement; the reply is a JSON score."""
    system = (
        "You check one requirement of a grading rubric against an assistant's response to a "
        "user's question. Give 1 when the response clearly meets the requirement (its wording "
        "may differ), 0.5 when it meets part of it, and 0 when it does not meet it, contradicts "
        "it, or gives no answer. Judge the requirement only, not the rest of the response. "
        'Reply with only a JSON object like {"score": 1, "reason": "one short sentence"}.')
    user = f"Question: {question}\nRequirement: {requirement}\nResponse: {response}\n\nJSON:"
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def rubric_score(llm: LLM, q: AgentQuestion, response: str) -> tuple[float | None, list[float | None]]:
    """Mean of the per-item verdicts (0 / 0.5 / 1) and the verdicts; a verdict that could not
    be read is None and left out of the mean (None when none could)."""
    scores: list[float | None] = []
    for req in q.rubric:
        try:
            s, _ = ask_parsed(llm, rubric_messages(q.question, req, response), parse_verdict,
                              expected=JUDGE_FORMAT, max_tokens=JUDGE_TOKENS, stage="judge")
            scores.append(s)
        except Exception:  # the judge must not take the run down
            scores.append(None)
    ok = [s for s in scores if s is not None]
    return (sum(ok) / len(ok) if ok else None), scores


def add_verdict(rec: dict[str, Any], q: AgentQuestion, judge_llm: LLM) -> None:
    """Grade one record in place: against the reference (AMA-Bench) or the rubric (BEAM)."""
    if q.rubric:
        rec["judge"], rec["rubric_scores"] = rubric_score(judge_llm, q, rec["answer"])
    else:
        v = judge(judge_llm, q.question, q.answer, rec["answer"], max_tokens=JUDGE_TOKENS)
        rec["judge"] = v.score if v.ok else None
        rec["judge_reason"] = v.reason[:200]
    rec["judge_model"] = judge_llm.model


# -- the run ------------------------------------------------------------------------------------

def fingerprints(mem: Memory, llm: LLM, budget: int) -> dict[str, str]:
    """What each variant's answers depend on, hashed: a record with another fingerprint is
    answered again. The reader, budget, prompts and the memory's configs for all; for ``auto``
    also the router that decides (:func:`~suffice._route.sufficiency.router_identity`)."""
    d = {"reader": llm.model, "budget": budget, "prompts": PROMPTS_FINGERPRINT,
         **({"deep_reader": mem.deep_llm.model} if mem.deep_llm is not None else {}),
         "store": mem.store_config.model_dump(), "retrieval": mem.retrieval.model_dump(),
         "render": mem.render_config.model_dump(),
         "engine": mem.engine_config.model_dump(exclude={"timeout_s", "tau"})}
    common = digest(d)
    routed = digest({**d, "router": router_identity(mem.router)})
    return {v: routed if v == "auto" else common for v in VARIANTS}


def questions_of(questions: Iterable[AgentQuestion]) -> dict[str, dict[str, Any]]:
    """Each question's key with its text and gold answer: a record under that key counts only
    if they match (:func:`.report.same_question`)."""
    return {q.key: {"question": q.question, "gold": q.answer} for q in questions}


def run(mem: Memory, llm: LLM, questions: Sequence[AgentQuestion], out: Path, *, budget: int,
        variants: Sequence[str] = VARIANTS, judge_llm: LLM | None = None,
        progress: Callable[[int], None] | None = None) -> dict[str, int]:
    """Answer, score and record every (variant, question) not yet recorded; judge recorded
    answers that lack a verdict. Returns how many answers were made, reused and judged."""
    prints = fingerprints(mem, llm, budget)
    recs = [r for r in read_results(out)] if out.exists() else []
    have = current(recs, prints, questions_of(questions))
    by_key = {q.key: q for q in questions}
    counts = {"ran": 0, "reused": 0, "judged": 0}
    if judge_llm is not None:  # verdicts missing from an earlier run (e.g. one with --no-judge)
        changed = False
        for r in have.values():
            if r["key"] in by_key and (r.get("judge") is None or r.get("judge_model") != judge_llm.model):
                add_verdict(r, by_key[r["key"]], judge_llm)
                counts["judged"] += 1
                changed = True
        if changed:
            write_atomic(out, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in recs))
    with open_append(out) as fh:
        for q in questions:
            for v in variants:
                if (v, q.key) in have:
                    counts["reused"] += 1
                    continue
                res = answer_one(v, mem, llm, q, budget)
                rec: dict[str, Any] = {"variant": v, "key": q.key, "group": q.group, "domain": q.domain,
                                       "question": q.question, "gold": q.answer, "budget": budget,
                                       "fingerprint": prints[v], "f1": token_f1(res["answer"], q.answer),
                                       **res}
                if judge_llm is not None:
                    add_verdict(rec, q, judge_llm)
                    counts["judged"] += 1
                fh.write(json.dumps(rec, ensure_ascii=False) + "\n")
                fh.flush()
                have[(v, q.key)] = rec
                counts["ran"] += 1
            if progress is not None:
                progress(1)
    return counts


# -- the report ---------------------------------------------------------------------------------

def _stats(recs: list[dict[str, Any]]) -> dict[str, Any]:
    n = len(recs)
    judged = [r["judge"] for r in recs if r.get("judge") is not None]
    novel = [r["novel_f1"] for r in recs if r.get("novel_f1") is not None]
    autos = [r for r in recs if r["variant"] == "auto"]
    return {
        "n": n, "f1": 100 * sum(r["f1"] for r in recs) / n,
        "judge": 100 * sum(judged) / len(judged) if judged else None, "judged": len(judged),
        "novel_f1": 100 * sum(novel) / len(novel) if novel else None, "novel_scored": len(novel),
        "early_rate": (100 * sum(bool(r["receipt"].get("early")) for r in autos) / len(autos)
                       if autos else None),
        "t_mem_ms": sum(r["receipt"]["t_mem_ms"] for r in recs) / n,
        "t_e2e_ms": sum(r["receipt"]["t_e2e_ms"] for r in recs) / n,
        "input_tokens": sum(r["receipt"]["input_tokens"] for r in recs) / n,
        "output_tokens": sum(r["receipt"]["output_tokens"] for r in recs) / n,
        "context_tokens": sum(r["receipt"]["context_tokens"] for r in recs) / n,
        "degraded": sum(bool(r["receipt"].get("degraded")) for r in recs),
    }


def summarize(path: Path, questions: Mapping[str, Mapping[str, Any]] | None = None, *,
              complete: bool = True, fingerprints: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Per variant: overall, per group (type / ability) and per domain; paired differences.

    A (variant, question) recorded twice counts once, as its newest record; with
    ``fingerprints`` only records made under the current settings count, with ``questions``
    (:func:`questions_of`) only those of the questions as asked now. With ``complete`` only
    questions every recorded variant has answered count, so the rows compare the same questions.
    """
    recs = list(current(read_results(path), fingerprints, questions).values())
    for r in recs:  # scored here, not when answered, so older records get it too
        r["novel_f1"] = novel_f1(r["answer"], r["gold"], r["question"])
    variants = [v for v in VARIANTS if any(r["variant"] == v for r in recs)]
    if complete:
        done: dict[str, set[str]] = {}
        for r in recs:
            done.setdefault(r["key"], set()).add(r["variant"])
        full = {k for k, vs in done.items() if set(variants) <= vs}
        recs = [r for r in recs if r["key"] in full]
    out: dict[str, Any] = {"n_questions": len({r["key"] for r in recs}), "variants": variants,
                           "overall": {}, "by_group": {}, "by_domain": {}, "compare": []}
    for v in variants:
        rv = [r for r in recs if r["variant"] == v]
        if not rv:
            continue
        out["overall"][v] = _stats(rv)
        for field_, name in (("group", "by_group"), ("domain", "by_domain")):
            for g in sorted({r[field_] for r in rv}):
                out[name].setdefault(g, {})[v] = _stats([r for r in rv if r[field_] == g])
    pairs = [("fast", "truncation"), ("auto", "truncation"), ("deep", "truncation"),
             ("fast", "prefix-fill"), ("deep", "fast"), ("auto", "deep")]
    by = {(r["variant"], r["key"]): r for r in recs}
    keys_done = sorted({r["key"] for r in recs})
    for a, b in pairs:
        if a not in variants or b not in variants:
            continue
        for metric in ("f1", "novel_f1", "judge"):
            ks = [k for k in keys_done if by[(a, k)].get(metric) is not None
                  and by[(b, k)].get(metric) is not None]
            if not ks:
                continue
            diff, lo, hi = paired_bootstrap([100 * by[(a, k)][metric] for k in ks],
                                            [100 * by[(b, k)][metric] for k in ks])
            out["compare"].append({"a": a, "b": b, "metric": metric, "n": len(ks), "diff": diff,
                                   "ci95": [lo, hi]})
    return out


def _cell(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}"


def format_summary(s: dict[str, Any], *, group_label: str = "type") -> str:
    """The tables of :func:`summarize`, in Markdown."""
    header = ["variant", "n", "F1", "F1 beyond the question", "judge", "early %", "T_mem ms", "T_e2e ms",
              "in tok", "out tok"]
    rows = [[v, r["n"], r["f1"], _cell(r["novel_f1"]), _cell(r["judge"]), _cell(r["early_rate"]),
             round(r["t_mem_ms"]), round(r["t_e2e_ms"]), round(r["input_tokens"]), round(r["output_tokens"])]
            for v, r in s["overall"].items()]
    text = markdown_table(header, rows)
    for name, label in (("by_group", group_label), ("by_domain", "domain")):
        groups = s[name]
        if not groups or (name == "by_domain" and len(groups) < 2):
            continue
        vs = s["variants"]
        head = [label, "n", *[f"{v} F1" for v in vs], *[f"{v} judge" for v in vs]]
        body = []
        for g, per in groups.items():
            n = next(iter(per.values()))["n"]
            body.append([g, n, *[_cell(per[v]["f1"]) if v in per else "-" for v in vs],
                         *[_cell(per[v]["judge"]) if v in per else "-" for v in vs]])
        text += "\n\n" + markdown_table(head, body)
    if s["compare"]:
        text += "\n\n" + markdown_table(
            ["difference", "metric", "n", "points", "95% CI (paired bootstrap)"],
            [[f"{c['a']} - {c['b']}", c["metric"], c["n"], f"{c['diff']:+.1f}",
              f"[{c['ci95'][0]:+.1f}, {c['ci95'][1]:+.1f}]"] for c in s["compare"]])
    return text


__all__ = ["AgentQuestion", "VARIANTS", "answer_one", "format_summary", "ingest", "rubric_messages",
           "rubric_score", "run", "sample_ama", "sample_beam", "summarize", "truncation_context"]


def _log(msg: str) -> None:
    import sys
    print(msg, file=sys.stderr, flush=True)


def main(dataset: str, *, mem: Memory, llm: LLM, judge_llm: LLM | None, data: Path | None,
         sources: int | None, per_source: int, limit: int | None, variants: Sequence[str], budget: int,
         out: Path, json_out: Path | None, progress: Callable[[int], None] | None = None,
         settings: dict[str, Any] | None = None) -> dict[str, Any]:
    """Sample, ingest, run and summarize one dataset (``ama`` or ``beam``); what the CLI calls."""
    from .report import envelope, write_json
    if dataset == "ama":
        from .._datasets.ama import default_path, load_ama
        root = data or default_path()
        picked = limited(sample_ama(load_ama(root), n_episodes=sources, per_episode=per_source), limit)
    else:
        from .._datasets.beam import default_path as beam_path
        from .._datasets.beam import load_beam
        root = data or beam_path()
        picked = limited(sample_beam(load_beam(root), root, n_convs=sources, per_ability=per_source), limit)
    questions = [q for _, qs in picked for q in qs]
    ingest(mem, picked, progress=_log)
    counts = run(mem, llm, questions, out, budget=budget, variants=variants, judge_llm=judge_llm,
                 progress=progress)
    prints = fingerprints(mem, llm, budget)
    summary = summarize(out, questions_of(questions), fingerprints=prints)
    summary["counts"] = counts
    summary["sample"] = {"questions": len(questions), "sources": len(picked),
                         "keys": [q.key for q in questions]}
    if json_out is not None:
        write_json(json_out, envelope(f"agent_qa_{dataset}", dataset, str(root), {
            "budget": budget, "variants": list(variants), "sources": sources, "per_source": per_source,
            "limit": limit, "reader": llm.model, "judge": judge_llm.model if judge_llm else None,
            "deep_reader": (mem.deep_llm or llm).model,
            "store": mem.store_config.model_dump(), "engine": mem.engine_config.model_dump(),
            "retrieval": mem.retrieval.model_dump(), "render": mem.render_config.model_dump(),
            "fingerprints": {v: prints[v] for v in variants},
            "router": getattr(mem.router, "name", "retrieval-signals"), **(settings or {})}, summary))
    return summary
