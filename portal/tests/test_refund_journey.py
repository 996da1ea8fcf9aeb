"""A customer's refund as she sees it: signed in at /accounts/login/, her home page says it awaits
approval and links to its run, whose page follows the run live while carol approves it. Real
workers, the sandbox provider, a real daphne and (for the browser test) Debian's Chromium."""

from __future__ import annotations

from typing import Any

import pytest

from approvals import decide
from examples.refunds.tests.conftest import World
from examples.refunds.tests.support import ask, assert_confirmed, new_order, pending_approval, wait_status
from tests.browser import chromium, new_page, off_loop
from tests.factories import Users, login
from tests.support import AsgiServer

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def home_html(user: Any) -> str:
    response = login(user).get("/")
    assert response.status_code == 200
    return response.content.decode()


def test_home_shows_a_refund_awaiting_approval_with_its_run_and_none_of_another_customers(
    world: World,
    users: Users,
) -> None:
    # given alice's and mallory's refunds, both above the limit and waiting for approval
    alices = ask(new_order(users.alice, "1042"), "120.00")
    mallorys = ask(new_order(users.mallory, "6661"), "130.00")
    for request in (alices, mallorys):
        pending_approval(request)
        wait_status(request, "awaiting approval")

    # when each opens their home page
    alice, mallory = home_html(users.alice), home_html(users.mallory)

    # then alice reads hers in words, with a link to its run, and nothing of mallory's
    row = f'<tr class="refund" data-refund="{alices.pk}">'
    assert row in alice
    assert '<td class="refund-status">awaiting approval</td>' in alice[alice.index(row) :]
    assert f'<a href="/runs/{alices.run_id}/">Follow the refund on order 1042</a>' in alice
    assert "6661" not in alice and "130.00" not in alice and str(mallorys.run_id) not in alice
    # and mallory the other way round
    assert "6661" in mallory and "1042" not in mallory and str(alices.run_id) not in mallory


def test_browser_alice_signs_in_sees_her_refund_awaiting_approval_and_follows_its_run_live(
    world: World, users: Users, asgi_server: AsgiServer, settings: Any
) -> None:
    # given alice with a password the server can check (the test process hashes with MD5
    # otherwise, which the server does not accept), and her £120 refund waiting for approval
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.PBKDF2PasswordHasher"]
    alice, carol = users.alice, users.carol
    alice.set_password("alice-secret-pw")
    alice.save()
    request = ask(new_order(alice, "1042"), "120.00")
    approval = pending_approval(request)
    wait_status(request, "awaiting approval")

    with chromium() as browser:
        page = new_page(browser)
        # when she opens the site, she is asked to sign in at /accounts/login/, and does
        page.goto(f"{asgi_server.url}/")
        page.wait_for_url("**/accounts/login/?next=/")
        page.get_by_label("Username").fill("alice")
        page.get_by_label("Password").fill("alice-secret-pw")
        page.get_by_role("button", name="Sign in").click()
        page.wait_for_url(f"{asgi_server.url}/")
        signed_in_as = page.text_content("#username")
        # her home page says where her refund is, in words
        row = f"tr[data-refund='{request.pk}']"
        home_status = page.text_content(f"{row} .refund-status")

        # she follows the link to its run: the page is live, the run waits for the approval
        page.click(f"{row} a")
        page.wait_for_url(f"**/runs/{request.run_id}/")
        page.wait_for_selector("#connection:text-is('live')")
        waiting = page.text_content("#status")
        page.evaluate("window.sameDocument = true")  # gone if the page were reloaded

        # when carol approves it, the page follows the run to its end without a reload
        off_loop(lambda: decide(approval, by=carol, approve=True, version=approval.version))
        page.wait_for_selector("#status.status-completed")
        same_document = page.evaluate("window.sameDocument === true")
        result = page.text_content("#result")

    # then
    assert signed_in_as == "alice"
    assert home_status == "awaiting approval"
    assert waiting == "waiting"
    assert same_document
    assert result is not None and '"refunded"' in result
    assert_confirmed(request, world.sandbox)
