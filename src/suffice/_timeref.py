"""Relative time phrases in a turn, stated against the date the turn was said.

"I went to a conference last Tuesday", said on 20 July 2023, means the Tuesday before 20 July
2023. A small reader sees the turn's timestamp and the phrase but rarely does that arithmetic,
and questions about when something happened hinge on it. This is the deep path's rule-based
temporal step: it reads only the turn and its own timestamp, so it needs no model call and
cannot invent an event; it adds the meaning next to the verbatim words and never rewrites them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import date, timedelta

from ._times import WEEKDAYS

__all__ = ["Resolution", "annotate", "asks_time", "resolve"]

_ASKS_TIME = re.compile(r"^\W*when\b|\bwhen (?:did|does|do|was|were|is|will|has|had)\b|"
                        r"\b(?:what|which) (?:year|month|day|date|time|week|weekend)\b|"
                        r"\bhow long\b|\bhow many (?:days|weeks|months|years)\b", re.I)


def asks_time(question: str) -> bool:
    """Does the question ask when something happened (or how long ago)? Then the stated dates
    are worth more of the context than its last lines of evidence."""
    return bool(_ASKS_TIME.search(question))

_COUNTS = {"a": 1, "an": 1, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6,
           "seven": 7, "eight": 8, "nine": 9, "ten": 10, "eleven": 11, "twelve": 12,
           "a couple of": 2, "couple of": 2, "a couple": 2, "couple": 2,
           "a few": 0, "few": 0, "several": 0}


@dataclass(frozen=True, slots=True)
class Resolution:
    """One relative phrase as written and what it means on the turn's date."""

    phrase: str
    meaning: str


def _day(d: date) -> str:
    return f"{d.day} {d:%B %Y}"


def _month(d: date) -> str:
    return f"{d:%B %Y}"


def _shift_months(d: date, n: int) -> date:
    m = d.month - 1 + n
    return date(d.year + m // 12, m % 12 + 1, 1)


_COUNT = (r"a couple of|couple of|a couple|couple|a few|few|several|an?|one|two|three|four|five|six|seven"
          r"|eight|nine|ten|eleven|twelve|\d+")
_PATTERNS = re.compile(
    r"\b(?:"
    r"(?P<dby>(?:the )?day before yesterday|(?:the )?night before last)"  # before "yesterday"
    r"|(?P<dat>(?:the )?day after tomorrow)"  # and "tomorrow": the longer phrase wins
    r"|(?P<yesterday>yesterday|last night)"
    r"|(?P<today>today|tonight|this morning|this afternoon|this evening)"
    r"|(?P<tomorrow>tomorrow)"
    r"|(?P<lastwd>last (?P<wd1>" + "|".join(WEEKDAYS) + r"))"
    r"|(?P<nextwd>next (?P<wd2>" + "|".join(WEEKDAYS) + r"))"
    r"|(?P<last>(?:last|past|previous) (?P<u1>week|weekend|month|year))"
    r"|(?P<next>next (?P<u2>week|weekend|month|year))"
    r"|(?P<this>this (?P<u3>week|month|year))"
    r"|(?P<ago>(?P<n>" + _COUNT + r") (?P<u4>day|night|week|weekend|month|year)s? ago)"
    r"|(?P<other>the other day)"
    r")\b",
    re.IGNORECASE,
)


def resolve(text: str, when: date) -> list[Resolution]:
    """Each relative time phrase in ``text``, in order, with its meaning on ``when``."""
    out: list[Resolution] = []
    for m in _PATTERNS.finditer(text):
        phrase = m.group(0)
        try:
            meaning = _meaning(m, when)
        except (OverflowError, ValueError):  # "999999 days ago", or a date at the calendar's edge
            continue
        if meaning and all(r.phrase.lower() != phrase.lower() for r in out):
            out.append(Resolution(phrase, meaning))
    return out


def _meaning(m: re.Match[str], when: date) -> str:
    on = _day(when)
    if m["dby"]:
        return f"two days before {on}, {_day(when - timedelta(days=2))}"
    if m["dat"]:
        return f"two days after {on}, {_day(when + timedelta(days=2))}"
    if m["yesterday"]:
        return f"the day before {on}, {_day(when - timedelta(days=1))}"
    if m["today"]:
        return on
    if m["tomorrow"]:
        return f"the day after {on}, {_day(when + timedelta(days=1))}"
    if m["lastwd"]:
        wd = WEEKDAYS.index(m["wd1"].lower())
        back = (when.weekday() - wd) % 7 or 7
        return f"the {_wd_name(wd)} before {on}, {_day(when - timedelta(days=back))}"
    if m["nextwd"]:
        wd = WEEKDAYS.index(m["wd2"].lower())
        ahead = (wd - when.weekday()) % 7 or 7
        return f"the {_wd_name(wd)} after {on}, {_day(when + timedelta(days=ahead))}"
    if m["last"]:
        return _relative(m["u1"].lower(), 1, "before", when)
    if m["next"]:
        return _relative(m["u2"].lower(), 1, "after", when)
    if m["this"]:
        unit = m["u3"].lower()
        return {"week": f"the week of {on}", "month": _month(when), "year": str(when.year)}[unit]
    if m["ago"]:
        count_word, unit = m["n"].lower(), m["u4"].lower()
        n = int(count_word) if count_word.isdigit() else _COUNTS.get(count_word, 0)
        if count_word.isdigit() and n == 0:  # "0 days ago": the day itself
            return on
        if n == 0:  # "a few", "several": keep the writer's vagueness
            vague = "a few" if count_word in ("few", "a few") else count_word
            return f"{vague} {unit}s before {on}"
        return _relative(unit, n, "before", when)
    if m["other"]:
        return f"a few days before {on}"
    return ""


def _wd_name(i: int) -> str:
    return WEEKDAYS[i].capitalize()


def _relative(unit: str, n: int, side: str, when: date) -> str:
    """``n`` units before or after ``when``, as a phrase plus the calendar value it points at."""
    on = _day(when)
    sign = -1 if side == "before" else 1
    count = "" if n == 1 else f"{n} "
    plural = "" if n == 1 else "s"
    if unit in ("day", "night"):
        return f"{count or 'the '}{unit}{plural} {side} {on}, {_day(when + timedelta(days=sign * n))}"
    if unit in ("week", "weekend"):
        return f"{count or 'the '}{unit}{plural} {side} {on}"
    if unit == "month":
        return f"{count or 'the '}month{plural} {side} {on}, {_month(_shift_months(when, sign * n))}"
    return f"{count or 'the '}year{plural} {side} {on}, {when.year + sign * n}"


def annotate(line: str, text: str, when: date | None) -> str:
    """``line`` (a rendered turn) with the meaning of each relative phrase in ``text`` (the
    turn's words) appended in brackets; unchanged when there is none or the turn has no date
    (``when``: the day of its parsed ``observed_ts``)."""
    if when is None:
        return line
    found = resolve(text, when)
    if not found:
        return line
    return f"{line} [{'; '.join(f'{r.phrase} = {r.meaning}' for r in found)}]"
