"""Progressive execution: one shared prefix, then stop if the evidence suffices, else go deep.

``fast`` always answers from the prefix evidence; ``deep`` always expands to blocks read by
memory agents; ``auto`` asks a sufficiency router and stops when its score reaches tau. Every
answer carries a :class:`Receipt` that adds up: stage latencies never exceed the end-to-end
time, and the call costs sum to the total.
"""

from __future__ import annotations

import logging
import math
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

from ._config import EngineConfig, RenderConfig, RetrievalConfig
from ._deep import (
    AgentNote,
    ChosenBlock,
    LLMBlockReader,
    MemoryAgent,
    choose_blocks,
    dated_context,
    notes_text,
    run_agents,
    with_dates,
)
from ._errors import ConfigError, DeadlineError, InvalidInputError, ProviderError
from ._llm.base import LLM, CallRecord, Ledger, Message
from ._llm.parse import extract_answer
from ._pipeline import ModuleReceipt, TieredAgent
from ._prompts import Style, aggregate_messages, answer_messages, deep_context, style_for_evidence
from ._render import Renderer
from ._retrieve import Ranking, Retriever
from ._route.features import OUTSIDE, context_seqs
from ._route.sufficiency import (
    RouterDecision,
    RouterInput,
    ScoreRouter,
    SufficiencyRouter,
    over_budget,
    router_tau,
)
from ._store.base import Store
from ._timeref import asks_time
from ._tokens import count_tokens, fill_in_order, truncate
from ._types import ContextPart, Evidence, Filter, Hit, Item
from ._updates import HINT, find_revision

Mode = Literal["fast", "deep", "auto"]
Path = Literal["fast", "deep"]
_Made = tuple[int, tuple[str, tuple[ContextPart, ...]]]
"""A fast context already rendered for a query: (its budget, (text, parts))."""


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
class LeverReceipt:
    """One thing the deep path did beyond the fast path, and what it cost."""

    name: str
    """``blocks`` (memory agents read blocks), ``evidence`` (a wider context than the fast
    budget), ``model`` (a stronger model answered), ``dates`` (relative dates stated) or
    ``updates`` (the reader was asked for the latest value of a fact the evidence revises)."""
    detail: str
    latency_ms: float = 0.0
    tokens: int = 0
    cost_usd: float = 0.0


@dataclass(frozen=True, slots=True)
class Receipt:
    """How an answer was made: path, decisions, evidence, calls, tokens, cost and time."""

    question: str
    scope: str
    mode: str
    path: Path
    model: str
    """The model that wrote the answer (on the deep path, the deep model when one is set)."""
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
    """The router's score in auto mode; None when it gave none (failed, over its input budget,
    out of time, or a value outside [0, 1]: the query went deep and ``router_reason`` says why)."""
    tau: float | None = None
    router_reason: str = ""
    blocks: tuple[BlockReceipt, ...] = ()
    degraded: bool = False
    notes: tuple[str, ...] = ()
    deadline_s: float | None = None
    """The query's deadline (``EngineConfig.timeout_s``), when it had one."""
    out_of_time: tuple[str, ...] = ()
    """Stages the deadline cut short (each fell back to a cheaper path; see ``notes``)."""
    levers: tuple[LeverReceipt, ...] = ()
    """On the deep path: which levers ran (blocks, wider evidence, a stronger model, dates,
    tiers) and what each cost."""
    modules: tuple[ModuleReceipt, ...] = ()
    """With the tiered agent: each pipeline module's tier, model, tokens, time and cost."""

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



log = logging.getLogger("suffice.engine")

def _model_lever(deep: str, fast: str, ok: bool) -> str:
    """What the capacity lever did: the deep model wrote the answer, or was asked and failed."""
    if ok:
        return f"{deep} wrote the answer (fast path: {fast})"
    return f"{deep} was asked to write the answer and failed; falling back to the fast path ({fast})"

_CONTEXT_LEVERS = ("evidence", "dates")
"""Levers that shaped the deep path's context: unused when the answer fell back to the fast one
(the updates hint is not among them: the fast path sends its own)."""


def _unused(levers: tuple[LeverReceipt, ...]) -> tuple[LeverReceipt, ...]:
    """The levers of a deep attempt the fast path answered instead: those that shaped its
    context say they went unused (their time and cost were still spent)."""
    return tuple(replace(lv, detail=f"{lv.detail} (not used: fell back to the fast path)")
                 if lv.name in _CONTEXT_LEVERS else lv for lv in levers)


class Engine:
    """Answers questions over one store with one reader model, from the parts Memory composed."""

    def __init__(self, store: Store, retriever: Retriever, renderer: Renderer, llm: LLM, *,
                 router: SufficiencyRouter | None = None, agent: MemoryAgent | None = None,
                 deep_llm: LLM | None = None, tiered: TieredAgent | None = None) -> None:
        self.store = store
        self.retriever = retriever
        self.renderer = renderer
        self.llm = llm
        self.deep_llm = deep_llm
        """The model that writes the deep path's answer (capacity escalation); None: ``llm``."""
        # Without a router, auto uses the retrieval-signal router: no model call (the 0.5B LM
        # router costs ~3 s a query) and on LoCoMo it ranks no worse (docs/benchmarks.md §5).
        self.router: SufficiencyRouter = router or ScoreRouter()
        self.agent = agent
        """The deep path's memory agent; None: an LLM block reader built from the engine config."""
        self.tiered = tiered
        """When set, the deep path reads through the tiered pipeline instead of block agents."""

    # -- context for the reader ---------------------------------------------------------------

    def fast_context(self, question: str, budget: int, ranking: Ranking, evidence: Evidence,
                     config: EngineConfig, render: RenderConfig, retrieval: RetrievalConfig,
                     notes: list[str] | None = None) -> tuple[str, tuple[ContextPart, ...]]:
        """The reader's context on the fast path, within ``budget`` tokens.

        ``render``: the budgeted memory (timeline + detail) built from ``ranking``.
        ``prefix``: the hits of ``evidence`` taken in rank order while they fit, shown in time order.
        Why the context is empty, when it is (no item matches, no room), goes to ``notes``.
        """
        if config.context == "render":
            ctx = self.renderer.render(ranking.scope, question, budget, config=render, retrieval=retrieval,
                                       ranking=ranking, flt=ranking.filter)
            # The ranking's own notice, which the render repeats, is on the notes already.
            own = ctx.notice.replace(ranking.notice, "").strip("; ") if ranking.notice else ctx.notice
            if notes is not None and own and own not in notes:
                notes.append(own)
            return ctx.text, ctx.parts
        cap = int(render.prompt_cap * budget)
        ranked = [(h, count_tokens(h.item.render()) + 1) for h in evidence.hits]
        chosen = [ranked[i] for i in fill_in_order((n for _, n in ranked), cap)]
        chosen.sort(key=lambda x: x[0].seq)
        text = "\n".join(h.item.render() for h, _ in chosen)
        parts = tuple(ContextPart("raw", h.unit, (h.seq,), n, f"prefix rank {h.rank + 1}", h.score)
                      for h, n in chosen)
        if notes is not None and not text:
            notes.append("no hit of the prefix fits the context" if ranked
                         else "no item matched the query; the reader read an empty memory")
        return text, parts

    # -- the query path -----------------------------------------------------------------------

    def ask(self, question: str, *, scope: str, mode: Mode, config: EngineConfig,
            retrieval: RetrievalConfig, render: RenderConfig, flt: Filter | None = None,
            style: Style | None = None) -> Answer:
        """Answer ``question`` from ``scope`` under the given configs, each applied whole."""
        if mode not in ("fast", "deep", "auto"):
            raise InvalidInputError(f"unknown mode {mode!r}; use fast, deep or auto")
        budget = config.reader_budget
        tau = config.tau if config.tau is not None else router_tau(self.router)
        ledger = Ledger()
        stages: dict[str, float] = {}
        notes: list[str] = []
        t0 = time.perf_counter()
        clock = _Clock(config.timeout_s)

        deep_budget = deep_budget_of(config)
        ranking, ranked = self.prefix(question, scope, mode, config, retrieval, render, flt)
        evidence = ranked.top(retrieval.k)
        # The evidence says what is being read: an agent's run or a conversation.
        style = style or style_for_evidence(question, [h.item.kind for h in evidence.hits])
        stages["prefix"] = _ms(t0)
        if "rerank_ms" in ranking.timings_ms:  # run inside the prefix, shown apart for its cost
            stages["rerank"] = ranking.timings_ms["rerank_ms"]
            stages["prefix"] -= stages["rerank"]  # stages are disjoint: each is counted once
        if ranking.notice:
            notes.append(ranking.notice)
        if clock.passed():  # the retrieval itself used up the time: the receipt says where it went
            clock.ran_out("prefix")

        decision: RouterDecision | None = None
        path: Path = "fast" if mode == "fast" else "deep"
        blocks: tuple[BlockReceipt, ...] = ()
        levers: tuple[LeverReceipt, ...] = ()
        modules: tuple[ModuleReceipt, ...] = ()
        degraded = False
        fast: tuple[str, tuple[ContextPart, ...]] | None = None
        if mode == "auto":
            # The router reads what the fast reader would read, so the context is made first;
            # on an early stop it is the one answered from.
            t = time.perf_counter()
            fast = self.fast_context(question, budget, ranking, ranked, config, render, retrieval, notes)
            stages["context"] = _ms(t)
            t = time.perf_counter()
            decision = self._route(self.router_input(question, fast[0], fast[1], evidence, ranking),
                                   ledger, clock)
            stages["router"] = _ms(t)
            path = "fast" if decision.ok and decision.score >= tau else "deep"
            if not decision.ok:
                notes.append(decision.reason)
                if clock.passed():  # no time to read wider: the fast context, already made, answers
                    path = "fast"
                    notes.append("out of time after routing: answered from the fast context")
            if decision.ok:
                notes += self._router_out_of_range(budget, retrieval.k)
            if path == "fast" and config.stop_reader == "deep" and self.deep_llm is not None \
                    and self.tiered is None and not clock.passed():
                # The deep model reads the fast budget: the stop saves the wider evidence only.
                result, blocks, levers, modules = self._deep(
                    question, scope, evidence, ranking, ranked, budget, budget, style, ledger, stages,
                    notes, config.stop_config(), render, retrieval, clock, made=(budget, fast))
                if result is not None:
                    text, parts, context_tokens = result
                    return self._finish(question, scope, mode, "fast", text, evidence, parts,
                                        context_tokens, ledger, stages, t0, decision, tau,
                                        blocks, False, notes, clock, levers, modules)
                degraded = True  # _deep said why; the fast reader answers below
                levers = _unused(levers)

        if path == "deep":
            result, blocks, levers, modules = self._deep(question, scope, evidence, ranking, ranked, budget,
                                                deep_budget, style, ledger, stages, notes, config, render,
                                                retrieval, clock)
            if result is None:  # every agent failed or nothing relevant: the fast path answers
                path = "fast"  # the blocks stay on the receipt: they were read and paid for
                degraded = True
                levers = _unused(levers)
            else:
                text, parts, context_tokens = result
                # An agent that failed left its block unread: the answer stands on less.
                degraded = degraded or any(not b.ok for b in blocks)
                return self._finish(question, scope, mode, "deep", text, evidence, parts,
                                    context_tokens, ledger, stages, t0, decision, tau,
                                    blocks, degraded, notes, clock, levers, modules)

        if fast is None:
            t = time.perf_counter()
            fast = self.fast_context(question, budget, ranking, ranked, config, render, retrieval, notes)
            stages["context"] = stages.get("context", 0.0) + _ms(t)
        context, parts = fast
        t = time.perf_counter()
        hint = self._revision_hint(question, scope, parts, style, config, notes)
        text, ok = self._answer(answer_messages(question, context, style, hint=hint), ledger, "answer",
                                config.answer_cap(style), clock, notes)
        stages["answer"] = _ms(t)
        if not ok:
            degraded = True
            notes.append(f"answer call failed ({text}); " + ("returned the top prefix hit instead"
                         if evidence.hits else "no prefix hit to return, so the answer is empty"))
            text = evidence.hits[0].item.text if evidence.hits else ""
        return self._finish(question, scope, mode, "fast", text, evidence, parts,
                            count_tokens(context), ledger, stages, t0, decision, tau,
                            blocks, degraded, notes, clock, levers, modules)

    def prefix(self, question: str, scope: str, mode: Mode, config: EngineConfig, retrieval: RetrievalConfig,
               render: RenderConfig, flt: Filter | None = None) -> tuple[Ranking, Evidence]:
        """The one retrieval of a query and the hits it fetches.

        Deep enough for every context it may feed: the fast reader's (render pieces, or prefix
        hits to fill the budget) and, when the query may go deep, the deep reader's wider one.
        The router and the deep path see its top k hits, the evidence context C_f; the fused
        order is kept ``candidate_k`` deep for the router.
        """
        budget = config.reader_budget
        read_budget = budget if mode == "fast" else deep_budget_of(config)
        use_prefix = config.context == "prefix"
        scale = -(-read_budget // max(budget, 1))
        depth = max(retrieval.k, config.context_depth * scale if use_prefix else 0)
        ranking = self.retriever.rank(scope, question, retrieval, depth=max(depth, retrieval.candidate_k),
                                      flt=flt, piece_depth=0 if use_prefix else render.depth(read_budget))
        return ranking, self.retriever.evidence(ranking, depth)

    def route_input(self, question: str, *, scope: str, config: EngineConfig, retrieval: RetrievalConfig,
                    render: RenderConfig, flt: Filter | None = None) -> RouterInput:
        """What the router reads for ``question`` in auto mode, made as :meth:`ask` makes it
        (benchmarks and training score routers on exactly this)."""
        ranking, ranked = self.prefix(question, scope, "auto", config, retrieval, render, flt)
        text, parts = self.fast_context(question, config.reader_budget, ranking, ranked, config, render,
                                        retrieval)
        return self.router_input(question, text, parts, ranked.top(retrieval.k), ranking)

    def _router_out_of_range(self, budget: int, k: int) -> list[str]:
        """Notes for a trained router read under other settings than it was fit to: its
        features (the context's size, which items are top hits) then come from another range."""
        out = []
        trained_on = getattr(self.router, "trained_budget", None)
        if isinstance(trained_on, int) and trained_on != budget:
            out.append(f"the router was trained and calibrated on {trained_on}-token contexts; this one "
                       f"was made for {budget}, so its score and tau are read out of their range")
        trained_k = getattr(self.router, "trained_k", None)
        if isinstance(trained_k, int) and trained_k != k:
            out.append(f"the router was trained with the prefix's top {trained_k} hits as its top hits; "
                       f"this query has k={k}, so its score and tau are read out of their range")
        return out

    def router_input(self, question: str, text: str, parts: Sequence[ContextPart], evidence: Evidence,
                     ranking: Ranking) -> RouterInput:
        """What a router reads: the fast context as the reader would get it, its items (and the
        ranking's first items it left out), the top hits and the query's ranking."""
        seqs = sorted({q for p in parts for q in p.seqs} | set(ranking.seqs[:OUTSIDE]))
        have = {h.seq: h.item for h in evidence.hits}
        missing = [q for q in seqs if q not in have]
        if missing:
            have.update({it.seq: it for it in self.store.items(ranking.scope, missing)})
        return RouterInput(question, text, count_tokens(text), tuple(parts),
                           {q: have[q] for q in seqs if q in have}, evidence, ranking)

    def _route(self, inp: RouterInput, ledger: Ledger, clock: _Clock) -> RouterDecision:
        """The router's decision; over its input budget or on any failure, ``ok=False`` (deep)."""
        refused = over_budget(inp.tokens, self.router.input_budget)
        if refused is not None:
            return refused
        if clock.passed():
            clock.ran_out("router")
            return RouterDecision(0.0, "the query's deadline passed before the router ran", 0.0, ok=False)
        try:
            d = self.router.score(inp, ledger=ledger, deadline=clock.deadline)
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
                clock: _Clock, notes: list[str], raw: bool = False,
                llm: LLM | None = None) -> tuple[str, bool]:
        """(answer, True), or (why not, False) when the call failed or gave no answer; a reply
        cut off by ``max_tokens`` is kept, and a note says so."""
        cap = max_tokens * (3 if raw else 1)
        model = llm or self.llm
        try:
            out = model.chat(messages, max_tokens=cap, stage=stage, ledger=ledger, deadline=clock.deadline)
        except DeadlineError as exc:
            clock.ran_out(stage)
            return str(exc), False
        except ProviderError as exc:
            return str(exc), False
        except (ConfigError, TypeError):  # a setup mistake (a price file, a chat() signature): say it
            raise
        except Exception as exc:  # a caller's own model class that fails its own way: degrade too
            log.warning("model %s failed at %s", model.model, stage, exc_info=True)
            return f"{type(exc).__name__}: {exc}", False
        if out.finish_reason == "length":
            notes.append(f"the {stage} reply of {model.model} reached its {cap}-token cap and may "
                         "be cut off")
        text = out.text if raw else extract_answer(out.text).strip()
        if not text.strip():
            return f"{model.model} gave an empty answer", False
        return text, True

    def _deep(self, question: str, scope: str, evidence: Evidence, ranking: Ranking, ranked: Evidence,
              budget: int, deep_budget: int, style: Style, ledger: Ledger, stages: dict[str, float],
              notes: list[str], s: EngineConfig, render: RenderConfig, retrieval: RetrievalConfig,
              clock: _Clock, made: _Made | None = None
              ) -> tuple[tuple[str, tuple[ContextPart, ...], int] | None,
                                      tuple[BlockReceipt, ...], tuple[LeverReceipt, ...],
                                      tuple[ModuleReceipt, ...]]:
        """(answer, parts, context tokens) or None when the deep path cannot answer; the
        receipts of the blocks it read, and of the levers it pulled, either way.

        The levers: block agents read the blocks around the hits (``deep_agents``); the reader
        gets ``deep_budget`` tokens, more than the fast path had (``evidence``); quoted and
        retrieved turns state their relative dates (``resolve_dates``); and the deep model, when
        the engine has one, writes the answer (``model``). With the tiered agent, its pipeline
        replaces all but the last (``tiers``). ``made``: a fast context already rendered for this
        query, with its budget, reused when the evidence asks for that same budget.
        """
        if self.tiered is not None:
            # The summary is the reader's memory: capped as every rendered context is, so the
            # question and instructions keep their room.
            capped = int(render.prompt_cap * deep_budget)
            return self._deep_tiered(self.tiered, question, scope, ranking, capped, style, ledger,
                                     stages, notes, s, clock)
        levers: list[LeverReceipt] = []
        reader = self.deep_llm or self.llm
        wider = deep_budget > budget
        agent_notes: list[AgentNote] = []
        chosen: list[ChosenBlock] = []
        pool: dict[int, Item] = {}
        if s.deep_agents:
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
            calls = [c for n in agent_notes for c in n.calls]
            levers.append(LeverReceipt(
                "blocks", f"{len(chosen)} block(s) read by memory agents, "
                f"{sum(n.relevant for n in agent_notes)} with relevant turns", stages["agents"],
                sum(c.input_tokens + c.output_tokens for c in calls), math.fsum(c.cost_usd for c in calls)))
        dated = 0
        if s.resolve_dates and agent_notes:
            t = time.perf_counter()
            agent_notes, dated = with_dates(agent_notes, pool)
            stages["dates"] = _ms(t)
        relevant = [n for n in agent_notes if n.relevant]
        if s.deep_agents and not relevant:
            if not wider:
                notes.append("no block agent returned relevant notes; falling back to the fast path")
                return None, _block_receipts(chosen, agent_notes, {}), tuple(levers), ()
            notes.append("no block agent returned relevant notes; the wider evidence answered")
        cap = int(render.prompt_cap * deep_budget)
        # The notes' heading (deep_context's) comes out of their share, so notes that fill it
        # still leave the whole context within the cap.
        head_cost = count_tokens(deep_context("x", "")) - 1
        body, kept = (notes_text(agent_notes, max(int(cap * s.notes_share) - head_cost, 0))
                      if relevant else ("", {}))
        used = {b: count_tokens("\n".join(lines)) for b, lines in kept.items()}
        receipts = _block_receipts(chosen, agent_notes, used)
        if relevant and not body and not wider:
            notes.append("no agent note fits the budget; falling back to the fast path")
            return None, receipts, tuple(levers), ()
        parts: list[ContextPart] = [
            ContextPart("notice", None, _quoted(n, set(kept[n.block])), used[n.block],
                        f"notes of block {n.block}")
            for n in relevant if n.block in kept]
        if s.aggregator == "llm" and body:
            t = time.perf_counter()
            text, ok = self._answer(aggregate_messages(question, body), ledger, "aggregate",
                                    s.answer_max_tokens, clock, notes, raw=True, llm=reader)
            stages["aggregate"] = _ms(t)
            if ok:
                text, conflicts = split_aggregate(text)
                if conflicts:
                    notes.append(f"conflicts flagged: {conflicts}")
                if not text:
                    text, ok = f"{reader.model} gave no answer after its conflicts", False
        else:
            # The reader merges: notes first (oldest first, later ones win), then as much
            # retrieved evidence as still fits the deep budget.
            t = time.perf_counter()
            room = cap - (count_tokens(body) + 40 if body else 0)
            evidence_text: str = ""
            evidence_parts: tuple[ContextPart, ...] = ()
            dates_ms = 0.0
            if room > 0 and render.prompt_cap > 0:
                evidence_text, evidence_parts = self._evidence(question, room, ranking, ranked, s, render,
                                                               retrieval, made)
                if s.resolve_dates:
                    td = time.perf_counter()
                    annotated = None
                    if s.date_room and asks_time(question):
                        evidence_text, evidence_parts, annotated = self._room_for_dates(
                            question, room, evidence_text, evidence_parts, ranking, ranked, s, render,
                            retrieval)
                    evidence_text, more = annotated or dated_context(evidence_text, evidence_parts, ranked,
                                                                     self.store, scope, room)
                    dated += more
                    dates_ms = _ms(td)
                    stages["dates"] = stages.get("dates", 0.0) + dates_ms
            parts += evidence_parts
            body = deep_context(body, evidence_text) if body else evidence_text
            if count_tokens(body) > cap:  # the headings' allowance is an estimate: the cap is not
                body = truncate(body, cap)
            stages["evidence"] = _ms(t) - dates_ms  # the date step is its own stage
            if wider:
                levers.append(LeverReceipt(
                    "evidence", f"{count_tokens(body)}-token context (deep budget {deep_budget}, "
                    f"fast budget {budget})", stages["evidence"]))
            t = time.perf_counter()
            hint = self._revision_hint(question, scope, parts, style, s, notes)
            if hint:
                levers.append(LeverReceipt("updates", notes[-1], _ms(t)))
            text, ok = self._answer(answer_messages(question, body, style, hint=hint), ledger, "aggregate",
                                    s.answer_cap(style), clock, notes, llm=reader)
            stages["aggregate"] = _ms(t)
        if dated:
            notes.append(f"relative dates stated in {dated} turn(s)")
            levers.append(LeverReceipt("dates", f"relative dates stated in {dated} turn(s), by rule",
                                       stages.get("dates", 0.0)))
        if reader is not self.llm:
            answer_calls = [c for c in ledger.records if c.stage == "aggregate"]
            levers.append(LeverReceipt(
                "model", _model_lever(reader.model, self.llm.model, ok),
                stages.get("aggregate", 0.0), sum(c.input_tokens + c.output_tokens for c in answer_calls),
                math.fsum(c.cost_usd for c in answer_calls)))
        if not ok:
            notes.append(f"aggregation failed ({text}); falling back to the fast path")
            return None, receipts, tuple(levers), ()
        return (text, tuple(parts), count_tokens(body)), receipts, tuple(levers), ()

    def _revision_hint(self, question: str, scope: str, parts: Sequence[ContextPart], style: Style,
                       config: EngineConfig, notes: list[str]) -> str:
        """:data:`~suffice._updates.HINT` when the context's messages hold a revision of the
        question's topic (and a note saying which), else ''. Conversation questions only: the
        dated style answers "as of" a date, a request is told to point out conflicts."""
        if not config.state_updates or style != "conversation":
            return ""
        seqs = context_seqs(parts)
        found = find_revision(question, self.store.items(scope, seqs)) if seqs else None
        if found is None:
            return ""
        notes.append(f"asked for the latest value: {found.describe()}")
        return HINT

    def _deep_tiered(self, agent: TieredAgent, question: str, scope: str, ranking: Ranking,
                     deep_budget: int, style: Style, ledger: Ledger, stages: dict[str, float],
                     notes: list[str], s: EngineConfig, clock: _Clock
                     ) -> tuple[tuple[str, tuple[ContextPart, ...], int] | None,
                                tuple[BlockReceipt, ...], tuple[LeverReceipt, ...],
                                tuple[ModuleReceipt, ...]]:
        """The deep path through the tiered pipeline: its summary is what the reader reads."""
        reader = self.deep_llm or self.llm
        t = time.perf_counter()
        try:
            result = agent.read(question, ranking, self.store, scope, budget=deep_budget,
                                ledger=ledger, deadline=clock.deadline)
        except Exception as exc:  # a provider, a config, or a caller's own model class
            stages["tiers"] = _ms(t)
            notes.append(f"tiered pipeline failed ({type(exc).__name__}: {exc}); "
                         "falling back to the fast path")
            return None, (), (), ()
        stages["tiers"] = _ms(t)
        for m in result.modules:
            if m.note:
                notes.append(f"{m.module}: {m.note}")
        if clock.passed() or any("DeadlineError" in (m.note or "") for m in result.modules):
            clock.ran_out("tiers")
        tiers = " ".join(f"{m.module}={m.tier}" for m in result.modules)
        levers = [LeverReceipt(
            "tiers", f"{agent.source.name}: {tiers}", stages["tiers"],
            sum(m.input_tokens + m.output_tokens for m in result.modules), result.cost_usd)]
        if not result.text.strip():
            notes.append("the tiered pipeline found nothing to read; falling back to the fast path")
            return None, (), tuple(levers), result.modules
        seqs = tuple(q for i in result.kept for q in result.chunks[i].seqs)
        parts = (ContextPart("notice", None, seqs, count_tokens(result.text), "tiered summary"),)
        t = time.perf_counter()
        text, ok = self._answer(answer_messages(question, result.text, style), ledger, "aggregate",
                                s.answer_cap(style), clock, notes, llm=reader)
        stages["aggregate"] = _ms(t)
        if reader is not self.llm:
            calls = [c for c in ledger.records if c.stage == "aggregate"]
            levers.append(LeverReceipt(
                "model", _model_lever(reader.model, self.llm.model, ok),
                stages["aggregate"], sum(c.input_tokens + c.output_tokens for c in calls),
                math.fsum(c.cost_usd for c in calls)))
        if not ok:
            notes.append(f"aggregation failed ({text}); falling back to the fast path")
            return None, (), tuple(levers), result.modules
        return (text, parts, count_tokens(result.text)), (), tuple(levers), result.modules

    def _evidence(self, question: str, room: int, ranking: Ranking, ranked: Evidence, s: EngineConfig,
                  render: RenderConfig, retrieval: RetrievalConfig, made: _Made | None = None
                  ) -> tuple[str, tuple[ContextPart, ...]]:
        """Retrieved evidence within ``room`` tokens: the fast path's kind of context, made wider.

        An early stop answered by the deep model reads the fast budget, so the context the router
        already read is ``made`` at that budget and is not rendered a second time."""
        budget = int(room / render.prompt_cap)
        if made is not None and made[0] == budget:
            return made[1]
        return self.fast_context(question, budget, ranking, ranked, s, render, retrieval)

    def _room_for_dates(self, question: str, room: int, text: str, parts: tuple[ContextPart, ...],
                        ranking: Ranking, ranked: Evidence, s: EngineConfig, render: RenderConfig,
                        retrieval: RetrievalConfig
                        ) -> tuple[str, tuple[ContextPart, ...], tuple[str, int] | None]:
        """The evidence rendered again, smaller by what its dates would take beyond ``room``.

        A render fills its budget, so the dates stated afterwards fit only in the slack it
        leaves (on LoCoMo's temporal questions, 39 of 134 dates at 1k). One re-render at the room
        minus the missing tokens; the dates of what it shows then fit, or nearly. When every
        date already fits, the dated text is returned too (third item), so the caller does not
        annotate the same text a second time."""
        if not text:
            return text, parts, None
        full = dated_context(text, parts, ranked, self.store, ranking.scope, 1 << 30)
        need = count_tokens(full[0]) - room
        if need <= 0:
            return text, parts, full
        smaller = room - need
        if smaller <= room // 2:  # dates would take over the context: keep the evidence
            return text, parts, None
        return (*self._evidence(question, smaller, ranking, ranked, s, render, retrieval), None)

    def _finish(self, question: str, scope: str, mode: str, path: Path, text: str,
                evidence: Evidence, parts: Sequence[ContextPart], context_tokens: int,
                ledger: Ledger, stages: dict[str, float], t0: float,
                decision: RouterDecision | None, tau: float, blocks: tuple[BlockReceipt, ...],
                degraded: bool, notes: list[str], clock: _Clock,
                levers: tuple[LeverReceipt, ...] = (),
                modules: tuple[ModuleReceipt, ...] = ()) -> Answer:
        if clock.missed:
            degraded = True
            notes.append(f"the query's deadline of {clock.timeout_s:g} s cut short (a call stopped at it, "
                         "or refused for lack of the time left): " + ", ".join(dict.fromkeys(clock.missed)))
        t_e2e = _ms(t0)
        # An early stop answered by the deep model (stop_reader="deep") wrote on the deep
        # path's stage though it read the fast budget.
        by_deep = path == "deep" or ("aggregate" in stages and "answer" not in stages)
        writer = ANSWER_STAGE["deep" if by_deep else path]
        t_mem = sum(v for k, v in stages.items() if k != writer)
        # The model that wrote the answer: where the deep path's step wrote it, the last call
        # that succeeded (the deep model, or the fast one it fell back to), else the reader.
        model = self.llm.model
        if by_deep:
            model = next((c.model for c in reversed(ledger.records) if c.ok), model)
        receipt = Receipt(
            question=question, scope=scope, mode=mode, path=path, model=model,
            hits=evidence.hits, context_tokens=context_tokens, parts=tuple(parts),
            calls=tuple(ledger.records), stages_ms=dict(stages), t_mem_ms=t_mem, t_e2e_ms=t_e2e,
            router=self.router.name if decision is not None else "",
            router_score=decision.score if decision is not None and decision.ok else None,
            tau=tau if decision else None, router_reason=decision.reason if decision else "",
            blocks=blocks, degraded=degraded, notes=tuple(notes), deadline_s=clock.timeout_s,
            out_of_time=tuple(dict.fromkeys(clock.missed)), levers=levers,
            modules=modules,
        )
        return Answer(text=text, receipt=receipt, evidence=evidence.items)


def deep_budget_of(config: EngineConfig) -> int:
    """The deep reader's context budget: ``deep_scale`` times the fast reader's."""
    return int(config.reader_budget * config.deep_scale)


class _Clock:
    """One query's deadline, and the stages it cut short."""

    def __init__(self, timeout_s: float | None) -> None:
        self.timeout_s = timeout_s
        self.deadline = None if timeout_s is None else time.monotonic() + timeout_s
        self.missed: list[str] = []

    def passed(self) -> bool:
        return self.deadline is not None and time.monotonic() >= self.deadline

    def ran_out(self, stage: str) -> None:
        """Note that ``stage`` was cut short by the deadline: stopped at it, or refused for
        lack of the time left. Without a deadline there is none to blame (a model of the
        caller's own may raise DeadlineError for reasons of its own): the failure stands as
        any other's."""
        if self.deadline is not None:
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
    tagged = _ANSWER_TAG.findall(body)
    if tagged:  # the last: a model may echo the format's example tag before its answer
        return tagged[-1].strip(), "; ".join(conflicts)
    remaining = [ln.strip() for ln in body.splitlines() if ln.strip()]
    return (extract_answer(remaining[-1]) if remaining else ""), "; ".join(conflicts)


def _ms(t0: float) -> float:
    return (time.perf_counter() - t0) * 1e3
