"""Sign-in attempts, counted in (real) Redis and limited, on the portal's form and the admin's."""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import redis
from django.conf import settings
from django.contrib.auth import SESSION_KEY
from django.test import Client
from django.test.client import RequestFactory
from django.test.utils import override_settings

from accounts import addresses, signin
from accounts.addresses import client_address
from accounts.checks import check_client_address
from tests.factories import Users
from tests.support import own_redis_prefix

pytestmark = pytest.mark.django_db

LOGIN = "/accounts/login/"
DEVICE = "signin_device"  # without HTTPS (with it: __Host-signin_device)
ADMIN_LOGIN = "/admin/login/"
HOME = "127.0.0.1"


@pytest.fixture(autouse=True)
def _own_counts(settings: Any) -> Iterator[str]:
    """Counts of this test's own (the suite's processes share Redis and one address), small limits."""
    settings.SIGNIN_MAX_FAILURES_PER_NAME_AND_ADDRESS = 3
    settings.SIGNIN_MAX_FAILURES_PER_ADDRESS = 6
    settings.SIGNIN_MAX_FAILURES_PER_NAME = 8
    settings.SIGNIN_WINDOW_SECONDS = 900
    with own_redis_prefix(settings, "SIGNIN_KEY_PREFIX", "signin-test") as prefix:
        yield prefix


def attempt(name: str, password: str, *, address: str = HOME, path: str = LOGIN, **headers: str) -> tuple[int, Client]:
    client = Client(REMOTE_ADDR=address, headers=headers)
    response = client.post(path, {"username": name, "password": password})
    return response.status_code, client


def signed_in(client: Client) -> bool:
    return SESSION_KEY in client.session


def fail(times: int, name: str = "alice", **kwargs: Any) -> None:
    for _ in range(times):
        status, client = attempt(name, "wrong", **kwargs)
        assert status == 200 and not signed_in(client)  # the form again, with Django's "incorrect"


def test_failures_up_to_the_limit_leave_the_form_as_it_was(users: Users) -> None:
    fail(2)

    status, client = attempt("alice", "pw-alice")

    assert status == 302 and signed_in(client)


def test_past_the_limit_even_the_right_password_is_refused_with_when_to_try_again(users: Users) -> None:
    # given three failures for alice from one address (the limit for a name and an address)
    fail(3)

    # when she then types her password right
    client = Client(REMOTE_ADDR=HOME)
    response = client.post(LOGIN, {"username": "alice", "password": "pw-alice"})

    # then she is not signed in, and told why and for how long
    assert response.status_code == 429 and not signed_in(client)
    assert 890 <= int(response["Retry-After"]) <= 900
    assert "Too many failed sign-ins. Try again in 15 minutes." in response.content.decode()
    # and from another address she still may (only this name from that address is held)
    status, elsewhere = attempt("alice", "pw-alice", address="203.0.113.9")
    assert status == 302 and signed_in(elsewhere)


def test_a_success_clears_its_own_count_but_not_the_addresss(users: Users) -> None:
    # given two failures for alice, then her sign-in
    fail(2)
    assert attempt("alice", "pw-alice")[0] == 302

    # then she has three tries again: the success cleared her count from this address
    fail(2)
    assert attempt("alice", "pw-alice")[0] == 302
    # but the address's count kept all four failures: two more (for bob) reach its limit of six,
    # and nobody may sign in from it now, whoever it is
    fail(2, name="bob")
    assert attempt("carol", "pw-carol")[0] == 429
    assert attempt("carol", "pw-carol", address="198.51.100.7")[0] == 302


def test_one_name_guessed_from_many_addresses_is_held_everywhere(users: Users) -> None:
    for number in range(8):  # two a machine, under the limit of each of them
        fail(1, address=f"192.0.2.{number}")

    assert attempt("alice", "pw-alice", address="198.51.100.200")[0] == 429
    assert attempt("bob", "pw-bob", address="198.51.100.200")[0] == 302


def test_a_name_is_counted_as_the_form_reads_it(users: Users) -> None:
    # the fullwidth form is alice's name to Django's username field (it signs in as her)
    fail(2, name="alice")
    fail(1, name="ａｌｉｃｅ")
    assert attempt("alice", "pw-alice")[0] == 429


def test_another_case_is_another_name(users: Users) -> None:
    # "ALICE" is not alice (usernames are compared exactly): guesses at it are not at her password,
    # and whoever owned "ALICE" could not clear alice's count by signing in
    fail(3, name="ALICE")
    assert attempt("alice", "pw-alice")[0] == 302


def test_the_window_ends(users: Users, settings: Any) -> None:
    settings.SIGNIN_WINDOW_SECONDS = 1
    fail(3)
    assert attempt("alice", "pw-alice")[0] == 429

    time.sleep(1.2)

    assert attempt("alice", "pw-alice")[0] == 302


def test_a_limit_of_0_counts_nothing(users: Users, settings: Any) -> None:
    settings.SIGNIN_MAX_FAILURES_PER_NAME_AND_ADDRESS = 0
    fail(5)

    assert attempt("alice", "pw-alice")[0] == 302  # five failures: under the address's six and the name's eight


def test_the_admins_sign_in_is_limited_the_same_way(users: Users) -> None:
    # carol is staff; a customer's tries at the admin count as failures too
    for _ in range(3):
        assert attempt("carol", "wrong", path=ADMIN_LOGIN)[0] == 200

    client = Client(REMOTE_ADDR=HOME)
    response = client.post(ADMIN_LOGIN, {"username": "carol", "password": "pw-carol", "next": "/admin/"})

    assert response.status_code == 429 and not signed_in(client)
    assert "Too many failed sign-ins." in response.content.decode()
    # the counts are one: the portal refuses her from here as well
    assert attempt("carol", "pw-carol")[0] == 429


def test_behind_a_proxy_the_address_is_the_one_the_proxy_added(users: Users) -> None:
    with override_settings(CLIENT_ADDRESS_HEADER="X-Forwarded-For"):
        # a client writing addresses of its own before the proxy's cannot pass for another machine
        for forged in ("10.0.0.1", "10.0.0.2", "10.0.0.3"):
            assert attempt("alice", "wrong", x_forwarded_for=f"{forged}, 192.0.2.50")[0] == 200

        assert attempt("alice", "pw-alice", x_forwarded_for="10.0.0.4, 192.0.2.50")[0] == 429
        # the proxy's own address (REMOTE_ADDR) is not what is counted: another client gets in
        assert attempt("alice", "pw-alice", x_forwarded_for="192.0.2.51")[0] == 302


def test_an_address_is_read_as_proxies_write_it() -> None:
    factory = RequestFactory()

    def address(forwarded: str) -> str:
        return client_address(factory.get("/", REMOTE_ADDR="10.0.0.1", headers={"X-Forwarded-For": forwarded}))

    with override_settings(CLIENT_ADDRESS_HEADER="X-Forwarded-For"):
        # with its port, in brackets: one machine's address, not a count per connection
        assert address("192.0.2.1:5555") == address("192.0.2.1") == "192.0.2.1"
        assert address("[2001:db8::1]") == address("[2001:db8::1]:8080") == "2001:db8::/64"
        assert address("evil, 192.0.2.2") == "192.0.2.2"
        with override_settings(CLIENT_ADDRESS_PROXIES=2):
            # a CDN, then nginx: the client's address is the CDN's entry, the one before nginx's
            assert address("forged, 192.0.2.3, 198.51.100.1") == "192.0.2.3"
            assert address("192.0.2.4") == "192.0.2.4"  # fewer than the proxies: the first


def test_an_ipv6_address_is_counted_by_its_64() -> None:
    factory = RequestFactory()

    def address(remote: str, real_ip: str | None = None) -> str:
        headers = {"X-Real-IP": real_ip} if real_ip else {}
        return client_address(factory.get("/", REMOTE_ADDR=remote, headers=headers))

    assert address("2001:db8:1:2:aaaa::1") == address("2001:db8:1:2:ffff::9") == "2001:db8:1:2::/64"
    assert address("2001:db8:1:3::1") == "2001:db8:1:3::/64"
    assert address("::ffff:192.0.2.1") == "192.0.2.1"
    assert address("192.0.2.1") == "192.0.2.1"
    with override_settings(CLIENT_ADDRESS_HEADER="X-Real-IP"):
        assert address("127.0.0.1", real_ip="192.0.2.8") == "192.0.2.8"
        assert address("127.0.0.1") == "127.0.0.1"  # the header missing: the connection's


def test_without_redis_sign_in_still_works_unlimited(
    users: Users, settings: Any, monkeypatch: Any, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(addresses, "_limits", None)  # (restored after: a client of the first URL)
    monkeypatch.setattr(addresses, "_said", {})
    settings.REDIS_URL = "redis://127.0.0.1:1/0"  # nothing listens there
    fail(4)
    assert attempt("alice", "pw-alice")[0] == 302
    # said once, without a traceback, however many attempts (anyone's to send) found it down
    said = [r for r in caplog.records if getattr(r, "event", "") == "limits.redis_down"]
    assert [r.getMessage().split(":")[0] for r in said] == [
        "sign-in attempts are not counted, nor limited",
        "a right sign-in's attempt is not taken back",
    ]
    assert all(r.exc_info is None for r in said)


def test_nothing_of_the_name_is_kept_in_redis(users: Users, _own_counts: str) -> None:
    fail(1, name="alice")

    keys = [key.decode() for key in redis.Redis.from_url(settings.REDIS_URL).scan_iter(f"{_own_counts}:*")]
    assert len(keys) == 3 and not any("alice" in key for key in keys)
    # nor its plain hash, which a dictionary would reverse: an HMAC under SECRET_KEY
    assert not any(hashlib.sha256(b"alice").hexdigest()[:16] in key for key in keys)


def test_attempts_at_once_have_no_more_passwords_checked_than_the_limit() -> None:
    # forty attempts arriving together: each is counted in the same step as the limits are
    # checked, so three (the name-and-address limit) go on and the rest are refused
    barrier = threading.Barrier(40)
    attempt = signin.Attempt(name="alice", address="192.0.2.77")

    def begin() -> int:
        barrier.wait()
        return attempt.begin()

    with ThreadPoolExecutor(max_workers=40) as pool:
        waits = list(pool.map(lambda _: begin(), range(40)))

    assert waits.count(0) == 3
    assert all(890 <= wait <= 900 for wait in waits if wait)


def test_a_right_password_takes_its_attempt_back(_own_counts: str) -> None:
    client = redis.Redis.from_url(settings.REDIS_URL)
    attempt = signin.Attempt(name="alice", address="192.0.2.78")
    assert attempt.begin() == 0 and attempt.begin() == 0  # a failure, then an attempt that is right
    attempt.right()

    counts = {key.decode().split(":")[1]: int(client.get(key) or 0) for key in client.scan_iter(f"{_own_counts}:*")}
    assert counts == {"name": 1, "address": 1}  # the failure only; the pair's count cleared


def test_a_customers_right_password_at_the_admin_is_no_failure(users: Users) -> None:
    # the admin refuses alice (not staff), but her password was right: no guess, nothing counted
    for _ in range(4):
        assert attempt("alice", "pw-alice", path=ADMIN_LOGIN)[0] == 200

    assert attempt("alice", "pw-alice")[0] == 302


def test_the_admins_change_of_password_checks_the_old_one_as_a_sign_in(users: Users) -> None:
    # a stolen staff session must not be a way to guess the password at full speed
    client = Client(REMOTE_ADDR=HOME)
    client.force_login(users.carol)
    change = {"new_password1": "a-new-long-one", "new_password2": "a-new-long-one"}
    for _ in range(3):
        response = client.post("/admin/password_change/", {**change, "old_password": "wrong"})
        assert response.status_code == 200 and "incorrect" in response.content.decode()

    response = client.post("/admin/password_change/", {**change, "old_password": "pw-carol"})

    assert response.status_code == 429 and int(response["Retry-After"]) > 0
    assert "Too many failed password checks." in response.content.decode()
    users.carol.refresh_from_db()
    assert users.carol.check_password("pw-carol")
    # and the counts are the sign-in's: carol cannot sign in from here either
    assert attempt("carol", "pw-carol")[0] == 429


def test_an_old_password_right_changes_it_and_counts_nothing(users: Users) -> None:
    client = Client(REMOTE_ADDR=HOME)
    client.force_login(users.carol)
    fail(2, name="carol")
    change = {"old_password": "pw-carol", "new_password1": "a-new-long-one", "new_password2": "a-new-long-one"}

    assert client.post("/admin/password_change/", change)["Location"] == "/admin/password_change/done/"
    users.carol.refresh_from_db()
    assert users.carol.check_password("a-new-long-one")
    fail(2, name="carol")  # her count began again: two more are no refusal
    assert attempt("carol", "a-new-long-one")[0] == 302


def test_behind_a_proxy_without_the_header_the_deploy_check_warns(settings: Any) -> None:
    settings.HTTPS, settings.CLIENT_ADDRESS_HEADER = True, ""
    assert [m.id for m in check_client_address()] == ["accounts.W001"]

    settings.CLIENT_ADDRESS_HEADER = "X-Forwarded-For"
    assert check_client_address() == []
    settings.HTTPS, settings.CLIENT_ADDRESS_HEADER = False, ""  # no proxy said: the connection's address
    assert check_client_address() == []
    # behind a proxy, it warns while either count is by address
    settings.HTTPS, settings.SIGNIN_MAX_FAILURES_PER_ADDRESS = True, 0
    [warning] = check_client_address()
    assert "forged webhook deliveries" in warning.msg and "sign-ins" not in warning.msg
    settings.WEBHOOKS_MAX_REJECTIONS_RECORDED_PER_ADDRESS = 0
    assert check_client_address() == []


def test_a_right_sign_in_marks_the_browser_for_its_name(users: Users) -> None:
    for path in (LOGIN, ADMIN_LOGIN):
        client = Client(REMOTE_ADDR=HOME)
        client.post(path, {"username": "carol", "password": "pw-carol", "next": "/admin/"})
        cookie = client.cookies[DEVICE]
        assert cookie["httponly"] and cookie["samesite"] == "Lax" and "carol" not in cookie.value
        assert cookie["max-age"] == 90 * 86400
    # a wrong password marks nothing
    status, client = attempt("carol", "wrong")
    assert status == 200 and DEVICE not in client.cookies


def test_failures_from_elsewhere_do_not_lock_the_name_out_of_its_own_browser(users: Users) -> None:
    # given alice's browser, where she signed in before, and bob's
    alices = Client(REMOTE_ADDR="198.51.100.10")
    assert alices.post(LOGIN, {"username": "alice", "password": "pw-alice"}).status_code == 302
    signed_out(alices)
    bobs = Client(REMOTE_ADDR="198.51.100.11")
    assert bobs.post(LOGIN, {"username": "bob", "password": "pw-bob"}).status_code == 302
    signed_out(bobs)
    # when eight addresses guess at her password (the name's limit)
    for number in range(8):
        fail(1, address=f"192.0.2.{number}")

    # then her own browser still signs her in, even from a new address
    alices.defaults["REMOTE_ADDR"] = "203.0.113.50"
    assert alices.post(LOGIN, {"username": "alice", "password": "pw-alice"}).status_code == 302
    # but a browser marked for bob, one with a forged mark, or none, is held by her name's count
    bobs.defaults["REMOTE_ADDR"] = "203.0.113.51"
    assert bobs.post(LOGIN, {"username": "alice", "password": "pw-alice"}).status_code == 429
    forged = Client(REMOTE_ADDR="203.0.113.52")
    forged.cookies[DEVICE] = alices.cookies[DEVICE].value[:-3] + "abc"
    assert forged.post(LOGIN, {"username": "alice", "password": "pw-alice"}).status_code == 429
    assert attempt("alice", "pw-alice", address="203.0.113.53")[0] == 429


def test_her_own_browser_is_still_held_by_its_address_and_name_count(users: Users) -> None:
    # the mark proves only that the browser once knew the password: guessing there is limited as ever
    client = Client(REMOTE_ADDR=HOME)
    assert client.post(LOGIN, {"username": "alice", "password": "pw-alice"}).status_code == 302
    signed_out(client)
    for _ in range(3):
        assert client.post(LOGIN, {"username": "alice", "password": "wrong"}).status_code == 200

    assert client.post(LOGIN, {"username": "alice", "password": "pw-alice"}).status_code == 429


def signed_out(client: Client) -> None:
    """Signed out as a browser is (POST /accounts/logout/), its other cookies kept: the test client's
    own logout() drops them all."""
    assert client.post("/accounts/logout/").status_code == 302
    assert not signed_in(client) and DEVICE in client.cookies


def test_a_copy_of_the_mark_has_no_more_guesses_than_one_address(users: Users) -> None:
    # alice's cookie, copied and sent from many addresses: its guesses are counted by the browser's
    # own count (the name-and-address limit, three here), not once per address
    client = Client(REMOTE_ADDR=HOME)
    assert client.post(LOGIN, {"username": "alice", "password": "pw-alice"}).status_code == 302
    copied = client.cookies[DEVICE].value

    answers = []
    for number in range(5):
        thief = Client(REMOTE_ADDR=f"192.0.2.{100 + number}")
        thief.cookies[DEVICE] = copied
        answers.append(thief.post(LOGIN, {"username": "alice", "password": "wrong"}).status_code)

    assert answers == [200, 200, 200, 429, 429]


def test_a_new_password_voids_the_mark(users: Users) -> None:
    # given alice's marked browser, and her name locked by guesses from eight addresses
    client = Client(REMOTE_ADDR=HOME)
    assert client.post(LOGIN, {"username": "alice", "password": "pw-alice"}).status_code == 302
    signed_out(client)
    for number in range(8):
        fail(1, address=f"192.0.2.{number}")
    assert client.post(LOGIN, {"username": "alice", "password": "pw-alice"}).status_code == 302
    signed_out(client)

    # when her password is changed (someone who once knew the old one kept a copy of the cookie)
    users.alice.set_password("a-new-long-one")
    users.alice.save()

    # then the cookie no longer spares that browser: the name's count holds it, the new password too
    assert client.post(LOGIN, {"username": "alice", "password": "a-new-long-one"}).status_code == 429


def test_over_https_the_mark_is_a_host_cookie(users: Users, settings: Any) -> None:
    # no other site of the domain can set a cookie of that name, to shadow the mark
    settings.SESSION_COOKIE_SECURE = True
    client = Client(REMOTE_ADDR=HOME)
    client.post(LOGIN, {"username": "alice", "password": "pw-alice"}, secure=True)

    cookie = client.cookies["__Host-signin_device"]
    assert cookie["secure"] and cookie["path"] == "/" and not cookie["domain"]
    assert DEVICE not in client.cookies
