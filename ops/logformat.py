"""``LOG_FORMAT=json``: one JSON object per line, for a log shipper.

Keys: ``ts`` (UTC, ISO 8601), ``level``, ``logger``, ``message``, then the context fields a call
gave with ``extra=`` among ``FIELDS`` (``event``, ``run_id``, ``attempt``, ``step``, ``turn_id``,
``operation_key``, ...), and ``exc`` for a traceback. Only those: an ``extra=`` that a library adds
(Celery's carries a task's arguments) is not copied, so a payload cannot slip in that way. What
the project logs never holds a payload, a request body or a person's data (README "Logs").
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from typing import Any

from django.core.exceptions import PermissionDenied

FIELDS = (
    "event",
    "run_id",
    "attempt",
    "step",
    "workflow",
    "turn_id",
    "agent_id",
    "operation_key",
    "system",
    "action",
    "kind",
    "status",
    "status_before",
    "outcome",
    "reason",
    "tries",
    "duration_ms",
    "error_type",
    "recoveries",
    "approval_id",
    "result",
    "source",
    "delivery_id",
    "event_id",
)


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name in FIELDS:
            value = record.__dict__.get(name)
            if value is not None:
                line[name] = value
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str, ensure_ascii=False)


class RequestPathFilter(logging.Filter):
    """Django's request lines (``Not Found: /…``, ``Forbidden (Permission denied): /…``, ``Forbidden
    (CSRF token missing.): /…``, ``Internal Server Error: /…``) name the route the request matched,
    or say it matched none, instead of its path: a path and its query are what a client typed, and
    may hold an email address or a token that must not reach the logs. A refusal (PermissionDenied:
    a 403, an answer like a 404) is written without the traceback Django adds to it: it is no error
    to look into. Nor is a suspicious request's (``django.security.*``: a Host not allowed)."""

    LOGGERS = ("django.request", "django.server", "django.security.csrf")

    def filter(self, record: logging.LogRecord) -> bool:
        request = getattr(record, "request", None)
        args = record.args
        path = getattr(request, "path", None)
        if record.name in self.LOGGERS and path is not None and isinstance(args, tuple) and path in args:
            match = getattr(request, "resolver_match", None)
            route = getattr(match, "route", None)
            named = f"route {route}" if route else "a path no route matches"
            record.args = tuple(named if arg == path else arg for arg in args)
            if record.exc_info and isinstance(record.exc_info[1], PermissionDenied):
                # and the text of it another handler formatted first (Django's console, with DEBUG)
                record.exc_info, record.exc_text = None, None
        if record.name.startswith("django.security.") and record.exc_info:
            # A request Django found suspicious (a Host not in ALLOWED_HOSTS, too many fields): one
            # line says it. Anyone can send one, and a traceback each would let them fill the log.
            record.exc_info, record.exc_text = None, None
        return True
