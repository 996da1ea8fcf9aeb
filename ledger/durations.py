"""Durations as operators type them: ``30s``, ``10m``, ``2h``, ``90d``, ``2w``."""

from __future__ import annotations

import re
from argparse import ArgumentParser, ArgumentTypeError
from datetime import datetime, timedelta

from django.utils import timezone

_DURATION = re.compile(r"^\s*(\d+)\s*([smhdw])\s*$", re.IGNORECASE)
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}


class InvalidDuration(ValueError):
    pass


def parse_duration(text: str) -> timedelta:
    """``10m`` → 10 minutes. A whole number and one unit (s, m, h, d, w); anything else, or a
    duration so large it overflows, is an InvalidDuration saying what was expected."""
    match = _DURATION.match(text)
    if match is None:
        raise InvalidDuration(
            f"{text!r} is not a duration: use a whole number and a unit, e.g. 30s, 10m, 2h, 90d or 2w"
        )
    amount, unit = int(match.group(1)), match.group(2).lower()
    try:
        return timedelta(**{_UNITS[unit]: amount})
    except OverflowError:
        raise InvalidDuration(f"{text!r} is too long a duration") from None


def duration_argument(text: str) -> timedelta:
    """``parse_duration`` as an argparse ``type``: bad input is a usage error naming the option."""
    try:
        return parse_duration(text)
    except InvalidDuration as exc:
        raise ArgumentTypeError(str(exc)) from None


def describe(duration: timedelta) -> str:
    """``timedelta(days=90)`` → ``90d``: the largest unit that divides it."""
    seconds = int(duration.total_seconds())
    for unit, size in (("w", 604800), ("d", 86400), ("h", 3600), ("m", 60)):
        if seconds and seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def add_retention_arguments(parser: ArgumentParser, *, which: str, setting: str, days: int) -> None:
    """A purge command's ``--older-than DURATION`` and ``--dry-run``; ``which`` says what goes
    (``"records received"``), ``setting`` and ``days`` the default."""
    parser.add_argument(
        "--older-than",
        type=duration_argument,
        metavar="DURATION",
        help=f"Delete {which} longer ago than this, e.g. 30d, 12w, 36h (default {setting}, now {days}d).",
    )
    parser.add_argument("--dry-run", action="store_true", help="Count what would be deleted; delete nothing.")


def purge_report(
    *, deleted: str, cutoff: datetime, dry_run: bool, older_than: timedelta | None, default_days: int
) -> list[str]:
    """What a purge command prints: ``Deleted 3 webhook delivery record(s) received before
    2026-12-01 04:00:00 (older than 30d).`` (``deleted``: what went, counted, up to "before"), and
    that a dry run deleted nothing."""
    age = describe(older_than) if older_than is not None else f"{default_days}d"
    when = timezone.localtime(cutoff).strftime("%Y-%m-%d %H:%M:%S")
    lines = [f"{'Would delete' if dry_run else 'Deleted'} {deleted} before {when} (older than {age})."]
    if dry_run:
        lines.append("Dry run: nothing was deleted.")
    return lines
