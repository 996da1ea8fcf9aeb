"""What every API class shares: authentication, strict input fields, pagination and the
API's own read helpers (who may see or control which run)."""
from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any
from uuid import UUID

from django.contrib.auth.models import AbstractUser, AnonymousUser
from django.db.models import QuerySet
from django.utils.dateparse import parse_datetime
from rest_framework import exceptions, serializers
from rest_framework.authentication import SessionAuthentication, TokenAuthentication
from rest_framework.pagination import Cursor, CursorPagination
from rest_framework.permissions import IsAuthenticated
from rest_framework.request import Request
from rest_framework.views import APIView

from workflows.models import RunAttempt, WorkflowRun
from workflows.selectors import can_control_all_runs, run_get
from workflows.storable import text_problem

if TYPE_CHECKING:
    # django-stubs' name for the model settings.AUTH_USER_MODEL names (what request.user is).
    from django.contrib.auth.models import _User

IDEMPOTENCY_KEY_MAX = 255


class ApiBase(APIView):
    """Token first: DRF answers an unauthenticated request with the first authenticator's
    ``WWW-Authenticate`` header, and only TokenAuthentication has one. With session first every
    missing credential would be a 403, indistinguishable from "you may not"; this way it is a 401.
    Session authentication still works (and enforces CSRF on unsafe methods)."""

    authentication_classes = [TokenAuthentication, SessionAuthentication]
    permission_classes = [IsAuthenticated]


class StrictCharField(serializers.CharField):
    """A string, and only a string: DRF's CharField quietly turns 5 or true into "5" or "True".
    And one PostgreSQL can store: a NUL character or an unpaired surrogate is a 400 here, never a
    500 at the INSERT (every text field of every API is one of these; JSON fields are checked by
    ``check_json_size``)."""

    default_error_messages = {"unstorable": "The text contains {problem}."}

    def to_internal_value(self, data: Any) -> str:
        if not isinstance(data, str):
            self.fail("invalid")
        problem = text_problem(data)
        if problem is not None:
            self.fail("unstorable", problem=problem)
        return str(super().to_internal_value(data))


class StrictSerializer(serializers.Serializer):
    """Refuses fields it does not declare, so a typo or a bare object is a 400, not ignored."""

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, Mapping):
            unknown = sorted(set(data) - set(self.fields))
            if unknown:
                raise exceptions.ValidationError({key: ["Unknown field."] for key in unknown})
        return super().to_internal_value(data)


class RunCursorPagination(CursorPagination):
    """Newest first. The cursor holds a created_at position; equal timestamps are handled by
    CursorPagination's offset, so no run is skipped or repeated across pages."""

    ordering = "-created_at"
    page_size = 50
    page_size_query_param = "page_size"
    max_page_size = 200

    def decode_cursor(self, request: Request) -> Cursor | None:
        # DRF answers a garbled cursor with 404 and passes a forged position straight into the
        # query (a 500 on a DateTimeField); both are bad input, so both are a 400 here.
        try:
            cursor = super().decode_cursor(request)
        except exceptions.NotFound:
            raise exceptions.ValidationError({"cursor": ["Invalid cursor."]}) from None
        if cursor is not None and cursor.position is not None and _parse_position(str(cursor.position)) is None:
            raise exceptions.ValidationError({"cursor": ["Invalid cursor."]})
        return cursor


def _parse_position(value: str) -> object | None:
    try:
        return parse_datetime(value)
    except ValueError:
        return None


def idempotency_key_header(request: Request) -> str | None:
    """The ``Idempotency-Key`` header: absent is None; present it must be 1-255 characters."""
    key = request.headers.get("Idempotency-Key")
    if key is None:
        return None
    key = key.strip()
    if not key or len(key) > IDEMPOTENCY_KEY_MAX:
        raise exceptions.ValidationError(
            {"Idempotency-Key": [f"The header must be 1 to {IDEMPOTENCY_KEY_MAX} characters."]}
        )
    problem = text_problem(key)
    if problem is not None:
        raise exceptions.ValidationError({"Idempotency-Key": [f"The header contains {problem}."]})
    return key


# --- The API's selectors ------------------------------------------------------------------------
def visible_run(*, user: AbstractUser | AnonymousUser, run_id: str) -> WorkflowRun:
    """The run if the user may see it, else NotFound: also for another owner's run, so that the
    answer does not confirm the run exists."""
    try:
        parsed = UUID(run_id)
    except ValueError:
        raise exceptions.NotFound() from None
    run = run_get(user=user, run_id=parsed)
    if run is None:
        raise exceptions.NotFound()
    return run


def controllable_run(*, user: AbstractUser | AnonymousUser, run_id: str) -> WorkflowRun:
    """The run if the user may control it (pause, send events...): its owner, or staff with the
    control permission. NotFound if they cannot see it; PermissionDenied if they can see but not act."""
    run = visible_run(user=user, run_id=run_id)
    if run.owner_id is not None and run.owner_id == user.pk:
        return run
    if not can_control_all_runs(user):
        raise exceptions.PermissionDenied("You may see this run but not control it.")
    return run


def authenticated_user(request: Request) -> _User:
    """The caller, who IsAuthenticated guarantees is not anonymous (checked again: a view that
    lost its permission class must fail closed, not start a run owned by nobody)."""
    user = request.user
    if isinstance(user, AnonymousUser) or not user.is_authenticated:
        raise exceptions.NotAuthenticated()
    return user


def run_attempts(*, run: WorkflowRun) -> QuerySet[RunAttempt]:
    return RunAttempt.objects.filter(run=run).order_by("number")
