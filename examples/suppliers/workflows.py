"""The ``supplier-assessment`` workflow (docs/architecture.md#the-examples): gather source records, remember their
revisions, generate a versioned report, wait for an authorised reviewer's decision on that exact
version, apply it.

Payload: ``{"assessment_id": int, "requested_by_id": int, "review_timeout_seconds": float?,
"agent": int?}``; ``assessment_submit_input`` starts it, naming the requester's account agent (if
their account has one): the run then tells that chat where the assessment stands, in words
(submitted, ready for review, approved, rejected, could not be completed), each by an atomic step,
exactly once. A run without an agent takes none of those steps, so runs in flight replay as they
were recorded.

1. ``start gathering``: awaiting_input → gathering_evidence.
2. ``gather source records``: {source: revision} of the latest revisions; stored, so every replay
   builds from the same evidence.
3. ``generate report``: report version n from exactly those revisions (atomic: the row and the
   step result commit together, so a retry never writes two versions).
4. ``ready for review``: gathering_evidence → ready_for_review.
5. ``report review``: ``approve_current`` raises a request for ``report-v<n>`` to the
   ``supplier-reviewers`` group (the requester may not decide it). Its load() regenerates the
   report when a source was revised since the latest report. A revision while the request is
   pending supersedes it in the same commit (``source_record_add``), which wakes the run to ask
   for the new version; one that lands between an approval and the re-check is caught there.
6. The decision is applied by the reviewer who took it (read in the step's body, never stored in a
   step result: the requester reads the run): approved or rejected. No decision in time:
   the assessment fails ("review expired") -- a failed assessment says plainly that nobody
   signed it off, where one left "ready for review" would look as if someone still might.
"""

from __future__ import annotations

from datetime import timedelta
from functools import partial
from typing import TYPE_CHECKING, Any

from approvals import ApprovalExpired, ApprovalRejected, approve_current
from examples.chat import agent_of, chat_report
from examples.suppliers.models import REVIEWERS, SUBJECT_TYPE, report_number
from workflows import NonRetryableError, StepError, Workflow, workflow
from workflows.exceptions import InvalidPayload, check_ids
from workflows.registry import Event

if TYPE_CHECKING:
    from workflows.engine import Step

NAME = "supplier-assessment"
DEFAULT_REVIEW_TIMEOUT = timedelta(days=7)
# What the requester's chat is told, in words: on the way, then by the run's outcome.
SUBMITTED, READY, NOT_COMPLETED = "submitted", "ready for review", "could not be completed"
OUTCOME_WORDS = {"approved": "approved", "rejected": "rejected", "failed": NOT_COMPLETED}


# Step bodies import the services when called: this module is imported while apps load.
def start_gathering(assessment_id: int) -> str:
    from examples.suppliers import services
    from examples.suppliers.models import SupplierAssessment
    from workflows import current_step

    # The assessment must be this run's own (assessment_submit_input starts the run and records it
    # on the assessment in one commit): a run started any other way touches nothing.
    context = current_step()
    run_id = SupplierAssessment.objects.filter(pk=assessment_id).values_list("run_id", flat=True).first()
    if context is not None and run_id != context.run_id:
        raise NonRetryableError(f"assessment {assessment_id} belongs to another run")
    try:
        return services.assessment_start_gathering(assessment_id=assessment_id)
    except services.AssessmentStateError as exc:
        # e.g. a restarted run of an assessment that was decided: trying again cannot help.
        raise NonRetryableError(str(exc)) from exc


def gather(assessment_id: int) -> dict[str, int]:
    from examples.suppliers import services

    return services.sources_gather(assessment_id=assessment_id)


def generate(assessment_id: int, revisions: dict[str, int]) -> int:
    from examples.suppliers import services

    return services.report_generate(assessment_id=assessment_id, revisions=revisions)


def mark_ready(assessment_id: int) -> str:
    from examples.suppliers import services

    try:
        return services.assessment_mark_ready(assessment_id=assessment_id)
    except services.AssessmentStateError as exc:
        raise NonRetryableError(str(exc)) from exc


def current_report(assessment_id: int) -> Any:
    from examples.suppliers import services

    return services.report_current(assessment_id=assessment_id)


def apply_decision(assessment_id: int, approve: bool, request_id: int, version: int) -> str:
    from django.contrib.auth import get_user_model
    from django.core.exceptions import PermissionDenied

    from approvals import decision_details
    from examples.suppliers import services

    # The reviewer is read here and recorded on the assessment, not returned: the step's result is
    # the run's, which its requester reads.
    by_id = decision_details(request_id)["decided_by_id"]
    # Who may decide does not change by trying again: refusals fail the step at once.
    if by_id is None or not get_user_model().objects.filter(pk=by_id).exists():
        raise NonRetryableError("the decision names no reviewer who still exists")
    try:
        return services.assessment_decide(assessment_id=assessment_id, approve=approve, by_id=by_id, version=version)
    except (PermissionDenied, services.AssessmentStateError) as exc:
        raise NonRetryableError(str(exc)) from exc


def report_status(agent_id: int, assessment_id: int, status: str) -> int | None:
    from examples.suppliers.models import SupplierAssessment

    supplier = SupplierAssessment.objects.values_list("supplier_name", flat=True).get(pk=assessment_id)
    return chat_report(agent_id, "assessments", str(assessment_id), {"supplier": supplier, "status": status})


def fail(assessment_id: int, reason: str) -> str:
    from examples.suppliers import services

    return services.assessment_fail(assessment_id=assessment_id, reason=reason)


@workflow(NAME)
class SupplierAssessmentWorkflow(Workflow):
    """Not public: ``assessment_submit_input`` starts it, for the requester only."""

    # 2: runs that name an agent tell its chat their states (steps "tell the chat: <status>"). The
    # engine replays any version with today's code; runs in flight name no agent, so take no new step.
    version = "2"

    @classmethod
    def validate_payload(cls, payload: dict[str, Any]) -> dict[str, Any]:
        check_ids(payload, "assessment_id", "requested_by_id")
        if "agent" in payload and agent_of(payload) is None:
            raise InvalidPayload("agent must be an agent's id")
        timeout = payload.get("review_timeout_seconds")
        if timeout is not None and (
            isinstance(timeout, bool) or not isinstance(timeout, int | float) or not 0 < timeout <= 90 * 24 * 3600
        ):
            raise InvalidPayload("review_timeout_seconds must be a number of seconds up to 90 days")
        return payload

    def run(self, event: Event, step: Step) -> dict[str, Any]:
        result = self.assess(event, step)
        self.tell(step, event, OUTCOME_WORDS.get(result["outcome"], NOT_COMPLETED))
        return result

    def tell(self, step: Step, event: Event, status: str) -> None:
        """Tell the requester's chat (if the run names one) the assessment's new status, once."""
        agent_id, assessment_id = agent_of(event.payload), int(event.payload["assessment_id"])
        if agent_id is not None:
            step.do(f"tell the chat: {status}", report_status, agent_id, assessment_id, status, atomic=True)

    def assess(self, event: Event, step: Step) -> dict[str, Any]:
        """Gather, report, ask for the review and apply it: the run's outcome."""
        payload = event.payload
        assessment_id = int(payload["assessment_id"])
        requester = payload.get("requested_by_id")
        timeout = timedelta(
            seconds=float(payload.get("review_timeout_seconds", DEFAULT_REVIEW_TIMEOUT.total_seconds()))
        )

        step.do("start gathering", start_gathering, assessment_id, atomic=True)  # checks it is this run's
        self.tell(step, event, SUBMITTED)
        revisions: dict[str, int] = step.do("gather source records", gather, assessment_id)
        version: int = step.do("generate report", generate, assessment_id, revisions, atomic=True)
        self.report_progress({"stage": "report generated", "report_version": version})
        step.do("ready for review", mark_ready, assessment_id, atomic=True)
        self.tell(step, event, READY)

        try:
            decision = approve_current(
                step,
                name="report review",
                subject=(SUBJECT_TYPE, assessment_id),
                load=partial(current_report, assessment_id),
                approvers=REVIEWERS,
                timeout=timeout,
                requested_by=int(requester) if requester is not None else None,
            )
        except ApprovalRejected as rejected:
            return self._apply(
                step,
                assessment_id,
                approve=False,
                request_id=rejected.decision.request_id,
                version=rejected.decision.version,
            )
        except ApprovalExpired:
            step.do("review expired", fail, assessment_id, "no reviewer decided in time", atomic=True)
            return {"outcome": "failed", "reason": "review expired"}
        return self._apply(step, assessment_id, approve=True, request_id=decision.request_id, version=decision.version)

    def _apply(self, step: Step, assessment_id: int, *, approve: bool, request_id: int, version: str) -> dict[str, Any]:
        number = report_number(version)
        outcome = "approved" if approve else "rejected"
        try:
            step.do(f"record {outcome}", apply_decision, assessment_id, approve, request_id, number, atomic=True)
        except StepError as exc:
            # The reviewer lost the right between deciding and now (removed from the group, or the
            # user deleted): nobody authorised may be said to have decided, so the assessment fails.
            step.do(
                "decision not applicable",
                fail,
                assessment_id,
                f"the decision could not be applied: {exc.message}",
                atomic=True,
            )
            return {"outcome": "failed", "reason": exc.message}
        return {"outcome": outcome, "report_version": number}
