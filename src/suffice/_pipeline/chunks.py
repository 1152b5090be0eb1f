"""The material the tier modules read: a few consecutive turns around each retrieved hit.

BudgetMem packs turns into chunks of a few hundred tokens before any query; suffice stores turns
once and never precomputes, so a chunk is cut per query instead: each of the prefix's best hits
with its neighbours from the same session, overlapping windows merged, best hit first.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import date

import numpy as np

from .._times import said_day
from .._types import Item

__all__ = ["Chunk", "build_chunks"]


@dataclass(frozen=True, slots=True)
class Chunk:
    """Consecutive items of one session, verbatim; ``vector`` is the mean of their stored
    vectors (unit length), or None when the memory has no embedder."""

    items: tuple[Item, ...]
    vector: np.ndarray | None = field(default=None, compare=False, repr=False)

    @property
    def seqs(self) -> tuple[int, ...]:
        return tuple(it.seq for it in self.items)

    @property
    def day(self) -> date | None:
        return said_day(self.items[0].observed_at, self.items[0].observed_ts) if self.items else None

    def text(self) -> str:
        return "\n".join(it.render() for it in self.items)

    def key(self) -> str:
        """What identifies the chunk's content in a cache key: a digest of each item's scope,
        id, place and text as shown, so two scopes' items (client ids are unique only within a
        scope) or an item renumbered by a forget never share a cached module output."""
        h = hashlib.sha256()
        for it in self.items:
            h.update("\x1f".join((it.scope, it.id, str(it.seq), it.render(), "\x1e")).encode())
        return h.hexdigest()


def build_chunks(ranked: Sequence[int], fetch: Callable[[Sequence[int]], dict[int, Item]],
                 vectors: Callable[[Sequence[int]], np.ndarray] | None, *, limit: int = 10,
                 window: int = 1) -> list[Chunk]:
    """Up to ``limit`` chunks from the seqs of ``ranked`` (best first): each hit with
    ``window`` turns either side from its own session; a hit inside an earlier chunk adds none.
    """
    want: list[int] = []
    for q in ranked[: limit * 3]:
        want.extend(range(max(q - window, 0), q + window + 1))
    items = fetch(sorted(set(want)))
    taken: set[int] = set()
    spans: list[list[int]] = []
    for q in ranked:
        if len(spans) >= limit:
            break
        if q in taken or q not in items:
            continue
        session = items[q].session
        span = [s for s in range(q - window, q + window + 1)
                if s in items and items[s].session == session and s not in taken]
        taken.update(span)
        spans.append(span)
    out = []
    for span in spans:
        its = tuple(items[s] for s in span)
        vec = None
        if vectors is not None:
            mat = vectors(span)
            if mat.size and np.any(mat):
                m = mat.mean(axis=0)
                n = float(np.linalg.norm(m))
                vec = (m / n).astype(np.float32) if n > 0 else None
        out.append(Chunk(its, vec))
    return out
