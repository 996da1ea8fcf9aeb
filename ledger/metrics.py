"""The ledger's event metric, counted where each event is recorded (``services.common.build_event``).
The operations' current statuses are read from the database at scrape time (``ops.metrics``)."""

from __future__ import annotations

from prometheus_client import Counter

OPERATION_EVENTS = Counter(
    "ledger_operation_events",
    "What happened to external operations: by system, event kind (submit, lookup, resolve, "
    "abandon) and the status it left the operation in.",
    ["system", "kind", "status"],
)
