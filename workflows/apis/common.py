"""What every API class shares: authentication, strict input fields, pagination, and the
selectors' answers (who may see or control which run) as the API's 404 and 403."""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any
from uuid import UUID

from django.contrib.auth.models import AbstractUser, AnonymousUser
from django.http import QueryDict
from django.utils.dateparse import parse_datetime
from rest_framework import exceptions, serializers
from rest_framework.authentication import SessionAuthentication
from rest_framework.pagination import Cursor, CursorPagination
from rest_framework.permissions import IsAuthenticated
from rest_framework.request import Request
from rest_framework.utils.urls import replace_query_param
from rest_framework.views import APIView

from workflows.apis.authentication import TokenAuthentication
from workflows.models import WorkflowRun
from workflows.selectors import can_control_run, run_get
from workflows.storable import text_problem

if TYPE_CHECKING:
    # django-stubs' name for the model settings.AUTH_USER_MODEL names (what request.user is).
    from django.contrib.auth.models import _User

IDEMPOTENCY_KEY_MAX = 255
# Printable ASCII, no space at either end (HTTP drops it anyway), 1 to 255 characters: what any
# client can send in a header and get back unchanged.
IDEMPOTENCY_KEY = f"[!-~](?:[ -~]{{0,{IDEMPOTENCY_KEY_MAX - 2}}}[!-~])?"


def idempotency_key_valid(key: object) -> bool:
    """Whether ``key`` is a string of IDEMPOTENCY_KEY's form (a command's option can be a list:
    Python 3.11's argparse reads ``--key=--`` as ``[]``)."""
    return isinstance(key, str) and re.fullmatch(IDEMPOTENCY_KEY, key) is not None


class ApiBase(APIView):
    """Token first: DRF answers an unauthenticated request with the first authenticator's
    ``WWW-Authenticate`` header, and only TokenAuthentication has one. With session first every
    missing credential would be a 403, indistinguishable from "you may not"; this way it is a 401.
    Session authentication still works (and enforces CSRF on unsafe methods)."""

    authentication_classes = [TokenAuthentication, SessionAuthentication]
    permission_classes = [IsAuthenticated]
    # The methods whose handlers read the query string, and refuse what they do not take (a list's
    # filters, an agent's ?account=). To any other, a query parameter is a 400: not one ignored.
    query_methods: frozenset[str] = frozenset()

    def initial(self, request: Request, *args: Any, **kwargs: Any) -> None:
        """A query parameter given twice is a 400: read as its last value (Django's QueryDict), a
        client that sent ``?status=pending&status=completed`` was answered for another filter
        than it meant. No parameter of the API takes several values. So is one sent to a handler
        that reads none (``POST /api/runs/<id>/terminate?force=1``)."""
        super().initial(request, *args, **kwargs)
        if repeated := repeated_parameters(request.query_params):
            raise exceptions.ValidationError(repeated)
        if request.query_params and request.method not in self.query_methods and request.method != "OPTIONS":
            unknown = sorted(request.query_params)
            raise exceptions.ValidationError({key: ["Unknown query parameter."] for key in unknown})


# ApiBase.query_methods of a view whose GET (and HEAD) reads the query, and of one whose every handler does.
QUERY_ON_GET = frozenset({"GET", "HEAD"})
QUERY_ON_ALL = frozenset({"GET", "HEAD", "POST"})


def repeated_parameters(query: QueryDict) -> dict[str, list[str]]:
    """Each query parameter given more than once, with why it is refused (none: empty)."""
    return {key: ["Given more than once; give it once."] for key, values in sorted(query.lists()) if len(values) > 1}


class StrictCharField(serializers.CharField):
    """A string, and only a string: DRF's CharField quietly turns 5 or true into "5" or "True".
    And one PostgreSQL can store: a NUL character or an unpaired surrogate is a 400 here, never a
    500 at the INSERT (every text field of every API is one of these; JSON fields are checked by
    ``check_json_size``).

    Taken as sent: no whitespace is trimmed, so ``max_length`` and ``allow_blank`` mean what the
    schema says (a trimmed value would be accepted longer than its maxLength, and "  " refused
    though it is not empty). ``pattern``: the value must match it whole (``re.fullmatch``); the
    schema states it (``workflows.apis.schema``)."""

    default_error_messages = {
        "unstorable": "The text contains {problem}.",
        "pattern": "The text does not have the expected form.",
    }

    def __init__(self, *, pattern: str | None = None, **kwargs: Any) -> None:
        kwargs.setdefault("trim_whitespace", False)
        super().__init__(**kwargs)
        self.pattern = pattern

    def to_internal_value(self, data: Any) -> str:
        if not isinstance(data, str):
            self.fail("invalid")
        problem = text_problem(data)
        if problem is not None:
            self.fail("unstorable", problem=problem)
        if self.pattern is not None and re.fullmatch(self.pattern, data) is None:
            self.fail("pattern")
        return str(super().to_internal_value(data))


class StrictIntegerField(serializers.IntegerField):
    """A JSON number with an integral value (3 or 3.0), not a string: DRF's IntegerField also takes
    "3", where the schema says integer."""

    def to_internal_value(self, data: Any) -> int:
        if (
            isinstance(data, bool)
            or not isinstance(data, int | float)
            or (isinstance(data, float) and not data.is_integer())
        ):
            self.fail("invalid")
        return int(super().to_internal_value(data))


class StrictFloatField(serializers.FloatField):
    """A JSON number, not a string: DRF's FloatField also takes "3.5", where the schema says number."""

    def to_internal_value(self, data: Any) -> float:
        if isinstance(data, bool) or not isinstance(data, int | float):
            self.fail("invalid")
        return float(super().to_internal_value(data))


class JsonValueField(serializers.JSONField):
    """Any JSON value; ``check_json_size`` decides whether PostgreSQL can store it (the schema
    calls it JsonValue). null only with ``allow_null`` (a field's own null would be SQL NULL in
    its column; inside an object or a list it is JSON's null)."""


class JsonObjectField(serializers.DictField):
    """A JSON object of JSON values (null too, unless ``child`` says otherwise). ``key_pattern`` and
    ``key_max_length``: what its keys must be (checked by the view or service that takes it; stated
    in the schema)."""

    def __init__(self, *, key_pattern: str | None = None, key_max_length: int | None = None, **kwargs: Any) -> None:
        kwargs.setdefault("child", JsonValueField(allow_null=True))
        super().__init__(**kwargs)
        self.key_pattern = key_pattern
        self.key_max_length = key_max_length


class StrictSerializer(serializers.Serializer[Any]):
    """Refuses fields it does not declare, so a typo or a bare object is a 400, not ignored."""

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, Mapping):
            unknown = sorted(set(data) - set(self.fields))
            if unknown:
                raise exceptions.ValidationError({key: ["Unknown field."] for key in unknown})
        return super().to_internal_value(data)


class NoFields(StrictSerializer):
    """The body of an operation that reads none: nothing, or ``{}``. A field sent to it is one it
    would not read (restart's ``attempt`` sent to a pause, a ``reason`` to a cancel), which a client
    would believe did something: a 400, not ignored."""


def check_no_body(request: Request) -> None:
    """A 400 for a body with a field (``NoFields``); a 415 for one that is not JSON."""
    NoFields(data=request.data).is_valid(raise_exception=True)


# ``<offset>.<reverse>[.<position>]``: the position is a created_at in microseconds since 1970
# (16 digits reach the year 2286), so every cursor of this form is a valid page.
CURSOR = "([0-9]{1,9})\\.([01])(?:\\.([0-9]{1,16}))?"  # plain groups: also the schema's pattern
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
MICROSECOND = timedelta(microseconds=1)


class RunCursorPagination(CursorPagination):
    """Newest first. The cursor holds a created_at position; equal timestamps are handled by
    CursorPagination's offset, so no run is skipped or repeated across pages.

    DRF's cursor is base64 of a query string: its schema could only say "a string", and most
    strings are refused (DRF answers 404, and passes a forged position straight into the query).
    This one has a form the schema states (``CURSOR``), and anything of that form is a page."""

    ordering = "-created_at"
    page_size = 50
    page_size_query_param = "page_size"
    max_page_size = 200

    def encode_cursor(self, cursor: Cursor) -> str:
        parts = [str(cursor.offset), "1" if cursor.reverse else "0"]
        if cursor.position is not None:
            # The position is str() of a created_at (DRF's _get_position_from_instance).
            when = parse_datetime(str(cursor.position))
            assert when is not None
            parts.append(str((when - EPOCH) // MICROSECOND))
        return str(replace_query_param(str(self.base_url), self.cursor_query_param, ".".join(parts)))

    def decode_cursor(self, request: Request) -> Cursor | None:
        encoded = request.query_params.get(self.cursor_query_param)
        if encoded is None:
            return None
        match = re.fullmatch(CURSOR, encoded)
        if match is None:
            raise exceptions.ValidationError({"cursor": ["Invalid cursor."]})
        offset, reverse, position = match.groups()
        return Cursor(
            offset=min(int(offset), self.offset_cutoff),
            reverse=reverse == "1",
            # The form DRF compares positions in: str() of the datetime (the stubs say int).
            position=str(EPOCH + int(position) * MICROSECOND) if position is not None else None,  # type: ignore[arg-type]
        )


def idempotency_key_header(request: Request) -> str | None:
    """The ``Idempotency-Key`` header: absent is None; present it must match IDEMPOTENCY_KEY."""
    key = request.headers.get("Idempotency-Key")
    if key is None:
        return None
    if not idempotency_key_valid(key):
        problem = text_problem(key)
        raise exceptions.ValidationError(
            {
                "Idempotency-Key": [
                    f"The header contains {problem}."
                    if problem is not None
                    else f"The header must be 1 to {IDEMPOTENCY_KEY_MAX} printable ASCII characters, "
                    "not starting or ending with a space."
                ]
            }
        )
    return key


# --- Runs and callers, as the API answers for them (404, 403) -------------------------------------
def visible_run(*, user: AbstractUser | AnonymousUser, run_id: str) -> WorkflowRun:
    """The run if the user may see it, else NotFound: also for another owner's run, so that the
    answer does not confirm the run exists."""
    try:
        parsed = UUID(run_id)
    except ValueError:
        raise exceptions.NotFound() from None
    if str(parsed) != run_id.lower():
        raise exceptions.NotFound()  # only the form the schema names (UUID() also takes braces, no hyphens...)
    run = run_get(user=user, run_id=parsed)
    if run is None:
        raise exceptions.NotFound()
    return run


def controllable_run(*, user: AbstractUser | AnonymousUser, run_id: str) -> WorkflowRun:
    """The run if the user may control it (pause, send events...): see ``selectors.can_control_run``.
    NotFound if they cannot see it; PermissionDenied if they can see but not act."""
    run = visible_run(user=user, run_id=run_id)
    if not can_control_run(user, run):
        if run.owner_id == user.pk:
            raise exceptions.PermissionDenied(
                f"This {run.workflow} run is driven by its own process; only staff may control it or send it events."
            )
        raise exceptions.PermissionDenied("You may see this run but not control it.")
    return run


def authenticated_user(request: Request) -> _User:
    """The caller, who IsAuthenticated guarantees is not anonymous (checked again: a view that
    lost its permission class must fail closed, not start a run owned by nobody)."""
    user = request.user
    if isinstance(user, AnonymousUser) or not user.is_authenticated:
        raise exceptions.NotAuthenticated()
    return user
