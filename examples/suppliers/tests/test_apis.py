"""/api/assessments: who sees and does what, bad input, and a review over HTTP end to end (a real
worker advances the run) in which a stale tab is refused."""

from __future__ import annotations

from typing import Any

import pytest
from django.urls import include, path
from drf_spectacular.drainage import GENERATOR_STATS
from drf_spectacular.generators import SchemaGenerator
from drf_spectacular.validation import validate_schema
from rest_framework.test import APIClient

from approvals.models import ApprovalRequest, ApprovalStatus, DecisionLog
from examples.suppliers.models import AssessmentStatus, SourceRecord, SupplierAssessment
from examples.suppliers.tests.conftest import SOURCES
from examples.suppliers.tests.test_services import in_state, snapshot
from tests.factories import Users, api_login
from tests.support import Worker, wait_for, wait_for_terminal
from workflows.models import RunStatus, WorkflowRun

URL = "/api/assessments"
WAIT = 120.0


def create(api: APIClient, **body: Any) -> Any:
    return api.post(URL, {"supplier_name": "Acme Metals", "sources": SOURCES, **body}, format="json")


@pytest.mark.django_db
class TestCreateAndSee:
    def test_the_requester_creates_an_assessment_with_revision_1_of_each_source(self, users: Users) -> None:
        response = create(api_login(users.alice, via="force"))

        assert response.status_code == 201, response.json()
        body = response.json()
        assert response["Location"] == f"{URL}/{body['id']}"
        assert (body["supplier_name"], body["status"], body["requested_by"], body["run"]) == (
            "Acme Metals",
            AssessmentStatus.AWAITING_INPUT,
            "alice",
            None,
        )
        assert [(s["source"], s["revision"], s["content"]) for s in body["sources"]] == [
            ("companies-house", 1, {"status": "active"}),
            ("sanctions", 1, {"hits": 0}),
        ]
        assert (body["report"], body["review"], body["input"]) == (None, None, {})

    @pytest.mark.parametrize(
        "body, field",
        [
            ({"supplier_name": ""}, "supplier_name"),
            ({"supplier_name": "   "}, "supplier_name"),
            ({"supplier_name": 7}, "supplier_name"),
            ({"sources": {}}, "sources"),
            ({"sources": ["sanctions"]}, "sources"),
            ({"sources": {"": {"hits": 0}}}, "sources"),
            ({"owner": "mallory"}, "owner"),
            ({"sources": {"sanc\u0000tions": {"hits": 0}}}, "sources"),
            ({"sources": {"sanctions": {"note": "a\u0000b"}}}, "sources"),
        ],
    )
    def test_bad_input_is_a_400_naming_the_field_and_creates_nothing(
        self, users: Users, body: dict[str, Any], field: str
    ) -> None:
        response = create(api_login(users.alice, via="force"), **body)

        assert response.status_code == 400, response.json()
        error = response.json()["error"]
        assert field in (error["detail"] or {}) or field in error["message"], error
        assert not SupplierAssessment.objects.exists()

    def test_anonymous_callers_are_refused(self) -> None:
        assert create(api_login(None)).status_code == 401
        assert api_login(None).get(URL).status_code == 401

    def test_the_requester_and_reviewers_see_it_and_nobody_else(
        self, users: Users, assessment: SupplierAssessment
    ) -> None:
        detail = f"{URL}/{assessment.pk}"
        for who in ("alice", "bob", "carol"):
            assert api_login(getattr(users, who), via="force").get(detail).status_code == 200, who
            assert [a["id"] for a in api_login(getattr(users, who), via="force").get(URL).json()["results"]] == [
                assessment.pk
            ], who
        # mallory learns nothing: not even that it exists
        assert api_login(users.mallory, via="force").get(detail).status_code == 404
        assert api_login(users.mallory, via="force").get(URL).json()["results"] == []
        assert api_login(users.mallory, via="force").get(f"{URL}/999999").status_code == 404
        # filters are checked
        assert api_login(users.bob, via="force").get(URL, {"status": "approved"}).json()["results"] == []
        assert api_login(users.bob, via="force").get(URL, {"status": "nonsense"}).status_code == 400


@pytest.mark.django_db
class TestSourcesAndSubmit:
    def test_requester_and_reviewers_add_revisions_others_get_404(
        self, users: Users, assessment: SupplierAssessment
    ) -> None:
        url = f"{URL}/{assessment.pk}/sources"

        by_alice = api_login(users.alice, via="force").post(
            url, {"source": "sanctions", "content": {"hits": 1}}, format="json"
        )
        by_bob = api_login(users.bob, via="force").post(
            url, {"source": "credit", "content": {"score": 81}}, format="json"
        )
        before = snapshot(assessment)
        by_mallory = api_login(users.mallory, via="force").post(url, {"source": "credit", "content": {}}, format="json")

        assert (by_alice.status_code, by_alice.json()["revision"], by_alice.json()["created_by"]) == (201, 2, "alice")
        assert (by_bob.status_code, by_bob.json()["revision"]) == (201, 1)
        assert by_mallory.status_code == 404 and snapshot(assessment) == before
        sources = api_login(users.alice, via="force").get(f"{URL}/{assessment.pk}").json()["sources"]
        assert [(s["source"], s["revision"]) for s in sources] == [
            ("companies-house", 1),
            ("credit", 1),
            ("sanctions", 2),
        ]
        assert SourceRecord.objects.filter(assessment=assessment, source="sanctions").count() == 2  # history kept

    def test_an_assessment_holds_a_bounded_number_of_source_records(
        self, users: Users, assessment: SupplierAssessment, settings: Any
    ) -> None:
        # given an assessment that may hold 4 source records, holding 2 (revision 1 of two sources)
        settings.SUPPLIER_MAX_SOURCE_RECORDS = 4
        url, api = f"{URL}/{assessment.pk}/sources", api_login(users.alice, via="force")
        for hits in (1, 2):
            assert api.post(url, {"source": "sanctions", "content": {"hits": hits}}, format="json").status_code == 201

        # when one more revision is sent, it is refused and nothing is stored
        before = snapshot(assessment)
        refused = api.post(url, {"source": "sanctions", "content": {"hits": 3}}, format="json")

        assert refused.status_code == 429 and refused.json()["error"]["code"] == "too_many_requests"
        assert "at most 4 source records" in refused.json()["error"]["message"]
        assert snapshot(assessment) == before
        # and a new assessment of more sources than that is refused whole
        settings.SUPPLIER_MAX_SOURCE_RECORDS = 1
        count = SupplierAssessment.objects.count()
        assert create(api).status_code == 429 and SupplierAssessment.objects.count() == count

    def test_a_requester_has_a_bounded_number_of_open_assessments(self, users: Users, settings: Any) -> None:
        # given alice may have 2 assessments open, and has 2 open (an approved one does not count)
        settings.SUPPLIER_MAX_OPEN_ASSESSMENTS = 2
        in_state(users, AssessmentStatus.APPROVED)
        api = api_login(users.alice, via="force")
        assert [create(api).status_code for _ in range(2)] == [201, 201]

        # when she asks for another while 2 are open, it is refused; bob's count is his own
        refused = create(api)

        assert refused.status_code == 429 and "2 supplier assessments open" in refused.json()["error"]["message"]
        assert SupplierAssessment.objects.filter(requested_by=users.alice).count() == 3
        assert create(api_login(users.bob, via="force")).status_code == 201

    def test_a_closed_assessment_takes_no_more_evidence(self, users: Users) -> None:
        closed = in_state(users, AssessmentStatus.APPROVED)
        before = snapshot(closed)

        response = api_login(users.alice, via="force").post(
            f"{URL}/{closed.pk}/sources", {"source": "credit", "content": {}}, format="json"
        )

        assert response.status_code == 409
        assert response.json()["error"]["code"] == "invalid_state"
        assert response.json()["error"]["detail"] == {"status": "approved"}
        assert snapshot(closed) == before

    def test_bad_source_input_is_a_400(self, users: Users, assessment: SupplierAssessment) -> None:
        url = f"{URL}/{assessment.pk}/sources"
        before = snapshot(assessment)
        body: dict[str, Any]
        for body in (
            {"content": {}},
            {"source": "", "content": {}},
            {"source": "x" * 101, "content": {}},
            {"source": "credit"},
            {"source": "credit", "content": {}, "revision": 9},
            {"source": "cre\u0000dit", "content": {}},
            {"source": "credit", "content": {"a": "\u0000"}},
        ):
            assert api_login(users.alice, via="force").post(url, body, format="json").status_code == 400, body
        assert snapshot(assessment) == before

    def test_only_the_requester_submits_and_only_once(self, users: Users, assessment: SupplierAssessment) -> None:
        url = f"{URL}/{assessment.pk}/submit"
        before = snapshot(assessment)

        for bad in (
            {"input": {"scope": "tier 1"}, "review_timeout_seconds": 1e300},
            {"input": {"scope": "tier 1"}, "review_timeout_seconds": 0},
            {"input": {"scope": "\u0000"}},
            {"input": "tier 1"},
        ):
            assert api_login(users.alice, via="force").post(url, bad, format="json").status_code == 400, bad
        assert snapshot(assessment) == before
        by_bob = api_login(users.bob, via="force").post(url, {"input": {"scope": "tier 1"}}, format="json")
        by_mallory = api_login(users.mallory, via="force").post(url, {"input": {}}, format="json")
        assert (by_bob.status_code, by_mallory.status_code) == (403, 404)
        assert snapshot(assessment) == before

        first = api_login(users.alice, via="force").post(url, {"input": {"scope": "tier 1"}}, format="json")
        again = api_login(users.alice, via="force").post(url, {"input": {"scope": "tier 2"}}, format="json")

        assert first.status_code == 200, first.json()
        assert (first.json()["input"], first.json()["run"]) == (
            {"scope": "tier 1"},
            str(SupplierAssessment.objects.get(pk=assessment.pk).run_id),
        )
        assert again.status_code == 409 and again.json()["error"]["code"] == "invalid_state"
        assert WorkflowRun.objects.filter(workflow="supplier-assessment").count() == 1

    def test_a_review_with_nothing_pending_is_a_409(self, users: Users, assessment: SupplierAssessment) -> None:
        response = api_login(users.carol, via="force").post(
            f"{URL}/{assessment.pk}/review", {"approve": True, "report_version": 1}, format="json"
        )
        assert response.status_code == 409 and response.json()["error"]["code"] == "invalid_state"
        bad = api_login(users.carol, via="force").post(
            f"{URL}/{assessment.pk}/review", {"approve": "yes", "report_version": 1}, format="json"
        )
        assert bad.status_code == 400 and "approve" in bad.json()["error"]["detail"]


def test_the_project_schema_has_no_warnings() -> None:
    GENERATOR_STATS.reset()
    generator = SchemaGenerator(patterns=[path("", include("config.urls"))])

    schema = generator.get_schema(request=None, public=True)

    assert not GENERATOR_STATS, "drf-spectacular warned: " + "; ".join(
        [*GENERATOR_STATS._warn_cache, *GENERATOR_STATS._error_cache]
    )
    validate_schema(schema)
    assert {"assessment_create", "assessment_review"} <= {
        op["operationId"] for item in schema["paths"].values() for op in item.values()
    }


def under_review(api: APIClient, detail: str, version: int) -> dict[str, Any]:
    """The assessment as ``api``'s caller sees it, once report ``version`` is under review."""

    def shown() -> dict[str, Any]:
        body: dict[str, Any] = api.get(detail).json()
        review = body["review"]
        return body if review and review["report_version"] == version and body["status"] == "ready_for_review" else {}

    return wait_for(shown, timeout=WAIT, what=f"report v{version} under review")


def approve(api: APIClient, detail: str, version: int, **note: str) -> Any:
    return api.post(f"{detail}/review", {"approve": True, "report_version": version, **note}, format="json")


@pytest.mark.django_db(transaction=True)
def test_a_review_over_http_refuses_a_stale_tab_and_approves_the_current_report(worker: Worker, users: Users) -> None:
    # given alice's assessment, its input submitted
    alice, carol = api_login(users.alice, via="force"), api_login(users.carol, via="force")
    assessment_id = create(alice).json()["id"]
    detail = f"{URL}/{assessment_id}"
    assert alice.post(f"{detail}/submit", {"input": {"scope": "tier 1"}}, format="json").status_code == 200

    # when carol opens it, then report v1 is under review and she may decide it; alice may not
    tab = under_review(carol, detail, 1)
    assert tab["report"]["version"] == 1 and tab["review"]["can_decide"] is True
    assert alice.get(detail).json()["review"]["can_decide"] is False
    own = approve(alice, detail, 1)
    assert own.status_code == 403 and own.json()["error"]["code"] == "not_authorised"  # not a reviewer

    # when alice revises a source while carol's tab still shows v1
    revised = alice.post(f"{detail}/sources", {"source": "sanctions", "content": {"hits": 1}}, format="json")
    assert revised.status_code == 201

    # then report v2 is built from the new revision and put under review
    current = under_review(carol, detail, 2)
    assert current["report"]["source_revisions"] == {"companies-house": 1, "sanctions": 2}

    # when carol approves from her stale tab, then she is refused, with nothing changed
    stale = approve(carol, detail, 1)
    assert stale.status_code == 409, stale.json()
    assert stale.json()["error"]["code"] == "stale_version"
    assert "review the current version" in stale.json()["error"]["message"]
    assert ApprovalRequest.objects.get(pk=current["review"]["request"]).status == ApprovalStatus.PENDING

    # when she approves the current report
    approved = approve(carol, detail, 2, note="fine")
    assert approved.status_code == 200, approved.json()

    # then the run completes, and the assessment records that exact version, decided by her
    run_id = SupplierAssessment.objects.get(pk=assessment_id).run_id
    assert run_id is not None
    run = wait_for_terminal(run_id, timeout=WAIT)
    assert run.status == RunStatus.COMPLETED, run.error
    final = carol.get(detail).json()
    assert (final["status"], final["decided_by"], final["decided_version"], final["review"]) == (
        "approved",
        "carol",
        2,
        None,
    )
    channels = set(DecisionLog.objects.filter(actor=users.carol).values_list("channel", "result"))
    assert channels == {("api", "refused"), ("api", "accepted")}
