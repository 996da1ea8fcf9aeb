"""Webhook deliveries by outcome, counted by the web process that received each one."""

from __future__ import annotations

from prometheus_client import Counter

DELIVERIES = Counter(
    "webhooks_deliveries",
    "Inbound webhook deliveries by source (a configured one) and outcome (accepted, duplicate, rejected).",
    ["source", "outcome"],
)
