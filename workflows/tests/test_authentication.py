"""The API's token authentication (workflows.apis.authentication): DRF's, its read one prepared
statement, with DRF's answers."""

from __future__ import annotations

import pytest
from rest_framework.authtoken.models import Token

from tests.factories import Users, api_login
from tests.support import statements_sent
from workflows.statements import _token_sql, token_with_user

pytestmark = pytest.mark.django_db


def test_the_token_and_its_user_as_the_orm_reads_them(users: Users) -> None:
    token = Token.objects.create(user=users.alice)

    found = token_with_user(token.key)

    assert found is not None
    read, user = found
    stored = Token.objects.get(pk=token.key)
    assert (read.key, read.created, read.user_id) == (stored.key, stored.created, users.alice.pk)
    assert user == users.alice and read.user is user
    assert (user.username, user.email, user.password, user.date_joined) == (
        users.alice.username,
        users.alice.email,
        users.alice.password,
        users.alice.date_joined,
    )
    assert token_with_user("0" * 40) is None


def test_a_token_signs_its_user_in_with_one_prepared_statement(users: Users) -> None:
    client = api_login(users.alice)

    with statements_sent() as sent:
        response = client.get("/api/runs")

    assert response.status_code == 200
    assert [sql for sql in sent if "authtoken_token" in sql] == [_token_sql()]


@pytest.mark.parametrize(
    ("header", "message"),
    [
        ("Token " + "0" * 40, "Invalid token."),
        ("Token", "Invalid token header. No credentials provided."),
        ("Token a b", "Invalid token header. Token string should not contain spaces."),
    ],
)
def test_a_token_nobody_has_is_a_401(header: str, message: str) -> None:
    client = api_login(None)
    client.credentials(HTTP_AUTHORIZATION=header)

    response = client.get("/api/runs")

    assert response.status_code == 401
    assert response.json()["error"]["message"] == message
    assert response["WWW-Authenticate"] == "Token"


def test_an_inactive_users_token_is_a_401(users: Users) -> None:
    client = api_login(users.alice)
    users.alice.is_active = False
    users.alice.save()

    response = client.get("/api/runs")

    assert response.status_code == 401
    assert response.json()["error"]["message"] == "User inactive or deleted."
