"""Webhook deliveries by outcome, counted by the web process that received each one; and the tries
of later actions, counted by the worker that made them."""

from __future__ import annotations

from prometheus_client import Counter

DELIVERIES = Counter(
    "webhooks_deliveries",
    "Inbound webhook deliveries by source (a configured one) and outcome (accepted, duplicate, rejected).",
    ["source", "outcome"],
)

ACTION_TRIES = Counter(
    "webhooks_actions",
    "Tries of the actions of sources that act later, by source and where each left its delivery"
    " (done, pending: to try again, refused, failed).",
    ["source", "state"],
)

REJECTIONS_UNRECORDED = Counter(
    "webhooks_rejections_unrecorded",
    "Deliveries rejected before their signature held and not recorded, by source: past"
    " WEBHOOKS_MAX_REJECTIONS_RECORDED_PER_ADDRESS or _PER_SOURCE in a window (webhooks.rejections).",
    ["source"],
)
