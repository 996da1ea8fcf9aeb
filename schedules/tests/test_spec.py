"""When a schedule is due: cron fields, macros, the day-of-month/day-of-week rule, intervals, the
latest due time missed, clock changes in a time zone, and expressions refused with a reason.

Pure functions: no database."""

from __future__ import annotations

import calendar
import re
from datetime import UTC, datetime, timedelta

import pytest

from schedules.spec import Cron, Interval, SpecError, spec_of


def at(year: int, month: int, day: int, hour: int = 0, minute: int = 0, second: int = 0) -> datetime:
    return datetime(year, month, day, hour, minute, second, tzinfo=UTC)


def following(cron: Cron, start: datetime, n: int) -> list[datetime]:
    times, t = [], start
    for _ in range(n):
        t = cron.next_after(t)
        times.append(t)
    return times


@pytest.mark.parametrize(
    ("expression", "after", "expected"),
    [
        ("30 2 * * *", at(2025, 1, 1, 2, 30), at(2025, 1, 2, 2, 30)),  # strictly after
        ("30 2 * * *", at(2025, 1, 1, 2, 29, 59), at(2025, 1, 1, 2, 30)),
        ("*/15 * * * *", at(2025, 1, 1, 10, 1), at(2025, 1, 1, 10, 15)),
        ("0 9-17/4 * * *", at(2025, 1, 1, 14), at(2025, 1, 1, 17)),  # 9, 13, 17
        ("5,10 0 * * *", at(2025, 1, 1, 0, 7), at(2025, 1, 1, 0, 10)),
        ("0 0 * * mon", at(2025, 1, 1), at(2025, 1, 6)),  # 2025-01-01 is a Wednesday
        ("0 0 * * 7", at(2025, 1, 1), at(2025, 1, 5)),  # 7 is Sunday, as 0 is
        ("0 0 1 jan-mar/2 *", at(2025, 1, 2), at(2025, 3, 1)),
        ("0 0 29 2 *", at(2025, 1, 1), at(2028, 2, 29)),  # the next leap year
        ("30 4 1 * fri", at(2025, 1, 1, 5), at(2025, 1, 3, 4, 30)),  # day of month OR day of week
        ("30 4 */10 * fri", at(2025, 1, 1, 5), at(2025, 1, 31, 4, 30)),  # a * field: AND (1, 11, 21, 31)
        ("@hourly", at(2025, 1, 1, 10, 0, 1), at(2025, 1, 1, 11)),
        ("@weekly", at(2025, 1, 1), at(2025, 1, 5)),
        ("@yearly", at(2025, 6, 1), at(2026, 1, 1)),
        ("0 0 31 * *", at(2025, 1, 31, 1), at(2025, 3, 31)),  # February has none
    ],
)
def test_next_after(expression: str, after: datetime, expected: datetime) -> None:
    assert Cron.parse(expression).next_after(after) == expected


def test_a_time_zone_reads_the_fields_as_its_wall_clock() -> None:
    # 09:00 in New York is 14:00 UTC in winter, 13:00 in summer.
    cron = Cron.parse("0 9 * * *", "America/New_York")

    assert cron.next_after(at(2025, 1, 10)) == at(2025, 1, 10, 14)
    assert cron.next_after(at(2025, 7, 10)) == at(2025, 7, 10, 13)


def test_spring_forward_a_missing_time_fires_once_past_the_gap() -> None:
    # Europe/London, 2025-03-30: 01:00 GMT jumps to 02:00 BST (01:00 UTC); 01:30 does not exist.
    daily = Cron.parse("30 1 * * *", "Europe/London")
    hourly = Cron.parse("30 * * * *", "Europe/London")

    assert following(daily, at(2025, 3, 29, 12), 2) == [at(2025, 3, 30, 1, 30), at(2025, 3, 31, 0, 30)]
    # Elapsed time runs on: one firing an hour, none lost, none twice.
    assert following(hourly, at(2025, 3, 29, 23), 3) == [
        at(2025, 3, 29, 23, 30),
        at(2025, 3, 30, 0, 30),
        at(2025, 3, 30, 1, 30),
    ]


def test_fall_back_a_repeated_time_fires_once_unless_the_hour_is_a_star() -> None:
    # Europe/London, 2025-10-26: 02:00 BST goes back to 01:00 GMT; 01:30 happens twice.
    daily = Cron.parse("30 1 * * *", "Europe/London")
    hourly = Cron.parse("30 * * * *", "Europe/London")

    assert following(daily, at(2025, 10, 25, 12), 2) == [at(2025, 10, 26, 0, 30), at(2025, 10, 27, 1, 30)]
    assert following(hourly, at(2025, 10, 26, 0), 3) == [
        at(2025, 10, 26, 0, 30),
        at(2025, 10, 26, 1, 30),
        at(2025, 10, 26, 2, 30),
    ]


@pytest.mark.parametrize("weekdays", ["*/7", "*/2", "*/3"])
def test_february_29_on_given_weekdays_is_found_however_far_ahead(weekdays: str) -> None:
    # both day fields restricted, the weekday's starting with "*": February 29 AND one of those
    # weekdays, which recur up to 40 years apart (across 2100, which has no February 29)
    cron = Cron.parse(f"0 0 29 2 {weekdays}")
    for start in (2025, 2033, 2061, 2090, 2096):
        leap_days = (datetime(year, 2, 29, tzinfo=UTC) for year in range(start, start + 60) if calendar.isleap(year))
        expected = next(day for day in leap_days if day.isoweekday() % 7 in cron.weekdays)
        assert cron.next_after(at(start, 1, 1)) == expected


def test_the_latest_due_time_missed() -> None:
    cron = Cron.parse("0 * * * *")
    every_minute = Cron.parse("* * * * *")
    interval = Interval.of(90)

    assert cron.latest_due(at(2025, 1, 1, 3), at(2025, 1, 1, 7, 59)) == at(2025, 1, 1, 7)
    assert cron.latest_due(at(2025, 1, 1, 3), at(2025, 1, 1, 3, 5)) == at(2025, 1, 1, 3)
    # A week down: the last minute, found without stepping through ten thousand.
    assert every_minute.latest_due(at(2025, 1, 1), at(2025, 1, 8, 5, 3, 7)) == at(2025, 1, 8, 5, 3)
    # An interval keeps its phase: 00:00:00, 00:01:30, 00:03:00, ...
    assert interval.latest_due(at(2025, 1, 1), at(2025, 1, 1, 0, 4)) == at(2025, 1, 1, 0, 3)
    assert interval.next_after(at(2025, 1, 1, 0, 3)) == at(2025, 1, 1, 0, 4, 30)


@pytest.mark.parametrize(
    ("expression", "problem"),
    [
        ("", "5 fields"),
        ("* * * *", "day-of-week), not 4"),
        ("* * * * * *", "not 6"),
        ("60 * * * *", "minute: 60 is out of range 0-59"),
        ("* 24 * * *", "hour: 24 is out of range 0-23"),
        ("* * 0 * *", "day of month: 0 is out of range 1-31"),
        ("* * * 13 *", "month: 13 is out of range 1-12"),
        ("* * * * 8", "day of week: 8 is out of range 0-7"),
        ("5-1 * * * *", "backwards range"),
        ("*/0 * * * *", "step in '*/0' must be at least 1"),
        ("x * * * *", "minute: 'x' is not a number"),
        ("* * * foo *", "month: 'foo' is not a number or a name"),
        ("1,,2 * * * *", "is not a value"),
        ("0 0 30 2 *", "never fires"),
        ("@reboot", "not a macro"),
    ],
)
def test_bad_expressions_are_refused_with_the_reason(expression: str, problem: str) -> None:
    with pytest.raises(SpecError, match=re.escape(problem)):
        Cron.parse(expression)


def test_bad_intervals_zones_and_combinations() -> None:
    for seconds in (0, -5, 366 * 86400 + 1, None):
        with pytest.raises(SpecError, match="an interval is 1 to"):
            Interval.of(seconds)
    for zone in ("Mars/Olympus", "", "../etc/passwd", "/etc/localtime", "localtime", "Factory"):
        with pytest.raises(SpecError, match="time zone"):
            Cron.parse("* * * * *", zone)
    with pytest.raises(SpecError, match="not both"):
        spec_of(cron="* * * * *", interval_seconds=60, timezone="UTC")
    with pytest.raises(SpecError, match="needs a cron expression or an interval"):
        spec_of(cron="", interval_seconds=None, timezone="UTC")
    assert spec_of(cron="", interval_seconds=60, timezone="UTC").next_after(at(2025, 1, 1)) == at(
        2025, 1, 1
    ) + timedelta(minutes=1)
