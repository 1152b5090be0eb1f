"""Time as data: an item's ``observed_at`` is parsed once, at write time, into UTC seconds.

The text is kept as written (it is what a reader sees); the parsed timestamp is what filters,
ordering by time and the relative-date step use. Parsing is python-dateutil's, with fuzzy
matching so "1:56 pm on 8 May, 2023" reads as written. A time without a zone is taken as UTC.
Text that names no year ("yesterday", "session 3") gets no timestamp rather than a guess.
"""

from __future__ import annotations

import math
from datetime import UTC, date, datetime, time
from functools import lru_cache
from typing import TypeAlias

from dateutil import parser as _parser

from ._errors import InvalidQueryError

TimeLike: TypeAlias = datetime | date | str | int | float
"""What a time argument may be: a datetime or date, text with a date in it, or POSIX seconds."""

_DEFAULTS = (datetime(2001, 1, 1), datetime(2002, 2, 2))


@lru_cache(maxsize=4096)
def parse_time(text: str) -> float | None:
    """UTC POSIX seconds of the time ``text`` states, or None when it states no year.

    Cached: a conversation repeats its session's timestamp on every turn."""
    text = text.strip()
    if not text:
        return None
    try:
        first = _parser.parse(text, fuzzy=True, default=_DEFAULTS[0])
        second = _parser.parse(text, fuzzy=True, default=_DEFAULTS[1])
    except (ValueError, OverflowError):
        return None
    if first.year != second.year:  # the year came from our default, not from the text
        return None
    return to_utc(first).timestamp()


def to_utc(moment: datetime) -> datetime:
    """``moment`` in UTC; a naive datetime is taken to be UTC already."""
    if moment.tzinfo is None:
        return moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC)


def as_timestamp(value: TimeLike, name: str = "time") -> float:
    """A time argument (``since``, ``until``) as UTC POSIX seconds; clear error otherwise."""
    if isinstance(value, bool):
        raise InvalidQueryError(f"{name} must be a datetime, a date, text or POSIX seconds, got {value!r}")
    if isinstance(value, datetime):
        return to_utc(value).timestamp()
    if isinstance(value, date):
        return datetime.combine(value, time(), tzinfo=UTC).timestamp()
    if isinstance(value, (int, float)):
        if not math.isfinite(value):
            raise InvalidQueryError(f"{name} must be a finite number of seconds, got {value!r}")
        return float(value)
    if isinstance(value, str):
        ts = parse_time(value)
        if ts is None:
            raise InvalidQueryError(f"{name} {value!r} holds no date (a year at least) that can be read")
        return ts
    raise InvalidQueryError(
        f"{name} must be a datetime, a date, text or POSIX seconds, got {type(value).__name__}")


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
