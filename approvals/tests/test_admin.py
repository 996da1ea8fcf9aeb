"""The approvals console: the pending queue, the request's page, and decisions POSTed from it.

Most tests run in one transaction each (no worker: the decision's enqueue is never sent); the
last one approves in the admin and watches a real worker resume the run.
"""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Group, User
from django.contrib.messages import get_messages
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from approvals.models import ApprovalRequest, ApprovalStatus, DecisionLog, DecisionResult
from approvals.tests.support import GROUP, assert_still_waiting, state, waiting_request
from approvals.tests.test_workflow import WAIT, waiting_for_approval
from tests.factories import Users, login
from tests.support import Worker, wait_for_terminal
from workflows import public as wf
from workflows.models import RunEvent, RunStatus

CHANGELIST = reverse("admin:approvals_approvalrequest_changelist")


def change_url(request: ApprovalRequest) -> str:
    return reverse("admin:approvals_approvalrequest_change", args=[request.pk])


def decide_url(request: ApprovalRequest) -> str:
    return reverse("admin:approvals_approvalrequest_decide", args=[request.pk])


def listed(client: Client, query: str = "") -> set[int]:
    response = client.get(CHANGELIST + query)
    assert response.status_code == 200
    return {r.pk for r in response.context["cl"].result_list}


def messages_of(response: object) -> list[str]:
    return [str(m) for m in get_messages(response.wsgi_request)]  # type: ignore[attr-defined]


@pytest.mark.django_db
class TestQueue:
    def test_the_queue_opens_on_pending_requests_with_age_expiry_requester_summary_version(self, users: Users) -> None:
        # given
        pending = waiting_request(requested_by=users.bob, version="v7", expires_in=timedelta(hours=5))
        approved = waiting_request(status=ApprovalStatus.APPROVED)
        carol = login(users.carol)

        # when
        response = carol.get(CHANGELIST)

        # then
        assert {r.pk for r in response.context["cl"].result_list} == {pending.pk}
        html = response.content.decode()
        for shown in ("Refund £120 on order 1042", "v7", "bob", "in 4\xa0hours", "shop.order 1042", "0\xa0minutes"):
            assert shown in html, shown
        assert listed(carol, "?status=all") == {pending.pk, approved.pk}
        assert listed(carol, "?status=approved") == {approved.pk}

    def test_reviewers_see_their_groups_requests_viewers_and_decide_any_see_all(self, users: Users) -> None:
        ours = waiting_request()
        theirs = waiting_request(approvers="finance-approvers")

        assert listed(login(users.carol)) == {ours.pk}
        assert listed(login(users.dave)) == {ours.pk, theirs.pk}
        assert listed(login(users.erin)) == {ours.pk, theirs.pk}
        outsider = User.objects.create_user("gina", password="pw", is_staff=True)
        assert login(outsider).get(CHANGELIST).status_code == 403
        assert login(outsider).get(change_url(ours)).status_code == 403
        # another group's request answers as a missing one does (Django: "does not exist", to the index)
        hidden, missing = (
            login(users.carol).get(change_url(theirs)),
            login(users.carol).get(reverse("admin:approvals_approvalrequest_change", args=[999999])),
        )
        assert (hidden.status_code, hidden["Location"]) == (missing.status_code, missing["Location"])
        assert (hidden.status_code, hidden["Location"]) == (302, "/admin/")

    def test_a_customer_cannot_reach_the_console(self, users: Users) -> None:
        response = login(users.alice).get(CHANGELIST)
        assert response.status_code == 302 and "/admin/login/" in response["Location"]


@pytest.mark.django_db
class TestChangePage:
    def test_a_reviewer_sees_the_content_and_buttons_that_carry_the_version(self, users: Users) -> None:
        request = waiting_request(
            requested_by=users.bob, version="v3", content={"order": 1042, "amount": "120.00", "reason": "damaged"}
        )

        html = login(users.carol).get(change_url(request)).content.decode()

        assert "&quot;reason&quot;: &quot;damaged&quot;" in html
        assert f'action="{decide_url(request)}"' in html
        assert re.search(r'<input type="hidden" name="version" value="v3"', html)
        assert 'name="decision" value="approve"' in html and 'name="decision" value="reject"' in html
        assert "csrfmiddlewaretoken" in html

    def test_no_buttons_for_a_viewer_the_requester_or_a_closed_request(self, users: Users) -> None:
        request = waiting_request(requested_by=users.carol)
        closed = waiting_request(status=ApprovalStatus.REJECTED)

        for client, obj in [
            (login(users.dave), request),
            (login(users.carol), request),
            (login(users.carol), closed),
        ]:
            response = client.get(change_url(obj))
            assert response.status_code == 200
            assert 'name="decision"' not in response.content.decode()
        assert "it takes no more decisions" in login(users.carol).get(change_url(closed)).content.decode()


@pytest.mark.django_db
class TestDecisions:
    def test_an_approval_in_the_admin_decides_and_is_logged(self, users: Users) -> None:
        request = waiting_request(requested_by=users.bob)

        response = login(users.carol).post(
            decide_url(request), {"version": "v1", "decision": "approve", "note": "fine"}, follow=True
        )

        assert response.redirect_chain[-1][0] == CHANGELIST
        assert any("approved (version v1)" in m for m in messages_of(response))
        request.refresh_from_db()
        assert (request.status, request.decided_by, request.note) == (ApprovalStatus.APPROVED, users.carol, "fine")
        assert RunEvent.objects.filter(run=request.run, type=request.event_type).count() == 1
        log = DecisionLog.objects.get(request=request)
        assert (log.result, log.channel, log.actor) == (DecisionResult.ACCEPTED, "admin", users.carol)
        assert LogEntry.objects.filter(object_id=str(request.pk), user=users.carol).exists()

    def test_a_double_click_is_the_established_result(self, users: Users) -> None:
        request = waiting_request(requested_by=users.bob)
        carol = login(users.carol)
        carol.post(decide_url(request), {"version": "v1", "decision": "reject"})

        response = carol.post(decide_url(request), {"version": "v1", "decision": "reject"}, follow=True)

        assert any("already rejected; nothing changed" in m for m in messages_of(response))
        assert RunEvent.objects.filter(run=request.run).count() == 1

    def test_a_reviewer_without_the_group_or_permission_is_refused_and_nothing_changes(self, users: Users) -> None:
        request = waiting_request(requested_by=users.bob)
        before = state(request)

        response = login(users.dave).post(decide_url(request), {"version": "v1", "decision": "approve"})

        assert response.status_code == 403
        assert "not in the approvers group" in response.content.decode()
        assert_still_waiting(request, before)
        log = DecisionLog.objects.get(request=request)
        assert (log.result, log.code, log.actor) == (DecisionResult.REFUSED, "not_authorised", users.dave)

    def test_the_requester_is_refused_four_eyes(self, users: Users) -> None:
        request = waiting_request(requested_by=users.carol)
        before = state(request)

        response = login(users.carol).post(decide_url(request), {"version": "v1", "decision": "approve"})

        assert response.status_code == 403
        assert_still_waiting(request, before)

    def test_a_post_without_csrf_token_is_refused(self, users: Users) -> None:
        request = waiting_request(requested_by=users.bob)
        before = state(request)
        carol = login(users.carol, enforce_csrf_checks=True)

        response = carol.post(decide_url(request), {"version": "v1", "decision": "approve"})

        assert response.status_code == 403
        assert_still_waiting(request, before)
        assert not DecisionLog.objects.exists()  # the view never ran
        # with the token the change page gave, the same POST goes through
        page = carol.get(change_url(request)).content.decode()
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page)
        assert token is not None
        response = carol.post(
            decide_url(request), {"version": "v1", "decision": "approve", "csrfmiddlewaretoken": token.group(1)}
        )
        assert response.status_code == 302
        assert ApprovalRequest.objects.get(pk=request.pk).status == ApprovalStatus.APPROVED

    def test_a_stale_form_is_refused_with_the_reason(self, users: Users) -> None:
        # given a page opened on version v1, then the subject changed: the request is now for v2
        request = waiting_request(requested_by=users.bob, version="v2")
        before = state(request)

        response = login(users.carol).post(decide_url(request), {"version": "v1", "decision": "approve"}, follow=True)

        assert response.redirect_chain[-1][0] == change_url(request)
        assert any("review the current version" in m for m in messages_of(response))
        assert_still_waiting(request, before)
        assert DecisionLog.objects.get(request=request).code == "stale_version"

    def test_a_form_for_a_superseded_request_points_at_the_new_one(self, users: Users) -> None:
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

        carol = login(users.carol)
        response = carol.post(decide_url(old), {"version": "v1", "decision": "approve"}, follow=True)

        assert any(
            f"superseded; it takes no more decisions: review the current version (v2, request {new.pk})" in m
            for m in messages_of(response)
        )
        assert response.redirect_chain[-1][0] == change_url(new)  # on the page of the version to review
        assert ApprovalRequest.objects.get(pk=old.pk).status == ApprovalStatus.SUPERSEDED
        assert (
            f'href="{change_url(new)}">request {new.pk} (version v2, pending)'
            in carol.get(change_url(old)).content.decode()
        )

    def test_bad_forms_get_and_unknown_requests(self, users: Users) -> None:
        request = waiting_request(requested_by=users.bob)
        carol = login(users.carol)
        before = state(request)

        assert carol.get(decide_url(request)).status_code == 405
        response = carol.post(decide_url(request), {"version": "v1", "decision": "maybe"}, follow=True)
        assert any("not understood" in m for m in messages_of(response))
        assert (
            carol.post(
                reverse("admin:approvals_approvalrequest_decide", args=[999999]),
                {"version": "v1", "decision": "approve"},
            ).status_code
            == 404
        )
        other = waiting_request(approvers="finance-approvers")
        assert carol.post(decide_url(other), {"version": "v1", "decision": "approve"}).status_code == 404
        assert_still_waiting(request, before)
        assert ApprovalRequest.objects.get(pk=other.pk).status == ApprovalStatus.PENDING


@pytest.mark.django_db(transaction=True)
def test_an_approval_in_the_admin_resumes_the_run(worker: Worker, users: Users) -> None:
    # given a run waiting for approval
    run = wf.start("approvals.test.simple", {"approvers": GROUP, "requested_by": users.bob.pk})
    request = waiting_for_approval(run)
    assert Group.objects.get(name=GROUP).user_set.filter(pk=users.carol.pk).exists()

    # when carol approves it in the admin (the real CSRF round trip)
    carol = login(users.carol, enforce_csrf_checks=True)
    page = carol.get(change_url(request)).content.decode()
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page)
    assert token is not None
    response = carol.post(
        decide_url(request),
        {"version": "v1", "decision": "approve", "note": "from the admin", "csrfmiddlewaretoken": token.group(1)},
    )
    assert response.status_code == 302

    # then the worker resumes the run with her decision
    run = wait_for_terminal(run.id, timeout=WAIT)
    assert run.status == RunStatus.COMPLETED, run.error
    assert run.result is not None, run.error
    assert run.result["outcome"] == "approved" and run.result["by"] == "carol"
    assert run.result["note"] == "from the admin"
