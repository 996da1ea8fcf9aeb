"""The configured webhook sources (settings.WEBHOOK_SOURCES), read into typed values.

``sources()`` is what the endpoint, the admin and the command use; ``source_problems(name, raw)``
is what the system check reports (``webhooks.checks``), so a bad source stops start-up with a
clear message instead of answering its sender 500s. Read once per value of the setting (checking
every source on every delivery cost a webhook about 50 µs): a test that sets WEBHOOK_SOURCES, or
HTTP_MAX_BODY_BYTES, which a source's check reads, sees its value at the next call. A source's
check also asks the workflow and agent registries, which are filled at start-up, before any call.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.core.signals import setting_changed
from django.dispatch import receiver

from webhooks.verify import SCHEMES, secret_bytes

DEFAULT_TOLERANCE_SECONDS = 300
DEFAULT_MAX_BODY_BYTES = 256 * 1024
# When a source's action runs: "now", in the transaction that accepts the delivery, before its answer
# (the sender is told if the event cannot be acted on); "later", in a worker after the 202 (README
# "Acting now or later").
ACT_WHEN = ("now", "later")
SOURCE_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789-_")


@dataclass(frozen=True)
class Source:
    name: str
    scheme: str
    secrets: tuple[str, ...] = field(repr=False)  # never printed: repr, the admin and logs leave them out
    action: dict[str, Any]
    tolerance_seconds: int = DEFAULT_TOLERANCE_SECONDS
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    act: str = "now"


def raw_sources() -> dict[str, Any]:
    value = getattr(settings, "WEBHOOK_SOURCES", {})
    return value if isinstance(value, dict) else {}


# (the setting's value, its sources): checked again only for another value of the setting.
_read: tuple[object, dict[str, Source]] | None = None


@receiver(setting_changed)
def _forget(*, setting: str, **kwargs: Any) -> None:
    global _read
    if setting in ("WEBHOOK_SOURCES", "HTTP_MAX_BODY_BYTES"):
        _read = None


def sources() -> dict[str, Source]:
    """The sources without problems (a bad one is reported by the system check, and unknown here).
    Shared: not to be changed."""
    global _read
    raw = raw_sources()
    if _read is not None and _read[0] is raw:
        return _read[1]
    found = _read_sources(raw)
    _read = (raw, found)
    return found


def _read_sources(raw_by_name: dict[str, Any]) -> dict[str, Source]:
    found: dict[str, Source] = {}
    for name, raw in raw_by_name.items():
        if not source_problems(name, raw):
            found[name] = Source(
                name=name,
                scheme=raw["scheme"],
                secrets=tuple(raw["secrets"]),
                action=dict(raw["action"]),
                tolerance_seconds=int(raw.get("tolerance_seconds", DEFAULT_TOLERANCE_SECONDS)),
                max_body_bytes=int(raw.get("max_body_bytes", DEFAULT_MAX_BODY_BYTES)),
                act=raw.get("act", "now"),
            )
    return found


def source_get(name: str) -> Source | None:
    return sources().get(name)


RESERVED_NAMES = frozenset({"schedule"})
KNOWN_KEYS = frozenset({"scheme", "secrets", "tolerance_seconds", "max_body_bytes", "action", "act"})


def source_problems(name: Any, raw: Any) -> list[str]:
    """What is wrong with one source's configuration, in words; empty if nothing. The action's own
    problems come from its type (``webhooks.actions.action_problems``)."""
    from webhooks.actions import action_problems  # actions import the services of lower apps

    if not isinstance(name, str) or not name or not set(name) <= SOURCE_NAME_CHARS or len(name) > 100:
        return ["its name must be 1 to 100 lower-case letters, digits, '-' or '_' (it is the URL's last part)"]
    if name in RESERVED_NAMES:
        # What an event starts is keyed <source>:<event id>; a firing of a schedule, with the same
        # owner (none), schedule:<name>:<due time>: an event of a source so named could pass for a
        # firing, or a firing find the event's run and count as done.
        return [f"the name {name!r} is reserved: schedules key their work with it"]
    if not isinstance(raw, dict):
        return ["it must be an object with scheme, secrets and action"]
    problems = [f"unknown key {key!r}" for key in sorted(set(raw) - KNOWN_KEYS)]
    if raw.get("scheme") not in SCHEMES:
        problems.append(f"scheme must be one of {', '.join(sorted(SCHEMES))}, not {raw.get('scheme')!r}")
    problems += _secrets_problems(raw.get("secrets"))
    for key, low, high in (("tolerance_seconds", 1, 3600), ("max_body_bytes", 1, 10 * 1024 * 1024)):
        value = raw.get(key)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high):
            problems.append(f"{key} must be a whole number from {low} to {high}")
    limit = int(settings.HTTP_MAX_BODY_BYTES)
    if isinstance(raw.get("max_body_bytes"), int) and raw["max_body_bytes"] > limit:
        problems.append(
            f"max_body_bytes is more than HTTP_MAX_BODY_BYTES ({limit}): the server refuses a larger body first"
        )
    if raw.get("act", "now") not in ACT_WHEN:
        problems.append(f"act must be one of {', '.join(ACT_WHEN)}, not {raw.get('act')!r}")
    problems += action_problems(raw.get("action"))
    return problems


def _secrets_problems(secrets: Any) -> list[str]:
    if not isinstance(secrets, list) or not all(isinstance(s, str) and s for s in secrets):
        return ["secrets must be a list of non-empty strings (two while one is rotated)"]
    problems = []
    for index, secret in enumerate(secrets):
        try:
            key = secret_bytes(secret)
        except ValueError as exc:
            problems.append(f"secret #{index + 1}: {exc}")
            continue
        if len(key) < 16:
            problems.append(f"secret #{index + 1} is {len(key)} bytes; at least 16 (a short key can be guessed)")
    return problems
