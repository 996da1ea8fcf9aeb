"""Celery tasks: the later action of one webhook delivery, and the sweep of lost ones (beat).

Nothing in ``webhooks`` imports this module: the services send these tasks by their names.
"""

from __future__ import annotations

from celery import shared_task

from webhooks import services


@shared_task(name=services.ACT_TASK)  # type: ignore[untyped-decorator]  # celery has no types
def act(delivery_id: int, tries: int = 0) -> str:
    delivery = services.delivery_act(delivery_id, tries)
    return "not this try" if delivery is None else delivery.action_state


@shared_task(name=services.SWEEP_TASK)  # type: ignore[untyped-decorator]  # celery has no types
def sweep() -> int:
    return services.delivery_sweep()
