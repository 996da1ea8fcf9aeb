"""Orders and the refunds customers ask for. Changes go through ``services`` (which bump
``Order.version``), so an approval names exactly the version a reviewer saw."""

from __future__ import annotations

import secrets

from django.conf import settings
from django.db import models
from django.db.models import Q


class OrderStatus(models.TextChoices):
    PLACED = "placed", "placed"
    PARTIALLY_REFUNDED = "partially_refunded", "partially refunded"
    REFUNDED = "refunded", "refunded"


class Order(models.Model):
    number = models.CharField(max_length=40, unique=True)
    customer = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="orders")
    amount = models.DecimalField(max_digits=12, decimal_places=2)
    currency = models.CharField(max_length=3, default="GBP")
    status = models.CharField(max_length=20, choices=OrderStatus.choices, default=OrderStatus.PLACED)
    # Bumped by every service that changes the order: approvals are for one exact version.
    version = models.PositiveIntegerField(default=1)
    items = models.JSONField(default=list, blank=True)
    # Personal data: never copied into step results, approvals or records (no refund decision needs
    # it); the ledger's redaction (LEDGER REDACT_KEYS has shipping_address) is the second line.
    shipping_address = models.JSONField(default=dict, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"order {self.number}"


def new_key_salt() -> str:
    """A request's part of its ledger key that no other database makes: see ``key_salt``."""
    return secrets.token_hex(6)


class RefundRequest(models.Model):
    order = models.ForeignKey(Order, on_delete=models.PROTECT, related_name="refund_requests")
    customer = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="refund_requests")
    amount = models.DecimalField(max_digits=12, decimal_places=2)
    reason = models.TextField(blank=True)
    # The customer's Idempotency-Key ("" when none was given): a replayed POST finds its request.
    idempotency_key = models.CharField(max_length=255, blank=True)
    run = models.ForeignKey("workflows.WorkflowRun", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    # The chat the customer asked in (the support agent's ``request_refund`` tool), or None (the API):
    # the refund's run reports each state the customer cares about to that agent's state.
    agent = models.ForeignKey("agents.Agent", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    # Random, in the refund's ledger key after the order and the request's id: a provider keeps
    # keys for good, and another database (a fresh one, or a backup restored) numbers its requests
    # again from where it stands. Without it, request 1 on order 1041 of a new database had the key
    # of an earlier one's, and the provider answered with that refund as this one's: confirmed, and
    # no money sent. "" for the requests made before it (their keys stay as they were).
    key_salt = models.CharField(max_length=16, blank=True, default=new_key_salt, editable=False)
    # When its refund was recorded and its order marked (by its run, or by the settling of an
    # operation whose run had ended): at most once. Kept here, not read from the operational
    # record, which purge_records deletes by age: a run restarted after that recorded it again.
    recorded_at = models.DateTimeField(null=True, blank=True, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["customer", "idempotency_key"],
                condition=~Q(idempotency_key=""),
                name="refund_request_customer_key",
            ),
        ]

    def __str__(self) -> str:
        return f"refund request {self.pk} on order {self.order.number}"

    @property
    def operation_key(self) -> str:
        """The ledger key of this request's refund: one refund per request, whatever retries."""
        return operation_key(self.order.number, self.pk, self.key_salt)


def operation_key(order_number: str, request_id: int, salt: str) -> str:
    return f"refund:{order_number}:{request_id}" + (f":{salt}" if salt else "")


def request_ids_in(key: str) -> list[int]:
    """The ids of the requests whose key ``key`` may be, if ``operation_key`` made it: its last
    part, or the one before the salt (which may be digits too). The caller keeps the request whose
    own key is ``key``."""
    if not key.startswith("refund:"):
        return []
    return [int(part) for part in key.split(":")[2:][-2:] if part.isdigit()]
