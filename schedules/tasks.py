"""The beat entry ``schedules-tick`` sends this task every SCHEDULES_TICK_INTERVAL seconds."""

from __future__ import annotations

from celery import shared_task

from schedules.services import schedules_tick

TICK_TASK = "schedules.tick"


@shared_task(name=TICK_TASK)  # type: ignore[untyped-decorator]  # celery has no types
def tick() -> dict[str, int]:
    report = schedules_tick()
    return {"fired": len(report.fired), "armed": report.armed, "disabled": len(report.disabled)}
