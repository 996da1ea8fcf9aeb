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
