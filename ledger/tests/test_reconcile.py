"""``manage.py reconcile`` and the reconcile services, against a real HTTP provider.

Operations are set up in the database in the state under test; the provider knows what it knows
(``seed``). Lookups are real HTTP calls; nothing here submits.
"""

from __future__ import annotations

from datetime import timedelta
from io import StringIO
from typing import Any

import pytest
from django.core.management import CommandError, call_command

from ledger import HttpAdapter, register_adapter, unregister_adapter
from ledger.durations import InvalidDuration, describe, parse_duration
from ledger.models import ExternalOperation, OperationEvent, OperationStatus
from ledger.services import operation_reconcile
from ledger.tests.provider import FakeProvider, Fault
from ledger.tests.support import make_operation, snapshot
from tests.factories import Users

pytestmark = pytest.mark.django_db


def reconcile(*args: str) -> str:
    out = StringIO()
    call_command("reconcile", *args, stdout=out)
    return out.getvalue()


@pytest.mark.django_db
def test_a_system_nothing_knows_is_an_error() -> None:
    # a typo in a scheduled job is not "nothing to reconcile"
    with pytest.raises(CommandError, match="no adapter is registered for system 'paymnets'.*no operation of it"):
        call_command("reconcile", "--system", "paymnets", stdout=StringIO(), stderr=StringIO())


@pytest.mark.django_db
def test_a_system_without_an_adapter_but_with_operations_lists_them_flagged() -> None:
    # an app removed with operations of its system left: they are shown, for a person
    op = make_operation("orphan", system="gone")
    out, err = StringIO(), StringIO()
    call_command("reconcile", "--system", "gone", stdout=out, stderr=err)
    assert "no adapter is registered for system 'gone'" in err.getvalue()
    assert "!" in row_of(out.getvalue(), op.key)


def row_of(output: str, key: str) -> str:
    [row] = [line for line in output.splitlines() if f" {key} " in f" {line} "]
    return row


def status_of(op: ExternalOperation) -> str:
    return str(ExternalOperation.objects.get(pk=op.pk).status)


@pytest.fixture
def scene(payments: FakeProvider) -> dict[str, ExternalOperation]:
    """One operation of each kind reconciliation meets, and what the provider knows of them."""
    payments.seed("paid")
    payments.seed("declined", status="failed", reason="card_declined")
    payments.seed("fresh")
    payments.inject("lookup", "provider-down", Fault("error", status=503))
    return {
        "paid": make_operation("paid"),  # unknown; the provider did it
        "declined": make_operation("declined"),  # unknown; the provider declined it
        "never-sent": make_operation("never-sent", OperationStatus.SUBMITTED),  # stale; the provider never got it
        "provider-down": make_operation("provider-down"),  # unknown; the lookup fails
        "fresh": make_operation("fresh", OperationStatus.SUBMITTED, sent_ago=timedelta(seconds=1)),  # in flight
        "done": make_operation("done", OperationStatus.SUCCEEDED),
    }


def test_reconcile_resolves_what_the_provider_knows_and_flags_the_rest(
    scene: dict[str, ExternalOperation], payments: FakeProvider
) -> None:
    # when
    output = reconcile()

    # then each operation is where the provider's answer puts it
    assert status_of(scene["paid"]) == OperationStatus.SUCCEEDED
    assert ExternalOperation.objects.get(key="paid").response == payments.records["paid"]
    assert status_of(scene["declined"]) == OperationStatus.FAILED
    declined = ExternalOperation.objects.get(key="declined")
    assert declined.error is not None and declined.error["reason"] == "card_declined"
    assert status_of(scene["never-sent"]) == OperationStatus.PENDING  # the next perform sends it
    assert status_of(scene["provider-down"]) == OperationStatus.UNKNOWN
    assert status_of(scene["fresh"]) == OperationStatus.SUBMITTED  # its worker may still answer
    # and nothing was submitted, the fresh and finished ones not even looked up
    assert payments.submits() == 0
    assert {c.key for c in payments.calls} == {"paid", "declined", "never-sent", "provider-down"}

    # and the table says what it did, one row each, the unresolved one flagged
    header, rule, *_ = output.splitlines()
    assert header.split() == ["KEY", "SYSTEM", "BEFORE", "→", "AFTER", "NOTE"]
    assert set(rule) <= {"-", " "}
    assert row_of(output, "paid").split()[:6] == ["✓", "paid", "payments", "unknown", "→", "succeeded"]
    assert "card_declined" in row_of(output, "declined")
    assert "submitted → pending" in row_of(output, "never-sent")
    assert "safe to send again" in row_of(output, "never-sent")
    flagged = row_of(output, "provider-down")
    assert flagged.startswith("!") and "unknown → unknown" in flagged and "HTTP 503" in flagged
    assert "fresh" not in output and "done" not in output
    assert "4 operation(s): 3 resolved, 1 flagged, 0 skipped." in output
    assert "1 need a person" in output


def test_dry_run_looks_up_but_changes_nothing(scene: dict[str, ExternalOperation], payments: FakeProvider) -> None:
    # given
    before = snapshot(*scene.values())
    events = OperationEvent.objects.count()

    # when
    output = reconcile("--dry-run")

    # then
    assert snapshot(*scene.values()) == before
    assert OperationEvent.objects.count() == events
    assert "unknown would be succeeded" in row_of(output, "paid")
    assert "submitted would be pending" in row_of(output, "never-sent")
    assert row_of(output, "provider-down").startswith("!")
    assert output.count("Dry run, nothing changed.") == 1
    assert payments.submits() == 0


def test_system_and_older_than_narrow_what_is_reconciled(payments: FakeProvider) -> None:
    # given
    payments.seed("old")
    payments.seed("recent")
    old = make_operation("old", sent_ago=timedelta(hours=2))
    recent = make_operation("recent", sent_ago=timedelta(minutes=5))
    elsewhere = make_operation("elsewhere", system="mail", sent_ago=timedelta(hours=2))
    before = snapshot(recent, elsewhere)

    # when
    output = reconcile("--system", "payments", "--older-than", "10m")

    # then
    assert status_of(old) == OperationStatus.SUCCEEDED
    assert snapshot(recent, elsewhere) == before
    assert "recent" not in output and "elsewhere" not in output
    assert reconcile("--system", "payments", "--older-than", "10m").startswith(
        "Nothing to reconcile: no unknown or stale submitted operations of payments sent more than 10m ago."
    )


def test_an_operator_may_reconcile_a_submit_younger_than_the_stale_setting(
    payments: FakeProvider, ledger_settings: Any
) -> None:
    # given a submit one minute old, not stale by the setting (10 minutes)
    ledger_settings.LEDGER = {**ledger_settings.LEDGER, "STALE_SUBMITTED_SECONDS": 600.0}
    payments.seed("minute-old")
    op = make_operation("minute-old", OperationStatus.SUBMITTED, sent_ago=timedelta(minutes=1))
    assert "Nothing to reconcile" in reconcile()

    # when the operator says 30 seconds is old enough
    reconcile("--older-than", "30s")

    # then
    assert status_of(op) == OperationStatus.SUCCEEDED


def test_what_cannot_be_looked_up_is_flagged_for_a_person(provider: FakeProvider, ledger_settings: Any) -> None:
    # given a system that cannot look up, and one with no adapter in this process
    register_adapter("blind", HttpAdapter(base_url=provider.url, lookup_path=None))
    stale = make_operation("blind-stale", OperationStatus.SUBMITTED, system="blind")
    unknown = make_operation("blind-unknown", system="blind")
    orphan = make_operation("orphan", system="retired")
    try:
        # when
        output = reconcile()
    finally:
        unregister_adapter("blind")

    # then the stale submit is now unknown (so the admin lists it), and every row is flagged
    assert status_of(stale) == OperationStatus.UNKNOWN
    assert status_of(unknown) == OperationStatus.UNKNOWN
    assert status_of(orphan) == OperationStatus.UNKNOWN
    for key in ("blind-stale", "blind-unknown", "orphan"):
        assert row_of(output, key).startswith("!")
    assert "resolve it by hand in the admin" in row_of(output, "blind-stale")
    assert "no adapter for 'retired'" in row_of(output, "orphan")
    assert "3 need a person" in output
    assert provider.calls == []


def test_reconciling_one_operation_that_needs_nothing_changes_nothing(payments: FakeProvider) -> None:
    done = make_operation("done", OperationStatus.SUCCEEDED)
    fresh = make_operation("fresh", OperationStatus.SUBMITTED, sent_ago=timedelta(seconds=1))
    before = snapshot(done, fresh)

    results = [operation_reconcile(operation_id=op.pk) for op in (done, fresh)]

    assert [r.verdict for r in results] == ["skipped", "skipped"]
    assert "may still be in flight" in results[1].note
    assert snapshot(done, fresh) == before
    assert payments.calls == []


@pytest.mark.parametrize("bad", ["10x", "ten minutes", "-5m", "5", "1.5h", ""])
def test_bad_durations_are_usage_errors_that_change_nothing(payments: FakeProvider, bad: str) -> None:
    op = make_operation("untouched")
    payments.seed("untouched")
    before = snapshot(op)

    with pytest.raises(CommandError, match="--older-than"):
        reconcile("--older-than", bad)

    assert snapshot(op) == before
    assert payments.calls == []


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("30s", timedelta(seconds=30)),
        ("10m", timedelta(minutes=10)),
        ("2h", timedelta(hours=2)),
        ("90d", timedelta(days=90)),
        ("2w", timedelta(weeks=2)),
        (" 10M ", timedelta(minutes=10)),
        ("0s", timedelta(0)),
    ],
)
def test_parse_duration(text: str, expected: timedelta) -> None:
    assert parse_duration(text) == expected


def test_parse_duration_says_what_it_expected() -> None:
    with pytest.raises(InvalidDuration, match="use a whole number and a unit, e.g. 30s, 10m, 2h, 90d"):
        parse_duration("10 minutes")
    with pytest.raises(InvalidDuration, match="too long"):
        parse_duration("99999999999999d")
    assert [describe(parse_duration(t)) for t in ("90d", "36h", "10m", "45s", "2w")] == [
        "90d",
        "36h",
        "10m",
        "45s",
        "2w",
    ]


# --- operations of runs that ended ------------------------------------------------------------------
def ended_run(status: str = "terminated") -> Any:
    """A run row that has ended (the engine's status is protected: set once, at creation)."""
    from workflows.models import WorkflowRun

    return WorkflowRun.objects.create(workflow="ledger.test.refund", queue="none", status=status)


def test_a_pending_operation_of_an_ended_run_is_abandoned_and_listed_until_then(payments: FakeProvider) -> None:
    from ledger.selectors import operations_to_reconcile, run_operations_needing_reconciliation

    # given a run that ended (failed) before it sent its operation, and a live one that will
    run = ended_run("failed")
    orphan = make_operation("orphan", OperationStatus.PENDING, sent_ago=None, run=run)
    live = make_operation("live", OperationStatus.PENDING, sent_ago=None)
    assert orphan.pk in {op.pk for op in operations_to_reconcile()}
    assert live.pk not in {op.pk for op in operations_to_reconcile()}
    assert [op.key for op in run_operations_needing_reconciliation(run)] == ["orphan"]

    # when
    output = reconcile()

    # then nobody will send it: it is failed as abandoned (the key is spent), and nothing was sent
    op = ExternalOperation.objects.get(pk=orphan.pk)
    assert op.error is not None
    assert (op.status, op.error["reason"]) == (OperationStatus.FAILED, "abandoned")
    assert "abandoned" in row_of(output, "orphan")
    assert status_of(live) == OperationStatus.PENDING
    assert payments.submits() == 0 and payments.lookups() == 0
    assert list(run_operations_needing_reconciliation(run)) == []


def test_a_not_found_of_an_ended_runs_operation_never_settles_it(payments: FakeProvider) -> None:
    # given an operation of an ended run, sent a second ago, that the provider has no record of
    run = ended_run()
    op = make_operation("young", sent_ago=timedelta(seconds=1), run=run)

    # when reconcile looks it up: "not found" proves nothing yet
    output = reconcile()
    assert status_of(op) == OperationStatus.UNKNOWN
    assert "may still reach the provider" in row_of(output, "young")  # (the table cuts long notes)
    assert not row_of(output, "young").startswith("!")  # it needs time, not a person

    # when the send is older than the window: still unknown, for a person (a provider may act on a
    # request long after our call gave up; nobody will send this one again)
    assert op.submitted_at is not None
    ExternalOperation.objects.filter(pk=op.pk).update(submitted_at=op.submitted_at - timedelta(minutes=5))
    output = reconcile()
    assert status_of(op) == OperationStatus.UNKNOWN
    assert row_of(output, "young").startswith("!")
    assert "a person decides" in ExternalOperation.objects.get(pk=op.pk).note

    # when the provider acts on it after all, the next reconcile finds it
    payments.seed("young")
    reconcile()
    assert status_of(op) == OperationStatus.SUCCEEDED
    assert payments.submits() == 0 and payments.lookups("young") == 3


def test_a_pending_operation_sent_before_is_looked_up_never_abandoned(
    payments: FakeProvider, ledger_settings: Any, users: Users
) -> None:
    from django.contrib.auth.models import Permission, User

    from ledger.services import operation_resolve

    # given two operations of an ended run, pending again after a send (released, or a "not found")
    run = ended_run()
    found = make_operation("sent-found", OperationStatus.PENDING, submit_count=1, run=run)
    lost = make_operation("sent-lost", OperationStatus.PENDING, submit_count=1, run=run)
    payments.seed("sent-found")

    # when
    output = reconcile()

    # then the one the provider has is settled; the other is left for a person, flagged
    assert status_of(found) == OperationStatus.SUCCEEDED
    assert status_of(lost) == OperationStatus.PENDING and row_of(output, "sent-lost").startswith("!")
    staff = users.carol
    staff.user_permissions.add(*Permission.objects.filter(codename="resolve_externaloperation"))
    operation_resolve(
        operation_id=lost.pk,
        outcome="failed",
        note="the provider's dashboard has nothing",
        user=User.objects.get(pk=staff.pk),
    )
    assert status_of(lost) == OperationStatus.FAILED
    assert payments.submits() == 0


def test_terminating_a_run_abandons_its_pending_operations_at_once(payments: FakeProvider) -> None:
    from workflows.models import WorkflowRun
    from workflows.services import run_terminate

    run = WorkflowRun.objects.create(workflow="ledger.test.refund", queue="none", status="waiting")
    pending = make_operation("held", OperationStatus.PENDING, sent_ago=None, run=run)
    unknown = make_operation("maybe", run=run)
    sent_before = make_operation("sent-before", OperationStatus.PENDING, submit_count=1, run=run)

    run_terminate(run_id=run.id)

    assert status_of(pending) == OperationStatus.FAILED
    assert status_of(unknown) == OperationStatus.UNKNOWN  # it may have happened: reconcile finds out
    assert status_of(sent_before) == OperationStatus.PENDING  # an earlier send may still take effect
    assert [e.kind for e in OperationEvent.objects.filter(operation=pending)] == ["abandon"]


def test_every_way_an_operation_settles_calls_the_settled_hooks_once(payments: FakeProvider, users: Users) -> None:
    from django.contrib.auth.models import Permission, User

    from ledger import hooks
    from ledger.services import operation_resolve

    settled: list[tuple[str, str]] = []

    def hook(op: ExternalOperation) -> None:
        settled.append((op.key, op.status))

    hooks.on_operation_settled(hook)
    try:
        payments.seed("found")
        make_operation("found")  # unknown; the provider did it
        make_operation("orphan", OperationStatus.PENDING, sent_ago=None, run=ended_run())
        make_operation("still-unknown", sent_ago=timedelta(seconds=1))  # not found yet: not settled
        reconcile()
        staff = users.carol
        staff.user_permissions.add(*Permission.objects.filter(codename="resolve_externaloperation"))
        by_hand = make_operation("by-hand")
        operation_resolve(operation_id=by_hand.pk, outcome="failed", note="checked", user=User.objects.get(pk=staff.pk))
    finally:
        hooks._on_settled.remove(hook)

    assert sorted(settled) == [("by-hand", "failed"), ("found", "succeeded"), ("orphan", "failed")]


def test_an_operation_marked_failed_by_hand_that_the_provider_did_after_all_is_corrected(
    payments: FakeProvider, users: Users
) -> None:
    from django.contrib.auth.models import Permission, User

    from ledger import hooks
    from ledger.services import operation_resolve

    # given a sent operation a person marked failed, the provider having no record of it yet
    staff = users.carol
    staff.user_permissions.add(*Permission.objects.filter(codename="resolve_externaloperation"))
    op = make_operation("late", run=ended_run())
    operation_resolve(
        operation_id=op.pk, outcome="failed", note="dashboard shows nothing", user=User.objects.get(pk=staff.pk)
    )
    assert "Nothing to reconcile" in reconcile()  # nothing new: the person's answer stands, unreported

    # when the provider acts on it after all, and reconcile runs
    payments.seed("late")
    settled: list[str] = []
    hook = hooks.on_operation_settled(lambda settled_op: settled.append(settled_op.status))
    try:
        output = reconcile()
    finally:
        hooks._on_settled.remove(hook)

    # then the ledger says what happened to the money, flagged for a person, and the hooks ran
    current = ExternalOperation.objects.get(pk=op.pk)
    assert current.status == OperationStatus.SUCCEEDED
    assert current.response == payments.records["late"]
    assert "marked failed by hand" in current.note
    assert row_of(output, "late").startswith("!") and settled == ["succeeded"]
    assert current.resolution_note == "dashboard shows nothing"  # the person's answer stays on record
    assert [e.kind for e in OperationEvent.objects.filter(operation=current)][-1] == "lookup"
    assert payments.submits() == 0
