"""System checks for the engine's settings: a misconfiguration is an error at start-up."""
from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.checks import Error, register

from workflows.conf import conf


@register()
def check_settings(app_configs: Any = None, **kwargs: Any) -> list[Error]:
    errors: list[Error] = []
    if conf()["STEP_COMMIT"] not in ("sync", "async"):
        errors.append(Error(f"WORKFLOWS_STEP_COMMIT is {conf()['STEP_COMMIT']!r}; use sync or async",
                            id="workflows.E001"))
    visibility = settings.CELERY_BROKER_TRANSPORT_OPTIONS.get("visibility_timeout", 3600)
    if conf()["MAX_STEP_TIMEOUT_SECONDS"] >= visibility:
        errors.append(Error(
            f"WORKFLOWS_MAX_STEP_TIMEOUT ({conf()['MAX_STEP_TIMEOUT_SECONDS']} s) must be below the broker's "
            f"visibility timeout ({visibility} s), or Redis hands a running task to a second worker",
            id="workflows.E002",
        ))
    if conf()["LEASE_SECONDS"] <= 0:
        errors.append(Error("WORKFLOWS_LEASE_SECONDS must be positive", id="workflows.E003"))
    return errors
