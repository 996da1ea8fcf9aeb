"""Who belongs to which account, read directly."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import AnonymousUser

from accounts.selectors import account_for, accounts_of, is_member
from accounts.services import account_ensure
from tests.factories import Users

pytestmark = pytest.mark.django_db


def test_a_user_acts_in_their_default_account_or_one_they_name(users: Users) -> None:
    # given alice in acme then in shop, bob in acme only, mallory in globex
    acme = account_ensure(slug="acme", members=[users.alice, users.bob])
    shop = account_ensure(slug="shop", members=[users.alice])
    globex = account_ensure(slug="globex", members=[users.mallory])

    # then the earliest membership is the default, and a named account counts only for members
    assert list(accounts_of(users.alice)) == [acme, shop]
    assert account_for(users.alice) == acme
    assert account_for(users.alice, "shop") == shop
    assert account_for(users.bob, "shop") is None  # not a member: as if there were no such account
    assert account_for(users.mallory, "acme") is None
    assert account_for(users.mallory) == globex
    assert account_for(users.carol) is None  # in no account
    assert account_for(AnonymousUser()) is None
    assert is_member(users.bob, acme) and not is_member(users.bob, globex)


def test_account_ensure_is_safe_to_repeat(users: Users) -> None:
    first = account_ensure(slug="acme", name="Acme", members=[users.alice])
    again = account_ensure(slug="acme", name="Other", members=[users.alice, users.bob])

    assert again == first and again.name == "Acme"
    assert sorted(m.user.username for m in again.memberships.all()) == ["alice", "bob"]
