"""``POST /webhooks/<source>/``: a plain Django view, no session, no CSRF (the signature is the
authentication). Parses the request, calls ``delivery_receive``, renders what became of it."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt

from accounts.addresses import client_address
from webhooks.conf import source_get
from webhooks.models import Outcome, WebhookDelivery
from webhooks.services import Rejection, check_size, delivery_receive, delivery_reject_unverified
from workflows.apis.errors import error_body


def error(code: str, message: str, http_status: int, detail: Any = None) -> JsonResponse:
    """The API's error shape (docs/decisions/0010-api-paths-and-error-format.md)."""
    return JsonResponse(error_body(code, message, detail), status=http_status)


def rejected_answer(rejection: Rejection, delivery: WebhookDelivery | None) -> JsonResponse:
    """The refusal, naming the delivery's record for a sender whose signature held. A refusal before
    it held (401, 413) is anyone's to cause and names none (null), recorded or not: record ids are
    sequential, and would tell anyone how many deliveries, real ones included, arrive; nor may the
    answer tell whether the limits of what is recorded (``webhooks.rejections``) were reached.

    Django's own log line for a 4xx or 5xx is left out: a recorded rejection has the webhooks
    logger's line already, and one past the limits must add none (it is anyone's to send)."""
    named = delivery.pk if delivery is not None and not rejection.unverified else None
    response = error(rejection.reason, rejection.message, rejection.status, {"delivery": named})
    response._has_been_logged = True  # type: ignore[attr-defined]  # django.utils.log.log_response's mark
    return response


@csrf_exempt
def receive(request: HttpRequest, source: str) -> JsonResponse:
    if request.method != "POST":
        return error("method_not_allowed", f'Method "{request.method}" not allowed.', 405)
    found = source_get(source)
    if found is None:
        # Not recorded: a name nobody configured is nobody's delivery (and scanners would fill the table).
        return error("not_found", "Not found.", 404)
    headers, address = dict(request.headers), client_address(request)
    try:
        check_size(source=found, content_length=request.headers.get("Content-Length"))
    except Rejection as rejection:
        declared = min(int(request.headers["Content-Length"]), 2**31 - 1)
        refused = delivery_reject_unverified(
            source=found, headers=headers, size=declared, rejection=rejection, address=address
        )
        return rejected_answer(rejection, refused)
    # At most one byte over the limit: enough to know it is too large, without reading the rest.
    body = request.read(found.max_body_bytes + 1)
    delivery, rejected = delivery_receive(source=found, headers=headers, body=body, address=address)
    if rejected is not None:
        return rejected_answer(rejected, delivery)
    assert delivery is not None  # accepted or a duplicate: always recorded
    if delivery.outcome == Outcome.DUPLICATE:
        return JsonResponse({"status": "duplicate"}, status=200)
    return JsonResponse({"status": "accepted", "delivery": delivery.pk}, status=202)


@csrf_exempt
def not_found(request: HttpRequest) -> JsonResponse:
    return error("not_found", "Not found.", 404)
