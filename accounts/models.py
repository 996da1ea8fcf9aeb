"""An account is a tenant (a household, a company); a membership puts a user in one. A user may
belong to several accounts; the earliest membership is their default."""

from __future__ import annotations

from django.conf import settings
from django.db import models


class Account(models.Model):
    slug = models.SlugField(max_length=64, unique=True, help_text="Names the account in URLs (?account=<slug>).")
    name = models.CharField(max_length=200)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["slug"]

    def __str__(self) -> str:
        return self.slug


class Membership(models.Model):
    account = models.ForeignKey(Account, on_delete=models.CASCADE, related_name="memberships")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["account", "user"], name="accounts_one_membership")]
        ordering = ["created_at", "id"]

    def __str__(self) -> str:
        return f"{self.user} in {self.account}"
