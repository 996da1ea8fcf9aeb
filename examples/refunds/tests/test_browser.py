"""The founding story in a real browser: a refund above the limit waits for approval; an approver
logs in to the admin, opens the pending request and approves it; the refund is made, once."""

from __future__ import annotations

from typing import Any

import pytest

from approvals.models import ApprovalStatus
from examples.refunds.tests.conftest import World
from examples.refunds.tests.support import ask, assert_confirmed, new_order, pending_approval
from tests.browser import chromium, new_page
from tests.factories import Users
from tests.support import AsgiServer

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def test_an_approver_approves_a_pending_refund_in_the_admin_and_the_run_completes(
    world: World, users: Users, asgi_server: AsgiServer, settings: Any
) -> None:
    # given a refund of £120 waiting for the refund-approvers, and carol able to log in with a
    # password the server process can check (the test process hashes fast, with MD5, otherwise)
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.PBKDF2PasswordHasher"]
    carol = users.carol
    carol.set_password("carol-secret-pw")
    carol.save()
    request = ask(new_order(users.alice, "1042"), "120.00")
    approval = pending_approval(request)
    assert world.sandbox.stats()["refunds"] == 0

    # when carol logs in to the admin, opens the pending queue, the request, and approves it
    with chromium() as browser:
        page = new_page(browser)
        page.goto(f"{asgi_server.url}/admin/login/?next=/admin/approvals/approvalrequest/")
        page.fill("#id_username", "carol")
        page.fill("#id_password", "carol-secret-pw")
        page.click("input[type=submit]")
        page.wait_for_url("**/admin/approvals/approvalrequest/**")
        assert "Refund £120.00 on order 1042" in page.content()
        page.click(f"a[href$='/approvalrequest/{approval.pk}/change/']")
        page.click("button[name=decision][value=approve]")
        page.wait_for_selector(".messagelist")
        message = page.inner_text(".messagelist")

    # then the request is approved by carol, the run completes and the provider refunded once
    assert "approv" in message.lower()
    approval.refresh_from_db()
    assert approval.status == ApprovalStatus.APPROVED
    assert approval.decided_by_id == carol.pk
    assert_confirmed(request, world.sandbox)
