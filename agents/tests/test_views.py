"""The chat page: for a member of the agent's account, a 404 for anyone else; linked from home."""

from __future__ import annotations

import pytest
from django.contrib.staticfiles import finders

from agents.models import Agent, Message
from agents.tests.test_consumers import KIND, World
from agents.tests.test_consumers import world as world  # noqa: F401  the fixture
from tests.factories import login

pytestmark = pytest.mark.django_db

PAGE = f"/chat/{KIND}/help/"
ELSEWHERE = {"Sec-Fetch-Site": "cross-site"}  # a link followed from another site's page


def test_the_page_renders_the_conversation_for_a_member(world: World) -> None:
    Message.objects.create(agent=world.agent, role="user", text="Where is <b>1042</b>?", author=world.users.alice)

    for user in (world.users.alice, world.users.bob):
        page = login(user).get(f"{PAGE}?account=acme")
        assert page.status_code == 200
        html = page.content.decode()
        assert 'data-ws-path="/ws/agents/support/help/?account=acme"' in html
        assert "Where is &lt;b&gt;1042&lt;/b&gt;?" in html  # escaped
        assert "/static/agents/chat.js" in html
        assert 'id="stop"' in html


def test_the_page_is_a_404_for_anyone_else_and_a_login_for_the_anonymous(world: World) -> None:
    mallory, alice = login(world.users.mallory), login(world.users.alice)

    assert mallory.get(f"{PAGE}?account=acme").status_code == 404
    assert alice.get(f"{PAGE}?account=nope").status_code == 404
    assert alice.get("/chat/nope/help/").status_code == 404
    assert alice.get(f"/chat/{KIND}/{'x' * 129}/").status_code == 404
    assert alice.get(f"{PAGE}?account=%00").status_code == 404
    anonymous = login(world.users.alice)
    anonymous.logout()
    assert anonymous.get(PAGE).status_code == 302
    assert list(Agent.objects.values_list("account__slug", "name")) == [("acme", "help")]


def test_a_name_with_spaces_is_quoted_in_the_sockets_path(world: World) -> None:
    page = login(world.users.alice).get(f"/chat/{KIND}/front desk/")

    assert page.status_code == 200
    assert 'data-ws-path="/ws/agents/support/front%20desk/?account=acme"' in page.content.decode()


def test_the_home_page_links_the_accounts_agents(world: World) -> None:
    alices = login(world.users.alice).get("/").content.decode()
    mallorys = login(world.users.mallory).get("/").content.decode()

    assert f'href="{PAGE}?account=acme"' in alices
    assert PAGE not in mallorys


def test_the_script_is_a_static_file() -> None:
    assert finders.find("agents/chat.js") is not None


def test_a_link_from_another_site_creates_nothing_until_the_user_asks(world: World) -> None:
    # given alice signed in, following links that other sites' pages put in front of her
    alice = login(world.users.alice, enforce_csrf_checks=True)

    # then a new name asks first and creates nothing, however the link came (another site, a sibling subdomain)
    for site in ("cross-site", "same-site", "CROSS-SITE"):
        page = alice.get(f"/chat/{KIND}/invoices/", headers={"Sec-Fetch-Site": site})
        assert page.status_code == 200
        assert 'id="open"' in page.content.decode() and "data-ws-path" not in page.content.decode()
    assert alice.get(f"/api/agents/{KIND}/invoices", headers=ELSEWHERE).status_code == 404
    # and so does a name mallory cannot have at all: the question confirms nothing
    assert login(world.users.mallory).get(f"/chat/{KIND}/help/?account=acme", headers=ELSEWHERE).status_code == 200
    assert set(Agent.objects.values_list("name", flat=True)) == {"help"}

    # and an agent that exists opens as ever from a link
    assert "data-ws-path" in alice.get(f"{PAGE}?account=acme", headers=ELSEWHERE).content.decode()
    assert alice.get(f"/api/agents/{KIND}/help", headers=ELSEWHERE).status_code == 200

    # when she presses the button (the page's form: a POST with its CSRF token)
    form = alice.get(f"/chat/{KIND}/invoices/?account=acme", headers=ELSEWHERE)
    token = form.context["csrf_token"]
    assert alice.post(f"/chat/{KIND}/invoices/?account=acme", headers=ELSEWHERE).status_code == 403  # no token: refused
    opened = alice.post(f"/chat/{KIND}/invoices/?account=acme", {"csrfmiddlewaretoken": str(token)}, headers=ELSEWHERE)

    # then the agent is created and she is sent to its page
    assert opened.status_code == 303 and opened["Location"] == f"/chat/{KIND}/invoices/?account=acme"
    assert Agent.objects.filter(account=world.acme, name="invoices").exists()
    # and the button does nothing for someone outside the account
    mallory = login(world.users.mallory)
    assert mallory.post(f"/chat/{KIND}/other/?account=acme").status_code == 404
    assert not Agent.objects.filter(name="other").exists()


def test_the_sites_own_pages_and_clients_that_are_no_browser_open_new_names_at_once(world: World) -> None:
    alice = login(world.users.alice)

    for n, site in enumerate(("same-origin", "none", None)):  # a link on this site, typed or bookmarked, no header
        headers = {} if site is None else {"Sec-Fetch-Site": site}
        assert "data-ws-path" in alice.get(f"/chat/{KIND}/n{n}/", headers=headers).content.decode()
    assert set(Agent.objects.values_list("name", flat=True)) == {"help", "n0", "n1", "n2"}
