"""``POST /webhooks/<source>/`` through Django's test client: every answer, and on every refusal
nothing but one rejected delivery record is written."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from typing import Any

import pytest
from django.test import Client

from ledger.models import ExternalOperation, OperationEvent
from ledger.tests.support import make_operation
from tests.support import statements_sent
from webhooks.models import WebhookDelivery
from webhooks.services import body_digest, replay_key
from webhooks.tests.support import (
    ROTATED,
    SOURCES,
    encode,
    github_headers,
    outcome_event,
    perform_workflow_with,
    standard_headers,
    stripe_headers,
)
from workflows.models import WorkflowRun

pytestmark = pytest.mark.django_db

EVENT = {"type": "order.paid", "data": {"order": "1042", "email": "alice@example.com"}}


@pytest.fixture(autouse=True)
def sources(settings: Any) -> Iterator[None]:
    settings.WEBHOOK_SOURCES = SOURCES
    yield


def post(source: str, body: bytes, headers: dict[str, str], **extra: Any) -> Any:
    return Client().post(f"/webhooks/{source}/", data=body, content_type="application/json", headers=headers, **extra)


def written() -> tuple[int, int, int]:
    return WorkflowRun.objects.count(), ExternalOperation.objects.count(), OperationEvent.objects.count()


def refused(response: Any, status: int, code: str) -> WebhookDelivery:
    """The answer is the API's error shape with ``code``; one rejected delivery and nothing else
    was written. Returns that delivery."""
    assert response.status_code == status, response.content
    error = response.json()["error"]
    assert error["code"] == code and error["message"], error
    assert written() == (0, 0, 0)
    [delivery] = WebhookDelivery.objects.all()
    assert (delivery.outcome, delivery.reason) == ("rejected", code)
    assert delivery.body is None and delivery.run is None and delivery.result is None
    return delivery


def test_accepted_starts_the_workflow_once_and_records_the_delivery() -> None:
    body = encode(EVENT)

    response = post("runs", body, standard_headers(body, "msg_1"))

    assert response.status_code == 202, response.content
    delivery = WebhookDelivery.objects.get()
    assert response.json() == {"status": "accepted", "delivery": delivery.pk}
    run = WorkflowRun.objects.get()
    assert (run.workflow, run.payload, run.idempotency_key) == ("test.echo", EVENT["data"], "runs:msg_1")
    assert run.owner is None
    assert (delivery.source, delivery.event_id, delivery.outcome) == ("runs", "msg_1", "accepted")
    assert delivery.run_id == run.id
    assert delivery.size == len(body)
    # what is recorded: personal data and signatures redacted
    assert delivery.body == {"type": "order.paid", "data": {"order": "1042", "email": "[redacted]"}}
    assert delivery.headers["Webhook-Signature"] == "[redacted]"
    assert delivery.headers["Webhook-Id"] == "msg_1"


def test_a_replayed_event_is_a_duplicate_and_nothing_else_happens() -> None:
    body = encode(EVENT)
    assert post("runs", body, standard_headers(body, "msg_1")).status_code == 202

    again = post("runs", body, standard_headers(body, "msg_1", secret=ROTATED))  # re-signed, even

    assert again.status_code == 200
    assert again.json() == {"status": "duplicate"}
    assert WorkflowRun.objects.count() == 1
    assert sorted(WebhookDelivery.objects.values_list("outcome", flat=True)) == ["accepted", "duplicate"]


def test_a_replay_runs_no_action_and_takes_no_lock() -> None:
    body = encode(EVENT)
    assert post("runs", body, standard_headers(body, "msg_1")).status_code == 202

    with statements_sent() as sent:
        assert post("runs", body, standard_headers(body, "msg_1")).status_code == 200

    # the accepted row's insert finds the first and does nothing; the first's body digest is read
    # and the duplicate's row written; the action (the run's start) never runs (around them, the
    # test's transaction's savepoint)
    assert [sql.split()[0] for sql in sent] == ["SAVEPOINT", "INSERT", "SELECT", "INSERT", "RELEASE"], sent
    assert all("webhooks_webhookdelivery" in sql for sql in sent[1:4])


def test_a_replayed_body_is_not_kept_again() -> None:
    # given an accepted event with a large body
    body = encode({**EVENT, "padding": "x" * 3_000})  # near the source's limit
    assert post("runs", body, standard_headers(body, "msg_1")).status_code == 202
    accepted = WebhookDelivery.objects.get(outcome="accepted")
    assert accepted.body_digest == body_digest("runs", "msg_1", body) and accepted.body is not None

    # when it is replayed, re-signed, twenty times
    for _ in range(20):
        assert post("runs", body, standard_headers(body, "msg_1")).status_code == 200

    # then each replay is recorded, with its headers and the digest but no copy of the body
    duplicates = WebhookDelivery.objects.filter(outcome="duplicate")
    assert duplicates.count() == 20
    for duplicate in duplicates:
        assert duplicate.body is None and duplicate.body_digest == accepted.body_digest
        assert duplicate.headers["Webhook-Id"] == "msg_1" and duplicate.size == len(body)
        assert duplicate.message == f"the body of accepted delivery {accepted.pk}, not kept again"


def test_a_replay_with_another_body_is_a_duplicate_and_changes_nothing() -> None:
    # given an accepted event
    body = encode(EVENT)
    assert post("runs", body, standard_headers(body, "msg_1")).status_code == 202

    # when its sender sends the same event id with another body
    other = encode({"type": "order.paid", "data": {"order": "9999"}})
    again = post("runs", other, standard_headers(other, "msg_1"))

    # then it is a duplicate, and the first's run is as it was; the other body is kept (redacted)
    assert again.status_code == 200 and again.json() == {"status": "duplicate"}
    assert WorkflowRun.objects.get().payload == EVENT["data"]
    assert sorted(WebhookDelivery.objects.values_list("outcome", flat=True)) == ["accepted", "duplicate"]
    duplicate = WebhookDelivery.objects.get(outcome="duplicate")
    assert duplicate.body == {"type": "order.paid", "data": {"order": "9999"}} and duplicate.message == ""
    assert duplicate.body_digest == body_digest("runs", "msg_1", other)


def test_credentials_in_a_body_are_recorded_redacted_and_reach_the_work_whole() -> None:
    data = {"order": "1042", "api_key": "sk_live_1", "login": {"Password": "hunter2", "user": "alice"}}
    body = encode({"type": "order.paid", "data": data})

    assert post("runs", body, standard_headers(body, "msg_cred")).status_code == 202

    delivery = WebhookDelivery.objects.get()
    assert delivery.body == {
        "type": "order.paid",
        "data": {"order": "1042", "api_key": "[redacted]", "login": {"Password": "[redacted]", "user": "alice"}},
    }
    assert WorkflowRun.objects.get().payload == data  # what the work is given is the sender's


def test_a_bodys_digest_is_keyed_so_it_confirms_no_guess_of_what_was_redacted(settings: Any) -> None:
    # the body as received holds the email the stored body redacts; its digest is no plain hash,
    # which anyone reading the row could compare with guesses, and it changes with the key
    body = encode(EVENT)
    digest = body_digest("runs", "msg_1", body)
    assert digest not in (hashlib.sha256(body).hexdigest(), hashlib.sha256(encode(EVENT["data"])).hexdigest())
    assert len(digest) == 64 and digest == body_digest("runs", "msg_1", body)
    # another event with the same body (the same email) has another digest
    assert body_digest("runs", "msg_2", body) != digest and body_digest("sandbox", "msg_1", body) != digest
    settings.SECRET_KEY = "another-secret-key-0123456789abcdefghijklmnop"
    assert body_digest("runs", "msg_1", body) != digest


def test_a_replay_is_compared_with_its_own_sources_accepted_delivery(settings: Any) -> None:
    # given the same event id and body accepted at two sources
    settings.WEBHOOK_SOURCES = {**SOURCES, "runs2": SOURCES["runs"]}
    body = encode(EVENT)
    assert post("runs", body, standard_headers(body, "msg_1")).status_code == 202
    assert post("runs2", body, standard_headers(body, "msg_1")).status_code == 202

    # when it is replayed at the second
    assert post("runs2", body, standard_headers(body, "msg_1")).status_code == 200

    # then the duplicate names that source's accepted delivery
    first = WebhookDelivery.objects.get(source="runs2", outcome="accepted")
    duplicate = WebhookDelivery.objects.get(outcome="duplicate")
    assert (duplicate.source, duplicate.body) == ("runs2", None)
    assert duplicate.message == f"the body of accepted delivery {first.pk}, not kept again"


def test_an_outcome_whose_record_is_not_the_operations_settles_nothing() -> None:
    # given our unknown refund of 10.00, and a signed outcome under its key for 1.00 (another
    # installation sharing the provider account made that one)
    make_operation("refund:9:3", request={"order": "9", "amount": "10.00", "currency": "GBP"})
    body = encode(outcome_event("refund:9:3", "succeeded", order="9", amount="1.00", currency="GBP"))

    response = post("sandbox", body, standard_headers(body, "evt_other"))

    # then the delivery is recorded, and says the report did not match; the refund is still unknown
    assert response.status_code == 202
    assert ExternalOperation.objects.get(key="refund:9:3").status == "unknown"
    result = WebhookDelivery.objects.get(outcome="accepted").result
    assert result is not None and result["changed"] is False
    assert "does not match this operation (its amount is '1.00'" in result["note"]


def test_a_replayed_outcome_is_a_duplicate_and_settles_nothing_twice() -> None:
    make_operation("refund:9:2")
    body = encode(outcome_event("refund:9:2", "succeeded"))
    assert post("sandbox", body, standard_headers(body, "evt_ok")).status_code == 202
    events = OperationEvent.objects.count()

    again = post("sandbox", body, standard_headers(body, "evt_ok"))

    assert again.status_code == 200 and again.json() == {"status": "duplicate"}
    assert ExternalOperation.objects.get(key="refund:9:2").status == "succeeded"
    assert OperationEvent.objects.count() == events
    assert sorted(WebhookDelivery.objects.values_list("outcome", flat=True)) == ["accepted", "duplicate"]


def test_a_github_delivery_sent_again_under_a_new_delivery_id_is_a_duplicate() -> None:
    # given a delivery accepted at a source whose scheme signs the body only (github)
    body = encode(EVENT)
    assert post("hub", body, github_headers(body, "guid-1")).status_code == 202
    accepted = WebhookDelivery.objects.get(outcome="accepted")
    assert accepted.replay_key == replay_key("hub", body)

    # when someone who captured it sends it again under a new X-GitHub-Delivery, its signature and
    # all, and GitHub redelivers it under its own id
    again = post("hub", body, github_headers(body, "guid-forged"))
    redelivered = post("hub", body, github_headers(body, "guid-1"))

    # then both are duplicates: one run, and the replay names the accepted delivery it repeats
    assert again.status_code == redelivered.status_code == 200 and again.json() == {"status": "duplicate"}
    assert WorkflowRun.objects.count() == 1
    forged = WebhookDelivery.objects.get(event_id="guid-forged")
    assert (forged.outcome, forged.body) == ("duplicate", None)
    assert forged.message.startswith(f"the signed body of accepted delivery {accepted.pk} (event guid-1) under another")
    second = WebhookDelivery.objects.get(event_id="guid-1", outcome="duplicate")
    assert second.body is None and second.message == f"the body of accepted delivery {accepted.pk}, not kept again"

    # and another body under a new id is another event
    other = encode({**EVENT, "data": {"order": "1043"}})
    assert post("hub", other, github_headers(other, "guid-2")).status_code == 202
    assert WorkflowRun.objects.count() == 2


def test_a_github_replay_matching_one_event_by_id_and_another_by_body_names_the_body() -> None:
    # given two accepted github deliveries
    first, second = encode(EVENT), encode({**EVENT, "data": {"order": "1043"}})
    assert post("hub", first, github_headers(first, "guid-1")).status_code == 202
    assert post("hub", second, github_headers(second, "guid-2")).status_code == 202

    # when the first's body comes under the second's id
    again = post("hub", first, github_headers(first, "guid-2"))

    # then it is a duplicate of the first (the body is what its signature vouches for)
    assert again.json() == {"status": "duplicate"} and WorkflowRun.objects.count() == 2
    accepted = WebhookDelivery.objects.get(event_id="guid-1", outcome="accepted")
    duplicate = WebhookDelivery.objects.get(outcome="duplicate")
    assert duplicate.body is None and f"accepted delivery {accepted.pk} (event guid-1)" in duplicate.message


def test_a_signed_id_keeps_events_with_equal_bodies_apart() -> None:
    # the schemes that sign the event id (standard, stripe) keep no replay key: equal bodies under
    # two signed ids are two events, as their sender said
    body = encode(EVENT)
    assert post("runs", body, standard_headers(body, "msg_1")).status_code == 202
    assert post("runs", body, standard_headers(body, "msg_2")).status_code == 202
    assert WorkflowRun.objects.count() == 2
    assert set(WebhookDelivery.objects.values_list("replay_key", flat=True)) == {""}


def test_a_replay_key_is_keyed_and_bound_to_its_source(settings: Any) -> None:
    body = encode(EVENT)
    key = replay_key("hub", body)
    assert len(key) == 64 and key != hashlib.sha256(body).hexdigest() and key != body_digest("hub", "", body)
    assert replay_key("hub2", body) != key
    settings.SECRET_KEY = "another-secret-key-0123456789abcdefghijklmnop"
    assert replay_key("hub", body) != key


def test_a_clash_on_the_primary_key_is_a_500_for_the_sender_to_try_again_not_a_duplicate() -> None:
    # given a row stored with the id the table's sequence hands out next (as after a restore that
    # left the sequence behind)
    taken = WebhookDelivery.objects.create(source="runs", event_id="evt_old", outcome="rejected")
    WebhookDelivery.objects.create(pk=taken.pk + 1, source="runs", event_id="evt_restored", outcome="rejected")

    # when a new event arrives, its accepted row gets that id
    body = encode(EVENT)
    response = post("runs", body, standard_headers(body, "msg_new"))

    # then it is not taken for a duplicate of an event never accepted: a 500, recorded, and nothing done
    assert response.status_code == 500 and response.json()["error"]["code"] == "action_failed"
    assert not WebhookDelivery.objects.filter(outcome__in=["accepted", "duplicate"]).exists()
    assert WorkflowRun.objects.count() == 0
    # and the sender's next try is accepted
    assert post("runs", body, standard_headers(body, "msg_new")).status_code == 202
    assert WorkflowRun.objects.count() == 1


def test_the_same_event_id_at_another_source_is_another_event() -> None:
    body = encode(EVENT)
    assert post("runs", body, standard_headers(body, "same")).status_code == 202
    assert post("hub", body, github_headers(body, "same")).status_code == 202
    assert WorkflowRun.objects.count() == 2


def test_an_unknown_source_is_a_404_and_records_nothing() -> None:
    body = encode(EVENT)
    response = post("nobody", body, standard_headers(body, "msg_1"))
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "not_found"
    assert WebhookDelivery.objects.count() == 0 and written() == (0, 0, 0)


@pytest.mark.parametrize("path", ["/webhooks/crm/extra/", "/webhooks/", "/webhooks/a/b"])
def test_any_other_path_under_webhooks_is_the_same_json_404(path: str) -> None:
    # a sender configured with a segment too many reads the API's error, not Django's page
    body = encode(EVENT)
    response = Client().post(path, data=body, content_type="application/json", headers=standard_headers(body, "m"))
    assert response.status_code == 404
    assert response.json() == {"error": {"code": "not_found", "message": "Not found.", "detail": None}}
    assert WebhookDelivery.objects.count() == 0


def test_a_url_without_its_trailing_slash_is_served_too(settings: Any) -> None:
    # given DEBUG on, where Django's APPEND_SLASH answers a POST to a URL without its slash with a 500
    settings.DEBUG = True
    body = encode(EVENT)

    response = Client().post(
        "/webhooks/runs", data=body, content_type="application/json", headers=standard_headers(body, "m")
    )

    assert response.status_code == 202, response.content
    assert WebhookDelivery.objects.get().event_id == "m" and WorkflowRun.objects.count() == 1


def test_a_get_is_a_405() -> None:
    response = Client().get("/webhooks/runs/")
    assert response.status_code == 405
    assert response.json()["error"]["code"] == "method_not_allowed"
    assert WebhookDelivery.objects.count() == 0


def test_a_body_over_the_limit_is_a_413() -> None:
    body = encode({"data": {"pad": "x" * 5000}})
    delivery = refused(post("runs", body, standard_headers(body, "big")), 413, "payload_too_large")
    assert delivery.size == len(body)


def test_a_declared_length_over_the_limit_is_a_413_before_reading() -> None:
    body = encode(EVENT)
    response = post("runs", body, standard_headers(body, "msg_1"), CONTENT_LENGTH="999999")
    delivery = refused(response, 413, "payload_too_large")
    assert (delivery.size, delivery.event_id) == (999999, "msg_1")


@pytest.mark.parametrize(
    ("tamper", "code"),
    [
        (lambda h: {**h, "webhook-signature": h["webhook-signature"][:-4] + "AAA="}, "bad_signature"),
        (lambda h: {k: v for k, v in h.items() if k != "webhook-signature"}, "missing_header"),
        (lambda h: {**h, "webhook-signature": "v1 nope"}, "malformed_header"),
    ],
)
def test_a_bad_or_missing_signature_is_a_401(tamper: Any, code: str) -> None:
    body = encode(EVENT)
    delivery = refused(post("runs", body, tamper(standard_headers(body, "msg_1"))), 401, code)
    assert delivery.headers.get("Webhook-Id") == "msg_1"
    # recorded under the id it claims, unverified: the admin's search for msg_1 finds it, rejected
    assert delivery.event_id == "msg_1"
    assert all(v == "[redacted]" for k, v in delivery.headers.items() if "signature" in k.lower())


def test_credential_like_headers_are_never_stored() -> None:
    body = encode(EVENT)
    credentials = {
        name: f"value-of-{name}"
        for name in ("X-Session-Id", "X-Jwt", "Bearer", "Sig", "X-Pass", "Proxy-Authorization", "X-Api-Key",
                     "X-Csrftoken", "X-Private-Token", "X-Webhook-Secret", "Cookie", "X-Ms-Client-Principal",
                     "X-Amzn-Oidc-Data", "X-Ssl-Client-Cert")
    }  # fmt: skip
    delivery = refused(post("runs", body, {"Webhook-Id": "msg_1", **credentials}), 401, "missing_header")
    kept = {name.lower(): value for name, value in delivery.headers.items()}
    assert {name: kept[name.lower()] for name in credentials} == dict.fromkeys(credentials, "[redacted]")
    assert kept["webhook-id"] == "msg_1"  # what is not a credential is kept


def test_a_tampered_body_is_a_401() -> None:
    body = encode(EVENT)
    refused(post("runs", body.replace(b"1042", b"9999"), standard_headers(body, "msg_1")), 401, "bad_signature")


@pytest.mark.parametrize(("offset", "code"), [(-360, "stale_timestamp"), (360, "future_timestamp")])
def test_a_timestamp_six_minutes_off_is_a_401(offset: int, code: str) -> None:
    import time

    body = encode(EVENT)
    refused(post("runs", body, standard_headers(body, "msg_1", at=time.time() + offset)), 401, code)


def test_a_stripe_signature_out_of_tolerance_is_a_401() -> None:
    import time

    body = encode({"id": "evt_1", "data": {}})
    delivery = refused(post("payments", body, stripe_headers(body, at=time.time() - 360)), 401, "stale_timestamp")
    assert delivery.event_id == ""  # stripe's id is in the body, which an unverified sender wrote: not read


@pytest.mark.parametrize(
    ("claimed", "code", "recorded"),
    [("guid-9", "bad_signature", "guid-9"), ("g" * 201, "malformed_header", "")],  # not an id: not recorded as one
)
def test_a_rejected_github_delivery_is_recorded_under_the_delivery_id_it_claims(
    claimed: str, code: str, recorded: str
) -> None:
    body = encode(EVENT)
    delivery = refused(post("hub", body, github_headers(body, claimed, secret="wrong")), 401, code)
    assert delivery.event_id == recorded


def test_malformed_json_is_a_400() -> None:
    body = b'{"data": '
    refused(post("runs", body, standard_headers(body, "msg_1")), 400, "parse_error")


@pytest.mark.parametrize("depth", [101, 50_000])  # past the stored limit; past what the parser can go
def test_json_nested_too_deep_is_a_400_that_says_so(depth: int) -> None:
    body = b"[" * depth + b"]" * depth
    response = post("sandbox", body, standard_headers(body, "deep"))
    refused(response, 400, "parse_error")
    assert "nested more than 100 levels deep" in response.json()["error"]["message"]


def test_what_a_request_can_make_us_store_of_its_headers_is_bounded() -> None:
    # given an unsigned request to a configured source with many long headers
    headers = {f"X-Pad-{i}": "y" * 1000 for i in range(100)}

    delivery = refused(post("runs", b"{}", headers), 401, "missing_header")

    # then its rejection keeps the first 40 headers (the client's own first), each cut short
    assert len(delivery.headers) == 40
    assert delivery.headers["X-Pad-0"] == "y" * 256 + "…[cut]"
    assert len(json.dumps(delivery.headers)) < 15_000


def test_a_signed_stripe_body_without_an_id_is_a_400() -> None:
    body = encode({"data": {}})
    refused(post("payments", body, stripe_headers(body)), 400, "parse_error")


def test_json_postgresql_cannot_store_is_a_400() -> None:
    body = b'{"data": {"x": "\\u0000"}}'
    refused(post("runs", body, standard_headers(body, "msg_1")), 400, "parse_error")


@pytest.mark.parametrize("number", [b"NaN", b"Infinity", b"-Infinity", b"1e999"])
def test_numbers_json_has_not_are_a_400_not_a_500(number: bytes) -> None:
    # Python's json takes them, PostgreSQL refuses them: a signed event with one was a 500 for ever
    body = b'{"data": {"x": ' + number + b"}}"
    refused(post("runs", body, standard_headers(body, "msg_1")), 400, "parse_error")


def test_a_payload_the_workflow_cannot_take_is_a_400_and_starts_nothing() -> None:
    body = encode({"data": ["not", "an", "object"]})
    delivery = refused(post("runs", body, standard_headers(body, "msg_1")), 400, "invalid_event")
    assert delivery.event_id == "msg_1"
    # refused, so not accepted: the sender may correct and send the event again
    fixed = encode(EVENT)
    assert post("runs", fixed, standard_headers(fixed, "msg_1")).status_code == 202


def test_a_source_without_a_secret_refuses_everything(settings: Any) -> None:
    settings.WEBHOOK_SOURCES = {**SOURCES, "runs": {**SOURCES["runs"], "secrets": []}}
    body = encode(EVENT)
    refused(post("runs", body, standard_headers(body, "msg_1")), 401, "no_secret")


def test_the_error_names_the_delivery_record_only_to_a_signed_sender() -> None:
    # signed, but not JSON: the sender holds the secret, and is told which record its refusal is
    signed = post("runs", b"{not json", standard_headers(b"{not json", "msg_1"))
    assert signed.status_code == 400
    assert signed.json()["error"]["detail"] == {"delivery": WebhookDelivery.objects.get().pk}

    # unsigned: recorded all the same, but anyone could have sent it, and ids are sequential
    unsigned = post("runs", encode(EVENT), {})
    assert unsigned.status_code == 401 and unsigned.json()["error"]["detail"] == {"delivery": None}
    assert WebhookDelivery.objects.filter(reason="missing_header").count() == 1


def test_an_action_that_fails_is_a_500_that_keeps_nothing_but_the_rejection(monkeypatch: pytest.MonkeyPatch) -> None:
    from webhooks import actions

    def broken(action: dict[str, Any], event: actions.Event) -> actions.ActionResult:
        WorkflowRun.objects.create(workflow="test.echo", payload={})  # work done, then a failure
        raise RuntimeError("the database of the partner is down")

    perform_workflow_with(monkeypatch, broken)
    body = encode(EVENT)

    delivery = refused(post("runs", body, standard_headers(body, "msg_1")), 500, "action_failed")

    assert "partner" not in delivery.message  # the exception's text stays in the log
    monkeypatch.undo()
    assert post("runs", body, standard_headers(body, "msg_1")).status_code == 202  # sent again: accepted


def test_a_failed_outcome_records_the_providers_failure_reason_not_the_requests_reason() -> None:
    make_operation("refund:9:1")  # unknown, sent an hour ago
    body = encode(outcome_event("refund:9:1", "failed", reason="arrived damaged", failure_reason="declined"))

    response = post("sandbox", body, standard_headers(body, "evt_failed"))

    assert response.status_code == 202, response.content
    op = ExternalOperation.objects.get(key="refund:9:1")
    assert op.status == "failed"
    assert op.error is not None and op.error["reason"] == "declined"


def test_a_long_source_name_and_event_id_start_a_run_under_a_hashed_key(settings: Any) -> None:
    # both allowed at their longest: "<source>:<event id>" would be 301 characters
    source = "s" * 100
    settings.WEBHOOK_SOURCES = {source: SOURCES["runs"]}
    body = encode(EVENT)

    response = post(source, body, standard_headers(body, "e" * 200))
    again = post(source, body, standard_headers(body, "e" * 200))

    assert (response.status_code, again.status_code) == (202, 200), response.content
    [run] = WorkflowRun.objects.all()
    assert run.idempotency_key.startswith(f"{source}:sha256:") and len(run.idempotency_key) <= 255
