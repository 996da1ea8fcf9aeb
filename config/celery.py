import gc
import logging
import os
from typing import Any

from celery import Celery, Task, signals

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

from config.broker import guard_restore_after_connection_loss  # noqa: E402

guard_restore_after_connection_loss()  # kombu's restore on a lost Redis connection kills the worker

app = Celery("config")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


class RoutineBeatLines(logging.Filter):
    """Beat's "Scheduler: Sending due task <entry>" line, left out for entries due more often than once
    a minute (the sweeps, the schedules' tick): at INFO, as scripts/run.sh logs, the sweep alone wrote
    one a second and buried the lines worth reading. What those tasks do is logged by the tasks."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not str(record.msg).startswith("Scheduler: Sending due task") or not isinstance(record.args, tuple):
            return True
        return not (record.args and record.args[0] in _frequent_entries())


def _frequent_entries() -> set[str]:
    from django.conf import settings

    frequent = set()
    for name, entry in settings.CELERY_BEAT_SCHEDULE.items():
        every = entry.get("schedule")
        if isinstance(every, int | float) and every < 60:
            frequent.add(name)
    return frequent


logging.getLogger("celery.beat").addFilter(RoutineBeatLines())


@signals.task_prerun.connect  # type: ignore[untyped-decorator]  # celery has no types
@signals.task_postrun.connect  # type: ignore[untyped-decorator]  # celery has no types
def close_old_connections(task: Task | None = None, **kwargs: Any) -> None:
    """Around each task, what Django does around each request: close a database connection that is
    past CONN_MAX_AGE or errored and is no longer usable; keep the others (settings.CELERY_DB_REUSE_MAX
    turns off Celery's closing of every connection)."""
    if task is not None and task.request.is_eager:
        return  # inside the caller's transaction
    from django.db import close_old_connections

    close_old_connections()


@signals.worker_process_init.connect  # type: ignore[untyped-decorator]  # celery has no types
def freeze_loaded_objects(**kwargs: Any) -> None:
    """A worker process has loaded Django and the apps (a prefork child, after the fork): what it
    holds now lives as long as it does, so the collector's full collections need not walk it (as in
    config/asgi.py)."""
    gc.freeze()


@signals.worker_process_shutdown.connect  # type: ignore[untyped-decorator]  # celery has no types
def mark_metrics_process_dead(pid: int | None = None, **kwargs: Any) -> None:
    """A prefork child ends: prometheus-client's multiprocess mode drops its live gauges' files
    (its counters and histograms stay, so totals never go down). Nothing to do without the folder."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(pid or os.getpid())  # type: ignore[no-untyped-call]  # not annotated
