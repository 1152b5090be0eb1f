"""Training pairs for the retriever: a question, the items that answer it, and near misses.

Positives are the gold evidence items of an annotated question; hard negatives are items the
current prefix ranks high for that question but that are not evidence. Neighbours of a gold item
(one turn either side) are never used as negatives: in conversations they often restate or
complete the evidence, and teaching the encoder that they are unrelated would teach it noise.

Every pair names its ``group`` (the conversation or episode it comes from), so that splits are
made by group and a model is never judged on a conversation it was trained on.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from .._api import Memory
from .._datasets.locomo import LocomoConversation
from .._errors import InvalidInputError
from .._text import embedding_text


@dataclass(frozen=True, slots=True)
class Pair:
    group: str
    """Conversation or episode: the unit of every split."""
    query: str
    positives: tuple[str, ...]
    """Texts as the encoder sees them (``speaker: text``)."""
    negatives: tuple[str, ...]
    category: int = 0


def locomo_pairs(mem: Memory, convs: Sequence[LocomoConversation], *, hard: int = 4, depth: int = 30,
                 categories: Iterable[int] = (1, 2, 3, 4), seed: int = 0,
                 progress: Callable[[int], None] | None = None) -> list[Pair]:
    """Pairs from LoCoMo's evidence annotations; ``mem`` holds the conversations (one scope each)
    and ranks them with its fused prefix, whose top ``depth`` non-evidence items give ``hard``
    negatives per question."""
    rnd = random.Random(seed)
    cats = set(categories)
    out: list[Pair] = []
    for conv in convs:
        items = mem.items(scope=conv.scope, limit=None)
        texts = [embedding_text(it.speaker, it.text) for it in items]
        by_dia = {str(it.meta.get("dia_id")): it.seq for it in items}
        for q in conv.questions:
            gold = sorted({by_dia[d] for d in q.evidence if d in by_dia})
            if q.category not in cats or not gold:
                continue
            near = {s + d for s in gold for d in (-1, 0, 1)}
            ranked = mem.retriever.rank(conv.scope, q.question, mem.retrieval, depth=depth).seqs
            pool = [s for s in ranked[:depth] if s not in near]
            negs = rnd.sample(pool, min(hard, len(pool)))
            out.append(Pair(conv.scope, q.question, tuple(texts[s] for s in gold),
                            tuple(texts[s] for s in negs), q.category))
            if progress is not None:
                progress(1)
    return out


def folds(groups: Sequence[str], k: int) -> list[list[str]]:
    """``groups`` dealt into ``k`` folds in their given order (round robin), so a fold's held-out
    conversations are fixed by the data, not by a random seed."""
    if not 2 <= k <= len(groups):
        raise InvalidInputError(f"folds must be between 2 and the number of groups ({len(groups)}), got {k}")
    out: list[list[str]] = [[] for _ in range(k)]
    for i, g in enumerate(groups):
        out[i % k].append(g)
    return out
