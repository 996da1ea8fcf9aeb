"""The demo end to end on a real worker, and its seeding command."""

from __future__ import annotations

from io import StringIO
from typing import Any

import pytest
from django.contrib.auth import authenticate
from django.contrib.auth.models import Group, User
from django.core.management import call_command

from accounts.models import Account
from agents.models import Agent
from approvals import ApprovalRefused, decide
from approvals.models import ApprovalRequest
from examples.demo.management.commands.seed_demo import RUN_KEY
from examples.demo.workflows import APPROVERS
from tests.factories import Users, api_login
from tests.support import Worker, wait_for_status, wait_for_terminal
from workflows import public as wf
from workflows.exceptions import InvalidPayload
from workflows.models import RunStatus, StepResult, StepStatus, WorkflowRun

# Short enough for a test, long enough that the sleep really suspends the run.
FAST = {"customer": "bob", "plan": "team", "work_seconds": 0.5, "settle_seconds": 1}
STEPS = [
    "create account",
    "provision workspace",
    "import sample data",
    "let the workspace settle",
    "onboarding approval: request",
    "onboarding approval: decision",
    "send welcome",
]


def steps_of(run_id: Any) -> list[tuple[str, str]]:
    return list(StepResult.objects.filter(run_id=run_id).order_by("position").values_list("name", "status"))


@pytest.mark.django_db(transaction=True)
def test_onboarding_completes_after_a_real_approval_its_owner_could_not_give(worker: Worker, users: Users) -> None:
    # given: the run works through its steps and its durable sleep, then asks for an approval
    alice, carol = users.alice, users.carol
    carol.groups.add(Group.objects.create(name=APPROVERS))
    run = wf.start("demo.onboarding", {**FAST, "approval_timeout_seconds": 300}, owner=alice)
    waiting = wait_for_status(run.id, RunStatus.WAITING, timeout=90)
    request = ApprovalRequest.objects.get(run=run)
    assert waiting.wait_event_type == f"approval:{request.pk}"
    assert (request.approvers, request.requested_by, request.summary) == (
        APPROVERS,
        alice,
        "Onboard bob on the team plan",
    )
    assert waiting.progress == {"done": 4, "total": 6, "stage": "settled; awaiting approval"}

    # when alice, who started it, tries to approve it (as the "approve" event did before), then carol does
    with pytest.raises(InvalidPayload):
        wf.send_event(run.id, f"approval:{request.pk}", {"approved": True})
    with pytest.raises(ApprovalRefused):
        decide(request, by=alice, approve=True, version="1")
    decide(request, by=carol, approve=True, version="1")

    # then
    done = wait_for_terminal(run.id, timeout=60)
    assert done.status == RunStatus.COMPLETED, done.error
    assert done.result is not None
    assert (done.result["approved"], done.result["approval_request"]) == (True, request.pk)
    assert done.result["welcome"] == {"to": "bob", "template": "welcome"}
    assert done.progress == {"done": 6, "total": 6, "stage": "done"}
    assert steps_of(run.id) == [(name, StepStatus.COMPLETED) for name in STEPS]


@pytest.mark.django_db(transaction=True)
def test_onboarding_carries_on_unapproved_when_the_wait_times_out(worker: Worker) -> None:
    run = wf.start("demo.onboarding", {**FAST, "approval_timeout_seconds": 1})

    done = wait_for_terminal(run.id, timeout=90)

    assert done.status == RunStatus.COMPLETED, done.error
    assert done.result is not None
    assert done.result["approved"] is False
    assert done.result["welcome"]["template"] == "welcome-pending-review"
    assert ("onboarding approval: decision", StepStatus.FAILED) in steps_of(run.id)  # the timeout, recorded
    assert ApprovalRequest.objects.get(run=run).status == "expired"


@pytest.mark.django_db
@pytest.mark.parametrize(
    "payload, why",
    [
        ({"work_seconds": 36000}, "work_seconds must be between 0 and 10"),
        ({"settle_seconds": -1}, "settle_seconds must be between 0 and 600"),
        ({"approval_timeout_seconds": "soon"}, "approval_timeout_seconds must be a number"),
        ({"customer": ""}, "customer must be a string"),
        ({"plan": ["team"]}, "plan must be a string"),
        ({"work_seconds": True}, "work_seconds must be a number"),
        ({"hack": 1}, "unknown payload keys: hack"),
    ],
)
def test_a_bad_onboarding_payload_is_a_400_and_starts_nothing(users: Users, payload: dict[str, Any], why: str) -> None:
    client = api_login(users.mallory, via="force")

    response = client.post("/api/workflows/demo.onboarding/runs", {"payload": payload}, format="json")

    assert response.status_code == 400, response.json()
    assert response.json()["error"]["code"] == "invalid_payload"
    assert why in response.json()["error"]["message"]
    assert not WorkflowRun.objects.exists()


@pytest.mark.django_db
def test_seed_demo_is_idempotent() -> None:
    # when: seeded twice
    first, second = StringIO(), StringIO()
    call_command("seed_demo", stdout=first)
    call_command("seed_demo", stdout=second)

    # then: one of each, logins that work, one run owned by alice
    admin, alice = User.objects.get(username="admin"), User.objects.get(username="alice")
    assert (admin.is_superuser, admin.is_staff, alice.is_staff) == (True, True, False)
    assert authenticate(username="admin", password="admin") == admin
    assert authenticate(username="alice", password="alice") == alice
    run = WorkflowRun.objects.get()
    assert (run.workflow, run.owner, run.idempotency_key) == ("demo.onboarding", alice, RUN_KEY)
    assert "admin  / admin" in first.getvalue() and "alice  / alice" in first.getvalue()
    assert f"Demo run {run.pk} (demo.onboarding, owner alice): started." in first.getvalue()
    assert "already existed" in second.getvalue()
    assert f"Demo run {run.pk} (demo.onboarding, owner alice): already exists" in second.getvalue()
    # and the tenants: alice and bob share acme, mallory is alone in globex
    members = {a.slug: sorted(m.user.username for m in a.memberships.all()) for a in Account.objects.all()}
    assert members == {"acme": ["alice", "bob"], "globex": ["mallory"]}
    # and alice's support agent in acme, made once, its chat's address and what to type printed each time
    agent = Agent.objects.get()
    assert (agent.account.slug, agent.kind, agent.name) == ("acme", "support", "help")
    for out in (first.getvalue(), second.getvalue()):
        assert "Support chat of acme (signed in as alice, or bob): /chat/support/help/" in out
        assert 'Type: "I\'d like a refund for order 1042 because it arrived damaged"' in out


@pytest.mark.django_db
def test_seed_demo_leaves_a_changed_password_alone() -> None:
    call_command("seed_demo", stdout=StringIO())
    alice = User.objects.get(username="alice")
    alice.set_password("a better one")
    alice.save()

    call_command("seed_demo", stdout=StringIO())

    assert authenticate(username="alice", password="a better one") == alice


@pytest.mark.django_db
def test_seed_demo_schedules_the_weekly_supplier_reminder_to_acme_and_a_reseed_leaves_it_alone() -> None:
    from schedules.models import Schedule
    from schedules.services import schedule_fire, schedules_enable

    out = StringIO()
    call_command("seed_demo", stdout=out)
    schedule = Schedule.objects.get(name="supplier-reassessment-weekly")
    assert (schedule.cron, schedule.enabled, schedule.describe_action()) == (
        "0 9 * * mon",
        True,
        "submit to acme/support/supplier-reviews",
    )
    assert schedule.next_due_at is not None and schedule.next_due_at.isoweekday() == 1
    assert "Schedule supplier-reassessment-weekly (cron 0 9 * * mon (UTC)" in out.getvalue()

    schedules_enable(schedules=[schedule], enabled=False)  # an operator turns it off
    call_command("seed_demo", stdout=StringIO())
    assert not Schedule.objects.get(pk=schedule.pk).enabled

    firing = schedule_fire(schedule=schedule)
    assert firing is not None and firing.outcome == "started", firing and firing.error
    submission = firing.submission
    assert submission is not None
    assert (submission.agent.account.slug, submission.agent.kind, submission.agent.name) == (
        "acme",
        "support",
        "supplier-reviews",
    )
    assert "re-assess our suppliers" in submission.messages[0]["content"]


@pytest.mark.django_db(transaction=True)
def test_the_weekly_reminder_is_answered_without_telling_anyone_an_assessment(worker: Worker) -> None:
    # given the demo, with alice's assessment of Acme Metals
    from agents.tests.support import wait_ended
    from schedules.models import Schedule
    from schedules.services import schedule_fire

    call_command("seed_demo", stdout=StringIO())

    # when the weekly reminder fires (a schedule: no person asked) and the support agent answers it
    firing = schedule_fire(schedule=Schedule.objects.get(name="supplier-reassessment-weekly"))
    assert firing is not None and firing.submission is not None and firing.submission.turn is not None
    turn = wait_ended(firing.submission.turn)

    # then the answer says why it tells nothing, rather than that there is no such assessment
    assert turn.status == "completed", turn.end_reason
    assert "no person asked this" in turn.text and "ask in the chat yourself" in turn.text
    assert "I found no assessment" not in turn.text
