"""Writes: accounts and memberships (the admin and ``seed_demo`` use these)."""

from __future__ import annotations

from collections.abc import Sequence

from django.contrib.auth.models import User
from django.db import transaction

from accounts.models import Account, Membership


def account_ensure(*, slug: str, name: str = "", members: Sequence[User] = ()) -> Account:
    """The account ``slug`` (created if missing) with ``members`` in it; safe to repeat."""
    with transaction.atomic():
        account, _ = Account.objects.get_or_create(slug=slug, defaults={"name": name or slug})
        for user in members:
            Membership.objects.get_or_create(account=account, user=user)
    return account
