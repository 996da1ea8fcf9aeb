from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest
from rest_framework.authtoken.admin import TokenAdmin as DRFTokenAdmin
from rest_framework.authtoken.models import TokenProxy

from accounts.models import Account, Membership


class MembershipInline(admin.TabularInline[Membership, Account]):
    model = Membership
    extra = 0
    autocomplete_fields = ["user"]


@admin.register(Account)
class AccountAdmin(admin.ModelAdmin[Account]):
    list_display = ["slug", "name", "created_at"]
    search_fields = ["slug", "name"]
    inlines = [MembershipInline]


admin.site.unregister(TokenProxy)


@admin.register(TokenProxy)
class TokenAdmin(DRFTokenAdmin):
    """API tokens are credentials: whoever reads one acts as its user. DRF's admin shows every key to
    any staff member with the view permission (an auditor given every view permission could then
    act as anyone), in the list and in each page's title; here only superusers, who may act as
    anyone anyway, see the tokens at all, and the list shows the start of each key."""

    list_display = ("key_start", "user", "created")

    @admin.display(description="key")
    def key_start(self, token: TokenProxy) -> str:
        return f"{token.key[:4]}…"

    def has_module_permission(self, request: HttpRequest) -> bool:
        return bool(request.user.is_superuser)

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return bool(request.user.is_superuser)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return bool(request.user.is_superuser)

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return bool(request.user.is_superuser)

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return bool(request.user.is_superuser)
