"""The system checks of the configured webhook sources (a bad source is an error at start-up) and
of the later actions' settings."""

from __future__ import annotations

from typing import Any

from django.conf import settings
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
    messages.extend(shared_secrets())
    return messages


def shared_secrets() -> list[CheckMessage]:
    """A secret configured for two sources: a delivery signed for one is accepted by the other as
    well (no scheme signs the source's name), so one event captured on its way to the first could
    be acted on by both."""
    owners: dict[str, list[str]] = {}
    for name, raw in raw_sources().items():
        secrets = raw.get("secrets") if isinstance(raw, dict) else None
        for secret in set(secrets) if isinstance(secrets, list) else ():
            if isinstance(secret, str):
                owners.setdefault(secret, []).append(str(name))
    return [
        Warning(
            f"webhook sources {', '.join(map(repr, sorted(names)))} share a secret: a delivery signed for one "
            "is accepted by the others too",
            hint="Give each source a secret of its own.",
            id="webhooks.W002",
        )
        for names in owners.values()
        if len(names) > 1
    ]


@register()
def check_act_settings(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """A later action needs at least one try, and the sweep a grace past a try's due time."""
    messages: list[CheckMessage] = []
    for name, low in (("WEBHOOKS_ACT_ATTEMPTS", 1), ("WEBHOOKS_ACT_GRACE_SECONDS", 1)):
        value = getattr(settings, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < low:
            problem = f"{name} must be a whole number of at least {low}, not {value!r}"
            messages.append(Error(problem, id="webhooks.E002"))
    return messages
