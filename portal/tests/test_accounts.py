"""Signing in and out at /accounts/ for everyone, customers included; the admin keeps its own login."""

from __future__ import annotations

import pytest
from django.conf import settings
from django.contrib.auth import SESSION_KEY
from django.test import Client

from tests.factories import Users, login

pytestmark = pytest.mark.django_db

LOGIN = "/accounts/login/"
LOGOUT = "/accounts/logout/"


def signed_in_as(client: Client) -> str | None:
    """The session's user id, or None when nobody is signed in."""
    return client.session.get(SESSION_KEY)


def test_login_url_is_the_page_for_everyone_and_home_is_where_it_lands() -> None:
    assert (settings.LOGIN_URL, settings.LOGIN_REDIRECT_URL) == (LOGIN, "/")


def test_the_login_page_is_a_form_with_labelled_fields() -> None:
    response = Client().get(LOGIN)

    assert response.status_code == 200
    html = response.content.decode()
    assert '<label for="id_username">Username</label>' in html and '<label for="id_password">Password</label>' in html
    assert 'name="csrfmiddlewaretoken"' in html
    assert 'action="/accounts/logout/"' not in html  # nobody to sign out


def test_a_customer_signs_in_with_a_password_and_lands_on_the_home_page(users: Users) -> None:
    # given alice, a customer (not staff): the admin's login refuses her
    alice = users.alice
    assert not alice.is_staff
    client = Client()

    # when she signs in at /accounts/login/
    response = client.post(LOGIN, {"username": "alice", "password": "pw-alice"})

    # then she is signed in and sent home, where the page knows her
    assert response.status_code == 302 and response["Location"] == "/"
    assert signed_in_as(client) == str(alice.pk)
    home = client.get("/")
    assert home.status_code == 200
    assert '<strong id="username">alice</strong>' in home.content.decode()


def test_the_admin_login_still_refuses_a_customer_and_admits_staff(users: Users) -> None:
    customer, staff = Client(), Client()

    customer.post("/admin/login/", {"username": "alice", "password": "pw-alice"})
    response = staff.post("/admin/login/?next=/admin/", {"username": "carol", "password": "pw-carol"})

    assert signed_in_as(customer) is None
    assert response.status_code == 302 and signed_in_as(staff) == str(users.carol.pk)


def test_a_wrong_password_is_refused_with_a_message_and_signs_nobody_in(users: Users) -> None:
    client = Client()

    response = client.post(LOGIN, {"username": "alice", "password": "not-hers"})

    assert response.status_code == 200
    assert 'role="alert"' in response.content.decode()
    assert "enter a correct username and password" in response.content.decode()
    assert signed_in_as(client) is None


def test_an_inactive_user_cannot_sign_in(users: Users) -> None:
    mallory = users.mallory
    mallory.is_active = False
    mallory.save()
    client = Client()

    client.post(LOGIN, {"username": "mallory", "password": "pw-mallory"})

    assert signed_in_as(client) is None


def test_sign_in_returns_to_the_page_asked_for_but_never_to_another_site(users: Users) -> None:
    local, elsewhere = Client(), Client()

    to_run = local.post(LOGIN, {"username": "alice", "password": "pw-alice", "next": "/runs/1/"})
    to_other = elsewhere.post(
        LOGIN, {"username": "alice", "password": "pw-alice", "next": "https://attacker.example/steal"}
    )

    assert to_run["Location"] == "/runs/1/"
    assert to_other["Location"] == "/"


def test_the_home_page_sends_someone_signed_out_to_the_login_page() -> None:
    response = Client().get("/")

    assert response.status_code == 302
    assert response["Location"] == f"{LOGIN}?next=/"


def test_sign_out_is_a_post_and_ends_the_session(users: Users) -> None:
    # given alice signed in
    client = Client()
    client.post(LOGIN, {"username": "alice", "password": "pw-alice"})
    assert signed_in_as(client) == str(users.alice.pk)

    # when she presses "Log out" (a form that POSTs), having first been sent a GET by a link
    by_link = client.get(LOGOUT)
    still_in = signed_in_as(client)
    response = client.post(LOGOUT)

    # then the GET changed nothing; the POST signed her out and sent her to the login page
    assert by_link.status_code == 405 and still_in == str(users.alice.pk)
    assert response.status_code == 302 and response["Location"] == LOGIN
    assert signed_in_as(client) is None
    assert client.get("/").status_code == 302


def test_sign_out_needs_the_csrf_token(users: Users) -> None:
    client = login(users.alice, enforce_csrf_checks=True)

    response = client.post(LOGOUT)

    assert response.status_code == 403
    assert signed_in_as(client) == str(users.alice.pk)


@pytest.mark.parametrize(("name", "admin_link"), [("alice", False), ("carol", True)])
def test_the_header_names_the_user_has_a_logout_button_and_an_admin_link_for_staff(
    users: Users, name: str, admin_link: bool
) -> None:
    client = login(getattr(users, name))

    html = client.get("/").content.decode()

    assert f'<strong id="username">{name}</strong>' in html
    assert '<form method="post" action="/accounts/logout/">' in html and ">Log out</button>" in html
    assert '<a href="/" aria-current="page">Home</a>' in html
    assert ('<a href="/admin/">Admin</a>' in html) is admin_link
