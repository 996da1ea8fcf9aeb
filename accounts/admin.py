from __future__ import annotations

from django.contrib import admin

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
