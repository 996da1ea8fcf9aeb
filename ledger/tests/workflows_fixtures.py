"""A workflow that refunds through the ledger, for the end-to-end test with a real Celery worker
(loaded there through WORKFLOWS_MODULES; in the test process by importing this module)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from workflows import Retries, Workflow, workflow
from workflows.registry import Event


def submit_refund(provider_url: str, key: str, request: dict[str, Any]) -> Any:
    from ledger import HttpAdapter, perform, register_adapter

    # Registered here rather than at start-up: the provider's port is only known to the test.
    register_adapter("e2e-payments", HttpAdapter(base_url=provider_url))
    return perform(key=key, system="e2e-payments", action="refund", request=request)


@workflow("ledger.test.refund")
class Refund(Workflow):
    def run(self, event: Event, step: Any) -> Any:
        p = event.payload
        return step.do(
            "submit refund",
            submit_refund,
            p["provider_url"],
            p["key"],
            p["request"],
            retries=Retries(limit=3, delay=timedelta(seconds=0.2), backoff="constant"),
        )
