"""Step references in agent questions: "at step 78", "between step 73 and 76", "steps 34, 35 and 36".

An agent's history is ordered by step (``meta['step']`` on every item the trajectory importers
write), and questions about it name steps far more often than they paraphrase them. A step
number is an exact address, which neither BM25 (a number is a weak term) nor an embedding
resolves; so the prefix reads the numbers here and fetches those steps' items through the
store's filters (:meth:`suffice._retrieve.Retriever.rank`). Pure text functions: no store, no model.

State questions ("what is the inventory now", "the last time X changed", "X at step 50") are
answered by the newest item that set the state, so :func:`asks_latest` says when a question
wants the latest match rather than the best one.

Enumeration questions ("which actions were performed on soapbar 1 before step 49", "the commands
run against setup.py") want every action on one object, not the few that rank best:
:func:`acted_on` reads the object, and the prefix fetches each action that names it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

STEP_KEY = "step"
"""The meta key that holds an item's step (an int), as the trajectory importers write it."""

MAX_RANGE = 50
"""A range wider than this many steps is read as its two ends only: such a span is context
("from step 3 to step 120, the agent ..."), and fetching all of it would flood the context."""

MAX_REFERENCES = 64
"""At most this many distinct steps are taken from one text (the first mentioned)."""

_STEPS = re.compile(r"\b(?:steps?|turns?)\s*(?:#\s*)?(\d+)((?:\s*(?:,|and|to|through|-|–|—|&)\s*"
                    r"(?:(?:steps?|turns?)\s*)?\d+)*)", re.IGNORECASE)
_PART = re.compile(r"(,|and|to|through|-|–|—|&)\s*(?:(?:steps?|turns?)\s*)?(\d+)", re.IGNORECASE)
_BETWEEN = re.compile(r"\bbetween\s+(?:steps?|turns?)\s*(?:#\s*)?(\d+)\s+and\s+"
                      r"(?:(?:steps?|turns?)\s*)?(?:#\s*)?(\d+)", re.IGNORECASE)
_BOUND = re.compile(r"\b(?:at|by|as of|before|until|up to|through)\s+(?:the\s+(?:end\s+of\s+)?)?"
                    r"(?:steps?|turns?)\s*(?:#\s*)?(\d+)", re.IGNORECASE)
_LATEST = re.compile(r"\b(?:now|current(?:ly)?|latest|last(?:\s+time)?|most\s+recent(?:ly)?|final(?:ly)?|"
                     r"at\s+the\s+end|so\s+far|still|remaining|left)\b", re.IGNORECASE)
_STATE = re.compile(r"\b(?:value|values|state|status|inventory|contents?|holding|score|position|count|"
                    r"location|located|set\s+to|equal|changed?)\b", re.IGNORECASE)
_STEP_WORDS = frozenset({"step", "steps", "turn", "turns"})
_ACTED_ON = re.compile(r"\b(?:actions?|commands?|tool\s+calls?|operations?)\b[^.?!;]{0,40}?\b"
                       r"(?:on|against|involving|touching|upon)\s+(?:the\s+)?"
                       r"(?:(?:file|folder|directory|table|column|page|object|item)\s+)?"
                       r"([A-Za-z_][\w./-]*(?:\s+\d+)?)", re.IGNORECASE)
_NOT_OBJECTS = frozenset({"it", "them", "this", "that", "these", "those", "step", "steps", "turn",
                          "turns", "each", "every", "which", "what", "its", "their", "a", "an",
                          "the", "his", "her", "my", "our", "your", "some", "any", "all", "both"})
_THOUSANDS = re.compile(r"(\b(?:step|turn)\s*(?:#\s*)?)(\d{1,3}(?:,\d{3})+)(?![\d,])", re.IGNORECASE)
"""One step written with thousands separators ("step 1,200"); after the plural it is a list
("steps 120,121,122")."""
_BEFORE = re.compile(r"\bbefore\s+(?:steps?|turns?)\s*(?:#\s*)?(\d+)", re.IGNORECASE)

MAX_SPAN = 20
"""Most steps filled in between two named ones (:func:`implied_steps`); a wider stretch is
context, as for :data:`MAX_RANGE`."""

MAX_IMPLIED = 20
"""Most steps :func:`implied_steps` adds to a question's named ones."""

MAX_STEP = 2**63 - 1
"""Steps past this are not looked up (a store's integers end here)."""


def _joined(text: str) -> str:
    """``text`` with "step 1,200" written "step 1200", so every reader of it sees one step."""
    return _THOUSANDS.sub(lambda m: m.group(1) + m.group(2).replace(",", ""), text)


def _num(digits: str) -> int:
    """A step number; one longer than any store's integers reads as MAX_STEP + 1, which no
    lookup takes (``int`` refuses strings of over 4,300 digits outright)."""
    return int(digits) if len(digits) <= len(str(MAX_STEP)) else MAX_STEP + 1


FOLLOWING_STEPS = 5
"""Steps after each named one that a question about what came next gets (:func:`implied_steps`).
Chosen among 1, 2, 3, 5 and 8 on half of the AMA-Bench episodes (every other one by name;
5 and 8 tied there), reported on the other half too (docs/benchmarks.md section 9)."""

# A stretch between two named steps: the opening word at most six words before the first
# mention, the joining word among the first three after it, one clause (no comma) in between.
_SPAN_LEAD = re.compile(r"\b(?:between|from|after|since)\b[^\w,;.?!]+(?:\w+[^\w,;.?!]+){0,6}$",
                        re.IGNORECASE)
_SPAN_GAP = re.compile(r"[^\w,;.?!]*(?:\w+[^\w,;.?!]+){0,2}(?:and|to|until|till|through|before)\b"
                       r"[^,;.?!]{0,120}$", re.IGNORECASE)
# What came after a step: "which action followed step 10", "the subsequent steps", and the
# consequences a counterfactual ("if at step 14 the agent had ...") asks about.
_AFTER = re.compile(r"\b(?:after(?:wards?)?|next|follow(?:s|ed|ing)?|later|subsequent(?:ly)?|"
                    r"cascad\w*|downstream|consequences?|outcomes?|led\s+to|lead\s+to|counterfactual)\b|"
                    r"\bif\b[^.?!]{0,120}?\bhad\b", re.IGNORECASE)
_SENTENCE_END = re.compile(r"[.?!;]\s")


def cited_steps(text: str, n_turns: int | None = None, *, between: bool = True,
                limit: int | None = MAX_REFERENCES) -> list[int]:
    """Step numbers named in ``text``, in order of first mention: "step 12", "turn 40",
    "steps 34, 35 and 36", "from step 72 to 74", "steps 3-5"; a range wider than
    :data:`MAX_RANGE` gives its two ends. ``between``: "between step 73 and 76" is the steps
    from 73 to 76 (off: the two named). With ``n_turns``, only steps ``0 <= n < n_turns`` are
    kept; at most ``limit`` steps (None: all)."""
    out: list[int] = []
    seen: set[int] = set()
    text = _joined(text)
    spans = ({m.start(1): (_num(m.group(1)), _num(m.group(2))) for m in _BETWEEN.finditer(text)}
             if between else {})
    for m in _STEPS.finditer(text):
        nums = [_num(m.group(1))]
        for part in _PART.finditer(m.group(2) or ""):
            sep, n = part.group(1).lower(), _num(part.group(2))
            if sep in ("to", "through", "-", "–", "—") and 0 < abs(n - nums[-1]) <= MAX_RANGE:
                # "steps 80 to 70" is the same stretch as "70 to 80"
                nums.extend(range(nums[-1] + 1, n + 1) if n > nums[-1] else range(nums[-1] - 1, n - 1, -1))
            else:
                nums.append(n)
        span = spans.get(m.start(1))
        if span is not None and nums[:2] == list(span) and 0 < abs(span[1] - span[0]) <= MAX_RANGE:
            lo, hi = sorted(span)
            nums = [*range(lo, hi + 1), *nums[2:]]
        for n in nums:
            if n > MAX_STEP:  # no store holds such a step; a filter could not even name it
                continue
            if n not in seen and (n_turns is None or 0 <= n < n_turns):
                if limit is not None and len(out) >= limit:
                    return out
                seen.add(n)
                out.append(n)
    return out


def implied_steps(text: str, named: list[int] | None = None) -> list[tuple[int, str]]:
    """Steps ``text`` asks about without naming them, each with why, in order; at most
    :data:`MAX_IMPLIED`, none of ``named`` (:func:`cited_steps` of ``text`` when None).

    * A stretch: two step mentions in one clause, the first at most six words after "between",
      "from", "after" or "since", joined by "and", "to", "until" or "before" among the next three
      words ("after Cancel (step 12) and before Add (step 17)" gives 13-16; "between the start
      of step 4 and the observation at step 8" 5-7), at most :data:`MAX_SPAN` steps in between.
      The bare "between step 4 and 8" is :func:`cited_steps`' own range already.
    * What came after: a sentence that asks what followed a step it names ("which action
      followed step 10", "how did that cascade", "if at step 14 the agent had ...") gives the
      :data:`FOLLOWING_STEPS` steps after each of them; not for the ends of a stretch, not at or
      past the question's "before step N". A state question ("what was X at step 50, after
      ...") gets them too: its own latest match still keeps to its step bound, and on AMA-Bench
      leaving them out lost more (its counterfactuals ask for "the final result")."""
    text = _joined(text)
    named = cited_steps(text) if named is None else named
    taken = set(named)
    out: list[tuple[int, str]] = []
    below = before_step(text)

    def add(n: int, why: str) -> None:
        if (0 <= n <= MAX_STEP and n not in taken and len(out) < MAX_IMPLIED
                and (below is None or n < below)):
            taken.add(n)
            out.append((n, why))

    spanned: set[int] = set()
    mentions = [(m.start(), m.end(), _num(m.group(1))) for m in _STEPS.finditer(text)]
    for (s1, e1, a), (s2, _e2, b) in zip(mentions, mentions[1:], strict=False):
        if 0 < b - a - 1 <= MAX_SPAN and _SPAN_LEAD.search(text[max(0, s1 - 80):s1]) and _SPAN_GAP.match(
                text[e1:s2]):
            spanned.update((a, b))
            for n in range(a + 1, b):
                add(n, f"step {n} (between step {a} and step {b})")
    if not named:
        return out
    for sentence in _SENTENCE_END.split(text):
        if _AFTER.search(sentence):
            for n in cited_steps(sentence):
                if n in spanned:  # a stretch's "after ... before" asks for the stretch
                    continue
                for k in range(1, FOLLOWING_STEPS + 1):
                    add(n + k, f"step {n + k} (after step {n})")
    return out


def step_bound(text: str) -> int | None:
    """The step a state question is asked at ("at step 50", "by step 12", "as of turn 7"):
    the latest step whose items may answer it; None when the question names none."""
    bounds = [n for m in _BOUND.finditer(_joined(text)) if (n := _num(m.group(1))) <= MAX_STEP]
    return max(bounds) if bounds else None


def asks_latest(text: str) -> bool:
    """Whether ``text`` asks for a state as it stood at some point ("now", "the last time", "the
    value of X at step 50") rather than for an event: then the newest matching item answers it."""
    return bool(_LATEST.search(text)) or (step_bound(text) is not None and bool(_STATE.search(text)))


def acted_on(text: str) -> str | None:
    """The object an enumeration question asks the actions on ("which actions were performed on
    soapbar 1" → ``soapbar 1``; "commands run against setup.py" → ``setup.py``), or None. Only
    an identifier counts (a number, a dot, a slash or an underscore in it): "actions taken on
    the weekend" asks for no enumeration."""
    for m in _ACTED_ON.finditer(text):
        phrase = " ".join(m.group(1).split()).rstrip("./-")  # a sentence's full stop is not the name's
        # An identifier ("soapbar 1", "setup.py", "src/app"), not a plain word ("the weekend").
        if (phrase and phrase.split()[0].lower() not in _NOT_OBJECTS
                and any(c.isdigit() or c in "./_" for c in phrase)):
            return phrase
    return None


def before_step(text: str) -> int | None:
    """The step of "before step N" in ``text`` (that step itself excluded), or None."""
    m = _BEFORE.search(_joined(text))
    n = _num(m.group(1)) if m else None
    return n if n is not None and n <= MAX_STEP else None


def key_terms(terms: list[str]) -> list[str]:
    """Query terms without step words and numbers: what the state is about."""
    return [t for t in terms if t not in _STEP_WORDS and not t.isdigit()
            and not _LATEST.fullmatch(t)]


@dataclass(frozen=True, slots=True)
class StepRef:
    """An item fetched because the query named its step (or asked for the latest state)."""

    seq: int
    step: int
    reason: str
    """``step 73``, or ``latest match before step 50``: shown in the ranking and the render."""
