"""JSON errors for every API: ``{"error": {"code", "message", "detail"}}``, and a body size limit."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.core.exceptions import RequestDataTooBig
from django.http import Http404
from drf_spectacular.utils import OpenApiResponse, extend_schema_serializer
from rest_framework import exceptions, serializers, status
from rest_framework.parsers import JSONParser
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from workflows.exceptions import (
    IdempotencyConflict,
    InvalidPayload,
    NotStartable,
    PayloadTooLarge,
    TooManyEvents,
    TooManyRuns,
    TransitionNotAllowed,
    UnknownWorkflow,
)
from workflows.storable import MAX_JSON_DEPTH, json_loads_strict, json_too_deep


@extend_schema_serializer(component_name="ErrorBody")
class ErrorBodySerializer(serializers.Serializer[dict[str, Any]]):
    code = serializers.CharField(help_text="Stable, machine-readable: unknown_workflow, parse_error, ...")
    message = serializers.CharField(help_text="For people; may change.")
    detail = serializers.JSONField(allow_null=True, help_text="Per-field errors, the run's status, or null.")


@extend_schema_serializer(component_name="Error")
class ErrorSerializer(serializers.Serializer[dict[str, Any]]):
    """Every error response of the API (for the OpenAPI schema; responses are built below)."""

    error = ErrorBodySerializer()


def error_responses(*statuses: int) -> dict[int, OpenApiResponse]:
    """The schema's error responses of an operation, all of the one error shape."""
    descriptions = {
        400: "Malformed JSON or invalid input",
        401: "Not authenticated",
        403: "Authenticated, but not allowed (or a CSRF failure with session authentication)",
        404: "No such workflow or run, or another owner's run",
        409: "Idempotency conflict, or the transition is not allowed in the run's state",
        413: "The request body or payload is too large",
        415: "The body is not application/json",
        429: "Too many of your runs or requests are still in progress; try again once some have finished",
    }
    return {code: OpenApiResponse(ErrorSerializer, description=descriptions[code]) for code in statuses}


class RequestBodyTooLarge(exceptions.APIException):
    """The body itself is over the limit (refused before parsing); a payload over
    WORKFLOWS_MAX_PAYLOAD_BYTES inside a body that fits is ``workflows.exceptions.PayloadTooLarge``."""

    status_code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE
    default_code = "payload_too_large"
    default_detail = "The request body is too large."


class LimitedJSONParser(JSONParser):
    """JSON only, no more than WORKFLOWS_MAX_PAYLOAD_BYTES of it and no deeper than MAX_JSON_DEPTH
    levels (each plus room for the envelope), and only JSON's numbers: Python's decoder reads
    ``1e400`` as infinity, which no JSON can say back (``json_loads_strict``).

    DRF reads the stream itself, bypassing Django's DATA_UPLOAD_MAX_MEMORY_SIZE, so the size limit
    is enforced here, before anything is parsed. Python's decoder recurses once a level: 100 KB of
    ``[`` raises RecursionError, and a value just shallow enough to parse would raise it later,
    wherever it is encoded again (validation, the jsonb adapter, the response). Both are a 400.
    """

    def parse(self, stream: Any, media_type: str | None = None, parser_context: Any = None) -> Any:
        limit = body_limit()
        body = stream.read(limit + 1) if stream is not None else b""
        if len(body) > limit:
            raise RequestBodyTooLarge(f"The request body is larger than {limit:,} bytes.")
        depth = MAX_JSON_DEPTH + 1  # room for the envelope: {"payload": <MAX_JSON_DEPTH levels>}
        too_deep = exceptions.ParseError(f"JSON parse error - nested more than {depth} levels deep")
        encoding = (parser_context or {}).get("encoding", settings.DEFAULT_CHARSET)
        try:
            data = json_loads_strict(body.decode(encoding))
        except RecursionError:
            raise too_deep from None
        except (ValueError, LookupError) as exc:
            # As JSONParser says it. A UnicodeDecodeError is a ValueError; a LookupError is a charset
            # Django took (codecs knows it) that is not a text encoding (charset=bz2_codec).
            raise exceptions.ParseError(f"JSON parse error - {exc}") from None
        # Every level costs a bracket, so most bodies need no walk.
        if body.count(b"[") + body.count(b"{") > depth and json_too_deep(data, max_depth=depth):
            raise too_deep
        return data


def body_limit() -> int:
    return int(settings.WORKFLOWS["MAX_PAYLOAD_BYTES"]) + 16 * 1024


def error_body(code: str, message: str, detail: Any = None) -> dict[str, Any]:
    """The body of every error: the API's, the webhooks', the SSE stream's, the server's 413."""
    return {"error": {"code": code, "message": message, "detail": detail}}


def error_response(code: str, message: str, http_status: int, detail: Any = None) -> Response:
    return Response(error_body(code, message, detail), status=http_status)


DOMAIN_ERRORS: dict[type[Exception], int] = {
    UnknownWorkflow: status.HTTP_404_NOT_FOUND,
    NotStartable: status.HTTP_403_FORBIDDEN,
    TooManyRuns: status.HTTP_429_TOO_MANY_REQUESTS,
    TooManyEvents: status.HTTP_429_TOO_MANY_REQUESTS,
    IdempotencyConflict: status.HTTP_409_CONFLICT,
    TransitionNotAllowed: status.HTTP_409_CONFLICT,
    PayloadTooLarge: status.HTTP_413_REQUEST_ENTITY_TOO_LARGE,  # before its base class
    InvalidPayload: status.HTTP_400_BAD_REQUEST,
}


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    if isinstance(exc, DjangoPermissionDenied):
        # A service's refusal of who asks (DRF's handler answers it 403 too, but under the generic
        # code "error", with the service's reason lost).
        exc = exceptions.PermissionDenied(str(exc) or None)
    for error_class, http_status in DOMAIN_ERRORS.items():
        if isinstance(exc, error_class):
            detail = {"status": exc.status} if isinstance(exc, TransitionNotAllowed) else None
            return error_response(getattr(exc, "code", "error"), str(exc), http_status, detail)
    if isinstance(exc, RequestDataTooBig):
        return error_response("payload_too_large", "The request body is too large.", 413)
    if isinstance(exc, Http404):
        return error_response("not_found", "Not found.", status.HTTP_404_NOT_FOUND)
    response = drf_exception_handler(exc, context)
    if response is None:
        return None
    if isinstance(exc, exceptions.ValidationError):
        code, message, detail = "invalid", "The request is not valid.", response.data
    elif isinstance(exc, exceptions.APIException):
        codes = exc.get_codes()
        code = codes if isinstance(codes, str) else "error"
        message = str(exc.detail) if isinstance(exc.detail, str) else "The request failed."
        detail = None if isinstance(exc.detail, str) else response.data
    else:
        code, message, detail = "error", "The request failed.", response.data
    response.data = error_body(code, message, detail)
    return response
