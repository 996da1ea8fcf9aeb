"""Reads of the webhooks app: the configured sources as people may see them, and deliveries."""

from __future__ import annotations

from datetime import datetime
from typing import Any, NamedTuple, TypedDict

from django.db.models import Count, Q, QuerySet

from webhooks.conf import raw_sources, source_problems
from webhooks.models import OPEN_ACTIONS, ActionState, Outcome, WebhookDelivery


class SourceSummary(TypedDict):
    name: str
    scheme: str
    secrets: int  # how many, never what they are
    tolerance_seconds: int | None
    max_body_bytes: int | None
    action: str
    act: str  # "now" (before the answer) or "later" (in a worker, after the 202)
    problems: list[str]


def source_summaries() -> list[SourceSummary]:
    """Every configured source, bad ones included with their problems; no secret in any of it."""
    summaries: list[SourceSummary] = []
    for name, raw in sorted(raw_sources().items()):
        raw = raw if isinstance(raw, dict) else {}
        action: dict[str, Any] = raw["action"] if isinstance(raw.get("action"), dict) else {}
        secrets = raw.get("secrets")
        summaries.append(
            {
                "name": str(name),
                "scheme": str(raw.get("scheme", "")),
                "secrets": len(secrets) if isinstance(secrets, list) else 0,
                "tolerance_seconds": raw.get("tolerance_seconds", 300) if raw.get("scheme") != "github" else None,
                "max_body_bytes": raw.get("max_body_bytes", 256 * 1024),
                "action": describe_action(action),
                "act": str(raw.get("act", "now")),
                "problems": source_problems(name, raw),
            }
        )
    return summaries


def describe_action(action: dict[str, Any]) -> str:
    kind = action.get("type", "?")
    if kind == "workflow":
        return f"start workflow {action.get('workflow')!r}"
    if kind == "operation_outcome":
        return f"settle {action.get('system')!r} operations"
    if kind == "submission":
        return f"submit to agent {action.get('kind')}/{action.get('name')} of account {action.get('account')!r}"
    return str(kind)


def delivery_ids_among(ids: set[int]) -> set[int]:
    """Which of ``ids`` are deliveries on record."""
    return set(WebhookDelivery.objects.filter(pk__in=ids).values_list("pk", flat=True))


def deliveries_received_before(cutoff: datetime, *, include_failed: bool = False) -> QuerySet[WebhookDelivery]:
    """What the retention purge deletes: deliveries received before ``cutoff``, except those whose
    action is pending (accepted work not yet done: deleting it would lose it, and let the event be
    accepted again) or, unless ``include_failed``, failed (it waits for an operator to act again)."""
    kept = [ActionState.PENDING] if include_failed else OPEN_ACTIONS
    return WebhookDelivery.objects.filter(received_at__lt=cutoff).exclude(action_state__in=kept)


def open_actions_received_before(cutoff: datetime) -> dict[str, int]:
    """Deliveries received before ``cutoff`` whose action is pending or failed, counted by state."""
    rows = WebhookDelivery.objects.filter(received_at__lt=cutoff, action_state__in=OPEN_ACTIONS)
    return dict(rows.order_by().values_list("action_state").annotate(n=Count("pk")))


class AcceptedLike(NamedTuple):
    pk: int
    event_id: str
    body_digest: str  # blank if it was accepted before digests were kept
    replay_key: str


def accepted_like(*, source: str, event_id: str, replay_key: str) -> AcceptedLike | None:
    """The accepted delivery a duplicate repeats: the source's accepted row with the same signed
    body (``replay_key``, when the scheme signs the body only), else with the same event id; None if
    there is none."""
    same = Q(event_id=event_id) | Q(replay_key=replay_key) if replay_key else Q(event_id=event_id)
    accepted = WebhookDelivery.objects.filter(same, source=source, outcome=Outcome.ACCEPTED).order_by()
    # At most two: one by each unique constraint.
    rows = [AcceptedLike(*row) for row in accepted.values_list("pk", "event_id", "body_digest", "replay_key")]
    same_body = [row for row in rows if replay_key and row.replay_key == replay_key]
    return next(iter(same_body or rows), None)
