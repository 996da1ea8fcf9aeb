"""The chat page: for a member of the agent's account, a 404 for anyone else; linked from home."""

from __future__ import annotations

from typing import Any
from uuid import uuid4

import pytest
from django.contrib.staticfiles import finders

from agents.models import Agent, Message
from agents.tests.test_consumers import KIND, World
from agents.tests.test_consumers import world as world  # noqa: F401  the fixture
from tests.factories import api_login, login

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
    assert alice.get(f"{PAGE}?account=acme").status_code == 200
    for query in ("?account=globex&account=acme", "?account=acme&account=acme"):  # which was meant?
        assert alice.get(f"{PAGE}{query}").status_code == 404, query
    anonymous = login(world.users.alice)
    anonymous.logout()
    assert anonymous.get(PAGE).status_code == 302
    assert list(Agent.objects.values_list("account__slug", "name")) == [("acme", "help")]


def test_a_name_with_spaces_is_quoted_in_the_sockets_path(world: World) -> None:
    Agent.objects.create(account=world.acme, kind=KIND, name="front desk")
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


def test_a_get_creates_no_agent_the_page_asks_and_the_users_click_does(world: World) -> None:
    # given alice signed in, opening a name that is no agent yet: from a link on any site (a
    # top-level navigation carries her session cookie), typed, or after signing in
    alice = login(world.users.alice, enforce_csrf_checks=True)
    page = alice.get(f"/chat/{KIND}/invoices/")

    # then the page asks, naming the account, and creates nothing
    html = page.content.decode()
    assert page.status_code == 200 and 'id="open"' in html and "data-ws-path" not in html
    assert "<strong>Acme</strong>" in html
    assert alice.head(f"/chat/{KIND}/invoices/").status_code == 200
    # and the session-authenticated API creates nothing either, on any GET naming the agent
    for path in ("", "/submissions", f"/turns/{uuid4()}"):
        assert alice.get(f"/api/agents/{KIND}/invoices{path}").status_code == 404, path
    # and someone who could not open it gets the 404 of an existing agent of the account: nothing told
    mallory = login(world.users.mallory)
    assert [mallory.get(f"/chat/{KIND}/{name}/?account=acme").status_code for name in ("help", "new")] == [404, 404]
    assert set(Agent.objects.values_list("name", flat=True)) == {"help"}

    # and an agent that exists opens as ever
    assert "data-ws-path" in alice.get(f"{PAGE}?account=acme").content.decode()

    # when she presses the button (the page's form: a POST with its CSRF token)
    token = alice.get(f"/chat/{KIND}/invoices/?account=acme").context["csrf_token"]
    assert alice.post(f"/chat/{KIND}/invoices/?account=acme").status_code == 403  # no token: refused
    opened = alice.post(f"/chat/{KIND}/invoices/?account=acme", {"csrfmiddlewaretoken": str(token)})

    # then the agent is created and she is sent to its page
    assert opened.status_code == 303 and opened["Location"] == f"/chat/{KIND}/invoices/?account=acme"
    assert Agent.objects.filter(account=world.acme, name="invoices").exists()
    assert "data-ws-path" in alice.get(opened["Location"]).content.decode()
    # and the button does nothing for someone outside the account
    assert mallory.post(f"/chat/{KIND}/other/?account=acme").status_code == 404
    assert not Agent.objects.filter(name="other").exists()


def test_a_token_caller_and_a_write_still_open_new_names(world: World) -> None:
    # a token is no cookie: no other site can send it, so its caller's GET opens the agent as before
    assert api_login(world.users.alice).get(f"/api/agents/{KIND}/by-token").status_code == 200
    # and a session's write needs its CSRF token, so it may open one too
    browser = api_login(world.users.alice, via="session")
    answer = browser.post(f"/api/agents/{KIND}/by-write/messages", {"text": "hello"}, format="json")
    assert answer.status_code == 202, answer.content
    # but asking about a turn of a name that is no agent yet creates nothing (it can have no turn)
    caller = api_login(world.users.alice)
    assert caller.get(f"/api/agents/{KIND}/no-turns/turns/{uuid4()}").status_code == 404
    assert caller.post(f"/api/agents/{KIND}/no-turns/turns/{uuid4()}/stop").status_code == 404
    assert set(Agent.objects.values_list("name", flat=True)) == {"help", "by-token", "by-write"}


# --- /chat/: starting a conversation from the site ---------------------------------------------------
def test_a_member_starts_a_conversation_from_the_home_page(world: World) -> None:
    # given alice, a member of acme, on the home page
    alice = login(world.users.alice, enforce_csrf_checks=True)
    home = alice.get("/").content.decode()
    assert 'href="/chat/"' in home

    # when she opens the form and starts "order 1042" with the support agent
    form = alice.get("/chat/")
    html = form.content.decode()
    assert (
        form.status_code == 200 and f'<option value="{KIND}"' in html and '<option value="acme">Acme</option>' in html
    )
    token = str(form.context["csrf_token"])
    assert alice.post("/chat/", {"kind": KIND, "name": "order 1042", "account": "acme"}).status_code == 403  # no token
    started = alice.post(
        "/chat/", {"kind": KIND, "name": "order 1042", "account": "acme", "csrfmiddlewaretoken": token}
    )

    # then the agent exists and she is on its page; the same name again opens the same conversation
    assert started.status_code == 303 and started["Location"] == f"/chat/{KIND}/order%201042/?account=acme"
    assert "data-ws-path" in alice.get(started["Location"]).content.decode()
    again = alice.post("/chat/", {"kind": KIND, "name": "order 1042", "account": "acme", "csrfmiddlewaretoken": token})
    assert again["Location"] == started["Location"]
    # and a name is counted in characters, not cut short by the browser (an emoji is two of its units)
    assert "maxlength" not in html
    emoji = alice.post("/chat/", {"kind": KIND, "name": "🎉" * 100, "account": "acme", "csrfmiddlewaretoken": token})
    assert emoji.status_code == 303 and Agent.objects.filter(name="🎉" * 100).exists()
    assert Agent.objects.filter(account=world.acme, kind=KIND, name="order 1042").count() == 1


def test_the_start_form_refuses_what_no_agent_can_be_and_says_why(world: World, settings: Any) -> None:
    alice = login(world.users.alice)
    bad = {
        "an unknown kind": {"kind": "nope", "name": "x", "account": "acme"},
        "another's account": {"kind": KIND, "name": "x", "account": "other"},
        "a slash": {"kind": KIND, "name": "a/b", "account": "acme"},
        "dot-dot": {"kind": KIND, "name": "..", "account": "acme"},
        "no name": {"kind": KIND, "name": "  ", "account": "acme"},
        "too long": {"kind": KIND, "name": "x" * 129, "account": "acme"},
        "a control character": {"kind": KIND, "name": "a\x01b", "account": "acme"},
        "a right-to-left override": {"kind": KIND, "name": "order \u202e2401", "account": "acme"},
        "a zero-width space": {"kind": KIND, "name": "a\u200bb", "account": "acme"},
        "a line separator": {"kind": KIND, "name": "a\u2028b", "account": "acme"},
    }
    for what, data in bad.items():
        answer = alice.post("/chat/", data)
        assert answer.status_code == 400 and 'class="error"' in answer.content.decode(), what
    assert set(Agent.objects.values_list("name", flat=True)) == {"help"}

    # and an account at its limit says so
    settings.AGENTS_MAX_AGENTS_PER_ACCOUNT = 1
    full = alice.post("/chat/", {"kind": KIND, "name": "one more", "account": "acme"})
    assert full.status_code == 400 and "has 1 agents, its limit" in full.content.decode()
    # and someone in no account is told so, not shown a form
    carol = login(world.users.carol).get("/chat/").content.decode()
    assert "not a member of any account" in carol and 'id="start"' not in carol
    assert login(world.users.carol).post("/chat/", {"kind": KIND, "name": "x", "account": "acme"}).status_code == 400
    assert set(Agent.objects.values_list("name", flat=True)) == {"help"}
