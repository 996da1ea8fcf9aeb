"""Who belongs to which account."""

from __future__ import annotations

from django.contrib.auth.models import AnonymousUser
from django.contrib.auth.models import User as DjangoUser
from django.db.models import QuerySet

from accounts.models import Account

User = DjangoUser | AnonymousUser


def accounts_of(user: User) -> QuerySet[Account]:
    """The accounts ``user`` is a member of, the default (earliest membership) first."""
    if not user.is_authenticated:
        return Account.objects.none()
    return Account.objects.filter(memberships__user=user).order_by("memberships__created_at", "memberships__id")


def account_for(user: User, slug: str | None = None) -> Account | None:
    """The account ``user`` acts in: the one named ``slug`` if they are a member of it, else their
    default; None if they belong to none (or not to ``slug``: indistinguishable from no such account)."""
    accounts = accounts_of(user)
    if slug is not None:
        accounts = accounts.filter(slug=slug)
    return accounts.first()


def is_member(user: User, account: Account) -> bool:
    return accounts_of(user).filter(pk=account.pk).exists()
