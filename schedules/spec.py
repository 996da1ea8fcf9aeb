"""When a schedule is due: cron expressions and intervals, as pure functions (no database).

``Cron.parse(text, timezone)`` reads a standard five-field expression (minute, hour, day of month,
month, day of week) or a macro (``@hourly``, ``@daily``, ``@weekly``, ``@monthly``, ``@yearly``)
and raises ``SpecError`` saying what is wrong. Fields take ``*``, numbers, ranges ``a-b``, steps
``*/n``, ``a-b/n`` and ``a/n`` (from a to the end), lists ``a,b``, and names for months (``jan``)
and weekdays (``sun``; 0 and 7 are both Sunday). As in Vixie cron, when both the day of month and
the day of week are restricted (neither starts with ``*``), a day matching either is due.

Times are wall-clock times in the schedule's time zone, and every due time is returned as an aware
UTC datetime. Where the clocks change:

- spring forward: a wall-clock time that does not exist that day (02:30 in a gap from 02:00 to
  03:00) is due at the same distance past the gap's start (03:30), once;
- fall back: a time that happens twice is due once, at its first occurrence, unless the hour field
  is ``*`` (an hourly or more frequent schedule): then it is due at both, as elapsed time runs on.

``Interval(seconds)`` is due every so many seconds, anchored to its first due time.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

MACROS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
MONTHS = {name: i for i, name in enumerate("jan feb mar apr may jun jul aug sep oct nov dec".split(), start=1)}
WEEKDAYS = {name: i for i, name in enumerate("sun mon tue wed thu fri sat".split())}
# The longest any month can be (February 29 in a leap year).
MONTH_DAYS = {1: 31, 2: 29, 3: 31, 4: 30, 5: 31, 6: 30, 7: 31, 8: 31, 9: 30, 10: 31, 11: 30, 12: 31}
# A search for the next time looks this far ahead. The rarest an accepted expression can be is a day
# that is both February 29 and a given weekday ("0 0 29 2 */2": both day fields restricted, the
# weekday's starting with "*", so both must match): up to 40 years apart (14,609 days, across 2100,
# which has no February 29). Every accepted expression has a due time in any 41 years.
HORIZON = timedelta(days=366 * 41)
MAX_INTERVAL_SECONDS = 366 * 24 * 3600


class SpecError(ValueError):
    """An expression, interval or time zone that cannot be a schedule; the message says why."""


@dataclass(frozen=True)
class Field:
    name: str
    low: int
    high: int
    names: dict[str, int]


FIELDS = (
    Field("minute", 0, 59, {}),
    Field("hour", 0, 23, {}),
    Field("day of month", 1, 31, {}),
    Field("month", 1, 12, MONTHS),
    Field("day of week", 0, 7, WEEKDAYS),
)
ITEM = re.compile(r"^(?P<range>\*|[a-z0-9]+(?:-[a-z0-9]+)?)(?:/(?P<step>[0-9]+))?$")


HOST_ZONES = frozenset({"localtime", "posixrules", "factory"})


def zone(name: str) -> ZoneInfo:
    """The IANA time zone ``name`` (``UTC``, ``Europe/London``), or SpecError."""
    if not name or name != name.strip() or name.startswith(("/", ".")) or ".." in name:
        raise SpecError(f"{name!r} is not a time zone name (e.g. UTC or Europe/London)")
    if name.lower() in HOST_ZONES:
        # The host's own setting: web, beat and workers on different machines could disagree.
        raise SpecError(f"{name!r} is each machine's own time zone; name one (e.g. UTC or Europe/London)")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise SpecError(f"no time zone is called {name!r} (e.g. UTC or Europe/London)") from None


def _value(text: str, field: Field) -> int:
    if text.isdigit():
        value = int(text)
    elif text in field.names:
        value = field.names[text]
    else:
        raise SpecError(f"{field.name}: {text!r} is not a number{' or a name' if field.names else ''}")
    if not field.low <= value <= field.high:
        raise SpecError(f"{field.name}: {value} is out of range {field.low}-{field.high}")
    return value


def parse_field(text: str, field: Field) -> frozenset[int]:
    """The values one field allows, or SpecError naming the field."""
    values: set[int] = set()
    for item in text.lower().split(","):
        match = ITEM.match(item)
        if match is None:
            raise SpecError(f"{field.name}: {item!r} is not a value, range (a-b), step (*/n, a-b/n) or *")
        step = int(match["step"]) if match["step"] is not None else 1
        if step < 1:
            raise SpecError(f"{field.name}: the step in {item!r} must be at least 1")
        if match["range"] == "*":
            low, high = field.low, field.high
        elif "-" in match["range"]:
            first, last = match["range"].split("-")
            low, high = _value(first, field), _value(last, field)
            if low > high:
                raise SpecError(f"{field.name}: {item!r} is a backwards range")
        else:
            low = _value(match["range"], field)
            high = field.high if match["step"] is not None else low  # a/n: from a to the end
        values.update(range(low, high + 1, step))
    if field.name == "day of week" and 7 in values:  # 7 is Sunday too
        values = (values - {7}) | {0}
    return frozenset(values)


@dataclass(frozen=True)
class Cron:
    text: str
    tz: ZoneInfo
    minutes: frozenset[int]
    hours: frozenset[int]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]  # 0 = Sunday
    any_day: bool  # the day of month field starts with *
    any_weekday: bool  # the day of week field starts with *
    any_hour: bool  # the hour field starts with *: the repeated hour of a fall back is due twice

    @classmethod
    def parse(cls, text: str, timezone: str = "UTC") -> Cron:
        tz = zone(timezone)
        expanded = MACROS.get(text.strip().lower(), text)
        if expanded.strip().startswith("@"):
            raise SpecError(f"{text.strip()!r} is not a macro this scheduler knows: {', '.join(MACROS)}")
        parts = expanded.split()
        if len(parts) != 5:
            raise SpecError(
                f"a cron expression has 5 fields (minute hour day-of-month month day-of-week), "
                f"not {len(parts)}: {text!r}"
            )
        minutes, hours, days, months, weekdays = (parse_field(p, f) for p, f in zip(parts, FIELDS))
        cron = cls(
            text=text.strip(),
            tz=tz,
            minutes=minutes,
            hours=hours,
            days=days,
            months=months,
            weekdays=weekdays,
            any_day=parts[2].startswith("*"),
            any_weekday=parts[4].startswith("*"),
            any_hour=parts[1].startswith("*"),
        )
        if cron.any_weekday and not any(d <= MONTH_DAYS[m] for d in days for m in months):
            raise SpecError(f"{text.strip()!r} never fires: none of its months has those days")
        return cron

    def day_matches(self, day: datetime) -> bool:
        in_month = day.day in self.days
        in_week = (day.isoweekday() % 7) in self.weekdays
        if self.any_day or self.any_weekday:
            return in_month and in_week
        return in_month or in_week  # both restricted: either (Vixie cron)

    def next_after(self, after: datetime) -> datetime:
        """The first due time strictly after ``after`` (aware), in UTC.

        Wall-clock order is instant order except within a few hours of a clock change, so the
        fast path takes the first wall-clock time past ``after`` that matches; near a change (the
        zone's offset differs three hours either side of ``after`` or of that time) the search
        starts three hours earlier in wall-clock time and takes the earliest instant."""
        local = after.astimezone(self.tz).replace(tzinfo=None, second=0, microsecond=0)
        _, found = self._scan(local + timedelta(minutes=1), after, local + HORIZON)
        if self._steady(after) and self._steady(found):
            return found
        wall, best = self._scan(local - timedelta(hours=3), after, local + HORIZON)
        limit = wall + timedelta(hours=3)
        while True:  # and any later wall-clock time up to three hours on that is an earlier instant
            try:
                wall, instant = self._scan(wall + timedelta(minutes=1), after, limit)
            except SpecError:
                return best
            best = min(best, instant)

    def _steady(self, instant: datetime) -> bool:
        span = timedelta(hours=3)
        return (instant - span).astimezone(self.tz).utcoffset() == (instant + span).astimezone(self.tz).utcoffset()

    def _scan(self, local: datetime, after: datetime, limit: datetime) -> tuple[datetime, datetime]:
        """The first matching wall-clock time from ``local`` (naive) before ``limit`` whose instant
        is after ``after``: (wall-clock time, instant in UTC); SpecError if there is none."""
        while local < limit:
            if local.month not in self.months:
                local = datetime(local.year + local.month // 12, local.month % 12 + 1, 1)
            elif not self.day_matches(local):
                local = datetime(local.year, local.month, local.day) + timedelta(days=1)
            elif local.hour not in self.hours:
                local = local.replace(minute=0) + timedelta(hours=1)
            elif local.minute not in self.minutes:
                local += timedelta(minutes=1)
            else:
                found = self._instant_after(local, after)
                if found is not None:
                    return local, found
                local += timedelta(minutes=1)
        raise SpecError(f"{self.text!r} has no due time in the {HORIZON.days // 366} years after {after:%Y-%m-%d}")

    def _instant_after(self, wall: datetime, after: datetime) -> datetime | None:
        """The instant of wall-clock time ``wall`` that is after ``after``, or None. fold=0 is the
        first of a repeated time and, for a time in a gap, the same distance past the gap's start;
        fold=1, the second of a repeated time, only for schedules whose hour field is *."""
        first = wall.replace(tzinfo=self.tz, fold=0).astimezone(UTC)
        if first > after:
            return first
        if self.any_hour:
            second = wall.replace(tzinfo=self.tz, fold=1).astimezone(UTC)
            if second > after:
                return second
        return None

    def latest_due(self, first: datetime, now: datetime) -> datetime:
        """The last due time at or before ``now``, counting from the due time ``first`` (<= now)."""
        latest = first
        if now - first > timedelta(days=2):
            # After a long downtime start from the last day (a frequent schedule missed thousands).
            recent = self.next_after(now - timedelta(days=1))
            if recent <= now:
                latest = recent
        while (following := self.next_after(latest)) <= now:
            latest = following
        return latest

    def describe(self) -> str:
        return f"cron {self.text} ({self.tz.key})"


@dataclass(frozen=True)
class Interval:
    seconds: int

    @classmethod
    def of(cls, seconds: int | None) -> Interval:
        if seconds is None or isinstance(seconds, bool) or not 1 <= seconds <= MAX_INTERVAL_SECONDS:
            raise SpecError(f"an interval is 1 to {MAX_INTERVAL_SECONDS} seconds (366 days), not {seconds!r}")
        return cls(seconds)

    def next_after(self, after: datetime) -> datetime:
        """When a schedule armed at ``after`` is first due (its later due times follow from it)."""
        return (after + timedelta(seconds=self.seconds)).astimezone(UTC)

    def latest_due(self, first: datetime, now: datetime) -> datetime:
        step = timedelta(seconds=self.seconds)
        return first + step * ((now - first) // step)

    def describe(self) -> str:
        return f"every {_seconds_in_words(self.seconds)}"


def _seconds_in_words(seconds: int) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


Spec = Cron | Interval


def spec_of(*, cron: str, interval_seconds: int | None, timezone: str) -> Spec:
    """Exactly one of ``cron`` and ``interval_seconds``, checked; SpecError otherwise."""
    if cron and interval_seconds is not None:
        raise SpecError("a schedule has either a cron expression or an interval, not both")
    if cron:
        return Cron.parse(cron, timezone)
    if interval_seconds is None:
        raise SpecError("a schedule needs a cron expression or an interval")
    zone(timezone)
    return Interval.of(interval_seconds)
