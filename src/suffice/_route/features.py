"""What the trained sufficiency router sees of a context: arrays, made the same way in
training and at run time.

The router does not read the context's text with a network: every item it shows already has a
vector (computed once, at write time, by the store's encoder) and a place in the query's
ranking (BM25, dense and fused ranks and scores). The router's input is therefore a *set*:

* the query vector (``D``);
* per item of the context, its stored vector (``D``) and a few numbers
  (:data:`ELEMENT_FEATURES`): where the ranking put it, how many of the query's words it holds,
  whether it names the person the question names, how long it is;
* a few numbers about the whole context (:data:`GLOBAL_FEATURES`): the share of the query's
  words it holds, its size, the question's first word.

Building these arrays and one ONNX pass cost about 4 ms (p50) for a 1,000-token context,
against about 160 ms for MiniLM to read the same text once (docs/benchmarks.md §7). The arrays are built
here only; :mod:`suffice._train.sufficiency_data` and :class:`~suffice._route.trained.TrainedRouter`
both call :func:`extract`, so training and inference cannot drift apart.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from .._retrieve import Ranking
from .._text import query_terms, stem, words
from .._times import MONTHS, WEEKDAYS, day_of
from .._types import ContextPart, Item

FEATURES_VERSION = 1
"""Bump when any feature changes meaning: a trained router records the version it was fit to."""

MAX_ELEMENTS = 64
"""Items of a context the router reads at most (the best by fused rank); a 1k-token LoCoMo
render shows about 25."""

RANK_DEPTH = 300
"""Dense and BM25 ranks count down to this depth only (the render's default candidate depth),
so a ranking read deeper for a wider context gives the same features."""

ELEMENT_FEATURES = (
    "fused_rr",        # 10 / (10 + fused rank); 0 past the ranking's depth
    "fused_in",        # 1 when the fused ranking reached the item
    "dense_cos",       # cosine of item and query
    "dense_gap",       # cosine minus the ranking's best cosine
    "dense_rr",        # 10 / (10 + dense rank); 0 past RANK_DEPTH
    "bm25_rel",        # best piece's BM25 over the ranking's best BM25; 0 without a term match
    "bm25_rr",         # 10 / (10 + BM25 rank); 0 without a term match or past RANK_DEPTH
    "top_hit",         # 1 when the item is one of the prefix's top k hits
    "coverage",        # share of the query's content words the item holds
    "coverage_new",    # share of them no earlier (better-ranked) item of the context holds
    "names_speaker",   # 1 when the question names the item's speaker
    "has_number",      # the item states a number or a year
    "log_tokens",      # log(1 + tokens) / 8
    "piece",           # 1 when the context shows only a piece of the item
    "position",        # the item's place in its history, 0 (oldest) .. 1 (newest)
    "order",           # the item's place among the context's items by time, 0 .. 1
    "topic_coverage",  # share of the query's topic words (content words that name no speaker)
    "topic_all",       # 1 when the item holds every topic word
    "in_period",       # the item was said in the period the question names (a month, a year)
    "has_time_word",   # the item speaks of time ("yesterday", "last week", a weekday, a month)
    "has_name",        # the item names something with a capital letter mid-sentence
)

QUESTION_WORDS = ("when", "what", "who", "where", "how", "why", "which", "would")

GLOBAL_FEATURES = (
    "coverage_all",    # share of the query's content words the whole context holds
    "coverage_best",   # the best single item's coverage
    "top_cos",         # the ranking's best cosine
    "cos_margin",      # best minus second-best cosine
    "context_cos",     # best cosine among the context's items
    "n_items",         # items in the context / MAX_ELEMENTS
    "log_tokens",      # log(1 + context tokens) / 8
    "n_records",       # timeline lines / 20
    "n_sessions",      # distinct sessions of the context's items / 20
    "top_hits_in",     # share of the top k hits the context shows
    "n_terms",         # query content words / 10
    "question_len",    # query words / 30
    *(f"q_{w}" for w in QUESTION_WORDS),
    "q_other",
    "topic_all",       # share of the query's topic words the whole context holds
    "topic_best",      # the best single item's topic coverage
    "n_topic",         # topic words / 10
    "topic_items",     # items holding at least half the topic words / 10
    "named_items",     # items said by a person the question names / 20
    "named_topic",     # best topic coverage among those items
    "has_period",      # the question names a month or a year
    "period_items",    # items said in that period / 10
    "period_topic",    # best topic coverage among those items
    "bm25_top",        # log(1 + best BM25 score) / 4: how strongly the best piece matched
    "bm25_gap",        # (best - tenth best) / best BM25 score: does one match stand out
    "cos_spread",      # best cosine minus the mean of the top ten: does one item stand out
    "plural_cue",      # the question asks for several things (plural noun after what/which, "all", "both")
    "q_how_many",      # "how many" / "how often"
    "q_would",         # a hypothetical ("would", "likely", "might"): an inference, not a lookup
    "out_topic",       # best topic coverage among the ranking's top OUTSIDE items the context left out
    "out_named_topic", # the same among those said by a person the question names
    "out_rr",          # 10 / (10 + fused rank) of the best-ranked item the context left out
    "idf_all",         # IDF-weighted share of the topic words the whole context holds
    "idf_best",        # the best single item's IDF-weighted topic coverage
    "idf_named",       # the same among items said by a person the question names
    "idf_out",         # the same among the ranking's top items the context left out
    "rare_missing",    # IDF of the rarest topic word no item of the context holds / 10
)

OUTSIDE = 30
"""The fused ranking's first this many items are checked for what the context left out."""

_NUMBER = re.compile(r"\b\d+(?:[.,]\d+)?\b")
_MONTH_ABBR = {m[:3]: i + 1 for i, m in enumerate(MONTHS)} | {m: i + 1 for i, m in enumerate(MONTHS)}
_PERIOD = re.compile(r"\b(?:(" + "|".join(_MONTH_ABBR) + r")\.?\s+(?:\d{1,2}(?:st|nd|rd|th)?,?\s+)?)?"
                     r"((?:19|20)\d{2})\b", re.I)
_TIME_WORDS = frozenset(
    "yesterday today tomorrow tonight week weekend month year ago last next recently lately "
    "morning evening night".split()
) | frozenset(MONTHS) | frozenset(WEEKDAYS)
_MID_CAPITAL = re.compile(r"(?<=[a-z,;] )[A-Z][a-z]+")
_PLURAL_CUE = re.compile(r"\b(?:what|which)\s+(?:\w+\s+)?\w+s\b|\ball\b|\bboth\b|\bthings\b|"
                         r"\bways\b|\btypes?\s+of\b|\bkinds?\s+of\b", re.I)
_WOULD = re.compile(r"\b(?:would|likely|might|could|probably)\b", re.I)


@dataclass(frozen=True, slots=True)
class RouterFeatures:
    """One context as the router's network reads it (float32 arrays)."""

    query: np.ndarray
    """(D,) the query vector."""
    vectors: np.ndarray
    """(N, D) the items' stored vectors, by time; zero rows where an item has none."""
    elements: np.ndarray
    """(N, len(ELEMENT_FEATURES))."""
    context: np.ndarray
    """(len(GLOBAL_FEATURES),)."""
    seqs: tuple[int, ...]
    """The items, in row order."""


def context_seqs(parts: Sequence[ContextPart]) -> list[int]:
    """The items a context shows, in time order."""
    return sorted({q for p in parts for q in p.seqs})


def extract(query: str, ranking: Ranking, parts: Sequence[ContextPart], items: Mapping[int, Item],
            top_hits: Sequence[int], context_tokens: int, *, dim: int = 384,
            max_elements: int = MAX_ELEMENTS) -> RouterFeatures:
    """The router's arrays for a context of ``parts`` built from ``ranking``.

    ``items`` holds the context's items and, where known, the ranking's first :data:`OUTSIDE`
    (what the context left out is a clue too). ``top_hits``: the prefix's top k seqs (C_f).
    Items without a stored vector get a zero vector; a ranking without a query vector (no
    embedder) gives a zero query vector. Word rarity (the ``idf_*`` features) is counted over
    ``items``: a word most candidates hold (a speaker's name, the conversation's theme) tells
    less than one only a few hold, and the count needs nothing the engine lacks at query time.
    """
    seqs_all = [q for q in context_seqs(parts) if q in items]
    fused_rank = {q: r for r, q in enumerate(ranking.seqs)}
    if len(seqs_all) > max_elements:  # keep the best-ranked, shown in time order
        keep = sorted(seqs_all, key=lambda q: (fused_rank.get(q, 1 << 30), -q))[:max_elements]
        seqs_all = sorted(keep)
    seqs = seqs_all
    n = len(seqs)
    qvec = ranking.qvec if ranking.qvec is not None else np.zeros(dim, np.float32)
    qvec = np.asarray(qvec, dtype=np.float32).reshape(-1)
    vectors = _vectors(ranking, seqs, qvec.shape[0])
    cos = vectors @ qvec if n else np.zeros(0, np.float32)
    dense_rank = {q: r for r, (q, _c) in enumerate(ranking.dense[:RANK_DEPTH])}
    top_cos = ranking.dense[0][1] if ranking.dense else 0.0
    second = ranking.dense[1][1] if len(ranking.dense) > 1 else top_cos
    bm25_best: dict[int, float] = {}
    bm25_rank: dict[int, int] = {}
    for seq, _piece, score in ranking.pieces:
        if seq not in bm25_best:
            bm25_best[seq] = score
            bm25_rank[seq] = len(bm25_rank)
            if len(bm25_rank) >= RANK_DEPTH:
                break
    bm25_top = max(bm25_best.values(), default=0.0)
    piece_only = {q for p in parts if p.kind in ("piece", "excerpt") for q in p.seqs}
    whole = {q for p in parts if p.kind in ("raw", "recent") for q in p.seqs}
    terms = [stem(t) for t in query_terms(query)]
    q_words = set(words(query))
    names = {w for q in seqs for w in words(items[q].speaker)[:1]}
    topic = [t for t in terms if t not in names] or terms
    period = _period(query)
    stems = {q: {stem(w) for w in words(it.text)} for q, it in items.items()}  # once per item
    idf = _rarity(topic, stems)
    idf_total = sum(idf.values()) or 1.0
    idf_best = idf_named = idf_out = 0.0
    hits = set(top_hits)
    size = max(ranking.size, 1)

    elements = np.zeros((n, len(ELEMENT_FEATURES)), np.float32)
    covered: set[str] = set()
    topic_covered: set[str] = set()
    best_cov = best_topic = named_topic = period_topic = 0.0
    named_items = period_items = topic_items = 0
    by_rank = sorted(range(n), key=lambda i: (fused_rank.get(seqs[i], 1 << 30), -seqs[i]))
    for i in by_rank:
        seq = seqs[i]
        it = items[seq]
        toks = words(it.text)
        have = stems[seq]
        own = [t for t in terms if t in have]
        cov = len(own) / len(terms) if terms else 0.0
        new = [t for t in own if t not in covered]
        covered.update(own)
        best_cov = max(best_cov, cov)
        own_topic = [t for t in topic if t in have]
        topic_covered.update(own_topic)
        tcov = len(own_topic) / len(topic) if topic else 0.0
        best_topic = max(best_topic, tcov)
        icov = sum(idf[t] for t in set(own_topic)) / idf_total
        idf_best = max(idf_best, icov)
        topic_items += tcov >= 0.5
        speaker = words(it.speaker)[:1]
        named = bool(speaker) and speaker[0] in q_words
        if named:
            named_items += 1
            named_topic = max(named_topic, tcov)
            idf_named = max(idf_named, icov)
        in_period = period is not None and _in_period(it.observed_ts, period)
        if in_period:
            period_items += 1
            period_topic = max(period_topic, tcov)
        fr = fused_rank.get(seq)
        dr = dense_rank.get(seq)
        br = bm25_rank.get(seq)
        elements[i] = (
            10.0 / (10.0 + fr) if fr is not None else 0.0,
            1.0 if fr is not None else 0.0,
            float(cos[i]),
            float(cos[i]) - top_cos,
            10.0 / (10.0 + dr) if dr is not None else 0.0,
            bm25_best[seq] / bm25_top if seq in bm25_best and bm25_top > 0 else 0.0,
            10.0 / (10.0 + br) if br is not None else 0.0,
            1.0 if seq in hits else 0.0,
            cov,
            len(new) / len(terms) if terms else 0.0,
            1.0 if named else 0.0,
            1.0 if _NUMBER.search(it.text) else 0.0,
            math.log1p(it.tokens) / 8.0,
            1.0 if seq in piece_only and seq not in whole else 0.0,
            seq / size,
            i / max(n - 1, 1),
            tcov,
            1.0 if topic and len(own_topic) == len(topic) else 0.0,
            1.0 if in_period else 0.0,
            1.0 if _TIME_WORDS.intersection(toks) else 0.0,
            1.0 if _MID_CAPITAL.search(it.text) else 0.0,
        )

    shown_set = set(seqs)
    out_topic = out_named = out_rr = 0.0
    for r, q in enumerate(ranking.seqs[:OUTSIDE]):
        if q in shown_set or q not in items:
            continue
        it = items[q]
        have = stems[q]
        tcov = sum(t in have for t in topic) / len(topic) if topic else 0.0
        out_topic = max(out_topic, tcov)
        idf_out = max(idf_out, sum(idf[t] for t in set(topic) if t in have) / idf_total)
        speaker = words(it.speaker)[:1]
        if speaker and speaker[0] in q_words:
            out_named = max(out_named, tcov)
        out_rr = max(out_rr, 10.0 / (10.0 + r))

    first = words(query)[:1]
    qw = first[0] if first else ""
    records = sum(1 for p in parts if p.kind == "record")
    bm_sorted = sorted(bm25_best.values(), reverse=True)
    tenth = bm_sorted[min(9, len(bm_sorted) - 1)] if bm_sorted else 0.0
    top10 = [c for _q, c in ranking.dense[:10]]
    ql = query.lower()
    context = np.array([
        len(covered) / len(terms) if terms else 0.0,
        best_cov,
        top_cos,
        top_cos - second,
        float(cos.max()) if n else 0.0,
        n / max_elements,
        math.log1p(context_tokens) / 8.0,
        records / 20.0,
        len({items[q].session for q in seqs}) / 20.0,
        len(hits & set(seqs)) / len(hits) if hits else 0.0,
        len(terms) / 10.0,
        len(words(query)) / 30.0,
        *(1.0 if qw == w else 0.0 for w in QUESTION_WORDS),
        0.0 if qw in QUESTION_WORDS else 1.0,
        len(topic_covered) / len(topic) if topic else 0.0,
        best_topic,
        len(topic) / 10.0,
        topic_items / 10.0,
        named_items / 20.0,
        named_topic,
        1.0 if period is not None else 0.0,
        period_items / 10.0,
        period_topic,
        math.log1p(max(bm25_top, 0.0)) / 4.0,
        (bm25_top - tenth) / bm25_top if bm25_top > 0 else 0.0,
        top_cos - (sum(top10) / len(top10)) if top10 else 0.0,
        1.0 if _PLURAL_CUE.search(query) else 0.0,
        1.0 if "how many" in ql or "how often" in ql else 0.0,
        1.0 if _WOULD.search(query) else 0.0,
        out_topic,
        out_named,
        out_rr,
        sum(idf[t] for t in set(topic_covered)) / idf_total,
        idf_best,
        idf_named,
        idf_out,
        max((idf[t] for t in topic if t not in topic_covered), default=0.0) / 10.0,
    ], dtype=np.float32)
    return RouterFeatures(qvec, vectors, elements, context, tuple(seqs))


def _rarity(topic: Sequence[str], stems: Mapping[int, set[str]]) -> dict[str, float]:
    """Smoothed inverse document frequency of each topic word among the items (``stems``:
    each item's stemmed words)."""
    want = set(topic)
    df = dict.fromkeys(want, 0)
    for have in stems.values():
        for t in have & want:
            df[t] += 1
    n = len(stems)
    return {t: math.log((n + 1) / (df[t] + 1)) + 1.0 for t in topic}


def _period(query: str) -> tuple[int, int | None] | None:
    """(year, month or None) of the first month-and-year or year the question names."""
    m = _PERIOD.search(query)
    if m is None:
        return None
    month = _MONTH_ABBR.get(m.group(1).lower().rstrip(".")) if m.group(1) else None
    return int(m.group(2)), month


def _in_period(ts: float | None, period: tuple[int, int | None]) -> bool:
    day = day_of(ts)
    if day is None:
        return False
    year, month = period
    return day.year == year and (month is None or day.month == month)


def _vectors(ranking: Ranking, seqs: Sequence[int], dim: int) -> np.ndarray:
    if ranking.index is None or not seqs:
        return np.zeros((len(seqs), dim), np.float32)
    got = ranking.index.vectors_of(seqs)
    return got if got.shape[1] == dim else np.zeros((len(seqs), dim), np.float32)
