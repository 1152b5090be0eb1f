"""Relative time phrases are stated against the date the turn was said, by rule."""

from datetime import date

import pytest

from suffice._timeref import annotate, resolve

THU = date(2023, 7, 20)  # a Thursday


@pytest.mark.parametrize(("text", "meaning"), [
    ("I went there yesterday.", "the day before 20 July 2023, 19 July 2023"),
    ("We met last night", "the day before 20 July 2023, 19 July 2023"),
    ("I ran a charity race last Tuesday", "the Tuesday before 20 July 2023, 18 July 2023"),
    ("last Thursday was fun", "the Thursday before 20 July 2023, 13 July 2023"),  # not today
    ("Last week I finished it", "the week before 20 July 2023"),
    ("last weekend we camped", "the weekend before 20 July 2023"),
    ("Last month I painted", "the month before 20 July 2023, June 2023"),
    ("last year was hard", "the year before 20 July 2023, 2022"),
    ("two weekends ago I hiked", "2 weekends before 20 July 2023"),
    ("I started 4 years ago", "4 years before 20 July 2023, 2019"),
    ("a few weeks ago we talked", "a few weeks before 20 July 2023"),
    ("several months ago it began", "several months before 20 July 2023"),
    ("We fly next month", "the month after 20 July 2023, August 2023"),
    ("See you next Monday", "the Monday after 20 July 2023, 24 July 2023"),
    ("today I signed up", "20 July 2023"),
])
def test_each_phrase_means_a_span_relative_to_the_turns_date(text, meaning):
    (r,) = resolve(text, THU)
    assert r.meaning == meaning and r.phrase.lower() in text.lower()


def test_month_arithmetic_crosses_year_ends():
    (r,) = resolve("last month", date(2023, 1, 5))
    assert r.meaning.endswith("December 2022")
    (r,) = resolve("in 3 months ago", date(2023, 2, 28))
    assert r.meaning.endswith("November 2022")


def test_words_that_only_contain_a_phrase_do_not_match():
    assert resolve("The lastweek report; todays news; yesterdays", THU) == []


def test_annotation_keeps_the_line_verbatim_and_adds_the_meaning():
    line = "[8:56 pm on 20 July, 2023] Caroline: I went to a conference last Tuesday."
    out = annotate(line, "I went to a conference last Tuesday.", THU)
    assert out.startswith(line)
    assert out.endswith("[last Tuesday = the Tuesday before 20 July 2023, 18 July 2023]")
    # Nothing to resolve, or no date to resolve against: the line is returned unchanged.
    assert annotate(line, "I went to a conference.", THU) == line
    assert annotate("step 3: ran tests yesterday", "ran tests yesterday", None) == \
        "step 3: ran tests yesterday"


@pytest.mark.parametrize(("question", "asks"), [
    ("When did Melanie buy the figurines?", True),
    ("How long has Melanie been practicing art?", True),
    ("In what year did Caroline move?", True),
    ("So when was the race?", True),
    ("What did Caroline research?", False),
    ("Where did Dana go kayaking?", False),
    ("Would Caroline pursue writing as a career?", False),
])
def test_a_question_that_asks_when_is_told_from_one_that_does_not(question, asks):
    from suffice._timeref import asks_time
    assert asks_time(question) is asks


def test_the_day_before_yesterday_is_two_days_back_and_the_day_after_tomorrow_two_ahead():
    (r,) = resolve("I bought it the day before yesterday.", THU)
    assert r.phrase == "the day before yesterday" and r.meaning.endswith("18 July 2023")
    (r,) = resolve("leaving the day after tomorrow evening", THU)
    assert r.phrase == "the day after tomorrow" and r.meaning.endswith("22 July 2023")
    for said in ("Day before yesterday I ran.", "I ran day before yesterday.", "the night before last"):
        (r,) = resolve(said, THU)  # without "the" it was read as yesterday
        assert r.meaning.endswith("18 July 2023"), said
    (r,) = resolve("day after tomorrow we fly", THU)
    assert r.meaning.endswith("22 July 2023")


def test_a_phrase_past_the_calendars_edge_is_left_unresolved_not_a_crash():
    assert resolve("999999 days ago", THU) == []
    assert resolve("yesterday", date(1, 1, 1)) == []
    assert resolve("next month", date(9999, 12, 5)) == []


def test_yesterday_said_in_the_evening_of_a_zone_behind_utc_is_the_day_before_that_evening():
    from suffice._times import parse_time, said_day
    when = said_day("2023-07-20T21:30:00-04:00", parse_time("2023-07-20T21:30:00-04:00"))
    assert annotate("Ana: we met yesterday", "we met yesterday", when).endswith("19 July 2023]")


@pytest.mark.parametrize(("text", "day"), [
    ("a couple days ago", "18 July 2023"), ("couple of days ago", "18 July 2023"),
    ("eleven days ago", "9 July 2023"), ("0 days ago", "20 July 2023")])
def test_more_ways_of_counting_days_back(text, day):
    (r,) = resolve(text, THU)
    assert r.meaning.endswith(day) and "0 days" not in r.meaning
