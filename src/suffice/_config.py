"""Configuration that says what it is: one store config, three query-time configs.

* :class:`StoreConfig` shapes what is derived and saved at write time (pieces, units, records,
  links, vectors, block numbering). It is saved with the store and checked on every open: a
  store is never read with view settings other than the ones it was built with.
* :class:`RetrievalConfig`, :class:`RenderConfig` and :class:`EngineConfig` are read per
  query. A ``Memory`` holds one of each as its default; a config passed to a call replaces that
  default *wholly* for the call, in every stage it reaches.

Every knob of the three designs is a named field with its default and a one-line reason.
Values are checked when a config is built (strict types: ``"3"`` is not a number), so a bad
value is refused at the boundary with a :class:`~suffice.ConfigError` naming the field.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Literal, Self, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from ._errors import ConfigError

RenderMode = Literal["unit", "piece", "unit+piece", "timeline"]
FusionMethod = Literal["rrf", "weighted"]
FastContext = Literal["render", "prefix"]
Aggregator = Literal["reader", "llm"]
StopReader = Literal["fast", "deep"]


def _explain(name: str, exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        where = ".".join(str(x) for x in err["loc"]) or "value"
        got = f" (got {err['input']!r})" if "input" in err and err["type"] != "missing" else ""
        parts.append(f"{where}: {err['msg']}{got}")
    return f"invalid {name}: " + "; ".join(parts)


class _Config(BaseModel):
    """Frozen, strict, no unknown fields; a failed check raises ConfigError."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    def __init__(self, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as exc:
            raise ConfigError(_explain(type(self).__name__, exc)) from None

    def replace(self, **changes: Any) -> Self:
        """A copy with ``changes`` applied, checked like a new config."""
        return type(self)(**{**self.model_dump(), **changes})

    def changed(self, other: _Config) -> dict[str, tuple[Any, Any]]:
        """Fields whose values differ from ``other``'s, as (mine, other)."""
        mine, theirs = self.model_dump(), other.model_dump()
        return {k: (mine[k], theirs.get(k)) for k in mine if mine[k] != theirs.get(k)}


class StoreConfig(_Config):
    """What the store derives at write time; saved with the store and checked on open.

    Change it on an existing store with :meth:`suffice.Memory.rebuild` (CLI: ``suffice
    rebuild``), which re-derives the views from the items without re-ingesting anything.
    """

    unit_tokens: int = Field(2000, gt=0, le=10_000_000, description=(
        "U: a unit packs consecutive items of one session to about this many o200k tokens "
        "(FlexA-Mem; 1,000 suits agent steps)."))
    piece_max_tokens: int = Field(64, gt=0, le=10_000_000, description=(
        "Items longer than this are cut into sentence pieces, so BM25 can point inside them."))
    index_header: bool = Field(True, description=(
        "Index speaker and date with each piece; measured to add 2-3 points on LoCoMo."))
    block_tokens: int = Field(512, gt=0, le=10_000_000, description=(
        "Size of a deep-path block: a 0.5B CPU reader takes ~4 s per 512-token block."))
    block_stride: int = Field(256, gt=0, le=10_000_000, description=(
        "Stride between blocks; half the size, so every item lies in one or two blocks."))
    links_per_unit: int = Field(3, ge=0, le=1_000, description=(
        "m: most similar earlier units linked once, when a unit closes."))
    record_tokens: int = Field(40, gt=0, le=100_000, description=(
        "A record (one timeline line) is cut to this many tokens, so the timeline stays compact."))
    encoder: str = Field("", description=(
        "Name of the model that made the store's vectors ('' until the first vector is "
        "written); a store never mixes vectors of two encoders."))
    encoder_dim: int = Field(0, ge=0, le=100_000, description=(
        "Dimension of the store's vectors (0: none yet)."))

    @model_validator(mode="after")
    def _blocks_cover(self) -> Self:
        if self.block_stride > self.block_tokens:
            raise ValueError("block_stride must not exceed block_tokens (blocks would leave gaps)")
        return self

    @classmethod
    def for_agent(cls, **changes: Any) -> StoreConfig:
        """Agent trajectories: units of about 1,000 tokens (FlexA-Mem's agentic setting)."""
        return cls(**{"unit_tokens": 1000, **changes})

    def views_key(self) -> tuple[Any, ...]:
        """The fields that shape units and blocks: in-memory views depend on these only."""
        return (self.unit_tokens, self.block_tokens, self.block_stride)


class RetrievalConfig(_Config):
    """The shared prefix: BM25 over pieces and dense cosine over items, fused."""

    k: int = Field(10, ge=0, le=1_000_000, description=(
        "Hits a search returns, and the evidence C_f the router and the deep path read "
        "(Router-Mem proposes K = 10)."))
    candidate_k: int = Field(100, gt=0, le=1_000_000, description=(
        "How deep each ranker ranks items before fusion."))
    fusion: FusionMethod = Field("rrf", description=(
        "Reciprocal-rank fusion is robust to the two scorers' different scales; 'weighted' "
        "mixes min-max BM25 with cosine (A-Mem's hybrid)."))
    rrf_k: int = Field(60, gt=0, le=1_000_000, description=(
        "The usual RRF constant; damps the weight of the very top ranks."))
    dense_weight: float = Field(1.0, ge=0.0, le=100.0, description=(
        "Weight of the dense ranking's reciprocal ranks against BM25's 1: in the prefix when "
        "fusion='rrf', and in the render's piece scores. 1 suits the shipped encoder; with an "
        "encoder trained as in docs/benchmarks.md section 6, 3 was chosen on held-out folds."))
    bm25_weight: float = Field(0.5, ge=0.0, le=1.0, description=(
        "For fusion='weighted': w in w*BM25_minmax + (1-w)*cosine."))
    overlap_bm25: bool = Field(True, description=(
        "Run the BM25 query on a worker thread while the query is embedded (both release the "
        "GIL); off, one after the other. Which is faster depends on the cores free."))
    rerank: int = Field(30, ge=0, le=10_000, description=(
        "When a reranker is loaded, how many of the fused prefix's first items it puts in "
        "order (0: none). Each costs one cross-encoder pass."))
    dense_scan_items: int = Field(20000, gt=0, le=1_000_000_000, description=(
        "Item vectors are scored one by one up to this many items; above, only those of the "
        "units closest to the query (a fifth as many), so latency stays flat as the log grows. "
        "Used only when the HNSW index is not (faiss missing, or dense_index_items higher)."))
    dense_index_items: int = Field(20_000, gt=0, le=1_000_000_000, description=(
        "From this many vectors up (after filters) dense search asks an HNSW index and rescores "
        "its candidates exactly; below, it scores every vector. The index is faster from ~3k "
        "vectors here, but below 20k the scan takes under 2 ms while building the index takes "
        "seconds (docs/benchmarks.md section 2); set it above any scope's size for exact search."))
    dense_index_ef: int = Field(128, gt=0, le=100_000, description=(
        "HNSW search breadth (never below the depth asked): wider finds more of the exact top "
        "for more time; 128 gave recall@10 of 0.98 against the exact scan at 100k real vectors."))
    step_refs: bool = Field(True, description=(
        "A query that names steps ('at step 78', 'between step 73 and 76') gets those steps' "
        "items first, fetched by meta['step'], and a state question ('now', 'last', 'at step "
        "50') the newest matching item; no effect on items without a step."))


class RenderConfig(_Config):
    """Budgeted rendering (FlexA-Mem): timeline of records plus verbatim detail."""

    mode: RenderMode = Field("piece", description=(
        "Detail by whole units / excerpts ('unit'), verbatim pieces ('piece'), both in turn, "
        "or the timeline alone."))
    prompt_cap: float = Field(0.95, gt=0.0, le=1.0, description=(
        "The rendered context may use at most this share of the budget B (0 would render nothing)."))
    timeline_share: float = Field(0.3, ge=0.0, le=1.0, description=(
        "rho: share of the memory budget given to the timeline of records (0.5 for agents)."))
    link_discount: float = Field(0.5, ge=0.0, le=1.0, description=(
        "lambda: priority passed along a link per hop (0.9 for agents)."))
    link_hops: int = Field(1, ge=0, le=100, description=(
        "H: how many links priority travels from a seed; one hop keeps the spread local."))
    seeds: int = Field(10, gt=0, le=1_000_000, description=(
        "k: top units by seed score that start the priorities."))
    seed_hit_weight: float = Field(0.5, ge=0.0, le=1.0, description=(
        "Seed score = (1-w)*unit cosine + w*prefix-hit mass of the unit; 0 is the paper's cosine only."))
    excerpt_tokens: int = Field(300, gt=0, le=10_000_000, description=(
        "E: size of an excerpt centred on a unit's best piece."))
    recent_share: float = Field(0.25, ge=0.0, le=1.0, description=(
        "Agent mode: share of B kept for the newest items verbatim (FlexA-Mem: 0.25)."))
    steps_over_recent: bool = Field(True, description=(
        "Agent mode: when the query names steps, the recent window shrinks to leave them room "
        "(the query asked for them; the newest items it did not)."))
    raw_first: bool = Field(False, description=(
        "Unit recovery: whole unit if it fits, else excerpt (off: every unit's excerpt first, "
        "then whole units while they fit, so more units get a look)."))
    excerpts: bool = Field(True, description=(
        "Unit recovery may show an excerpt when the raw unit does not fit (off only for ablations)."))
    piece_whole_item_tokens: int = Field(128, gt=0, le=10_000_000, description=(
        "Piece recovery shows a hit's whole item up to this size: a piece of a short turn reads badly."))
    piece_unit_boost: float = Field(1.0, ge=0.0, allow_inf_nan=False, description=(
        "Piece order adds this times the unit's priority, in units of a top RRF rank."))
    candidate_pieces: int = Field(300, gt=0, le=1_000_000, description=(
        "BM25 pieces and dense items the render ranks at least; large budgets rank one per "
        "four tokens of the cap."))
    short_headers: bool = Field(True, description=(
        "Over recovered detail a record shows only when and who: the detail says what, verbatim."))
    repeat_time: bool = Field(False, description=(
        "Item lines repeat their time even under a record header that already states it."))

    @classmethod
    def for_agent(cls, **changes: Any) -> RenderConfig:
        """Agent trajectories: more timeline, stronger links, whole units (FlexA-Mem), each whole
        before any excerpt (on the agent runs of docs/benchmarks.md section 9 that put more
        evidence in context at every budget)."""
        return cls(**{"timeline_share": 0.5, "link_discount": 0.9, "mode": "unit", "raw_first": True,
                      **changes})

    def depth(self, budget: int) -> int:
        """Pieces (and dense items) a ranking must hold for a render of ``budget`` tokens."""
        return max(self.candidate_pieces, int(budget * self.prompt_cap) // 4)


class EngineConfig(_Config):
    """Progressive execution (Router-Mem): prefix, router, and the deep path's blocks and agents."""

    timeout_s: float | None = Field(None, gt=0.0, le=86_400.0, description=(
        "One deadline for the whole query, every model call included (a reply still streaming "
        "in too); when it passes the engine answers from what it has and the receipt says so. "
        "None: no deadline beyond each model's own timeouts."))
    tau: float | None = Field(None, ge=0.0, le=1.0, description=(
        "Router threshold: auto answers from the prefix when the sufficiency score reaches it. "
        "None: the router's own calibrated threshold (a trained router stores one), else 0.5."))
    reader_budget: int = Field(1000, ge=0, le=10_000_000, description=(
        "Token budget of the reader's context; LoCoMo evidence fits in ~1k, and a small CPU "
        "model reads ~130 tokens/s, so every 1k tokens costs about 8 s."))
    context: FastContext = Field("render", description=(
        "Fast path context: the budgeted render (timeline + detail) or the prefix hits in rank order."))
    context_depth: int = Field(60, gt=0, le=1_000_000, description=(
        "Prefix hits the 'prefix' context may take; 60 short turns fill a 1k budget."))
    answer_max_tokens: int = Field(48, gt=0, le=100_000, description=(
        "Longest answer the reader may write; memory answers are a phrase or a sentence."))
    request_max_tokens: int = Field(160, gt=0, le=100_000, description=(
        "Longest reply to a message that asks for help rather than a fact (the 'request' "
        "answer style: advise, plan, list, sum up). A few sentences or a short list need more "
        "than a phrase's 48 tokens, which cut such replies off mid-sentence. A model that is "
        "done earlier stops earlier, so the cap costs time only where the reply needs it."))
    anchor_blocks: int = Field(2, gt=0, le=1_000, description=(
        "A: blocks with the most hit mass that anchor the deep path."))
    max_blocks: int = Field(4, gt=0, le=1_000, description=(
        "N_max: anchors plus temporal neighbours are capped at this count."))
    concurrency: int = Field(4, gt=0, le=1_000, description=(
        "Deep-path memory agents run at most this many at once."))
    notes_share: float = Field(0.5, ge=0.0, le=1.0, description=(
        "Share of the deep reader's context given to the agents' notes; the fast context fills the rest."))
    resolve_dates: bool = Field(True, description=(
        "Deep path: quoted turns also state their relative time phrases against the turn's "
        "own time, by rule (no model call)."))
    date_room: bool = Field(True, description=(
        "Deep path, with resolve_dates: when the question asks when (or how long), the evidence "
        "is rendered small enough that every relative date in it can be stated; otherwise a "
        "context filled to the budget leaves no room and most dates go unstated."))
    state_updates: bool = Field(True, description=(
        "When the context shows a later message revising an earlier one on the question's topic "
        "(a plan moved, a value changed), the question line asks the reader for the latest "
        "value; by rule, on conversation questions only (no model call)."))
    agent_block_tokens: int = Field(1800, gt=0, le=1_000_000, description=(
        "A block is cut to this many tokens before its agent reads it (a 2k-context model's room)."))
    agent_max_tokens: int = Field(160, gt=0, le=100_000, description="Longest note a block agent may write.")
    agent_grounding: float = Field(0.7, ge=0.0, le=1.0, description=(
        "An agent's copied line is kept when this share of its own content words occurs in one "
        "block item; lower lets guesses through, higher drops paraphrased copies."))
    deep_scale: float = Field(2.0, ge=1.0, le=64.0, description=(
        "The deep reader's context is this many times reader_budget: the agents' notes, then "
        "evidence rendered to fill it, so the deep path reads what the fast path had no room "
        "for (1: the same budget)."))
    deep_agents: bool = Field(False, description=(
        "Deep path: memory agents read the blocks around the hits and the turns they cite lead "
        "the context. Off by default: with the 0.5B model as agent they cost four calls a query "
        "for +0.9 F1 over fast (docs/benchmarks.md section 5), while a stronger reader over a "
        "wider render gained +15 (section 7). Not yet measured with a stronger agent model."))
    stop_reader: StopReader = Field("deep", description=(
        "Auto mode, on an early stop: the deep model answers from the fast budget with its "
        "dates stated ('deep', the default; it needs a deep model and no tiered agent, else the "
        "fast reader answers), or the fast reader from the fast context ('fast'). A 'deep' stop "
        "gives up only the wider evidence, which is what the router judges, and costs about half "
        "a deep answer. A 'fast' stop also gives up the stronger reader, which no router sees: "
        "with the 1.5B as deep model it cost 15.6 F1 a stop on LoCoMo (docs/benchmarks.md "
        "section 7). Choose 'fast' when a stop must cost no more than the fast path."))
    aggregator: Aggregator = Field("reader", description=(
        "Deep path: the reader answers from notes + context ('reader'), or one extra call "
        "merges the notes and flags conflicts ('llm')."))

    def stop_config(self) -> EngineConfig:
        """The config a deep-model stop answers under (``stop_reader="deep"``): the deep path at
        the fast budget, without block agents. The engine and the benchmark that records this
        path both take it from here, so they cannot drift apart."""
        return self.replace(deep_scale=1.0, deep_agents=False)

    def answer_cap(self, style: str) -> int:
        """The most tokens an answer in this style may take (:attr:`request_max_tokens` for a
        request, else :attr:`answer_max_tokens`)."""
        return self.request_max_tokens if style == "request" else self.answer_max_tokens

    @model_validator(mode="after")
    def _anchors_fit(self) -> Self:
        if self.anchor_blocks > self.max_blocks:
            raise ValueError("anchor_blocks must not exceed max_blocks (the deep path needs an anchor)")
        return self


def parse_overrides(pairs: Sequence[str]) -> dict[str, Any]:
    """``KEY=VALUE`` strings as settings; a value is read as JSON (``4``, ``0.25``, ``true``)
    when it is JSON, else kept as text (``mode=unit``)."""
    out: dict[str, Any] = {}
    for entry in pairs:
        key, sep, raw = entry.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"a setting is KEY=VALUE, got {entry!r}")
        try:
            out[key.strip()] = json.loads(raw)
        except json.JSONDecodeError:
            out[key.strip()] = raw
    return out


AnyConfig = TypeVar("AnyConfig", bound=_Config)


def apply_overrides(overrides: Mapping[str, Any], *configs: AnyConfig) -> tuple[AnyConfig, ...]:
    """Each config with the overrides that name its fields; a name no config has is an error."""
    known = {name for c in configs for name in type(c).model_fields}
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise ConfigError(f"unknown setting(s): {', '.join(unknown)}")
    return tuple(c.replace(**{k: v for k, v in overrides.items() if k in type(c).model_fields})
                 for c in configs)
