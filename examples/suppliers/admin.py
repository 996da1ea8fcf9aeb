"""Supplier assessments in the admin: status, every source revision, every report version, the run.

Read-only: the status moves only through the services (the FSM field is protected) and the
evidence and reports are history, so the admin shows them and links to the run that drives them.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from examples.suppliers.models import AssessmentReport, SourceRecord, SupplierAssessment
from examples.suppliers.selectors import current_report
from workflows.admin import ReadOnlyInline, run_admin_link


class SourceRecordInline(ReadOnlyInline[SourceRecord, SupplierAssessment]):
    model = SourceRecord
    fields = ("source", "revision", "content", "created_by", "created_at")
    readonly_fields = fields
    ordering = ("source", "-revision")


class AssessmentReportInline(ReadOnlyInline[AssessmentReport, SupplierAssessment]):
    model = AssessmentReport
    fields = ("version", "source_revisions", "body", "created_at")
    readonly_fields = fields
    ordering = ("-version",)


@admin.register(SupplierAssessment)
class SupplierAssessmentAdmin(admin.ModelAdmin[SupplierAssessment]):
    list_display = ("id", "supplier_name", "status", "requested_by", "latest_report", "run_link", "created_at")
    list_filter = ("status",)
    list_select_related = ("requested_by",)
    search_fields = ("supplier_name",)
    inlines = (SourceRecordInline, AssessmentReportInline)
    fields = (
        "supplier_name",
        "status",
        "requested_by",
        "input",
        "run_link",
        "decided_by",
        "decided_version",
        "failure_reason",
        "created_at",
        "updated_at",
    )
    readonly_fields = fields

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # created through services.assessment_create

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # the run and the approval requests refer to it

    @admin.display(description="run")
    def run_link(self, obj: SupplierAssessment) -> str:
        return run_admin_link(obj.run_id)

    @admin.display(description="latest report")
    def latest_report(self, obj: SupplierAssessment) -> str:
        report = current_report(obj)
        return f"v{report.version}" if report is not None else "-"
