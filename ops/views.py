"""``/healthz``, ``/readyz`` and ``/metrics``: plain Django views, no session, for probes and
Prometheus. They show no personal data: counts, ages and the names of what failed."""

from __future__ import annotations

import hmac

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_safe
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4

from ops.metrics import exposition
from ops.readiness import readiness


# csrf_exempt: a POST is answered 405 like any other method but GET and HEAD, not 403 (CSRF).
@csrf_exempt
@require_safe
def healthz(request: HttpRequest) -> JsonResponse:
    """The process answers (nothing else is asked: a liveness probe must not fail for a database)."""
    return JsonResponse({"status": "ok"})


@csrf_exempt
@require_safe
def readyz(request: HttpRequest) -> JsonResponse:
    """200 if PostgreSQL, Redis and the broker answer and every migration is applied; else 503
    naming what failed."""
    checks = readiness()
    ready = all(answer == "ok" for answer in checks.values())
    return JsonResponse({"status": "ok" if ready else "unavailable", "checks": checks}, status=200 if ready else 503)


def authorised(request: HttpRequest) -> bool:
    """``Authorization: Bearer <METRICS_TOKEN>``; without a token set, only with DEBUG on."""
    token = str(settings.METRICS_TOKEN).strip()  # spaces around it are a typo, not a token
    if not token:
        return bool(settings.DEBUG)
    scheme, _, given = request.headers.get("Authorization", "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), token.encode())


@csrf_exempt
@require_safe
def metrics(request: HttpRequest) -> HttpResponse:
    if not authorised(request):
        response = HttpResponse("not authorised\n", status=401, content_type="text/plain")
        response["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return response
    return HttpResponse(exposition(), content_type=CONTENT_TYPE_PLAIN_0_0_4)
