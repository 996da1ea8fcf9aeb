"""The operations console: carol (staff) with and without the ledger's permissions.

Operations are set up in the database directly; the actions go through the services.
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from django.contrib.messages import get_messages
from django.test import Client
from django.urls import reverse

from ledger.exceptions import ResolutionRefused
from ledger.models import ExternalOperation, OperationEvent, OperationStatus
from ledger.services import operation_resolve, record_create
from ledger.tests.provider import FakeProvider
from ledger.tests.support import make_operation, snapshot
from tests.factories import Users, login

pytestmark = pytest.mark.django_db

CHANGELIST = reverse("admin:ledger_externaloperation_changelist")


def grant(user: User, *codenames: str) -> User:
    user.is_staff = True
    user.save()
    user.user_permissions.add(*Permission.objects.filter(content_type__app_label="ledger", codename__in=codenames))
    return User.objects.get(pk=user.pk)  # fresh: has_perm caches permissions on the instance


@pytest.fixture
def viewer(users: Users) -> User:
    """Carol, who may see operations but not resolve them."""
    return grant(users.carol, "view_externaloperation")


@pytest.fixture
def resolver(users: Users) -> User:
    """Carol, who may see and resolve operations."""
    return grant(users.carol, "view_externaloperation", "resolve_externaloperation")


def listed(client: Client, query: str = "") -> list[str]:
    response = client.get(CHANGELIST + query)
    assert response.status_code == 200
    return [op.key for op in response.context["cl"].result_list]


def act(client: Client, action: str, *ops: ExternalOperation, **data: str) -> Any:
    return client.post(
        CHANGELIST, {"action": action, "_selected_action": [str(op.pk) for op in ops], **data}, follow=True
    )


def messages_of(response: Any) -> list[str]:
    return [str(m) for m in get_messages(response.wsgi_request)]


# --- the list -----------------------------------------------------------------------------------
def test_those_needing_attention_come_first(viewer: User) -> None:
    # given, created oldest first
    make_operation("failed", OperationStatus.FAILED)
    make_operation("done", OperationStatus.SUCCEEDED)
    make_operation("stale", OperationStatus.SUBMITTED, sent_ago=timedelta(hours=1))
    make_operation("in-flight", OperationStatus.SUBMITTED, sent_ago=timedelta(seconds=1))
    make_operation("unknown", OperationStatus.UNKNOWN)
    make_operation("pending", OperationStatus.PENDING, sent_ago=None)

    # when
    client = login(viewer)

    # then unknown, stale submitted, failed, then the rest newest first
    assert listed(client) == ["unknown", "stale", "failed", "pending", "in-flight", "done"]
    html = client.get(CHANGELIST).content.decode()
    assert "stale submit" in html
    assert listed(client, "?attention=any") == ["unknown", "stale", "failed"]
    assert listed(client, "?attention=1") == ["stale"]


def test_the_list_filters_by_status_and_system(viewer: User) -> None:
    make_operation("p1", OperationStatus.UNKNOWN)
    make_operation("p2", OperationStatus.SUCCEEDED)
    make_operation("m1", OperationStatus.UNKNOWN, system="mail")

    client = login(viewer)

    assert listed(client, "?status__exact=unknown") == ["m1", "p1"]
    assert listed(client, "?system__exact=payments") == ["p1", "p2"]
    assert listed(client, "?status__exact=unknown&system__exact=mail") == ["m1"]
    assert listed(client, "?q=p2") == ["p2"]


def test_no_filter_in_the_url_reads_what_the_page_shows_redacted(viewer: User) -> None:
    # given an operation whose request holds personal data, shown redacted
    make_operation("pd", request={"amount": "5.00", "customer": {"email": "alice@example.com"}})
    client = login(viewer)
    assert listed(client, "?key=pd") == ["pd"]

    # when a filter in the URL asks about the request, the answer or the error, a character at a time
    for query in (
        "?request__customer__email__startswith=a",
        "?request__customer__email=alice@example.com",
        "?request__has_key=customer",
        "?response__isnull=True",
        "?error__reason=x",
        "?request_hash__startswith=0",
    ):
        # then it is refused (Django answers a lookup it refuses 400), not a list that says yes or no
        assert client.get(CHANGELIST + query).status_code == 400, query


def test_staff_without_the_view_permission_see_nothing(users: Users) -> None:
    make_operation("secret")

    assert login(users.carol).get(CHANGELIST).status_code == 403  # staff, not given the ledger's permissions
    assert login(users.alice).get(CHANGELIST).status_code == 302  # not staff: to the login page


def test_the_change_page_is_read_only_and_redacted(viewer: User) -> None:
    op = make_operation("pd", request={"amount": "5.00", "customer": {"email": "alice@example.com"}})
    OperationEvent.objects.create(
        operation=op,
        kind="submit",
        outcome="unknown",
        status_before="submitted",
        status_after="unknown",
        note="no answer in time",
    )

    response = login(viewer).get(reverse("admin:ledger_externaloperation_change", args=[op.pk]))

    html = response.content.decode()
    assert response.status_code == 200
    assert "alice@example.com" not in html and "[redacted]" in html
    assert "no answer in time" in html  # the audit trail
    assert 'name="_save"' not in html
    assert login(viewer).get(reverse("admin:ledger_externaloperation_add")).status_code == 403
    assert (
        login(viewer).post(reverse("admin:ledger_externaloperation_delete", args=[op.pk]), {"post": "yes"}).status_code
        == 403
    )
    assert ExternalOperation.objects.filter(pk=op.pk).exists()


# --- manual resolution --------------------------------------------------------------------------
def test_manual_resolution_asks_for_a_note_and_records_who_and_when(resolver: User) -> None:
    # given
    op = make_operation("refund:7")
    client = login(resolver)

    # when the action is chosen, a page asks for the note; nothing changes yet
    page = act(client, "mark_succeeded", op)
    assert page.status_code == 200
    assert "Note" in page.content.decode() and "refund:7" in page.content.decode()
    assert '<input type="hidden" name="action" value="mark_succeeded">' in page.content.decode()
    assert '<input type="submit" class="default" value="Mark succeeded">' in page.content.decode()
    assert ExternalOperation.objects.get(pk=op.pk).status == OperationStatus.UNKNOWN

    # when carol submits a note
    done = act(client, "mark_succeeded", op, apply="1", note="  Provider dashboard shows re_123 paid.  ")

    # then
    op = ExternalOperation.objects.get(pk=op.pk)
    assert op.status == OperationStatus.SUCCEEDED
    assert op.resolved_by == resolver and op.resolved_at is not None
    assert op.resolution_note == "Provider dashboard shows re_123 paid."
    # the run gets the fact, never the staff note (its owner may read the step's result)
    assert op.response == {"status": "succeeded", "resolved_by_hand": True}
    assert "dashboard" not in json.dumps(op.response)
    assert messages_of(done) == ["Operation refund:7: resolved by hand as succeeded"]
    event = OperationEvent.objects.get(operation=op)
    assert (event.kind, event.outcome, event.status_before, event.status_after) == (
        "resolve",
        "succeeded",
        "unknown",
        "succeeded",
    )


def test_manual_resolution_without_a_note_changes_nothing(resolver: User) -> None:
    op = make_operation("refund:8")
    before = snapshot(op)

    response = act(login(resolver), "mark_failed", op, apply="1", note="   ")

    assert response.status_code == 200
    assert "This field is required." in response.content.decode()
    assert snapshot(op) == before
    assert not OperationEvent.objects.exists()


def test_manual_resolution_needs_the_permission(viewer: User) -> None:
    op = make_operation("refund:9")
    before = snapshot(op)
    client = login(viewer)

    # the actions are not offered
    form = client.get(CHANGELIST).context["action_form"]
    offered = {name for name, _ in form.fields["action"].choices} if form is not None else set()
    assert not {"mark_succeeded", "mark_failed", "reconcile_now"} & offered
    # and posting one anyway does nothing
    act(client, "mark_succeeded", op, apply="1", note="trust me")
    assert snapshot(op) == before

    # nor does the service let her
    with pytest.raises(ResolutionRefused, match="may not resolve"):
        operation_resolve(operation_id=op.pk, outcome="succeeded", note="trust me", user=viewer)
    assert snapshot(op) == before


def test_only_unknown_or_stale_operations_are_resolved_by_hand(resolver: User) -> None:
    done = make_operation("done", OperationStatus.SUCCEEDED)
    in_flight = make_operation("in-flight", OperationStatus.SUBMITTED, sent_ago=timedelta(seconds=1))
    stale = make_operation("stale", OperationStatus.SUBMITTED, sent_ago=timedelta(hours=1))
    before = snapshot(done, in_flight)

    response = act(login(resolver), "mark_failed", done, in_flight, stale, apply="1", note="checked by phone")

    assert snapshot(done, in_flight) == before
    assert ExternalOperation.objects.get(pk=stale.pk).status == OperationStatus.FAILED
    assert sorted(messages_of(response)) == [
        "Operation done: not resolved: only unknown operations (or submits gone stale, or pending ones sent before "
        "whose run has ended) are resolved by hand; this one is succeeded",
        "Operation in-flight: not resolved: only unknown operations (or submits gone stale, or pending ones sent "
        "before whose run has ended) are resolved by hand; this one is submitted",
        "Operation stale: resolved by hand as failed",
    ]


def test_the_service_refuses_an_empty_note(resolver: User) -> None:
    op = make_operation("refund:10")
    before = snapshot(op)
    for note in ("", "  \n "):
        with pytest.raises(ResolutionRefused, match="a note is required"):
            operation_resolve(operation_id=op.pk, outcome="failed", note=note, user=resolver)
    assert snapshot(op) == before


# --- reconcile now ------------------------------------------------------------------------------
def test_reconcile_now_looks_the_selected_operations_up(resolver: User, payments: FakeProvider) -> None:
    # given
    payments.seed("paid")
    paid = make_operation("paid")
    lost = make_operation("lost")  # the provider never got it
    untouched = make_operation("not-selected")
    before = snapshot(untouched)

    # when
    response = act(login(resolver), "reconcile_now", paid, lost)

    # then
    assert ExternalOperation.objects.get(pk=paid.pk).status == OperationStatus.SUCCEEDED
    assert ExternalOperation.objects.get(pk=lost.pk).status == OperationStatus.PENDING
    assert snapshot(untouched) == before
    assert sorted(messages_of(response)) == [
        "Operation lost: unknown → pending: the provider never received it, so it never took effect: "
        "safe to send again",
        "Operation paid: unknown → succeeded: the provider has it as succeeded",
    ]
    assert payments.submits() == 0


# --- operational records ------------------------------------------------------------------------
def test_operational_records_are_read_only(users: Users) -> None:
    carol = grant(users.carol, "view_operationalrecord")
    record = record_create(request_id="req-1", tool="payments.refund", response={"email": "alice@example.com"})
    client = login(carol)

    changelist = client.get(reverse("admin:ledger_operationalrecord_changelist"))
    change = client.get(reverse("admin:ledger_operationalrecord_change", args=[record.pk]))

    assert changelist.status_code == 200 and "req-1" in changelist.content.decode()
    assert change.status_code == 200 and 'name="_save"' not in change.content.decode()
    assert "alice@example.com" not in change.content.decode()
    assert client.get(reverse("admin:ledger_operationalrecord_add")).status_code == 403
    assert (
        client.post(reverse("admin:ledger_operationalrecord_delete", args=[record.pk]), {"post": "yes"}).status_code
        == 403
    )
    assert (
        client.post(
            reverse("admin:ledger_operationalrecord_change", args=[record.pk]), {"request_id": "changed"}
        ).status_code
        == 403
    )
    assert record.__class__.objects.get(pk=record.pk).request_id == "req-1"


def test_marking_a_sent_operation_failed_warns_that_the_provider_may_still_act(resolver: User) -> None:
    sent = make_operation("sent-once")
    client = login(resolver)

    page = " ".join(act(client, "mark_failed", sent).content.decode().split())
    succeeded_page = " ".join(act(client, "mark_succeeded", sent).content.decode().split())

    assert "A provider can act on a request long after our call gave up on it" in page
    assert "sent-once" in page and "Reconcile keeps looking it up for 7 days" in page
    assert "long after our call gave up" not in succeeded_page  # marking succeeded releases nothing
    assert ExternalOperation.objects.get(pk=sent.pk).status == OperationStatus.UNKNOWN
