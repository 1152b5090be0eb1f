"""Time as data: ``observed_at`` text is parsed once into UTC seconds; time arguments are checked."""

from datetime import UTC, date, datetime, timedelta, timezone

import pytest

from suffice import InvalidQueryError
from suffice._times import as_timestamp, day_of, parse_time

THU = date(2023, 7, 20)


@pytest.mark.parametrize("stamp", ["8:56 pm on 20 July, 2023", "2023-07-20T20:56:00",
                                   "2023-07-20", "July 20, 2023", "20 Jul 2023",
                                   "Thu, 20 Jul 2023 08:00:00 GMT"])
def test_stored_timestamps_give_their_calendar_date(stamp):
    assert day_of(parse_time(stamp)) == THU


def test_the_time_of_day_and_the_zone_are_kept():
    assert parse_time("1:56 pm on 8 May, 2023") == datetime(2023, 5, 8, 13, 56, tzinfo=UTC).timestamp()
    # A stated zone is honoured; a time without one is taken as UTC.
    assert parse_time("2023-07-20T20:56:00+02:00") == datetime(2023, 7, 20, 18, 56, tzinfo=UTC).timestamp()


@pytest.mark.parametrize(("stamp", "moment"), [
    ("noon on 8 May 2023", datetime(2023, 5, 8, 12)),  # dateutil alone: midnight
    ("12 noon, 8 May 2023", datetime(2023, 5, 8, 12)),  # dateutil alone: the year 2012
    ("Midday, 8 May 2023", datetime(2023, 5, 8, 12)),
    ("midnight on 8 May 2023", datetime(2023, 5, 8)),
    ("2023-05-08T24:00", datetime(2023, 5, 9)),  # ISO 8601's end of day (dateutil: no time)
    ("2023-12-31 24:00:00Z", datetime(2024, 1, 1)),
    ("Noonan's party, 8 May 2023", datetime(2023, 5, 8)),  # a word that starts with noon is a word
])
def test_times_of_day_in_words_and_the_end_of_day_read_as_clock_times(stamp, moment):
    assert parse_time(stamp) == moment.replace(tzinfo=UTC).timestamp()


@pytest.mark.parametrize("stamp", ["", "   ", "step 14", "yesterday", "session 3 of 10", "2023-13-45",
                                   "31 February, 2023", "May 8", "session 42", "step 250", "page 300",
                                   "v2.3.1 release", "Room 101, March", "maybe 42", "a novel of 99 pages",
                                   "9999-12-31T23:59:59-05:00", "0001-01-01T00:00:00+05:00",
                                   "2023-02-30T24:00", "9999-12-31T24:00"])
def test_text_without_a_readable_date_and_year_gives_none(stamp):
    assert parse_time(stamp) is None


def test_time_arguments_accept_datetimes_dates_text_and_seconds():
    berlin = timezone(timedelta(hours=2))
    assert (as_timestamp(datetime(2023, 7, 20, 2, 0, tzinfo=berlin))
            == datetime(2023, 7, 20, 0, 0, tzinfo=UTC).timestamp())
    assert as_timestamp(THU) == datetime(2023, 7, 20, tzinfo=UTC).timestamp()
    assert as_timestamp("20 July 2023") == as_timestamp(THU)
    assert as_timestamp(1_700_000_000) == 1_700_000_000.0


@pytest.mark.parametrize("bad", ["next week sometime", float("nan"), True, [2023]])
def test_a_time_argument_that_names_no_time_is_a_clear_error(bad):
    with pytest.raises(InvalidQueryError, match="since"):
        as_timestamp(bad, "since")


def test_nothing_depends_on_the_machine_zone_names_and_two_digit_years_are_fixed():
    # EST is UTC-5 wherever this runs (dateutil alone read it as the machine's zone, or dropped it)
    assert parse_time("2023-07-20 20:56 EST") == datetime(2023, 7, 21, 1, 56, tzinfo=UTC).timestamp()
    assert parse_time("2023-07-20 20:56 CEST") == datetime(2023, 7, 20, 18, 56, tzinfo=UTC).timestamp()
    assert parse_time("2023-07-20 20:56 XYZT") == datetime(2023, 7, 20, 20, 56, tzinfo=UTC).timestamp()
    # two-digit years pivot as strptime does, not on today's year
    from suffice._times import _INFO
    assert [_INFO.convertyear(y) for y in (76, 69, 68, 0)] == [1976, 1969, 2068, 2000]
    assert day_of(parse_time("8 May, 76")) == date(1976, 5, 8)
    assert day_of(parse_time("03/04/2025")) == date(2025, 3, 4)  # month first, as documented


def test_seconds_as_text_are_seconds_and_a_short_number_is_a_year():
    assert as_timestamp("1689811200") == 1_689_811_200.0
    assert as_timestamp("2023") == datetime(2023, 1, 1, tzinfo=UTC).timestamp()


@pytest.mark.parametrize("huge", [10**400, datetime(9999, 12, 31, 23, tzinfo=timezone(timedelta(hours=-5)))])
def test_a_time_beyond_what_can_be_compared_is_a_clear_error(huge):
    with pytest.raises(InvalidQueryError, match="beyond the times"):
        as_timestamp(huge, "since")


def test_a_turns_day_is_the_one_its_speaker_wrote_not_the_utc_day():
    from suffice._times import said_day
    evening = "2023-07-20T21:30:00-04:00"  # already 21 July in UTC
    assert day_of(parse_time(evening)) == date(2023, 7, 21)
    assert said_day(evening, parse_time(evening)) == THU
    assert said_day("8 May, 2023", parse_time("8 May, 2023")) == date(2023, 5, 8)
    assert said_day("", None) is None and said_day("session 3", None) is None


@pytest.mark.parametrize("text", ["Q4 2023", "H2 2023", "end of 2023", "summer 2023", "1 mei 2023"])
def test_a_time_argument_with_words_no_date_reader_knows_is_refused(text):
    """Read leniently, "Q4 2023" is 4 April and "summer 2023" 1 January: a filter on the wrong
    window with no error. Refused instead, naming the word."""
    with pytest.raises(InvalidQueryError, match="is not part of a date"):
        as_timestamp(text, "since")


@pytest.mark.parametrize("text", ["2023-05-08T10:00:00Z", "May 8, 2023", "1:56 pm on 8 May, 2023",
                                  "8 May 2023 at 10am", "Monday, 8 May 2023", "8th of May 2023",
                                  "Sun, 08 May 2023 10:00:00 GMT", "March 2024", "2023"])
def test_written_dates_with_filler_words_are_still_read(text):
    assert as_timestamp(text, "since") > 0


@pytest.mark.parametrize("text", ["Q4 2023", "week 3 of 2024", "summer 2023", "Christmas 2023"])
def test_an_observed_at_the_reader_would_misread_is_stored_without_a_timestamp(memory, text):
    """Read leniently these are 1 April, 1 March, 1 January: an item filed under a day it never
    named. It is kept, text as written, without a timestamp, and the add says why."""
    with pytest.warns(UserWarning, match="stored without a timestamp"):
        (it,) = memory.add("We shipped the release.", scope="s", observed_at=text)
    assert it.observed_ts is None and it.observed_at == text
    assert memory.items(scope="s", since="2000-01-01") == []


def test_an_observed_at_with_only_filler_words_keeps_its_timestamp(memory):
    (it,) = memory.add("We shipped the release.", scope="s", observed_at="1:56 pm on 8 May, 2023")
    assert it.observed_ts == parse_time("8 May 2023 13:56")


@pytest.mark.parametrize(("text", "same_as"), [
    ("Tue Jun 20 2023 10:00:00 GMT+0000 (Coordinated Universal Time)", "2023-06-20T10:00:00Z"),
    ("2023-05-08 EST", "2023-05-08"), ("8 May 2023 PST", "2023-05-08")])
def test_a_zone_name_or_a_bracketed_aside_does_not_cost_a_date_its_timestamp(memory, text, same_as):
    """A JavaScript Date's text and a date with a zone name are read as they always were."""
    (it,) = memory.add("We shipped the release.", scope="s", observed_at=text)
    assert it.observed_ts == parse_time(same_as)
    assert as_timestamp(text, "since") == parse_time(same_as)
