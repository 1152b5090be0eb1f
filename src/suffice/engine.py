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
from typing import TYPE_CHECKING, Literal

from .config import Settings
from .deep import (
    AgentNote,
    ChosenBlock,
    LLMBlockReader,
    MemoryAgent,
    choose_blocks,
    notes_text,
    run_agents,
    with_dates,
)
from .errors import ConfigError, ProviderError
from .llm.base import LLM, CallRecord, Ledger, Message
from .llm.parse import extract_answer
from .prompts import Style, aggregate_messages, answer_messages, choose_style, deep_context
from .render import render_context
from .route.sufficiency import RouterDecision, ScoreRouter, SufficiencyRouter, over_budget
from .tokens import count_tokens, fill_in_order
from .types import ContextPart, Evidence, Hit, Item

if TYPE_CHECKING:
    from .api import Memory

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
    """Answers questions over one Memory with one reader model."""

    def __init__(self, memory: Memory, llm: LLM, *, router: SufficiencyRouter | None = None,
                 agent: MemoryAgent | None = None, context: Literal["prefix", "render"] = "render",
                 aggregator: Literal["reader", "llm"] = "reader", answer_max_tokens: int = 48) -> None:
        self.memory = memory
        self.llm = llm
        # Without a router, auto uses the retrieval-signal router: no model call (the 0.5B LM
        # router costs ~3 s a query) and on LoCoMo it ranks no worse (docs/benchmarks.md §5).
        self.router: SufficiencyRouter = router or ScoreRouter()
        self.agent = agent or LLMBlockReader(llm)
        self.context = context
        self.aggregator = aggregator
        self.answer_max_tokens = answer_max_tokens

    # -- context for the reader ---------------------------------------------------------------

    def fast_context(self, scope: str, question: str, budget: int, evidence: Evidence,
                     settings: Settings | None = None
                     ) -> tuple[str, tuple[ContextPart, ...], tuple[Hit, ...]]:
        """The reader's context on the fast path, within ``budget`` tokens.

        ``prefix``: fused hits taken in rank order while they fit, shown in time order.
        ``render``: the budgeted memory of :meth:`Memory.render` (timeline + detail).
        """
        s = settings or self.memory.settings
        if self.context == "render":
            ctx = render_context(self.memory, question, budget, scope=scope, settings=s)
            return ctx.text, ctx.parts, evidence.hits
        cap = int(s.prompt_cap * budget)
        by_seq = {it.seq: it for it in evidence.items}
        ranked = [(h, by_seq[h.seq], count_tokens(by_seq[h.seq].render()) + 1) for h in evidence.hits]
        chosen = [ranked[i] for i in fill_in_order((n for _, _, n in ranked), cap)]
        chosen.sort(key=lambda x: x[1].seq)
        text = "\n".join(it.render() for _, it, _ in chosen)
        parts = tuple(ContextPart("raw", h.unit, (it.seq,), n, f"prefix rank {h.rank + 1}", h.score)
                      for h, it, n in chosen)
        return text, parts, tuple(h for h, _, _ in chosen)

    # -- the query path -----------------------------------------------------------------------

    def ask(self, question: str, *, scope: str, mode: Mode = "auto", tau: float | None = None,
            budget: int | None = None, style: Style | None = None,
            settings: Settings | None = None) -> Answer:
        """Answer ``question``; ``tau``, ``budget`` and ``settings`` override the memory's
        for this query (``settings``: prefix size, blocks, concurrency, render knobs; the unit
        and block sizes of the views always come from the memory)."""
        if mode not in ("fast", "deep", "auto"):
            raise ConfigError(f"unknown mode {mode!r}; use fast, deep or auto")
        s = settings or self.memory.settings
        tau = s.tau if tau is None else tau
        budget = s.reader_budget if budget is None else budget
        style = style or choose_style(question)
        ledger = Ledger()
        stages: dict[str, float] = {}
        notes: list[str] = []
        t0 = time.perf_counter()

        # One retrieval, deep enough to fill the reader's budget; the router and the deep
        # path see its top ``prefix_k`` hits, the evidence context C_f.
        ranked = self.memory.search(question, scope=scope, k=max(s.prefix_k, 60))
        evidence = _top(ranked, s.prefix_k)
        stages["prefix"] = _ms(t0)

        decision: RouterDecision | None = None
        path: Path = "fast" if mode == "fast" else "deep"
        if mode == "auto":
            t = time.perf_counter()
            decision = self._route(question, evidence, ledger)
            stages["router"] = _ms(t)
            path = "fast" if decision.ok and decision.score >= tau else "deep"
            if not decision.ok:
                notes.append(decision.reason)

        blocks: tuple[BlockReceipt, ...] = ()
        degraded = False
        if path == "deep":
            result, blocks = self._deep(question, scope, evidence, ranked, budget, style, ledger,
                                        stages, notes, s)
            if result is None:  # every agent failed or nothing relevant: the fast path answers
                path = "fast"  # the blocks stay on the receipt: they were read and paid for
                degraded = True
            else:
                text, parts, context_tokens = result
                return self._finish(question, scope, mode, "deep", text, evidence, parts,
                                    context_tokens, ledger, stages, t0, decision, tau,
                                    blocks, degraded, notes)

        t = time.perf_counter()
        context, parts, _ = self.fast_context(scope, question, budget, ranked, s)
        stages["context"] = _ms(t)
        t = time.perf_counter()
        text, ok = self._answer(answer_messages(question, context, style), ledger, "answer")
        stages["answer"] = _ms(t)
        if not ok:
            degraded = True
            notes.append(f"answer call failed ({text}); returned the top prefix hit instead")
            text = evidence.items[0].text if evidence.items else ""
            top = min(evidence.hits, key=lambda h: h.rank) if evidence.hits else None
            if top is not None:
                text = next(it.text for it in evidence.items if it.seq == top.seq)
        return self._finish(question, scope, mode, "fast", text, evidence, parts,
                            count_tokens(context), ledger, stages, t0, decision, tau,
                            blocks, degraded, notes)

    def _route(self, question: str, evidence: Evidence, ledger: Ledger) -> RouterDecision:
        """The router's decision; over its input budget or on any failure, ``ok=False`` (deep)."""
        refused = over_budget(count_tokens(evidence.text), self.router.input_budget)
        if refused is not None:
            return refused
        try:
            d = self.router.score(question, evidence, ledger=ledger)
        except Exception as exc:  # a pluggable router's bug must not sink the query
            return RouterDecision(0.0, f"router {self.router.name} failed "
                                  f"({type(exc).__name__}: {exc}); going deep", 0.0, ok=False)
        if d.ok and not (isinstance(d.score, int | float) and 0.0 <= d.score <= 1.0):
            return RouterDecision(0.0, f"router {self.router.name} gave {d.score!r}, not a "
                                  "score in [0, 1]; going deep", d.latency_ms, ok=False)
        return d

    def _answer(self, messages: list[Message], ledger: Ledger, stage: str,
                raw: bool = False) -> tuple[str, bool]:
        try:
            out = self.llm.chat(messages, max_tokens=self.answer_max_tokens * (3 if raw else 1),
                                stage=stage, ledger=ledger)
        except ProviderError as exc:
            return str(exc), False
        return (out.text if raw else extract_answer(out.text).strip()), True

    def _deep(self, question: str, scope: str, evidence: Evidence, ranked: Evidence,
              budget: int, style: Style,
              ledger: Ledger, stages: dict[str, float], notes: list[str], s: Settings
              ) -> tuple[tuple[str, tuple[ContextPart, ...], int] | None, tuple[BlockReceipt, ...]]:
        """(answer, parts, context tokens) or None when the deep path cannot answer; and the
        receipts of the blocks it read either way."""
        t = time.perf_counter()
        views = self.memory.retriever.index(scope).views
        chosen = choose_blocks(evidence.hits, views, s)
        lo = min((c.block.first_seq for c in chosen), default=0)
        hi = max((c.block.last_seq for c in chosen), default=-1)
        pool = {it.seq: it for it in self.memory.store.items(scope, start=lo, end=hi + 1)}
        block_items = {c.block.index: [pool[q] for q in range(c.block.first_seq, c.block.last_seq + 1)]
                       for c in chosen}
        stages["blocks"] = _ms(t)
        t = time.perf_counter()
        agent_notes = run_agents(self.agent, question, chosen, block_items,
                                 {h.seq for h in evidence.hits}, concurrency=s.concurrency,
                                 ledger=ledger)
        stages["agents"] = _ms(t)
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
        cap = int(s.prompt_cap * budget)
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
        if self.aggregator == "llm":
            t = time.perf_counter()
            text, ok = self._answer(aggregate_messages(question, body), ledger, "aggregate", raw=True)
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
            if room > 0 and s.prompt_cap > 0:
                evidence_text, evidence_parts, _ = self.fast_context(
                    scope, question, int(room / s.prompt_cap), ranked, s)
            parts += evidence_parts
            body = deep_context(body, evidence_text)
            stages["evidence"] = _ms(t)
            t = time.perf_counter()
            text, ok = self._answer(answer_messages(question, body, style), ledger, "aggregate")
            stages["aggregate"] = _ms(t)
        if not ok:
            notes.append(f"aggregation failed ({text}); the fast path answered")
            return None, receipts
        return (text, tuple(parts), count_tokens(body)), receipts

    def _finish(self, question: str, scope: str, mode: str, path: Path, text: str,
                evidence: Evidence, parts: Sequence[ContextPart], context_tokens: int,
                ledger: Ledger, stages: dict[str, float], t0: float,
                decision: RouterDecision | None, tau: float, blocks: tuple[BlockReceipt, ...],
                degraded: bool, notes: list[str]) -> Answer:
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
            blocks=blocks, degraded=degraded, notes=tuple(notes),
        )
        return Answer(text=text, receipt=receipt, evidence=evidence.items)


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


def _top(evidence: Evidence, k: int) -> Evidence:
    """The first ``k`` hits of a ranking, with their items, as an Evidence of its own."""
    hits = tuple(h for h in evidence.hits if h.rank < k)
    keep = {h.seq for h in hits}
    return Evidence(evidence.query, evidence.scope, hits,
                    tuple(it for it in evidence.items if it.seq in keep), evidence.timings_ms)


def _ms(t0: float) -> float:
    return (time.perf_counter() - t0) * 1e3
