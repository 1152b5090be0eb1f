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


@pytest.mark.parametrize("stamp", ["", "   ", "step 14", "yesterday", "session 3 of 10", "2023-13-45",
                                   "31 February, 2023", "May 8"])
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
