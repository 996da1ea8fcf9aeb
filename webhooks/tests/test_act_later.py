"""A source that acts later: the delivery is committed pending before its 202, and its action runs
once in a worker (``delivery_act``), tried again after a failure, swept when its task was lost, and
acted on again by an operator once it has failed. Here the action is called in-process; the
worker's end of it is in test_act_later_worker.py."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Permission, User
from django.core.management import CommandError, call_command
from django.test import Client
from django.utils import timezone

from accounts.models import Account
from agents.models import Submission
from tests.factories import Users, login
from webhooks import actions
from webhooks.conf import source_problems
from webhooks.models import ActionState, WebhookDelivery
from webhooks.services import act_backoff, body_digest, delivery_act, delivery_act_again, delivery_sweep
from webhooks.tests.support import SECRET, SOURCES, encode, github_headers, perform_workflow_with, standard_headers
from workflows.models import WorkflowRun
from workflows.services import run_start

pytestmark = pytest.mark.django_db

LATER = {**SOURCES["runs"], "act": "later"}
EVENT = {"type": "order.paid", "data": {"order": "1042", "email": "alice@example.com"}}


@pytest.fixture(autouse=True)
def sources(settings: Any) -> Iterator[None]:
    settings.WEBHOOK_SOURCES = {**SOURCES, "later": LATER}
    yield


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, tuple[Any, ...], dict[str, Any]]]:
    """The tasks the services send (instead of sending them): name, arguments, options."""
    from workflows import outbox

    messages: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []
    monkeypatch.setattr(outbox, "send_on_commit", lambda task, args, **options: messages.append((task, args, options)))
    return messages


def acts(sent: list[tuple[str, tuple[Any, ...], dict[str, Any]]]) -> list[int]:
    """The deliveries the act task was sent for, in order."""
    return [args[0] for task, args, _ in sent if task == "webhooks.act"]


def post(body: Any, event_id: str, source: str = "later") -> Any:
    raw = encode(body)
    headers = standard_headers(raw, event_id)
    return Client().post(f"/webhooks/{source}/", data=raw, content_type="application/json", headers=headers)


def accepted(event_id: str = "evt_1") -> WebhookDelivery:
    response = post(EVENT, event_id)
    assert response.status_code == 202, response.content
    return WebhookDelivery.objects.get(pk=response.json()["delivery"])


def test_the_202_comes_with_the_delivery_pending_and_nothing_done_yet(sent: list[Any], settings: Any) -> None:
    delivery = accepted()

    assert (delivery.outcome, delivery.action_state, delivery.action_attempts) == ("accepted", "pending", 0)
    assert delivery.raw_body == EVENT  # what the worker acts on, as received
    assert delivery.body == {"type": "order.paid", "data": {"order": "1042", "email": "[redacted]"}}
    assert delivery.act_after == delivery.received_at and delivery.acted_at is None
    assert not WorkflowRun.objects.exists()
    assert sent == [("webhooks.act", (delivery.pk, 0), {"queue": settings.WORKFLOWS["QUEUE"]})]


def test_acting_does_the_work_once_and_forgets_the_raw_body(sent: list[Any]) -> None:
    delivery = accepted()

    acted = delivery_act(delivery.pk)

    assert acted is not None and acted.action_state == ActionState.DONE
    [run] = WorkflowRun.objects.all()
    delivery.refresh_from_db()
    assert (run.idempotency_key, run.payload) == ("later:evt_1", EVENT["data"])
    assert (delivery.action_state, delivery.action_attempts, delivery.run_id) == ("done", 1, run.id)
    assert delivery.raw_body is None and delivery.acted_at is not None and delivery.act_after is None
    assert delivery.result == {"run": str(run.id), "created": True}
    # a second task for it (the sweep's, a message delivered twice) does nothing
    assert delivery_act(delivery.pk) is None
    assert WorkflowRun.objects.count() == 1


def test_a_replay_is_a_duplicate_before_and_after_the_action(sent: list[Any]) -> None:
    delivery = accepted()
    assert post(EVENT, "evt_1").json() == {"status": "duplicate"}
    delivery_act(delivery.pk)

    again = post(EVENT, "evt_1")

    assert (again.status_code, again.json()) == (200, {"status": "duplicate"})
    assert WorkflowRun.objects.count() == 1
    assert acts(sent) == [delivery.pk]  # only the first was to act on
    assert list(WebhookDelivery.objects.order_by("id").values_list("outcome", "action_state")) == [
        ("accepted", "done"),
        ("duplicate", ""),
        ("duplicate", ""),
    ]
    # the replays' bodies are the accepted one's: not kept again, before or after the action
    duplicates = WebhookDelivery.objects.filter(outcome="duplicate")
    assert [(d.body, d.raw_body, d.message) for d in duplicates] == [
        (None, None, f"the body of accepted delivery {delivery.pk}, not kept again")
    ] * 2
    assert {d.body_digest for d in duplicates} == {body_digest("later", "evt_1", encode(EVENT))}


def test_a_github_body_sent_again_under_a_new_delivery_id_is_a_duplicate_acting_later(
    sent: list[Any], settings: Any
) -> None:
    settings.WEBHOOK_SOURCES = {**SOURCES, "hub-later": {**SOURCES["hub"], "act": "later"}}
    raw = encode(EVENT)

    def post_hub(delivery_id: str) -> Any:
        headers = github_headers(raw, delivery_id)
        return Client().post("/webhooks/hub-later/", data=raw, content_type="application/json", headers=headers)

    first = post_hub("guid-1")
    assert first.status_code == 202
    before = post_hub("guid-2")  # before the action
    delivery_act(first.json()["delivery"])
    after = post_hub("guid-3")  # and after it

    assert before.json() == after.json() == {"status": "duplicate"}
    assert WorkflowRun.objects.count() == 1 and acts(sent) == [first.json()["delivery"]]
    replays = WebhookDelivery.objects.filter(outcome="duplicate")
    assert sorted(replays.values_list("event_id", flat=True)) == ["guid-2", "guid-3"]
    assert all(d.body is None and d.raw_body is None and "under another event id" in d.message for d in replays)


def test_an_event_of_the_wrong_shape_is_still_a_400_before_anything_is_kept(sent: list[Any]) -> None:
    response = post({"type": "order.paid"}, "evt_1")  # no data: nothing to start the workflow with

    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid_event"
    [delivery] = WebhookDelivery.objects.all()
    assert (delivery.outcome, delivery.action_state, delivery.raw_body) == ("rejected", "", None)
    assert sent == []


def test_an_event_the_action_refuses_is_refused_for_good(sent: list[Any]) -> None:
    # the event's key already started the workflow with another payload: the start refuses it
    run_start(workflow="test.echo", payload={"other": True}, idempotency_key="later:evt_1")
    delivery = accepted()

    delivery_act(delivery.pk)

    delivery.refresh_from_db()
    assert (delivery.action_state, delivery.reason, delivery.action_attempts) == ("refused", "idempotency_conflict", 1)
    assert "different payload" in delivery.message
    assert delivery.raw_body is None and delivery.run_id is None
    assert WorkflowRun.objects.count() == 1
    assert acts(sent) == [delivery.pk]  # not tried again


def test_a_failing_action_is_tried_again_with_a_back_off_then_failed_then_acted_on_again(
    sent: list[Any], monkeypatch: pytest.MonkeyPatch, settings: Any
) -> None:
    settings.WEBHOOKS_ACT_ATTEMPTS = 2

    def broken(action: dict[str, Any], event: actions.Event) -> actions.ActionResult:
        WorkflowRun.objects.create(workflow="test.echo", payload={})  # work done, then a failure
        raise RuntimeError("the partner's database is down")

    perform_workflow_with(monkeypatch, broken)
    delivery = accepted()

    before = timezone.now()
    delivery_act(delivery.pk)

    delivery.refresh_from_db()
    assert (delivery.action_state, delivery.action_attempts, delivery.reason) == ("pending", 1, "action_failed")
    assert "partner" not in delivery.message  # the exception's text stays in the log
    assert delivery.act_after is not None
    assert before + timedelta(seconds=5) <= delivery.act_after < timezone.now() + timedelta(seconds=5)
    task, args, options = sent[-1]
    assert (task, args) == ("webhooks.act", (delivery.pk, 1)) and 4 < options["countdown"] <= 5
    assert not WorkflowRun.objects.exists()  # rolled back with the try
    assert delivery_act(delivery.pk, 0) is None  # a message for the first try again: made already

    delivery_act(delivery.pk, 1)  # the last try

    delivery.refresh_from_db()
    assert (delivery.action_state, delivery.action_attempts) == ("failed", 2)
    assert delivery.raw_body == EVENT  # kept, for acting on again
    assert acts(sent) == [delivery.pk] * 2  # no third try is sent
    assert delivery_act(delivery.pk, 2) is None  # nor would one do anything

    perform_workflow_with(monkeypatch, actions._workflow_perform)  # the partner is back; an operator acts again
    assert delivery_act_again([delivery.pk, 99999], by="test") == [delivery.pk]
    delivery.refresh_from_db()
    assert (delivery.action_state, delivery.action_attempts, delivery.reason) == ("pending", 0, "")
    # how it was before stays said on it until its next try ends
    assert delivery.message == (
        "acted on again by test; before: failed after 2 tries (action_failed: the event could not be acted on "
        "(RuntimeError))"
    )
    assert sent[-1][:2] == ("webhooks.act", (delivery.pk, 0))

    delivery_act(delivery.pk)

    delivery.refresh_from_db()
    assert delivery.action_state == "done" and delivery.raw_body is None
    assert WorkflowRun.objects.get().idempotency_key == "later:evt_1"


def test_tries_that_never_ended_count_and_the_last_one_fails_the_delivery(sent: list[Any], settings: Any) -> None:
    # given a delivery whose every try was started, and never recorded its end (each worker killed)
    delivery = accepted()
    tries = settings.WEBHOOKS_ACT_ATTEMPTS
    WebhookDelivery.objects.filter(pk=delivery.pk).update(action_attempts=tries)

    # when the sweep's task for the next try arrives
    failed = delivery_act(delivery.pk, tries)

    # then it is failed, not tried again, and kept for an operator
    assert failed is not None
    delivery.refresh_from_db()
    assert (delivery.action_state, delivery.reason) == ("failed", "action_failed")
    assert delivery.message == f"none of its {tries} tries finished (each worker stopped in it)"
    assert delivery.raw_body == EVENT and not WorkflowRun.objects.exists()


def test_a_try_is_counted_before_its_action_runs(sent: list[Any], monkeypatch: pytest.MonkeyPatch) -> None:
    delivery = accepted()
    seen: list[tuple[int, str]] = []

    def watching(action: dict[str, Any], event: actions.Event) -> actions.ActionResult:
        # what another connection sees while the action runs: the try counted and committed
        row = WebhookDelivery.objects.values_list("action_attempts", "action_state").get(pk=delivery.pk)
        seen.append(row)
        return actions._workflow_perform(action, event)

    perform_workflow_with(monkeypatch, watching)

    delivery_act(delivery.pk)

    assert seen == [(1, "pending")]
    delivery.refresh_from_db()
    assert (delivery.action_state, delivery.action_attempts) == ("done", 1)


def test_the_back_off_grows_to_an_hour() -> None:
    assert [act_backoff(n) for n in (1, 2, 3, 4, 8, 20)] == [5, 15, 45, 135, 3600, 3600]


def test_a_submission_to_an_account_not_there_yet_waits_for_it(sent: list[Any], settings: Any) -> None:
    action = {"type": "submission", "account": "acme", "kind": "test.chat", "name": "crm", "text_from": "data.text"}
    settings.WEBHOOK_SOURCES = {"crm": {"scheme": "standard", "secrets": [SECRET], "act": "later", "action": action}}
    response = post({"data": {"text": "hello"}}, "evt_1", source="crm")
    assert response.status_code == 202  # where a source acting now answers 503
    delivery = WebhookDelivery.objects.get()

    delivery_act(delivery.pk)

    delivery.refresh_from_db()
    assert (delivery.action_state, delivery.reason, delivery.message) == (
        "pending",
        "agent_unavailable",
        "no account 'acme'",
    )
    Account.objects.create(slug="acme", name="Acme")

    delivery_act(delivery.pk, 1)  # the next try, once the account is there

    delivery.refresh_from_db()
    [submission] = Submission.objects.all()
    assert (delivery.action_state, delivery.submission_id) == ("done", submission.pk)
    assert submission.idempotency_key == "crm:evt_1"


def test_a_source_that_is_gone_is_tried_again(sent: list[Any], settings: Any) -> None:
    delivery = accepted()
    settings.WEBHOOK_SOURCES = SOURCES

    delivery_act(delivery.pk)

    delivery.refresh_from_db()
    assert (delivery.action_state, delivery.reason) == ("pending", "source_gone")


def test_the_sweep_sends_only_overdue_pending_deliveries_again(sent: list[Any], settings: Any) -> None:
    settings.WEBHOOKS_ACT_GRACE_SECONDS = 60
    overdue, recent, done = accepted("evt_1"), accepted("evt_2"), accepted("evt_3")
    delivery_act(done.pk)
    now = timezone.now()
    WebhookDelivery.objects.filter(pk__in=[overdue.pk, done.pk]).update(act_after=now - timedelta(seconds=61))
    del sent[:]

    assert delivery_sweep(now=now) == 1

    assert sent == [("webhooks.act", (overdue.pk, 0), {"queue": settings.WORKFLOWS["QUEUE"]})]
    overdue.refresh_from_db()
    assert overdue.swept_at == now  # the next sweeps leave it to that task for a grace
    assert overdue.act_after == now - timedelta(seconds=61)  # and it is still as late as it was
    assert delivery_sweep(now=now + timedelta(seconds=30)) == 0
    assert recent.pk not in [args[0] for _, args, _ in sent]
    # a grace later: it again (still not taken), and the recent one, overdue by then
    assert delivery_sweep(now=now + timedelta(seconds=61)) == 2


def test_act_must_be_now_or_later() -> None:
    assert source_problems("x", {**LATER, "act": "soon"}) == ["act must be one of now, later, not 'soon'"]
    assert source_problems("x", {**LATER, "act": "now"}) == []


def test_a_source_acting_now_records_its_delivery_done() -> None:
    raw = encode(EVENT)
    response = Client().post(
        "/webhooks/runs/", data=raw, content_type="application/json", headers=standard_headers(raw, "evt_1")
    )

    delivery = WebhookDelivery.objects.get(pk=response.json()["delivery"])
    assert (delivery.action_state, delivery.action_attempts, delivery.raw_body) == ("done", 0, None)
    assert delivery.acted_at == delivery.received_at


def test_commands_sweep_and_act_again(sent: list[Any], capsys: pytest.CaptureFixture[str]) -> None:
    delivery = accepted()
    WebhookDelivery.objects.filter(pk=delivery.pk).update(
        action_state="failed", act_after=timezone.now() - timedelta(hours=1)
    )

    done = accepted("evt_2")
    delivery_act(done.pk)
    with pytest.raises(CommandError, match="no such delivery"):  # exit status 1, after acting on the rest
        call_command("webhooks", "act-again", str(delivery.pk), "424242", str(done.pk))
    out, err = capsys.readouterr()
    assert "1 delivery(ies) will be acted on now" in out
    assert "no delivery 424242\n" in err and f"{done.pk}: neither failed nor pending" in err
    with pytest.raises(CommandError, match="nothing to act on"):
        call_command("webhooks", "act-again", str(done.pk))
    capsys.readouterr()
    WebhookDelivery.objects.filter(pk=delivery.pk).update(act_after=timezone.now() - timedelta(hours=1))
    call_command("webhooks", "sweep")
    assert "1 overdue action(s) sent again" in capsys.readouterr().out
    call_command("webhooks", "sources")
    assert "later: standard, 2 secret(s), start workflow 'test.echo', acts later" in capsys.readouterr().out


def test_the_admin_acts_again_on_failed_deliveries_for_staff_who_may_change_them(sent: list[Any], users: Users) -> None:
    failed, done = accepted("evt_1"), accepted("evt_2")
    WebhookDelivery.objects.filter(pk=failed.pk).update(action_state="failed")
    delivery_act(done.pk)
    carol = users.carol
    carol.is_staff = True
    carol.save()
    carol.user_permissions.add(Permission.objects.get(codename="view_webhookdelivery"))
    url = "/admin/webhooks/webhookdelivery/"
    form = {"action": "act_again", "_selected_action": [failed.pk, done.pk]}

    viewer = login(User.objects.get(pk=carol.pk))
    page = viewer.get(url)
    assert page.status_code == 200 and "act_again" not in page.content.decode()  # view only: no such action
    viewer.post(url, form)
    assert WebhookDelivery.objects.get(pk=failed.pk).action_state == "failed"

    carol.user_permissions.add(Permission.objects.get(codename="change_webhookdelivery"))
    changer = login(User.objects.get(pk=carol.pk))
    page = changer.get(url)
    assert "Act now on the selected failed or pending deliveries" in page.content.decode()
    assert "later, in a worker" in page.content.decode()  # the sources' table says how each acts
    response = changer.post(url, form, follow=True)

    text = response.content.decode()
    assert "1 delivery(ies) will be acted on now" in text and "1 neither failed nor pending" in text
    assert WebhookDelivery.objects.get(pk=failed.pk).action_state == "pending"
    assert WebhookDelivery.objects.get(pk=done.pk).action_state == "done"
    [entry] = LogEntry.objects.all()  # who acted again on what, in the admin's history
    assert (entry.object_id, entry.user_id, entry.get_change_message()) == (
        str(failed.pk),
        carol.pk,
        "Acted on again now; before: failed after 0 tries.",
    )
    detail = changer.get(f"{url}{failed.pk}/change/").content.decode()
    assert "alice@example.com" not in detail  # the raw body is never shown
    assert failed.body_digest and failed.body_digest not in detail  # nor the digest of it


def test_no_filter_in_the_admin_reads_the_raw_body(users: Users) -> None:
    delivery = accepted()  # pending: its raw body holds the email address
    carol = users.carol
    carol.is_staff = True
    carol.save()
    carol.user_permissions.add(Permission.objects.get(codename="view_webhookdelivery"))
    client = login(User.objects.get(pk=carol.pk))
    url = "/admin/webhooks/webhookdelivery/"

    lookups = (
        "raw_body__data__email",
        "raw_body__data__email__startswith",
        "raw_body__isnull",
        "body_digest",
        "replay_key",
        "replay_key__startswith",
    )
    for lookup in lookups:
        response = client.get(url, {lookup: "alice@example.com" if "email" in lookup else "False"})
        # refused (Django answers a disallowed lookup 400), not a list that says yes or no
        assert response.status_code == 400, (lookup, response.status_code)
    assert client.get(url, {"source": "later"}).status_code == 200
    assert delivery.raw_body is not None


def test_acting_again_on_a_pending_delivery_whose_tries_were_all_used_gives_it_its_tries_again(
    sent: list[Any], settings: Any
) -> None:
    # given a pending delivery whose last try's worker was killed in it (every try used, none ended)
    settings.WEBHOOKS_ACT_ATTEMPTS = 2
    delivery = accepted()
    WebhookDelivery.objects.filter(pk=delivery.pk).update(action_attempts=2)

    # when an operator acts on it now
    assert delivery_act_again([delivery.pk], by="test") == [delivery.pk]

    # then its try is made (not ended failed for the tries used before)
    assert sent[-1][:2] == ("webhooks.act", (delivery.pk, 0))
    delivery_act(delivery.pk, 0)
    delivery.refresh_from_db()
    assert (delivery.action_state, delivery.action_attempts) == ("done", 1)
    assert WorkflowRun.objects.count() == 1


def test_an_operator_cuts_a_pending_deliverys_back_off_short(sent: list[Any], settings: Any) -> None:
    # given a submission that waits out its back-off (its account was missing), now mended
    action = {"type": "submission", "account": "acme", "kind": "test.chat", "name": "crm", "text_from": "data.text"}
    settings.WEBHOOK_SOURCES = {"crm": {"scheme": "standard", "secrets": [SECRET], "act": "later", "action": action}}
    post({"data": {"text": "hello"}}, "evt_1", source="crm")
    delivery = WebhookDelivery.objects.get()
    delivery_act(delivery.pk)
    Account.objects.create(slug="acme", name="Acme")

    # when an operator acts on it now
    assert delivery_act_again([delivery.pk], by="test") == [delivery.pk]

    # then its next try is due now and its task sent for that try, its count kept
    delivery.refresh_from_db()
    assert (delivery.action_state, delivery.action_attempts) == ("pending", 1)
    assert delivery.act_after is not None and delivery.act_after <= timezone.now()
    assert sent[-1][:2] == ("webhooks.act", (delivery.pk, 1))
    delivery_act(delivery.pk, 1)
    assert WebhookDelivery.objects.get().action_state == "done"


def test_a_workflow_that_refuses_the_payload_refuses_it_before_the_202(sent: list[Any], settings: Any) -> None:
    onboarding = {"type": "workflow", "workflow": "demo.onboarding", "payload_from": "data"}
    signup = {"scheme": "standard", "secrets": [SECRET], "act": "later", "action": onboarding}
    settings.WEBHOOK_SOURCES = {"signup": signup}

    refused = post({"data": {"customer": "Ann", "email": "ann@example.com"}}, "evt_1", source="signup")
    too_big = post({"data": {"customer": "Ann", "work_seconds": 10**400}}, "evt_2", source="signup")

    assert (refused.status_code, refused.json()["error"]["code"]) == (400, "invalid_payload")
    assert "unknown payload keys: email" in refused.json()["error"]["message"]
    assert (too_big.status_code, too_big.json()["error"]["code"]) == (400, "invalid_payload")
    assert list(WebhookDelivery.objects.values_list("outcome", flat=True)) == ["rejected", "rejected"]
    assert sent == []


@pytest.mark.parametrize("name", ["WEBHOOKS_ACT_ATTEMPTS", "WEBHOOKS_ACT_GRACE_SECONDS"])
def test_the_act_settings_must_be_positive(name: str, settings: Any) -> None:
    from webhooks.checks import check_act_settings

    assert check_act_settings() == []
    setattr(settings, name, 0)
    [error] = check_act_settings()
    assert (error.id, error.msg) == ("webhooks.E002", f"{name} must be a whole number of at least 1, not 0")
