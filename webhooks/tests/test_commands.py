"""``manage.py webhooks purge`` applies the retention period; ``webhooks sources`` lists the sources."""

from __future__ import annotations

import io
from datetime import timedelta
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.db.models import QuerySet
from django.utils import timezone

from webhooks.models import WebhookDelivery
from webhooks.services import delivery_act_again
from webhooks.tests.support import SECRET, SOURCES

pytestmark = pytest.mark.django_db

EVENT = {"type": "order.paid", "data": {"order": "1042"}}


def run(*args: str) -> str:
    out = io.StringIO()
    call_command("webhooks", *args, stdout=out)
    return out.getvalue()


def delivery(age: timedelta, action_state: str = "", event_id: str = "") -> WebhookDelivery:
    return WebhookDelivery.objects.create(
        source="runs",
        event_id=event_id or f"evt_{age.days}",
        outcome="accepted",
        received_at=timezone.now() - age,
        action_state=action_state,
    )


def test_purge_deletes_only_what_is_older_than_the_retention(settings: Any) -> None:
    settings.WEBHOOKS_RETENTION_DAYS = 30
    old, recent = delivery(timedelta(days=31)), delivery(timedelta(days=29))

    out = run("purge")

    assert "Deleted 1 webhook delivery record(s)" in out and "(older than 30d)" in out
    assert list(WebhookDelivery.objects.values_list("pk", flat=True)) == [recent.pk]
    assert not WebhookDelivery.objects.filter(pk=old.pk).exists()


def test_purge_older_than_and_dry_run() -> None:
    delivery(timedelta(days=3))

    out = run("purge", "--older-than", "2d", "--dry-run")

    assert "Would delete 1 webhook delivery record(s)" in out and "Dry run: nothing was deleted." in out
    assert WebhookDelivery.objects.count() == 1
    assert "Deleted 1" in run("purge", "--older-than", "48h")
    assert WebhookDelivery.objects.count() == 0


def test_purge_keeps_pending_actions_and_failed_ones_unless_asked() -> None:
    old = timedelta(days=40)
    done, refused = delivery(old, "done", "evt_done"), delivery(old, "refused", "evt_refused")
    pending, failed = delivery(old, "pending", "evt_pending"), delivery(old, "failed", "evt_failed")

    dry = run("purge", "--dry-run")
    out = run("purge")

    assert "Would delete 2 webhook delivery record(s)" in dry
    assert "Would keep 1 older delivery(ies) whose action is pending" in dry
    assert "Would keep 1 older delivery(ies) whose action failed" in dry and "--include-failed" in dry
    assert "Deleted 2 webhook delivery record(s)" in out and "Kept 1" in out
    assert set(WebhookDelivery.objects.values_list("pk", flat=True)) == {pending.pk, failed.pk}
    assert not WebhookDelivery.objects.filter(pk__in=[done.pk, refused.pk]).exists()

    dry = run("purge", "--include-failed", "--dry-run")
    out = run("purge", "--include-failed")

    assert "Would delete 1 webhook delivery record(s)" in dry and "action failed" not in dry
    assert "Deleted 1 webhook delivery record(s)" in out and "action failed" not in out
    assert "Kept 1 older delivery(ies) whose action is pending" in out
    assert list(WebhookDelivery.objects.values_list("pk", flat=True)) == [pending.pk]


def test_a_failed_delivery_made_pending_while_the_purge_runs_is_not_deleted(monkeypatch: pytest.MonkeyPatch) -> None:
    # given an old failed delivery, and an operator who acts on it again just after the purge
    # selected it for deletion (--include-failed) and before its DELETE
    failed = delivery(timedelta(days=40), "failed", "evt_failed")
    WebhookDelivery.objects.filter(pk=failed.pk).update(raw_body=EVENT)  # what acting again acts on
    monkeypatch.setattr("workflows.outbox.send_on_commit", lambda *args, **options: None)
    delete, acted = QuerySet.delete, list[int]()

    def act_again_then_delete(self: QuerySet[Any]) -> Any:
        if self.model is WebhookDelivery and not acted:
            acted.extend(delivery_act_again([failed.pk], by="operator"))
        return delete(self)

    monkeypatch.setattr(QuerySet, "delete", act_again_then_delete)

    # when the purge deletes what it selected
    out = run("purge", "--include-failed")

    # then the DELETE checked the state again: the delivery, pending now, is kept
    monkeypatch.undo()
    assert acted == [failed.pk] and "Deleted 0 webhook delivery record(s)" in out
    assert WebhookDelivery.objects.get(pk=failed.pk).action_state == "pending"


def test_purge_refuses_a_bad_or_zero_duration() -> None:
    delivery(timedelta(days=3))
    with pytest.raises(CommandError):
        run("purge", "--older-than", "soon")
    with pytest.raises(CommandError, match="more than zero"):
        run("purge", "--older-than", "0d")
    with pytest.raises(CommandError, match="before the year 1"):  # a cutoff no date can hold
        run("purge", "--older-than", "999999w")
    assert WebhookDelivery.objects.count() == 1


def test_sources_lists_each_without_secrets(settings: Any) -> None:
    settings.WEBHOOK_SOURCES = {**SOURCES, "broken": {"scheme": "nope"}}

    out = run("sources")

    assert "runs: standard, 2 secret(s), start workflow 'test.echo'" in out
    assert "payments: stripe, 1 secret(s), settle 'payments' operations" in out
    assert "broken: nope" in out and "PROBLEMS: scheme must be one of" in out
    assert SECRET not in out


def test_sources_names_a_submissions_agent_and_says_when_there_is_none(settings: Any) -> None:
    action = {"type": "submission", "account": "acme", "kind": "test.chat", "name": "crm", "text_from": "data.text"}
    settings.WEBHOOK_SOURCES = {"crm": {"scheme": "standard", "secrets": [SECRET], "action": action}}
    assert "crm: standard, 1 secret(s), submit to agent test.chat/crm of account 'acme', acts now" in run("sources")

    settings.WEBHOOK_SOURCES = {}
    assert run("sources") == "No webhook source is configured (WEBHOOK_SOURCES_JSON).\n"
