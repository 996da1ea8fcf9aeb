"""``POST /webhooks/<source>/``: a plain Django view, no session, no CSRF (the signature is the
authentication). Parses the request, calls ``delivery_receive``, renders what became of it."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt

from webhooks.conf import source_get
from webhooks.models import Outcome
from webhooks.services import Rejection, check_size, delivery_receive, delivery_reject
from workflows.apis.errors import error_body


def error(code: str, message: str, http_status: int, detail: Any = None) -> JsonResponse:
    """The API's error shape (docs/decisions/0010-api-paths-and-error-format.md)."""
    return JsonResponse(error_body(code, message, detail), status=http_status)


@csrf_exempt
def receive(request: HttpRequest, source: str) -> JsonResponse:
    if request.method != "POST":
        return error("method_not_allowed", f'Method "{request.method}" not allowed.', 405)
    found = source_get(source)
    if found is None:
        # Not recorded: a name nobody configured is nobody's delivery (and scanners would fill the table).
        return error("not_found", "Not found.", 404)
    headers = dict(request.headers)
    try:
        check_size(source=found, content_length=request.headers.get("Content-Length"))
    except Rejection as rejection:
        declared = min(int(request.headers["Content-Length"]), 2**31 - 1)
        delivery = delivery_reject(source=found, headers=headers, size=declared, rejection=rejection)
        return error(rejection.reason, rejection.message, rejection.status, {"delivery": delivery.pk})
    # At most one byte over the limit: enough to know it is too large, without reading the rest.
    body = request.read(found.max_body_bytes + 1)
    delivery, rejected = delivery_receive(source=found, headers=headers, body=body)
    if rejected is not None:
        return error(rejected.reason, rejected.message, rejected.status, {"delivery": delivery.pk})
    if delivery.outcome == Outcome.DUPLICATE:
        return JsonResponse({"status": "duplicate"}, status=200)
    return JsonResponse({"status": "accepted", "delivery": delivery.pk}, status=202)


@csrf_exempt
def not_found(request: HttpRequest) -> JsonResponse:
    return error("not_found", "Not found.", 404)
