"""decide() against its rules (docs/architecture.md#approvals), expiry, re-check, cancellation, and ten concurrent
decisions on one request (real threads on PostgreSQL).

Most tests run in one transaction each, so the decision's on-commit enqueue is never sent: the
run stays as decide() left it (woken: queued) and no worker is involved.
"""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import Group, User
from django.core.management import call_command
from django.utils import timezone

from approvals import ApprovalRefused, RefusalCode, decide, supersede_pending
from approvals.models import ApprovalRequest, ApprovalStatus, DecisionAction, DecisionLog, DecisionResult
from approvals.services import (
    approval_expire,
    approval_recheck,
    approval_request_create,
    cancel_for_run,
    cancel_orphans,
    subject_ref,
)
from approvals.tests.support import GROUP, assert_still_waiting, state, waiting_request
from approvals.types import Proposal
from tests.factories import Users
from tests.fixtures import NoEnqueue
from tests.support import thread_of
from workflows import services as wf_services
from workflows.exceptions import InvalidPayload, NonRetryableError
from workflows.models import RunEvent, RunStatus, WorkflowRun


def refused(
    request: ApprovalRequest, user: User, *, approve: bool = True, version: str | None = None, code: RefusalCode
) -> ApprovalRefused:
    """decide() is refused with ``code``; nothing changes but a 'refused' line in the log."""
    before = state(request)
    logged = DecisionLog.objects.filter(request=request).count()
    with pytest.raises(ApprovalRefused) as info:
        decide(request, by=user, approve=approve, version=version or request.version, note="n")
    assert info.value.code == code
    assert_still_waiting(request, before)
    last = DecisionLog.objects.filter(request=request).last()
    assert DecisionLog.objects.filter(request=request).count() == logged + 1
    assert last is not None and (last.result, last.code, last.actor_id) == (DecisionResult.REFUSED, code, user.pk)
    return info.value


@pytest.mark.django_db
class TestDecisionTable:
    def test_current_version_and_authorised_reviewer_decides_and_wakes_the_run(self, users: Users) -> None:
        # given
        request = waiting_request(requested_by=users.bob)

        # when
        decided = decide(request, by=users.carol, approve=True, version="v1", note="within policy")

        # then the transition
        request.refresh_from_db()
        assert decided.created and decided.request.pk == request.pk
        assert (request.status, request.decided_by, request.note) == (
            ApprovalStatus.APPROVED,
            users.carol,
            "within policy",
        )
        assert request.decided_at is not None
        # and, in the same transaction, the one event that wakes the run
        event = RunEvent.objects.get(run=request.run)
        assert decided.event_id == event.pk
        assert (event.type, event.idempotency_key) == (f"approval:{request.pk}", f"approval:{request.pk}:decision")
        # (what was decided, not by whom or why: the run's owner reads the wait step's result)
        assert event.payload == {
            "request_id": request.pk,
            "approved": True,
            "version": "v1",
            "decided_at": request.decided_at.isoformat(),
        }
        run = WorkflowRun.objects.get(pk=request.run_id)
        assert run.status == RunStatus.QUEUED and run.wait_event_type == ""
        log = DecisionLog.objects.get(request=request)
        assert (log.actor, log.action, log.version, log.result, log.channel) == (
            users.carol,
            DecisionAction.APPROVE,
            "v1",
            DecisionResult.ACCEPTED,
            "python",
        )

    def test_a_rejection_is_a_transition_too(self, users: Users) -> None:
        request = waiting_request(requested_by=users.bob)

        decide(request.pk, by=users.carol, approve=False, version="v1", note="over the limit")

        request.refresh_from_db()
        assert request.status == ApprovalStatus.REJECTED
        assert RunEvent.objects.get(run=request.run).payload["approved"] is False

    def test_decide_any_permission_stands_in_for_the_group(self, users: Users) -> None:
        request = waiting_request(requested_by=users.bob)

        decide(request, by=users.erin, approve=True, version="v1")

        assert ApprovalRequest.objects.get(pk=request.pk).status == ApprovalStatus.APPROVED

    def test_another_version_is_refused_review_the_current_version(self, users: Users) -> None:
        request = waiting_request(requested_by=users.bob, version="v2")

        refusal = refused(request, users.carol, version="v1", code=RefusalCode.STALE_VERSION)

        assert "review the current version" in str(refusal)
        assert refusal.detail == {"status": "pending", "version": "v2", "superseded_by": None}

    @pytest.mark.parametrize("approve", [True, False])
    def test_the_same_decision_again_is_the_established_result_without_a_second_event(
        self, users: Users, approve: bool
    ) -> None:
        request = waiting_request(requested_by=users.bob)
        first = decide(request, by=users.carol, approve=approve, version="v1", note="first")
        before = state(request)

        again = decide(request, by=users.carol, approve=approve, version="v1", note="double click")

        assert first.created and not again.created
        assert again.request.note == "first" and again.event_id is None
        assert state(request) == before  # no second transition, no second event
        assert RunEvent.objects.filter(run=request.run).count() == 1
        assert list(DecisionLog.objects.filter(request=request).values_list("result", flat=True)) == [
            DecisionResult.ACCEPTED,
            DecisionResult.REPEATED,
        ]

    def test_a_reviewer_outside_the_group_without_the_permission_is_refused(self, users: Users) -> None:
        request = waiting_request(requested_by=users.bob)

        for outsider in ("alice", "dave", "mallory"):  # dave may view every request, but not decide
            refused(request, getattr(users, outsider), code=RefusalCode.NOT_AUTHORISED)

    def test_a_group_of_another_name_does_not_count(self, users: Users) -> None:
        request = waiting_request(requested_by=users.bob, approvers="finance-approvers")

        refused(request, users.carol, code=RefusalCode.NOT_AUTHORISED)

    def test_an_inactive_reviewer_is_refused(self, users: Users) -> None:
        request = waiting_request(requested_by=users.bob)
        users.carol.is_active = False
        users.carol.save()

        refused(request, users.carol, code=RefusalCode.NOT_AUTHORISED)

    def test_the_requester_may_not_decide_four_eyes(self, users: Users) -> None:
        request = waiting_request(requested_by=users.bob)  # bob is in the group

        refused(request, users.bob, code=RefusalCode.FOUR_EYES)

    def test_four_eyes_binds_superusers_too(self, users: Users) -> None:
        boss = User.objects.create_superuser("boss", "boss@example.com", "pw")
        request = waiting_request(requested_by=boss)

        refused(request, boss, code=RefusalCode.FOUR_EYES)

    @pytest.mark.parametrize(
        "status", [ApprovalStatus.EXPIRED, ApprovalStatus.REJECTED, ApprovalStatus.SUPERSEDED, ApprovalStatus.CANCELLED]
    )
    def test_a_closed_request_is_refused_naming_its_state(self, users: Users, status: str) -> None:
        request = waiting_request(requested_by=users.bob, status=status)

        refusal = refused(request, users.carol, approve=True, code=RefusalCode.NOT_PENDING)

        assert f"the request is {status}" in str(refusal)
        assert refusal.status == status

    def test_the_opposite_decision_after_a_decision_is_refused_naming_the_state(self, users: Users) -> None:
        request = waiting_request(requested_by=users.bob)
        decide(request, by=users.carol, approve=True, version="v1")

        refusal = refused(request, users.erin, approve=False, code=RefusalCode.NOT_PENDING)

        assert "the request is approved" in str(refusal)
        assert RunEvent.objects.filter(run=request.run).count() == 1

    def test_a_superseded_request_points_at_its_replacement(self, users: Users) -> None:
        old = waiting_request(requested_by=users.bob, status=ApprovalStatus.SUPERSEDED)
        new = ApprovalRequest.objects.create(
            run=old.run,
            attempt=1,
            step_name="refund approval",
            subject_type="shop.order",
            subject_id="1042",
            version="v2",
            summary="Refund £90",
            approvers=GROUP,
            replaces=old,
            expires_at=timezone.now() + timedelta(hours=1),
        )

        refusal = refused(old, users.carol, code=RefusalCode.NOT_PENDING)

        assert "review the current version (v2" in str(refusal)
        assert refusal.superseded_by == new.pk

    def test_past_its_expiry_a_pending_request_is_refused_as_expired(self, users: Users) -> None:
        # The workflow's timer has not moved it to expired yet; a decision now would come too late.
        request = waiting_request(requested_by=users.bob, expires_in=timedelta(seconds=-1))

        refusal = refused(request, users.carol, code=RefusalCode.EXPIRED)

        assert "expired at" in str(refusal)

    def test_a_request_of_a_finished_run_is_refused(self, users: Users) -> None:
        request = waiting_request(requested_by=users.bob, run_status=RunStatus.FAILED)

        refused(request, users.carol, code=RefusalCode.RUN_FINISHED)

    def test_bad_input_is_refused_before_anything(self, users: Users) -> None:
        request = waiting_request(requested_by=users.bob)
        before = state(request)

        with pytest.raises(InvalidPayload):
            decide(request, by=users.carol, approve=True, version="")
        with pytest.raises(InvalidPayload):
            decide(request, by=users.carol, approve=True, version="v1", note="x" * 5000)

        assert_still_waiting(request, before)
        assert not DecisionLog.objects.exists()


@pytest.mark.django_db
class TestWorkflowSide:
    def test_subject_is_a_saved_instance_or_a_type_and_id(self, users: Users) -> None:
        group = Group.objects.create(name="g")
        assert subject_ref(group) == ("auth.group", str(group.pk))
        assert subject_ref(("shop.order", 1042)) == ("shop.order", "1042")
        with pytest.raises(ValueError, match="not saved"):
            subject_ref(Group(name="unsaved"))
        for bad in [("shop.order",), ("", 1), ("shop.order", True), "shop.order:1", ("shop.order", None)]:
            with pytest.raises(TypeError):
                subject_ref(bad)  # type: ignore[arg-type]

    def test_a_request_names_the_version_and_its_consequence(self, users: Users) -> None:
        run = waiting_request().run
        request = approval_request_create(
            run_id=run.id,
            attempt=1,
            step_name="refund approval",
            subject=("shop.order", "7"),
            proposal=Proposal(version="3", content={"amount": "120.00"}, summary="Refund £120"),
            approvers=GROUP,
            timeout=timedelta(hours=48),
            requested_by_id=users.bob.pk,
        )
        assert (request.status, request.version, request.summary, request.content, request.requested_by) == (
            ApprovalStatus.PENDING,
            "3",
            "Refund £120",
            {"amount": "120.00"},
            users.bob,
        )
        assert timedelta(hours=47) < request.expires_at - timezone.now() <= timedelta(hours=48)
        with pytest.raises(InvalidPayload, match="approval content"):
            approval_request_create(
                run_id=run.id,
                attempt=1,
                step_name="x",
                subject=("shop.order", "7"),
                proposal=Proposal(version="3", content={1, 2}),
                approvers=GROUP,
                timeout=timedelta(hours=1),
            )

    def test_personal_data_in_the_content_is_redacted_before_it_is_stored(self, users: Users) -> None:
        run = waiting_request().run
        content = {"order": "7", "customer": {"email": "alice@example.com", "shipping_address": {"street": "x"}}}
        request = approval_request_create(
            run_id=run.id,
            attempt=1,
            step_name="refund approval",
            subject=("shop.order", "7"),
            proposal=Proposal(version="3", content=content, summary="Refund £120"),
            approvers=GROUP,
            timeout=timedelta(hours=48),
        )
        stored = ApprovalRequest.objects.get(pk=request.pk).content
        assert stored == {"order": "7", "customer": {"email": "[redacted]", "shipping_address": "[redacted]"}}

    def test_no_request_is_raised_for_a_run_that_has_ended(self, users: Users) -> None:
        run = waiting_request(run_status=RunStatus.TERMINATED).run

        with pytest.raises(NonRetryableError, match="the run is terminated"):
            approval_request_create(
                run_id=run.id,
                attempt=1,
                step_name="late",
                subject=("shop.order", "7"),
                proposal=Proposal(version="1"),
                approvers=GROUP,
                timeout=timedelta(hours=1),
            )

        assert ApprovalRequest.objects.filter(run=run).count() == 1  # only the fixture's

    def test_expiry_moves_a_pending_request_to_expired_once(self, users: Users) -> None:
        request = waiting_request(requested_by=users.bob)

        assert approval_expire(request_id=request.pk) == {"status": "expired", "decision": None}
        assert approval_expire(request_id=request.pk) == {"status": "expired", "decision": None}

        assert ApprovalRequest.objects.get(pk=request.pk).status == ApprovalStatus.EXPIRED
        assert DecisionLog.objects.filter(request=request, action=DecisionAction.EXPIRE).count() == 1

    def test_a_decision_that_won_the_race_with_the_timer_stands(self, users: Users) -> None:
        request = waiting_request(requested_by=users.bob)
        decide(request, by=users.carol, approve=True, version="v1")

        expiry = approval_expire(request_id=request.pk)

        assert expiry["status"] == ApprovalStatus.APPROVED
        assert expiry["decision"] == RunEvent.objects.get(run=request.run).payload
        assert ApprovalRequest.objects.get(pk=request.pk).status == ApprovalStatus.APPROVED

    def test_recheck_supersedes_an_approval_of_a_version_no_longer_current(self, users: Users) -> None:
        request = waiting_request(requested_by=users.bob)
        decide(request, by=users.carol, approve=True, version="v1")

        same = approval_recheck(request_id=request.pk, current=Proposal(version="v1"))
        assert same == {"changed": False, "approved_version": "v1", "current_version": "v1"}
        assert ApprovalRequest.objects.get(pk=request.pk).status == ApprovalStatus.APPROVED

        changed = approval_recheck(request_id=request.pk, current=Proposal(version="v2"))
        assert changed == {"changed": True, "approved_version": "v1", "current_version": "v2"}
        assert ApprovalRequest.objects.get(pk=request.pk).status == ApprovalStatus.SUPERSEDED
        log = DecisionLog.objects.get(request=request, action=DecisionAction.SUPERSEDE)
        assert log.version == "v2" and "from version v1 to v2" in log.message

    def test_proposals_from_load_are_checked(self) -> None:
        assert Proposal.of(("2", {"a": 1}, "s")) == Proposal(version="2", content={"a": 1}, summary="s")
        assert Proposal.of({"version": "2"}) == Proposal(version="2")
        bad: object
        for bad in [("2", {}), (2, {}, "s"), ("", None, ""), None]:
            with pytest.raises(TypeError):
                Proposal.of(bad)  # type: ignore[arg-type]


@pytest.mark.django_db
class TestCancellation:
    def test_terminating_the_run_cancels_its_pending_requests(self, users: Users) -> None:
        # given a pending request and an approved one on the same run
        pending = waiting_request(requested_by=users.bob)
        decided = ApprovalRequest.objects.create(
            run=pending.run,
            attempt=1,
            step_name="earlier",
            subject_type="shop.order",
            subject_id="1",
            version="v0",
            summary="s",
            approvers=GROUP,
            status=ApprovalStatus.APPROVED,
            expires_at=timezone.now() + timedelta(hours=1),
        )

        # when the run is terminated (the engine calls the hook inside run_terminate)
        wf_services.run_terminate(run_id=pending.run_id)

        # then only the pending one is cancelled, once
        assert ApprovalRequest.objects.get(pk=pending.pk).status == ApprovalStatus.CANCELLED
        assert ApprovalRequest.objects.get(pk=decided.pk).status == ApprovalStatus.APPROVED
        assert cancel_for_run(pending.run_id) == 0  # idempotent
        log = DecisionLog.objects.get(request=pending, action=DecisionAction.CANCEL)
        assert (log.message, log.channel) == ("the run is terminated", "system")
        refused(pending, users.carol, code=RefusalCode.NOT_PENDING)

    def test_cancel_for_run_leaves_a_live_runs_current_requests_alone(self, users: Users) -> None:
        request = waiting_request(requested_by=users.bob)

        assert cancel_for_run(request.run_id) == 0
        assert ApprovalRequest.objects.get(pk=request.pk).status == ApprovalStatus.PENDING

    def test_after_a_restart_the_earlier_attempts_requests_are_cancelled(self, users: Users) -> None:
        request = waiting_request(requested_by=users.bob)

        wf_services.run_restart(run_id=request.run_id)  # the restart hook cancels in its transaction

        assert ApprovalRequest.objects.get(pk=request.pk).status == ApprovalStatus.CANCELLED
        assert "restarted (attempt 2)" in DecisionLog.objects.get(action=DecisionAction.CANCEL).message
        assert cancel_for_run(request.run_id) == 0  # nothing left for the sweep

    def test_the_sweep_cancels_what_the_hook_does_not_see_and_only_that(self, users: Users) -> None:
        live = waiting_request(requested_by=users.bob)
        failed = waiting_request(requested_by=users.bob, run_status=RunStatus.FAILED)
        restarted = waiting_request(requested_by=users.bob)
        wf_services.run_restart(run_id=restarted.run_id)

        call_command("approvals", "sweep")

        assert ApprovalRequest.objects.get(pk=live.pk).status == ApprovalStatus.PENDING
        assert ApprovalRequest.objects.get(pk=failed.pk).status == ApprovalStatus.CANCELLED
        assert ApprovalRequest.objects.get(pk=restarted.pk).status == ApprovalStatus.CANCELLED
        assert cancel_orphans() == 0


@pytest.mark.django_db
def test_the_command_lists_the_queue(users: Users, capsys: pytest.CaptureFixture[str]) -> None:
    pending = waiting_request(requested_by=users.bob, version="v9")
    waiting_request(status=ApprovalStatus.APPROVED)
    waiting_request(status=ApprovalStatus.CANCELLED)

    call_command("approvals", "list")

    out = capsys.readouterr().out.splitlines()
    assert len(out) == 1 and out[0].startswith(f"{pending.pk}\tpending\tshop.order:1042 version v9\trefund-approvers")
    assert "\texpires in " in out[0]

    # a closed request says so, not when it would have expired
    call_command("approvals", "list", "--status", ApprovalStatus.CANCELLED)
    (line,) = capsys.readouterr().out.splitlines()
    assert "\tcancelled\t" in line and "\tclosed\t" in line and "expires" not in line


@pytest.mark.django_db(transaction=True)
def test_ten_concurrent_decisions_make_exactly_one_transition_and_one_event(
    users: Users, no_enqueue: NoEnqueue
) -> None:
    # given ten reviewers in the group, five approving and five rejecting at the same instant
    # (no_enqueue: no worker advances the run)
    group = Group.objects.get(name=GROUP)
    reviewers = [User.objects.create_user(f"reviewer{i}", password="pw") for i in range(10)]
    group.user_set.add(*reviewers)
    request = waiting_request(requested_by=users.bob)
    barrier = threading.Barrier(len(reviewers))
    outcomes: list[Any] = [None] * len(reviewers)

    def body(i: int) -> None:
        try:
            barrier.wait()
            decided = decide(request.pk, by=reviewers[i], approve=i % 2 == 0, version="v1")
            outcomes[i] = ("created" if decided.created else "repeated", i % 2 == 0)
        except ApprovalRefused as refusal:
            outcomes[i] = (str(refusal.code), i % 2 == 0)

    # when
    threads = [thread_of(body, i) for i in range(len(reviewers))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)

    # then exactly one made the transition and sent the one event
    request.refresh_from_db()
    winner_approved = request.status == ApprovalStatus.APPROVED
    assert [o[0] for o in outcomes].count("created") == 1
    assert RunEvent.objects.filter(run=request.run).count() == 1
    assert DecisionLog.objects.filter(request=request, result=DecisionResult.ACCEPTED).count() == 1
    assert DecisionLog.objects.filter(request=request).count() == 10
    # the others saw its result: the same decision is repeated, the opposite one refused naming it
    for kind, approving in outcomes:
        if kind != "created":
            assert kind == ("repeated" if approving == winner_approved else RefusalCode.NOT_PENDING)
    winner = next(reviewers[i] for i, o in enumerate(outcomes) if o[0] == "created")
    assert request.decided_by == winner


@pytest.mark.django_db
class TestSupersedePending:
    def test_the_subjects_pending_requests_are_superseded_and_their_runs_woken(self, users: Users) -> None:
        # given a pending request on order 1042, one already approved on it, and one on another order
        pending = waiting_request(requested_by=users.bob)
        approved = waiting_request(status=ApprovalStatus.APPROVED)
        other = waiting_request(subject_id="7")
        before_approved, before_other = state(approved), state(other)

        # when order 1042 changes
        superseded = supersede_pending(("shop.order", 1042), reason="the amount changed", current_version="v2")

        # then only the pending request on it is superseded, with the event that wakes its run
        assert superseded == [pending.pk]
        pending.refresh_from_db()
        assert pending.status == ApprovalStatus.SUPERSEDED and pending.decided_by is None
        event = RunEvent.objects.get(run=pending.run)
        assert (event.type, event.idempotency_key) == (pending.event_type, pending.event_key)
        assert event.payload == {
            "request_id": pending.pk,
            "superseded": True,
            "version": "v1",
            "current_version": "v2",
            "reason": "the amount changed",
        }
        run = WorkflowRun.objects.get(pk=pending.run_id)
        assert run.status == RunStatus.QUEUED and run.wait_event_type == ""
        log = DecisionLog.objects.get(request=pending)
        assert (log.action, log.result, log.version, log.actor) == (
            DecisionAction.SUPERSEDE,
            DecisionResult.ACCEPTED,
            "v2",
            None,
        )
        assert "the amount changed" in log.message
        assert (state(approved), state(other)) == (before_approved, before_other)

        # and a reviewer whose page still shows it is refused, naming the state
        info = refused(pending, users.carol, code=RefusalCode.NOT_PENDING)
        assert "superseded" in str(info)

        # and superseding again finds nothing left to supersede
        assert supersede_pending(("shop.order", "1042"), reason="again") == []
        assert RunEvent.objects.filter(run=pending.run).count() == 1

    def test_a_request_whose_run_ended_or_moved_on_or_whose_time_is_up_is_left_alone(self) -> None:
        ended = waiting_request(run_status=RunStatus.TERMINATED)
        restarted = waiting_request()
        WorkflowRun.objects.filter(pk=restarted.run_id).update(attempt=2)
        overdue = waiting_request(expires_in=timedelta(seconds=-1))  # its timer is about to expire it
        before = state(overdue)

        assert supersede_pending(("shop.order", 1042), reason="changed") == []
        assert {r.status for r in ApprovalRequest.objects.filter(pk__in=[ended.pk, restarted.pk, overdue.pk])} == {
            ApprovalStatus.PENDING
        }
        assert_still_waiting(overdue, before)

    def test_bad_input_changes_nothing(self, users: Users) -> None:
        pending = waiting_request()
        before = state(pending)
        with pytest.raises(TypeError):
            supersede_pending(["shop.order", 1042], reason="changed")  # type: ignore[arg-type]
        with pytest.raises(InvalidPayload):
            supersede_pending(("shop.order", 1042), reason="x" * 5000)
        assert_still_waiting(pending, before)


@pytest.mark.django_db(transaction=True)
def test_a_decision_and_a_supersession_at_once_make_one_transition_and_one_event(
    users: Users, no_enqueue: NoEnqueue
) -> None:
    # given a pending request that carol decides in the very instant the subject changes
    # (no_enqueue: no worker advances the run)
    request = waiting_request(requested_by=users.bob)
    barrier = threading.Barrier(2)
    outcomes: dict[str, Any] = {}

    def decision() -> None:
        try:
            barrier.wait()
            outcomes["decide"] = decide(request.pk, by=users.carol, approve=True, version="v1").created
        except ApprovalRefused as refusal:
            outcomes["decide"] = refusal.code

    def change() -> None:
        barrier.wait()
        outcomes["supersede"] = supersede_pending(("shop.order", 1042), reason="changed")

    # when
    threads = [thread_of(decision), thread_of(change)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)

    # then one of them made the transition, the other saw it, and the run got one event
    request.refresh_from_db()
    if request.status == ApprovalStatus.APPROVED:
        assert (outcomes["decide"], outcomes["supersede"]) == (True, [])
    else:
        assert request.status == ApprovalStatus.SUPERSEDED
        assert (outcomes["decide"], outcomes["supersede"]) == (RefusalCode.NOT_PENDING, [request.pk])
    assert RunEvent.objects.filter(run=request.run).count() == 1
    assert DecisionLog.objects.filter(request=request, result=DecisionResult.ACCEPTED).count() == 1
