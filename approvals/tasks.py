"""Celery tasks: thin over the services."""

from __future__ import annotations

from celery import shared_task

from approvals import services


@shared_task(name="approvals.sweep")  # type: ignore[untyped-decorator]  # celery has no types
def sweep() -> int:
    """Cancel pending requests whose run ended or was restarted (see services.cancel_orphans)."""
    return services.cancel_orphans()
