"""One typed settings object; every knob of the three designs is a named field.

Defaults follow the papers (or our engineering reading of them) for chat histories; see
``Settings.for_agent`` for agent trajectories.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any, Literal

from .errors import ConfigError
from .types import RenderMode

FusionMethod = Literal["rrf", "weighted"]


@dataclass(frozen=True, slots=True)
class Settings:
    # --- views -------------------------------------------------------------------------
    unit_tokens: int = 2000
    """U: a unit packs consecutive items of one session to about this many o200k tokens."""
    piece_max_tokens: int = 64
    """Items longer than this are split into sentence pieces so BM25 can point inside them."""
    block_tokens: int = 512
    """Size of a deep-path block: a 0.5B CPU reader takes ~4 s per 512-token block."""
    block_stride: int = 256
    """Stride between blocks; half the size so every item lies in one or two blocks."""

    # --- retrieval prefix ------------------------------------------------------------------
    prefix_k: int = 10
    """Hits the shared prefix returns by default (Router-Mem proposes K = 10)."""
    candidate_k: int = 100
    """How deep each retriever ranks before fusion."""
    fusion: FusionMethod = "rrf"
    """Reciprocal-rank fusion is robust to the two scorers' different scales."""
    rrf_k: int = 60
    """The usual RRF constant; damps the weight of the very top ranks."""
    bm25_weight: float = 0.5
    """For ``fusion='weighted'``: w in w*BM25_minmax + (1-w)*cosine (A-Mem's hybrid)."""
    index_header: bool = True
    """Index speaker and date with each piece; measured to add 2-3 points on LoCoMo."""

    # --- render (FlexA-Mem) ----------------------------------------------------------------
    prompt_cap: float = 0.95
    """The rendered context may use at most this share of the budget B."""
    timeline_share: float = 0.3
    """rho: share of the memory budget given to the timeline of records (0.5 for agents)."""
    link_discount: float = 0.5
    """lambda: priority passed along a link per hop (0.9 for agents)."""
    seeds: int = 10
    """k: top units by cosine to the query that seed the priorities."""
    links_per_unit: int = 3
    """m: most similar earlier units linked once at write time."""
    excerpt_tokens: int = 300
    """E: size of an excerpt centred on a unit's best BM25 piece."""
    recent_share: float = 0.0
    """Share of B kept for the newest items verbatim (0.25 in agent mode)."""
    render_mode: RenderMode = "piece"
    """Detail by whole units/excerpts, verbatim pieces, both in turn, or the timeline alone."""
    record_tokens: int = 40
    """A record (one timeline line) is cut to this many o200k tokens so the timeline stays compact."""
    link_hops: int = 1
    """H: how many links priority travels from a seed; one hop keeps the spread local."""
    raw_first: bool = False
    """Unit recovery: each unit's excerpt first, whole units after (on: whole unit if it fits)."""
    excerpts: bool = True
    """Unit recovery may show an excerpt when the raw unit does not fit (off only for ablations)."""
    piece_whole_item_tokens: int = 128
    """Piece recovery shows a hit's whole item up to this size: a piece of a short turn reads badly."""
    piece_unit_boost: float = 1.0
    """Piece order adds this times the unit's priority, in units of a top RRF rank."""
    dense_scan_items: int = 20000
    """Render scores item vectors one by one up to this many items; above, only in the best units."""
    short_headers: bool = True
    """Over recovered detail, a record shows only when and who: the detail says what verbatim."""
    repeat_time: bool = False
    """Item lines repeat their time even under a record header that already states it."""
    seed_hit_weight: float = 0.5
    """Seed score = (1-w)*unit cosine + w*prefix-hit mass of the unit; 0 is the paper's cosine only."""

    # --- engine (Router-Mem) ---------------------------------------------------------------
    tau: float = 0.5
    """Router threshold: answer from the prefix when the sufficiency score reaches it."""
    anchor_blocks: int = 2
    """A: blocks with the most hit mass that anchor the deep path."""
    max_blocks: int = 4
    """N_max: anchors plus temporal neighbours are capped at this count."""
    concurrency: int = 4
    """Deep-path memory agents run at most this many at once."""
    notes_share: float = 0.5
    """Share of the deep reader's context given to the agents' notes; the fast path's context
    fills the rest."""
    resolve_dates: bool = True
    """Deep path: quoted turns also state their relative time phrases ("last Tuesday")
    against the turn's own date, by rule (no model call)."""
    reader_budget: int = 1000
    """Token budget of the reader's context; LoCoMo evidence fits in ~1k, and a small CPU
    model reads ~130 tokens/s, so every 1k tokens costs about 8 s."""

    def __post_init__(self) -> None:
        for name in ("unit_tokens", "piece_max_tokens", "block_tokens", "block_stride",
                     "prefix_k", "candidate_k", "rrf_k", "seeds", "excerpt_tokens",
                     "max_blocks", "concurrency", "record_tokens", "dense_scan_items",
                     "piece_whole_item_tokens"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"setting {name} must be positive, got {getattr(self, name)!r}")
        if not 1 <= self.anchor_blocks <= self.max_blocks:
            raise ConfigError("anchor_blocks must lie in [1, max_blocks] so the deep path has an anchor")
        if self.block_stride > self.block_tokens:
            raise ConfigError("block_stride must not exceed block_tokens (blocks would leave gaps)")
        for name in ("prompt_cap", "timeline_share", "link_discount", "tau", "bm25_weight",
                     "recent_share", "seed_hit_weight", "notes_share"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ConfigError(f"setting {name} must lie in [0, 1], got {value!r}")
        if self.links_per_unit < 0 or self.link_hops < 0:
            raise ConfigError("links_per_unit and link_hops must not be negative")
        if self.render_mode not in ("unit", "piece", "unit+piece", "timeline"):
            raise ConfigError(f"render_mode must be unit, piece, unit+piece or timeline, "
                              f"got {self.render_mode!r}")
        if self.fusion not in ("rrf", "weighted"):
            raise ConfigError(f"fusion must be 'rrf' or 'weighted', got {self.fusion!r}")

    @classmethod
    def for_agent(cls, **overrides: Any) -> Settings:
        """Defaults for agent trajectories: smaller units, more timeline, stronger links."""
        base = cls(unit_tokens=1000, timeline_share=0.5, link_discount=0.9, recent_share=0.25,
                   render_mode="unit")
        return base.replace(**overrides)

    def replace(self, **overrides: Any) -> Settings:
        names = {f.name for f in fields(self)}
        unknown = sorted(set(overrides) - names)
        if unknown:
            raise ConfigError(f"unknown setting(s): {', '.join(unknown)}")
        return replace(self, **overrides)
