"""Training pairs for the retriever: a question, the items that answer it, and near misses.

Every dataset with evidence annotations gives ``Question`` records: the history (scope) a
question is asked of, and its gold evidence as seqs of that history. LoCoMo names dialogue turns,
BEAM message ids, HotpotQA supporting sentences, AMA-Bench the steps its questions cite (each
step is two items, the agent's action and the environment's reply: either one shows the step).

``mine`` turns questions into pairs. Positives are the gold items; hard negatives are items the
current prefix ranks high for that question but that are not evidence. Neighbours of a gold item
(one item either side) are never used as negatives: in conversations they often restate or
complete the evidence, and in agent runs they are the other half of the same step.

Every question and pair names its ``group`` (the conversation, episode or HotpotQA item it comes
from), so that splits are made by group and a model is never judged on a history it was trained on.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from .._api import Memory
from .._datasets.ama import AmaEpisode
from .._datasets.beam import BeamConversation
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
    category: int | str = 0


@dataclass(frozen=True, slots=True)
class Question:
    """One evidence-annotated question of one history."""

    group: str
    scope: str
    query: str
    gold: tuple[tuple[int, ...], ...]
    """Evidence, one tuple per piece of evidence: it is present when any of its seqs is."""
    category: int | str = 0
    index: int = 0
    """The question's position in its history's list (to join results across runs)."""
    answer: str = ""
    """The reference answer, where the dataset gives one."""

    @property
    def seqs(self) -> tuple[int, ...]:
        return tuple(sorted({s for g in self.gold for s in g}))


def locomo_questions(mem: Memory, convs: Sequence[LocomoConversation],
                     categories: Iterable[int] = (1, 2, 3, 4)) -> list[Question]:
    """LoCoMo questions of ``categories`` with evidence; each cited turn is one piece."""
    cats = set(categories)
    out = []
    for conv in convs:
        by_dia = {str(it.meta.get("dia_id")): it.seq for it in mem.items(scope=conv.scope, limit=None)}
        for qi, q in enumerate(conv.questions):
            gold = sorted({by_dia[d] for d in q.evidence if d in by_dia})
            if q.category in cats and gold:
                out.append(Question(conv.scope, conv.scope, q.question, tuple((s,) for s in gold),
                                    q.category, qi, q.answer))
    return out


def beam_questions(mem: Memory, convs: Sequence[BeamConversation]) -> list[Question]:
    """BEAM probing questions with source messages (abstention questions have none)."""
    out = []
    for conv in convs:
        by_id = {str(it.meta.get("chat_id")): it.seq for it in mem.items(scope=conv.scope, limit=None)}
        for qi, q in enumerate(conv.questions):
            gold = sorted({by_id[c] for c in q.evidence if c in by_id})
            if gold:
                out.append(Question(conv.scope, conv.scope, q.question, tuple((s,) for s in gold),
                                    q.ability, qi, q.answer))
    return out


def ama_questions(mem: Memory, episodes: Sequence[AmaEpisode]) -> list[Question]:
    """AMA-Bench questions that cite steps; each cited step is one piece (action or reply)."""
    out = []
    for ep in episodes:
        by_step: dict[int, list[int]] = {}
        for it in mem.items(scope=ep.scope, limit=None):
            by_step.setdefault(int(it.meta["step"]), []).append(it.seq)
        for qi, q in enumerate(ep.questions):
            gold = tuple(tuple(by_step[s]) for s in sorted(q.steps) if s in by_step)
            if gold:
                out.append(Question(ep.scope, ep.scope, q.question, gold, q.type, qi, q.answer))
    return out


def hotpot_questions(mem: Memory, entries: Sequence[dict[str, Any]],
                     prefix: str = "hotpot") -> list[Question]:
    """HotpotQA items, each its own history ``{prefix}-{n}`` of sentences (``meta``: title and
    sentence index); each supporting sentence is one piece."""
    out = []
    for n, entry in enumerate(entries):
        scope = f"{prefix}-{n}"
        key = {(it.meta["title"], it.meta["sent"]): it.seq for it in mem.items(scope=scope, limit=None)}
        gold = sorted({key[(t, int(i))] for t, i in entry["supporting_facts"] if (t, int(i)) in key})
        if gold:
            out.append(Question(scope, scope, entry["question"], tuple((s,) for s in gold),
                                str(entry.get("type", "")), n, str(entry.get("answer", ""))))
    return out


def mine(mem: Memory, questions: Sequence[Question], *, hard: int = 4, depth: int = 30, seed: int = 0,
         progress: Callable[[int], None] | None = None) -> list[Pair]:
    """One pair per question; ``mem`` ranks each history with its fused prefix, whose top
    ``depth`` items that are neither gold, nor next to gold, nor worded as a gold item give
    ``hard`` negatives."""
    rnd = random.Random(seed)
    texts: dict[str, list[str]] = {}
    out: list[Pair] = []
    for q in questions:
        if q.scope not in texts:
            texts[q.scope] = [embedding_text(it.speaker, it.text)
                              for it in mem.items(scope=q.scope, limit=None)]
        t = texts[q.scope]
        gold = q.seqs
        near = {s + d for s in gold for d in (-1, 0, 1)}
        ranked = mem.retriever.rank(q.scope, q.query, mem.retrieval, depth=depth).seqs
        same = {t[s] for s in gold}  # an agent's "up" at step 5 reads as its "up" at step 9
        pool = [s for s in ranked[:depth] if s not in near and t[s] not in same]
        negs = rnd.sample(pool, min(hard, len(pool)))
        out.append(Pair(q.group, q.query, tuple(t[s] for s in gold), tuple(t[s] for s in negs), q.category))
        if progress is not None:
            progress(1)
    return out


def locomo_pairs(mem: Memory, convs: Sequence[LocomoConversation], *, hard: int = 4, depth: int = 30,
                 categories: Iterable[int] = (1, 2, 3, 4), seed: int = 0,
                 progress: Callable[[int], None] | None = None) -> list[Pair]:
    """Pairs from LoCoMo's evidence annotations; ``mem`` holds the conversations (one scope each)."""
    return mine(mem, locomo_questions(mem, convs, categories), hard=hard, depth=depth, seed=seed,
                progress=progress)


def folds(groups: Sequence[str], k: int) -> list[list[str]]:
    """``groups`` dealt into ``k`` folds in their given order (round robin), so a fold's held-out
    conversations are fixed by the data, not by a random seed."""
    if not 2 <= k <= len(groups):
        raise InvalidInputError(f"folds must be between 2 and the number of groups ({len(groups)}), got {k}")
    out: list[list[str]] = [[] for _ in range(k)]
    for i, g in enumerate(groups):
        out[i % k].append(g)
    return out
