"""Writes of the ledger: perform, reconcile, resolve by hand, records and their retention."""

from ledger.services.operations import check_operation, operation_perform, operation_prepare, request_fingerprint
from ledger.services.reconciliation import (
    ReconcileResult,
    operation_reconcile,
    operation_report,
    operation_resolve,
    operations_abandon_for_run,
    operations_reconcile,
)
from ledger.services.records import PurgeResult, purge_in_batches, record_create, record_purge, retention_cutoff

__all__ = [
    "PurgeResult",
    "purge_in_batches",
    "retention_cutoff",
    "ReconcileResult",
    "check_operation",
    "operation_perform",
    "operation_prepare",
    "operations_abandon_for_run",
    "operation_reconcile",
    "operation_report",
    "operation_resolve",
    "operations_reconcile",
    "record_create",
    "record_purge",
    "request_fingerprint",
]
