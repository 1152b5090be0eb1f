"""Progressive execution: one shared prefix, then stop if the evidence suffices, else go deep.

``fast`` always answers from the prefix evidence; ``deep`` always expands to blocks read by
memory agents; ``auto`` asks a sufficiency router and stops when its score reaches tau. Every
answer carries a :class:`Receipt` that adds up: stage latencies never exceed the end-to-end
time, and the call costs sum to the total.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from ._config import EngineConfig, RenderConfig, RetrievalConfig
from ._deep import (
    AgentNote,
    ChosenBlock,
    LLMBlockReader,
    MemoryAgent,
    choose_blocks,
    notes_text,
    run_agents,
    with_dates,
)
from ._errors import ConfigError, DeadlineError, ProviderError
from ._llm.base import LLM, CallRecord, Ledger, Message
from ._llm.parse import extract_answer
from ._prompts import Style, aggregate_messages, answer_messages, choose_style, deep_context
from ._render import Renderer
from ._retrieve import Ranking, Retriever
from ._route.sufficiency import RouterDecision, ScoreRouter, SufficiencyRouter, over_budget
from ._store.base import Store
from ._tokens import count_tokens, fill_in_order
from ._types import ContextPart, Evidence, Filter, Hit, Item

Mode = Literal["fast", "deep", "auto"]
Path = Literal["fast", "deep"]


@dataclass(frozen=True, slots=True)
class BlockReceipt:
    block: int
    first_seq: int
    last_seq: int
    tokens: int
    why: str
    relevant: bool
    latency_ms: float
    ok: bool
    error: str = ""
    calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0
    notes_tokens: int = 0
    """Tokens of this block's notes that reached the final context."""


@dataclass(frozen=True, slots=True)
class Receipt:
    """How an answer was made: path, decisions, evidence, calls, tokens, cost and time."""

    question: str
    scope: str
    mode: str
    path: Path
    model: str
    hits: tuple[Hit, ...]
    context_tokens: int
    parts: tuple[ContextPart, ...]
    calls: tuple[CallRecord, ...]
    stages_ms: dict[str, float]
    t_mem_ms: float
    """Memory work: every stage except the call that writes the answer (``answer`` on the
    fast path, ``aggregate`` on the deep path), so both paths count the same things."""
    t_e2e_ms: float
    router: str = ""
    router_score: float | None = None
    tau: float | None = None
    router_reason: str = ""
    blocks: tuple[BlockReceipt, ...] = ()
    degraded: bool = False
    notes: tuple[str, ...] = ()
    deadline_s: float | None = None
    """The query's deadline (``EngineConfig.timeout_s``), when it had one."""
    out_of_time: tuple[str, ...] = ()
    """Stages the deadline cut short (each fell back to a cheaper path; see ``notes``)."""

    @property
    def input_tokens(self) -> int:
        return sum(c.input_tokens for c in self.calls)

    @property
    def output_tokens(self) -> int:
        return sum(c.output_tokens for c in self.calls)

    @property
    def cost_usd(self) -> float:
        return math.fsum(c.cost_usd for c in self.calls)

    def cost_by_stage(self) -> dict[str, float]:
        stages: dict[str, list[float]] = {}
        for c in self.calls:
            stages.setdefault(c.stage, []).append(c.cost_usd)
        return {k: math.fsum(v) for k, v in stages.items()}

    def tokens_by_stage(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for c in self.calls:
            out[c.stage] = out.get(c.stage, 0) + c.input_tokens + c.output_tokens
        return out


@dataclass(frozen=True, slots=True)
class Answer:
    text: str
    receipt: Receipt
    evidence: tuple[Item, ...] = field(default=())


class Engine:
    """Answers questions over one store with one reader model, from the parts Memory composed."""

    def __init__(self, store: Store, retriever: Retriever, renderer: Renderer, llm: LLM, *,
                 router: SufficiencyRouter | None = None, agent: MemoryAgent | None = None) -> None:
        self.store = store
        self.retriever = retriever
        self.renderer = renderer
        self.llm = llm
        # Without a router, auto uses the retrieval-signal router: no model call (the 0.5B LM
        # router costs ~3 s a query) and on LoCoMo it ranks no worse (docs/benchmarks.md §5).
        self.router: SufficiencyRouter = router or ScoreRouter()
        self.agent = agent
        """The deep path's memory agent; None: an LLM block reader built from the engine config."""

    # -- context for the reader ---------------------------------------------------------------

    def fast_context(self, question: str, budget: int, ranking: Ranking, evidence: Evidence,
                     config: EngineConfig, render: RenderConfig, retrieval: RetrievalConfig
                     ) -> tuple[str, tuple[ContextPart, ...]]:
        """The reader's context on the fast path, within ``budget`` tokens.

        ``render``: the budgeted memory (timeline + detail) built from ``ranking``.
        ``prefix``: the hits of ``evidence`` taken in rank order while they fit, shown in time order.
        """
        if config.context == "render":
            ctx = self.renderer.render(ranking.scope, question, budget, config=render, retrieval=retrieval,
                                       ranking=ranking, flt=ranking.filter)
            return ctx.text, ctx.parts
        cap = int(render.prompt_cap * budget)
        ranked = [(h, count_tokens(h.item.render()) + 1) for h in evidence.hits]
        chosen = [ranked[i] for i in fill_in_order((n for _, n in ranked), cap)]
        chosen.sort(key=lambda x: x[0].seq)
        text = "\n".join(h.item.render() for h, _ in chosen)
        parts = tuple(ContextPart("raw", h.unit, (h.seq,), n, f"prefix rank {h.rank + 1}", h.score)
                      for h, n in chosen)
        return text, parts

    # -- the query path -----------------------------------------------------------------------

    def ask(self, question: str, *, scope: str, mode: Mode, config: EngineConfig,
            retrieval: RetrievalConfig, render: RenderConfig, flt: Filter | None = None,
            style: Style | None = None) -> Answer:
        """Answer ``question`` from ``scope`` under the given configs, each applied whole."""
        if mode not in ("fast", "deep", "auto"):
            raise ConfigError(f"unknown mode {mode!r}; use fast, deep or auto")
        tau, budget = config.tau, config.reader_budget
        style = style or choose_style(question)
        ledger = Ledger()
        stages: dict[str, float] = {}
        notes: list[str] = []
        t0 = time.perf_counter()
        clock = _Clock(config.timeout_s)

        # The one retrieval of this query: deep enough for the reader's context (render pieces,
        # or prefix hits to fill the budget); the router and the deep path see its top k hits,
        # the evidence context C_f.
        use_prefix = config.context == "prefix"
        depth = max(retrieval.k, config.context_depth if use_prefix else 0)
        ranking = self.retriever.rank(scope, question, retrieval, depth=depth, flt=flt,
                                      piece_depth=0 if use_prefix else render.depth(budget))
        ranked = self.retriever.evidence(ranking)
        evidence = ranked.top(retrieval.k)
        stages["prefix"] = _ms(t0)
        if "rerank_ms" in ranking.timings_ms:  # part of the prefix, shown apart for its cost
            stages["rerank"] = ranking.timings_ms["rerank_ms"]
        if ranking.notice:
            notes.append(ranking.notice)

        decision: RouterDecision | None = None
        path: Path = "fast" if mode == "fast" else "deep"
        if mode == "auto":
            t = time.perf_counter()
            decision = self._route(question, evidence, ledger, clock)
            stages["router"] = _ms(t)
            path = "fast" if decision.ok and decision.score >= tau else "deep"
            if not decision.ok:
                notes.append(decision.reason)

        blocks: tuple[BlockReceipt, ...] = ()
        degraded = False
        if path == "deep":
            result, blocks = self._deep(question, scope, evidence, ranking, ranked, budget, style, ledger,
                                        stages, notes, config, render, retrieval, clock)
            if result is None:  # every agent failed or nothing relevant: the fast path answers
                path = "fast"  # the blocks stay on the receipt: they were read and paid for
                degraded = True
            else:
                text, parts, context_tokens = result
                return self._finish(question, scope, mode, "deep", text, evidence, parts,
                                    context_tokens, ledger, stages, t0, decision, tau,
                                    blocks, degraded, notes, clock)

        t = time.perf_counter()
        context, parts = self.fast_context(question, budget, ranking, ranked, config, render, retrieval)
        stages["context"] = _ms(t)
        t = time.perf_counter()
        text, ok = self._answer(answer_messages(question, context, style), ledger, "answer",
                                config.answer_max_tokens, clock)
        stages["answer"] = _ms(t)
        if not ok:
            degraded = True
            notes.append(f"answer call failed ({text}); returned the top prefix hit instead")
            text = evidence.hits[0].item.text if evidence.hits else ""
        return self._finish(question, scope, mode, "fast", text, evidence, parts,
                            count_tokens(context), ledger, stages, t0, decision, tau,
                            blocks, degraded, notes, clock)

    def _route(self, question: str, evidence: Evidence, ledger: Ledger, clock: _Clock) -> RouterDecision:
        """The router's decision; over its input budget or on any failure, ``ok=False`` (deep)."""
        refused = over_budget(count_tokens(evidence.text), self.router.input_budget)
        if refused is not None:
            return refused
        if clock.passed():
            clock.ran_out("router")
            return RouterDecision(0.0, "the query's deadline passed before the router ran", 0.0, ok=False)
        try:
            d = self.router.score(question, evidence, ledger=ledger, deadline=clock.deadline)
        except Exception as exc:  # a pluggable router's bug must not sink the query
            return RouterDecision(0.0, f"router {self.router.name} failed "
                                  f"({type(exc).__name__}: {exc}); going deep", 0.0, ok=False)
        if not d.ok and clock.passed():
            clock.ran_out("router")
        if d.ok and not (isinstance(d.score, int | float) and 0.0 <= d.score <= 1.0):
            return RouterDecision(0.0, f"router {self.router.name} gave {d.score!r}, not a "
                                  "score in [0, 1]; going deep", d.latency_ms, ok=False)
        return d

    def _answer(self, messages: list[Message], ledger: Ledger, stage: str, max_tokens: int,
                clock: _Clock, raw: bool = False) -> tuple[str, bool]:
        try:
            out = self.llm.chat(messages, max_tokens=max_tokens * (3 if raw else 1),
                                stage=stage, ledger=ledger, deadline=clock.deadline)
        except DeadlineError as exc:
            clock.ran_out(stage)
            return str(exc), False
        except ProviderError as exc:
            return str(exc), False
        return (out.text if raw else extract_answer(out.text).strip()), True

    def _deep(self, question: str, scope: str, evidence: Evidence, ranking: Ranking, ranked: Evidence,
              budget: int, style: Style, ledger: Ledger, stages: dict[str, float], notes: list[str],
              s: EngineConfig, render: RenderConfig, retrieval: RetrievalConfig, clock: _Clock
              ) -> tuple[tuple[str, tuple[ContextPart, ...], int] | None, tuple[BlockReceipt, ...]]:
        """(answer, parts, context tokens) or None when the deep path cannot answer; and the
        receipts of the blocks it read either way."""
        t = time.perf_counter()
        views = (ranking.index or self.retriever.index(scope)).views
        chosen = choose_blocks(evidence.hits, views, s)
        lo = min((c.block.first_seq for c in chosen), default=0)
        hi = max((c.block.last_seq for c in chosen), default=-1)
        pool = {it.seq: it for it in self.store.items(scope, start=lo, end=hi + 1)}
        if ranking.filter is not None and not ranking.filter.empty:
            flt = ranking.filter
            pool = {q: it for q, it in pool.items() if flt.matches(it)}
        block_items = {c.block.index: [pool[q] for q in range(c.block.first_seq, c.block.last_seq + 1)
                                       if q in pool] for c in chosen}
        stages["blocks"] = _ms(t)
        t = time.perf_counter()
        agent = self.agent or LLMBlockReader(self.llm, max_block_tokens=s.agent_block_tokens,
                                             max_tokens=s.agent_max_tokens, grounding=s.agent_grounding)
        agent_notes = run_agents(agent, question, chosen, block_items,
                                 {h.seq for h in evidence.hits}, concurrency=s.concurrency,
                                 ledger=ledger, deadline=clock.deadline)
        stages["agents"] = _ms(t)
        if any(not n.ok and "DeadlineError" in n.error for n in agent_notes):
            clock.ran_out("agents")
        for n in agent_notes:
            if not n.ok:
                notes.append(f"block {n.block} agent failed: {n.error}")
        if s.resolve_dates:
            t = time.perf_counter()
            agent_notes, dated = with_dates(agent_notes, pool)
            stages["dates"] = _ms(t)
            if dated:
                notes.append(f"relative dates stated in {dated} quoted turn(s)")
        relevant = [n for n in agent_notes if n.relevant]
        if not relevant:
            notes.append("no block agent returned relevant notes; the fast path answered")
            return None, _block_receipts(chosen, agent_notes, {})
        cap = int(render.prompt_cap * budget)
        body, kept = notes_text(agent_notes, int(cap * s.notes_share))
        used = {b: count_tokens("\n".join(lines)) for b, lines in kept.items()}
        receipts = _block_receipts(chosen, agent_notes, used)
        if not body:
            notes.append("no agent note fits the budget; the fast path answered")
            return None, receipts
        parts: list[ContextPart] = [
            ContextPart("notice", None, _quoted(n, set(kept[n.block])), used[n.block],
                        f"notes of block {n.block}")
            for n in relevant if n.block in kept]
        if s.aggregator == "llm":
            t = time.perf_counter()
            text, ok = self._answer(aggregate_messages(question, body), ledger, "aggregate",
                                    s.answer_max_tokens, clock, raw=True)
            stages["aggregate"] = _ms(t)
            if ok:
                text, conflicts = split_aggregate(text)
                if conflicts:
                    notes.append(f"conflicts flagged: {conflicts}")
        else:
            # The reader merges: notes first (oldest first, later ones win), then as much of
            # the fast path's context as still fits.
            t = time.perf_counter()
            room = cap - count_tokens(body) - 40
            evidence_text: str = ""
            evidence_parts: tuple[ContextPart, ...] = ()
            if room > 0 and render.prompt_cap > 0:
                evidence_text, evidence_parts = self.fast_context(
                    question, int(room / render.prompt_cap), ranking, ranked, s, render, retrieval)
            parts += evidence_parts
            body = deep_context(body, evidence_text)
            stages["evidence"] = _ms(t)
            t = time.perf_counter()
            text, ok = self._answer(answer_messages(question, body, style), ledger, "aggregate",
                                    s.answer_max_tokens, clock)
            stages["aggregate"] = _ms(t)
        if not ok:
            notes.append(f"aggregation failed ({text}); the fast path answered")
            return None, receipts
        return (text, tuple(parts), count_tokens(body)), receipts

    def _finish(self, question: str, scope: str, mode: str, path: Path, text: str,
                evidence: Evidence, parts: Sequence[ContextPart], context_tokens: int,
                ledger: Ledger, stages: dict[str, float], t0: float,
                decision: RouterDecision | None, tau: float, blocks: tuple[BlockReceipt, ...],
                degraded: bool, notes: list[str], clock: _Clock) -> Answer:
        if clock.missed:
            degraded = True
            notes.append(f"the query's deadline of {clock.timeout_s:g} s passed during: "
                         + ", ".join(dict.fromkeys(clock.missed)))
        t_e2e = _ms(t0)
        writer = ANSWER_STAGE[path]
        t_mem = sum(v for k, v in stages.items() if k != writer)
        receipt = Receipt(
            question=question, scope=scope, mode=mode, path=path, model=self.llm.model,
            hits=evidence.hits, context_tokens=context_tokens, parts=tuple(parts),
            calls=tuple(ledger.records), stages_ms=dict(stages), t_mem_ms=t_mem, t_e2e_ms=t_e2e,
            router=self.router.name if decision is not None else "",
            router_score=decision.score if decision else None,
            tau=tau if decision else None, router_reason=decision.reason if decision else "",
            blocks=blocks, degraded=degraded, notes=tuple(notes), deadline_s=clock.timeout_s,
            out_of_time=tuple(dict.fromkeys(clock.missed)),
        )
        return Answer(text=text, receipt=receipt, evidence=evidence.items)


class _Clock:
    """One query's deadline, and the stages it cut short."""

    def __init__(self, timeout_s: float | None) -> None:
        self.timeout_s = timeout_s
        self.deadline = None if timeout_s is None else time.monotonic() + timeout_s
        self.missed: list[str] = []

    def passed(self) -> bool:
        return self.deadline is not None and time.monotonic() >= self.deadline

    def ran_out(self, stage: str) -> None:
        self.missed.append(stage)


ANSWER_STAGE: dict[Path, str] = {"fast": "answer", "deep": "aggregate"}
"""The stage that writes the answer on each path; every other stage, a failed deep attempt
included, counts as memory work (``t_mem_ms``)."""


def _block_receipts(chosen: Sequence[ChosenBlock], notes: Sequence[AgentNote],
                    used: dict[int, int]) -> tuple[BlockReceipt, ...]:
    by_block = {n.block: n for n in notes}
    out = []
    for c in chosen:
        n = by_block.get(c.block.index)
        calls = n.calls if n else ()
        out.append(BlockReceipt(
            c.block.index, c.block.first_seq, c.block.last_seq, c.block.tokens, c.why,
            bool(n and n.relevant), n.latency_ms if n else 0.0, bool(n and n.ok),
            n.error if n else "missing", calls=len(calls),
            input_tokens=sum(x.input_tokens for x in calls),
            output_tokens=sum(x.output_tokens for x in calls),
            cost_usd=math.fsum(x.cost_usd for x in calls), notes_tokens=used.get(c.block.index, 0)))
    return tuple(out)


def _quoted(note: AgentNote, kept: set[str]) -> tuple[int, ...]:
    """The items of ``note`` whose lines reached the context under its block (a turn two
    overlapping blocks quote is credited to the block that got it); its whole block for
    free-form notes, which quote no items."""
    pairs = note.quoted_lines()
    if pairs is not None:
        return tuple(q for q, line in pairs if line in kept)
    return tuple(range(note.first_seq, note.last_seq + 1))


_ANSWER_TAG = re.compile(r"<answer>(.*?)(?:</answer>|$)", re.DOTALL | re.IGNORECASE)


def split_aggregate(text: str) -> tuple[str, str]:
    """(answer, conflicts) from the aggregator's reply, tolerant of a missing answer tag.

    Conflicts sit on the ``CONFLICTS:`` line itself, or, when that line is empty, in the
    bulleted list after it; "none" means there were none.
    """
    conflicts: list[str] = []
    lines: list[str] = []
    in_list = False  # after an empty "CONFLICTS:" line: a bulleted list follows
    for line in text.strip().splitlines():
        head, _, rest = line.partition(":")
        if head.strip().upper() == "CONFLICTS":
            rest = rest.strip()
            in_list = not rest
            if rest.lower().rstrip(".") not in ("", "none", "none, or one line per conflict"):
                conflicts.append(rest)
            continue
        if in_list:
            if not line.strip():
                continue
            if line.lstrip().startswith(("-", "*", "•")):
                item = line.strip().lstrip("-*• ").strip()
                if item.lower().rstrip(".") != "none":
                    conflicts.append(item)
                continue
            in_list = False
        lines.append(line)
    body = "\n".join(lines).strip()
    m = _ANSWER_TAG.search(body)
    if m:
        return m.group(1).strip(), "; ".join(conflicts)
    remaining = [ln.strip() for ln in body.splitlines() if ln.strip()]
    return (extract_answer(remaining[-1]) if remaining else ""), "; ".join(conflicts)


def _ms(t0: float) -> float:
    return (time.perf_counter() - t0) * 1e3
