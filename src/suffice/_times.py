"""Time as data: an item's ``observed_at`` is parsed once, at write time, into UTC seconds.

The text is kept as written (it is what a reader sees); the parsed timestamp is what filters,
ordering by time and the relative-date step use. Parsing is python-dateutil's, with fuzzy
matching so "1:56 pm on 8 May, 2023" reads as written. A time without a zone is taken as UTC.
Text that names no year ("yesterday", "session 3") gets no timestamp rather than a guess, and
neither does a number that only looks like one ("session 42", "step 250"): the text must name a
month, have a date's shape or hold a four-digit year. Nothing depends on the machine: zone
names are read from a fixed table (not the local zone), two-digit years pivot on a fixed rule
(not today's year), and numeric dates are month first (03/04/2025 is 4 March).
"""

from __future__ import annotations

import math
import re
from datetime import UTC, date, datetime, time, timedelta
from datetime import tzinfo as _tzinfo
from functools import lru_cache
from typing import TypeAlias

from dateutil import parser as _parser
from dateutil.tz import tzoffset

from ._errors import InvalidQueryError

MONTHS = ("january", "february", "march", "april", "may", "june", "july", "august", "september",
          "october", "november", "december")
"""English month names, lower case, January first; the rule readers of dates share them."""

WEEKDAYS = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
"""English weekday names, lower case, Monday first (as ``date.weekday()`` counts)."""

SECONDS = re.compile(r"-?\d{9,}(\.\d+)?")
"""Text that is POSIX seconds, not a date: nine digits or more (1973 onwards), on every surface."""

TimeLike: TypeAlias = datetime | date | str | int | float
"""What a time argument may be: a datetime or date, text with a date in it, or POSIX seconds."""

_DEFAULTS = (datetime(2001, 1, 1), datetime(2002, 2, 2))

_ZONES = {"UTC": 0, "UT": 0, "GMT": 0, "Z": 0, "WET": 0, "WEST": 1, "BST": 1, "CET": 1, "CEST": 2,
          "EET": 2, "EEST": 3, "MSK": 3, "JST": 9, "KST": 9, "AEST": 10, "AEDT": 11, "NZST": 12,
          "NZDT": 13, "HST": -10, "AKST": -9, "AKDT": -8, "PST": -8, "PDT": -7, "MST": -7, "MDT": -6,
          "CST": -6, "CDT": -5, "EST": -5, "EDT": -4}
"""Zone names read as fixed offsets (hours). Names that mean several zones (IST, for one) are
left out: an unknown name is read as UTC, like no zone at all."""

_MONTH = re.compile(r"\b(jan(uary)?|feb(ruary)?|mar(ch)?|apr(il)?|may|june?|july?|aug(ust)?|sept?(ember)?"
                    r"|oct(ober)?|nov(ember)?|dec(ember)?)\b", re.IGNORECASE)  # whole words: not "maybe"
_DATE_SHAPE = re.compile(r"\b(\d{4}[-/.]\d{1,2}|\d{1,2}[-/.]\d{1,2}[-/.]\d{2,4}|\d{8})\b")
_YEAR = re.compile(r"\b[12]\d{3}\b")


class _FixedInfo(_parser.parserinfo):  # type: ignore[misc]  # dateutil ships no types here
    """dateutil's reading, minus what depends on the day it runs."""

    def convertyear(self, year: int, century_specified: bool = False) -> int:
        """Two-digit years as POSIX strptime reads them: 69-99 are 19xx, 00-68 are 20xx."""
        if year < 100 and not century_specified:
            return year + (1900 if year >= 69 else 2000)
        return year


_INFO = _FixedInfo()

_NOON = re.compile(r"\b(?:12\s*)?(noon|midday|midnight)\b", re.IGNORECASE)
"""Words for a time of day that dateutil skips as noise ("noon" read as midnight, "12 noon" as
the year 2012): written as clock times before parsing."""
_HOUR_24 = re.compile(r"\b(\d{4}-\d{2}-\d{2})([T ])24:00(?::00(?:\.0+)?)?")
"""ISO 8601's end of day, 24:00, which datetime cannot hold: the next day's 00:00."""


def _clock_words(text: str) -> str:
    text = _NOON.sub(lambda m: "00:00" if m.group(1).lower() == "midnight" else "12:00", text)
    return _HOUR_24.sub(_next_midnight, text)


def _next_midnight(m: re.Match[str]) -> str:
    try:
        return f"{(date.fromisoformat(m.group(1)) + timedelta(days=1)).isoformat()}{m.group(2)}00:00"
    except (ValueError, OverflowError):  # not a real day, or the calendar's last one: leave it
        return m.group(0)


def _zone(name: str | None, offset: int | None) -> _tzinfo | None:
    if offset is not None:  # a numeric offset, as written
        return tzoffset(name, offset)  # type: ignore[no-any-return]
    if not name:
        return None  # no zone: taken as UTC below
    hours = _ZONES.get(name.upper())
    return tzoffset(name, int(hours * 3600)) if hours is not None else UTC


def parse_time(text: str) -> float | None:
    """UTC POSIX seconds of the time ``text`` states, or None when it states no year."""
    moment = _read(text.strip())
    return None if moment is None else to_utc(moment).timestamp()


@lru_cache(maxsize=4096)
def _read(text: str) -> datetime | None:
    """The time ``text`` states, in its own zone (naive when it names none), or None.

    Cached: a conversation repeats its session's timestamp on every turn."""
    if not text or not (_MONTH.search(text) or _DATE_SHAPE.search(text) or _YEAR.search(text)):
        return None  # a bare number is a step, a page, a session, not a year
    text = _clock_words(text)
    try:
        first: datetime = _parser.parse(text, _INFO, fuzzy=True, default=_DEFAULTS[0], tzinfos=_zone)
        second = _parser.parse(text, _INFO, fuzzy=True, default=_DEFAULTS[1], tzinfos=_zone)
        if first.year != second.year:  # the year came from our default, not from the text
            return None
        if first.year < 1000 and not _DATE_SHAPE.search(text):  # "Room 101, March"
            return None
        to_utc(first).timestamp()  # beyond what a datetime holds in UTC: OverflowError
        return first
    except (ValueError, OverflowError):  # unreadable, or out of range
        return None


_FILLER = frozenset({"t", "z", "on", "at", "of", "the", "utc", "gmt"})
"""Words a written time may hold that say nothing of which time it is."""


def observed_time(text: str) -> tuple[float | None, tuple[str, ...]]:
    """An item's ``observed_at`` at write time: its UTC seconds and the words the parser
    skipped. With skipped words the text is stored without a timestamp: "Q4 2023" would
    otherwise file the item under 4 April, where ``since`` / ``until`` would find it."""
    ts = parse_time(text)
    if ts is None:
        return None, ()
    left = _unread(text.strip())
    return (None, left) if left else (ts, ())


@lru_cache(maxsize=4096)
def _unread(text: str) -> tuple[str, ...]:
    """Words of ``text`` the date parser skipped ("Q4 2023": ``Q``; "end of 2023": ``end``).
    A time with such words was read as some other date than meant: "Q4 2023" as 4 April,
    "summer 2023" as 1 January. Cached: a conversation repeats its session's time."""
    try:
        _moment, skipped = _parser.parse(_clock_words(text), _INFO, fuzzy_with_tokens=True,
                                         default=_DEFAULTS[0], tzinfos=_zone)
    except (ValueError, OverflowError):
        return ()
    # A zone's name ("2023-05-08 EST") and words in brackets (what a JavaScript date appends:
    # "(Coordinated Universal Time)") do not move the day.
    aside = {w for part in _ASIDE.findall(text) for w in re.findall(r"[^\W_]+", part)}
    return tuple(w for tok in skipped for w in re.findall(r"[^\W_]+", tok)
                 if w.lower() not in _FILLER and w.upper() not in _ZONES and w not in aside)


_ASIDE = re.compile(r"\(([^()]*)\)")


def to_utc(moment: datetime) -> datetime:
    """``moment`` in UTC; a naive datetime is taken to be UTC already."""
    if moment.tzinfo is None:
        return moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC)


def as_timestamp(value: TimeLike, name: str = "time") -> float:
    """A time argument (``since``, ``until``) as UTC POSIX seconds; clear error otherwise."""
    if isinstance(value, bool):
        raise InvalidQueryError(f"{name} must be a datetime, a date, text or POSIX seconds, got {value!r}")
    try:
        if isinstance(value, datetime):
            return to_utc(value).timestamp()
        if isinstance(value, date):
            return datetime.combine(value, time(), tzinfo=UTC).timestamp()
        if isinstance(value, (int, float)):
            if not math.isfinite(value):
                raise InvalidQueryError(f"{name} must be a finite number of seconds, got {value!r}")
            return float(value)
    except OverflowError:
        shown = str(value)[:40]
        raise InvalidQueryError(f"{name} {shown!r} is beyond the times that can be compared") from None
    if isinstance(value, str):
        if SECONDS.fullmatch(value.strip()):  # POSIX seconds written as text (a query string)
            return float(value)
        ts, left = observed_time(value)  # the reading an item's observed_at gets
        if left:
            raise InvalidQueryError(
                f"{name} {value!r}: {' '.join(left)!r} is not part of a date that can be read, so the "
                "rest would stand for another day than meant; write the date, e.g. 2023-10-01")
        if ts is None:
            raise InvalidQueryError(f"{name} {value!r} holds no date (a year at least) that can be read")
        return ts
    raise InvalidQueryError(
        f"{name} must be a datetime, a date, text or POSIX seconds, got {type(value).__name__}")


def said_day(observed_at: str, ts: float | None) -> date | None:
    """The calendar day the speaker wrote on: ``observed_at``'s own date, in its own zone, so
    a "yesterday" said at 21:30 -04:00 counts from that evening's date, not from the UTC day
    (already the next one). The UTC day of ``ts`` when the text has no date of its own."""
    if ts is None:
        return None
    moment = _read(observed_at.strip())
    return moment.date() if moment is not None else day_of(ts)


def day_of(ts: float | None) -> date | None:
    """The UTC calendar day of a timestamp (None stays None)."""
    if ts is None:
        return None
    return datetime.fromtimestamp(ts, tz=UTC).date()


def iso(ts: float | None) -> str:
    """ISO 8601 text of a timestamp in UTC, '' for None."""
    if ts is None:
        return ""
    return datetime.fromtimestamp(ts, tz=UTC).isoformat()
