"""The tiered pipeline as the deep path's memory agent: chunks from the prefix, tiers per question."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .._llm.base import Ledger
from .._retrieve import Ranking
from .._store.base import Store
from .._types import Item
from .chunks import Chunk, build_chunks
from .modules import Tier
from .run import PipelineResult, TieredPipeline, TierSettings, TierSource

__all__ = ["TieredAgent", "chunks_for"]


def chunks_for(ranking: Ranking, store: Store, scope: str, settings: TierSettings) -> list[Chunk]:
    """The chunks the pipeline reads for a query's ranking (its filter honoured)."""
    flt = ranking.filter if ranking.filter is not None and not ranking.filter.empty else None

    def fetch(seqs: Sequence[int]) -> dict[int, Item]:
        got = store.items(scope, list(seqs))
        return {it.seq: it for it in got if flt is None or flt.matches(it)}

    index = ranking.index
    return build_chunks(ranking.seqs, fetch, index.vectors_of if index is not None else None,
                        limit=settings.chunks, window=settings.window)


@dataclass(frozen=True, slots=True)
class TieredAgent:
    """Reads a question's prefix ranking through ``pipeline`` at the tiers ``source`` picks,
    never above ``cap``."""

    pipeline: TieredPipeline
    source: TierSource
    cap: Tier | None = None

    def read(self, question: str, ranking: Ranking, store: Store, scope: str, *,
             budget: int | None = None, ledger: Ledger | None = None,
             deadline: float | None = None) -> PipelineResult:
        chunks = chunks_for(ranking, store, scope, self.pipeline.settings)
        # A source that sets reads_vectors False (fixed tiers, the heuristic) is never handed
        # the facts' embedding; one that does not say is taken to read it.
        return self.pipeline.run(question, chunks, self.source.chooser(question), qvec=ranking.qvec,
                                 cap=self.cap, budget=budget, ledger=ledger, deadline=deadline,
                                 vectors=getattr(self.source, "reads_vectors", True))
