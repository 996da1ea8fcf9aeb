"""The system check of the tick's settings. Schedules themselves are rows, checked when they are
saved (``Schedule.clean``, ``manage.py schedules add``); none are kept in settings."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Error, register


@register()
def check_tick(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    entry = settings.CELERY_BEAT_SCHEDULE.get("schedules-tick")
    if entry is None or entry.get("task") != "schedules.tick":
        return [
            Error(
                "CELERY_BEAT_SCHEDULE has no 'schedules-tick' entry for the task schedules.tick: "
                "no schedule would fire",
                id="schedules.E001",
            )
        ]
    interval = settings.SCHEDULES_TICK_INTERVAL
    if not isinstance(interval, int | float) or not 0 < interval <= 60:
        return [
            Error(
                f"SCHEDULES_TICK_INTERVAL is {interval!r}; use more than 0 and at most 60 seconds "
                "(a schedule fires up to one tick late)",
                id="schedules.E002",
            )
        ]
    return []
