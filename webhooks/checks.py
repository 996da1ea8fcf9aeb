"""The system check of the configured webhook sources: a bad source is an error at start-up."""

from __future__ import annotations

from typing import Any

from django.core.checks import CheckMessage, Error, Warning, register

from webhooks.conf import raw_sources, source_problems


@register()
def check_sources(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    messages: list[CheckMessage] = []
    for name, raw in raw_sources().items():
        if isinstance(raw, dict) and raw.get("secrets") == []:
            # Allowed (the default source without DEBUG and without its secret), but said.
            messages.append(
                Warning(
                    f"webhook source {name!r} has no secret: every delivery to it is refused (401 no_secret)",
                    hint="Set its secret (SANDBOX_WEBHOOK_SECRET for the default source) or remove the source.",
                    id="webhooks.W001",
                )
            )
        for problem in source_problems(name, raw):
            messages.append(Error(f"webhook source {name!r}: {problem}", id="webhooks.E001"))
    return messages
