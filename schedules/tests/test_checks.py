"""The system check: without the beat entry, or with a tick interval out of bounds, start-up
says so (schedules are rows, checked when saved; none are kept in settings)."""

from __future__ import annotations

from typing import Any

from schedules.checks import check_tick


def test_the_settings_as_shipped_pass() -> None:
    assert check_tick() == []


def test_a_missing_beat_entry_or_a_bad_interval_is_an_error(settings: Any) -> None:
    settings.SCHEDULES_TICK_INTERVAL = 0
    assert [e.id for e in check_tick()] == ["schedules.E002"]
    settings.SCHEDULES_TICK_INTERVAL = 120
    assert [e.id for e in check_tick()] == ["schedules.E002"]

    settings.CELERY_BEAT_SCHEDULE = {k: v for k, v in settings.CELERY_BEAT_SCHEDULE.items() if k != "schedules-tick"}
    assert [e.id for e in check_tick()] == ["schedules.E001"]
