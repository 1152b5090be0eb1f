"""Plain-text helpers shared by indexing and rendering: word tokens, stopwords, sentences."""

from __future__ import annotations

import re

_WORD = re.compile(r"\w+", re.UNICODE)
# Sentence ends, or line breaks, separate pieces. Keeps the separator with the left part so
# that pieces concatenate back to the original text.
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+|\n+")

STOPWORDS = frozenset(
    """a an and are as at be but by for from had has have he her his i if in into is it its
    me my of on or our she so that the their them then there these they this to was we were
    what when where which who whom why will with would you your do does did""".split()
)
"""A short English stopword list: function words that carry no topic in a memory query."""


def words(text: str) -> list[str]:
    """Lower-cased word tokens."""
    return _WORD.findall(text.lower())


def query_terms(text: str) -> list[str]:
    """Distinct content words of a query, in order; all words if every one is a stopword."""
    toks = words(text)
    content = [t for t in toks if t not in STOPWORDS]
    chosen = content or toks
    seen: set[str] = set()
    out = []
    for t in chosen:
        if t not in seen:
            seen.add(t)
            out.append(t)
    return out


def stem(word: str) -> str:
    """A crude English stem (plural and verb endings), enough to match "ran"/"runs" no better
    than BM25's porter stemmer does, but "painting"/"paintings"/"painted" alike."""
    for suffix in ("ings", "ing", "ies", "ied", "es", "ed", "s"):
        if len(word) > len(suffix) + 2 and word.endswith(suffix):
            return word[: -len(suffix)] + ("y" if suffix in ("ies", "ied") else "")
    return word


def sentence_spans(text: str) -> list[tuple[int, int]]:
    """Character spans of the sentences (or lines) of ``text``; they cover it without gaps."""
    spans: list[tuple[int, int]] = []
    start = 0
    for m in _SENTENCE_END.finditer(text):
        end = m.end()
        if end > start and text[start:m.start()].strip():
            spans.append((start, end))
            start = end
    if start < len(text):
        if spans and not text[start:].strip():
            spans[-1] = (spans[-1][0], len(text))
        else:
            spans.append((start, len(text)))
    return spans or [(0, len(text))]


def embedding_text(speaker: str, text: str) -> str:
    """What the dense model sees for an item: questions often name the speaker."""
    return f"{speaker}: {text}" if speaker else text


def is_utf8(text: str) -> bool:
    """Whether ``text`` can be written as UTF-8: a lone surrogate (from a bad decode, or JSON
    with an unpaired escape) cannot, and no store can hold it."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
