"""``manage.py check --deploy``: a production process without ``METRICS_TOKEN`` refuses every scrape."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Tags, Warning, register


@register(Tags.security, deploy=True)
def check_metrics_token(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    token = str(settings.METRICS_TOKEN).strip()
    if not token:
        return [
            Warning(
                "METRICS_TOKEN is not set: /metrics answers 401 to every scrape (with DEBUG off).",
                hint="Set METRICS_TOKEN to a long random value and give Prometheus the same as a Bearer token.",
                id="ops.W001",
            )
        ]
    if len(token) < 16:
        return [Warning("METRICS_TOKEN is shorter than 16 characters: it can be guessed.", id="ops.W002")]
    return []
