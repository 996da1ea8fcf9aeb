"""HTTP requests counted and timed for ``/metrics``, by the web process that answered each."""

from __future__ import annotations

import time
from collections.abc import Callable

from django.http import HttpRequest, HttpResponseBase
from prometheus_client import Histogram

# From a millisecond to ten seconds: a probe answers in one, a webhook or a submission in tens.
BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

REQUESTS = Histogram(
    "http_request_duration_seconds",
    "HTTP requests by method, route (the URL pattern, not the path: bounded) and status class, and "
    "the time to their response's headers (a stream's body is not counted).",
    ["method", "route", "status"],
    buckets=BUCKETS,
)
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


def route_of(request: HttpRequest) -> str:
    """The URL pattern the request matched (``api/runs/<uuid:run_id>``), or ``unmatched``: label
    values come from the project's patterns only, never from what a client typed."""
    match = getattr(request, "resolver_match", None)
    return match.route if match is not None and match.route else "unmatched"


class RequestMetrics:
    """The outermost middleware: times the rest of the chain and the view (synchronously, in the
    request's one thread: config.handlers.ASGIHandler)."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponseBase]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponseBase:
        started = time.perf_counter()
        response = self.get_response(request)
        method = request.method if request.method in METHODS else "other"
        status = f"{response.status_code // 100}xx"
        REQUESTS.labels(method, route_of(request), status).observe(time.perf_counter() - started)
        return response
