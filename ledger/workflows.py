"""``ledger.reconcile``: what ``manage.py reconcile`` does, as a run of the engine.

The schedules app starts it every night (the ``reconcile-nightly`` schedule a migration installs),
so unknown and stale operations are looked up without anyone typing the command. Private: only a
service (a schedule) starts it. Payload, every key optional:

    system              str  only operations of this ledger system (e.g. "payments")
    older_than_seconds  int  only operations last sent more than this long ago (as --older-than)

One step, retried a few times (a provider down makes each operation its own flagged row, not an
error; a retry is for the database). Reconciling again is always safe: it only looks up and records
what it finds where nobody moved the operation meanwhile. The result counts what happened and
names (up to 50 of) the operations that need a person.
"""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Any

from workflows import Retries, Workflow, workflow
from workflows.exceptions import InvalidPayload
from workflows.registry import Event

if TYPE_CHECKING:
    from workflows.engine import Step

FLAGGED_SHOWN = 50
MAX_OLDER_THAN_SECONDS = 366 * 24 * 3600


def reconcile(system: str | None, older_than_seconds: int | None) -> dict[str, Any]:
    from ledger.services import operations_reconcile

    older_than = timedelta(seconds=older_than_seconds) if older_than_seconds is not None else None
    results = operations_reconcile(system=system, older_than=older_than)
    counts = {
        verdict: sum(1 for r in results if r.verdict == verdict) for verdict in ("resolved", "flagged", "skipped")
    }
    flagged = [r.key for r in results if r.verdict == "flagged"]
    return {"operations": len(results), **counts, "flagged_keys": flagged[:FLAGGED_SHOWN]}


@workflow("ledger.reconcile")
class Reconcile(Workflow):
    version = "1"

    @classmethod
    def validate_payload(cls, payload: dict[str, Any]) -> dict[str, Any]:
        unknown = set(payload) - {"system", "older_than_seconds"}
        if unknown:
            raise InvalidPayload(f"unknown keys: {', '.join(sorted(unknown))} (system, older_than_seconds)")
        system = payload.get("system")
        if system is not None and (not isinstance(system, str) or not 1 <= len(system) <= 100):
            raise InvalidPayload("system must be a ledger system's name, 1 to 100 characters")
        older = payload.get("older_than_seconds")
        if older is not None and (
            isinstance(older, bool) or not isinstance(older, int) or not 0 <= older <= MAX_OLDER_THAN_SECONDS
        ):
            raise InvalidPayload(f"older_than_seconds must be a whole number from 0 to {MAX_OLDER_THAN_SECONDS}")
        return payload

    def run(self, event: Event, step: Step) -> dict[str, Any]:
        p = event.payload
        result: dict[str, Any] = step.do(
            "reconcile",
            reconcile,
            p.get("system"),
            p.get("older_than_seconds"),
            retries=Retries(limit=3, delay=timedelta(minutes=1)),
            timeout=timedelta(minutes=30),
        )
        return result
