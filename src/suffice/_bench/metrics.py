"""Answer-quality metrics, scored the way the LoCoMo benchmark scores them.

Numbers are only comparable with published LoCoMo results if the scoring rules match, so
these follow its conventions: the answer is lower-cased; commas and punctuation are dropped;
the words a, an, the and "and" are removed; words are Porter-stemmed (NLTK's stemmer, the one
the reference scorer uses); then token-level F1. Per question category:

* 1 (multi-hop, list answers): the gold is split on commas; each gold part takes its best F1
  against the comma-split parts of the prediction; the score is the mean over gold parts.
* 2 (temporal), 4 (single-hop): plain token F1.
* 3 (open-domain): the gold is cut at its first ';' (the rest is a rationale), then token F1.
* 5 (adversarial): 1 when the prediction says the fact is not in the memory, else 0.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Callable
from functools import lru_cache

from .._errors import MissingExtraError

_DROP_WORDS = re.compile(r"\b(a|an|the|and)\b")
_PUNCT = str.maketrans("", "", string.punctuation)
NOT_IN_MEMORY_PHRASES = ("no information available", "not mentioned")
"""Phrases that mark an abstention in LoCoMo's adversarial category."""


@lru_cache(maxsize=1)
def _stemmer() -> Callable[[str], str]:
    try:
        from nltk.stem import PorterStemmer
    except ImportError as exc:
        raise MissingExtraError("bench", "nltk") from exc
    stem: Callable[[str], str] = PorterStemmer().stem
    return lru_cache(maxsize=65536)(stem)


def normalize_answer(text: object) -> str:
    """Lower-case; drop commas, punctuation, articles and 'and'; collapse whitespace."""
    s = str(text).replace(",", "").lower().translate(_PUNCT)
    s = _DROP_WORDS.sub(" ", s)
    return " ".join(s.split())


def answer_tokens(text: object) -> list[str]:
    """Normalised, stemmed tokens of an answer: the unit F1 counts."""
    stem = _stemmer()
    return [stem(w) for w in normalize_answer(text).split()]


def _f1(pred: list[str], ref: list[str]) -> float:
    """Harmonic mean of token precision and recall (multiset overlap); 0 when nothing overlaps."""
    same = sum((Counter(pred) & Counter(ref)).values())
    if same == 0:
        return 0.0
    precision = same / len(pred)
    recall = same / len(ref)
    return 2 * precision * recall / (precision + recall)


def token_f1(prediction: object, gold: object) -> float:
    """Harmonic mean of token precision and recall (multiset overlap); 0 when nothing overlaps."""
    return _f1(answer_tokens(prediction), answer_tokens(gold))


def novel_f1(prediction: object, gold: object, question: object) -> float | None:
    """Token F1 over the words the question does not already hold; None when the gold answer
    holds none (nothing is left to score).

    Agent questions are long and carry much of their own answer ("what did the agent do
    between step 45 and step 47 while ..."), so a reader that restates the question earns
    plain F1 whatever its memory held. Dropping the question's words from both sides leaves
    what the answer had to bring from memory: steps, values, objects.
    """
    asked = set(answer_tokens(question))
    ref = [t for t in answer_tokens(gold) if t not in asked]
    if not ref:
        return None
    return _f1([t for t in answer_tokens(prediction) if t not in asked], ref)


def multi_answer_f1(prediction: object, gold: object) -> float:
    """Mean over comma-separated gold parts of the best F1 against any predicted part."""
    preds = [p.strip() for p in str(prediction).split(",")]
    golds = [g.strip() for g in str(gold).split(",")]
    return sum(max(token_f1(p, g) for p in preds) for g in golds) / len(golds)


def exact_match(prediction: object, gold: object) -> float:
    """1.0 when both answers normalise and stem to the same token sequence, else 0.0."""
    return 1.0 if answer_tokens(prediction) == answer_tokens(gold) else 0.0


def says_not_in_memory(prediction: object) -> bool:
    """Whether a prediction abstains with one of LoCoMo's recognised phrases."""
    low = str(prediction).lower()
    return any(phrase in low for phrase in NOT_IN_MEMORY_PHRASES)


def score_locomo(prediction: str, gold: object, category: int) -> float:
    """The LoCoMo score of one prediction in [0, 1], by question category (1-5).

    ``gold`` may be a number (some LoCoMo answers are years); it is compared as text.
    """
    if category == 1:
        return multi_answer_f1(prediction, gold)
    if category in (2, 4):
        return token_f1(prediction, gold)
    if category == 3:
        return token_f1(prediction, str(gold).split(";")[0].strip())
    if category == 5:
        return 1.0 if says_not_in_memory(prediction) else 0.0
    raise ValueError(f"LoCoMo question categories are 1-5, got {category!r}")


__all__ = [
    "NOT_IN_MEMORY_PHRASES",
    "answer_tokens",
    "exact_match",
    "multi_answer_f1",
    "novel_f1",
    "normalize_answer",
    "says_not_in_memory",
    "score_locomo",
    "token_f1",
]


def answer_recall(text: object, gold: object) -> float:
    """Share of the gold answer's (normalised, stemmed) words that ``text`` holds: how much of
    the answer a context carries, with no reader involved."""
    g = answer_tokens(gold)
    if not g:
        return 0.0
    have = set(answer_tokens(text))
    return sum(t in have for t in g) / len(g)
