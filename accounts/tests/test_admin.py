"""API tokens in the admin: credentials, so only superusers see them, and never a whole key in a list."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission, User
from rest_framework.authtoken.models import Token

from tests.factories import Users, login

pytestmark = pytest.mark.django_db
URL = "/admin/authtoken/tokenproxy/"


def test_staff_with_every_token_permission_see_no_token(users: Users) -> None:
    token = Token.objects.create(user=users.alice)
    dave = users.dave
    dave.is_staff = True
    dave.save()
    dave.user_permissions.add(*Permission.objects.filter(content_type__app_label="authtoken"))
    client = login(User.objects.get(pk=dave.pk))

    assert client.get(URL).status_code == 403
    assert client.get(f"{URL}{users.alice.pk}/change/").status_code == 403
    assert token.key not in client.get("/admin/").content.decode()


def test_a_superuser_lists_tokens_by_the_start_of_their_key(users: Users) -> None:
    token = Token.objects.create(user=users.alice)
    carol = users.carol
    carol.is_staff = carol.is_superuser = True
    carol.save()
    client = login(carol)

    listed = client.get(URL)

    assert listed.status_code == 200
    text = listed.content.decode()
    assert f"{token.key[:4]}…" in text and token.key not in text and "alice" in text
