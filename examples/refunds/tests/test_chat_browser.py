"""The customer's chat in a real browser: alice asks the support agent for a refund in words, loses
her connection mid-answer and gets it back, and reads the whole answer once; carol approves the
refund in the admin and alice's chat follows it. Real workers (the rules model slowed down so the
answer takes seconds), the sandbox provider, a real daphne and Debian's Chromium."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from accounts.services import account_ensure
from agents.models import TURN_ENDED, Turn, TurnStatus
from approvals.models import ApprovalRequest, ApprovalStatus
from examples.refunds.models import RefundRequest
from examples.refunds.tests.conftest import WORKER_ENV, Workers, World
from examples.refunds.tests.support import assert_confirmed, new_order, pending_approval
from tests.browser import chromium, new_page, off_loop
from tests.factories import Users
from tests.support import AsgiServer, Worker, serving, wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

ASK = "I'd like a refund for order 1042 because it arrived damaged"
WORD_DELAY = "0.15"  # seconds a word: an answer of about twenty words takes three seconds
PAGE = "/chat/support/help/"
STATUS = "What's happening with my refund?"

# Records, in the page, every text the streaming answer of a turn showed (its text nodes: the tool
# lines are elements), and every frame the sockets received.
WATCH = """() => {
  window.shown = {};
  new MutationObserver(() => {
    for (const li of document.querySelectorAll("#messages li.streaming[data-turn]")) {
      const text = Array.from(li.childNodes).filter((n) => n.nodeType === Node.TEXT_NODE).map((n) => n.data).join("");
      const seen = (window.shown[li.dataset.turn] = window.shown[li.dataset.turn] || []);
      if (text && seen[seen.length - 1] !== text) seen.push(text);
    }
  }).observe(document.getElementById("messages"), {childList: true, subtree: true, characterData: true});
}"""


@pytest.fixture(scope="module")
def server(refund_workers: Workers, django_db_blocker: Any) -> Iterator[AsgiServer]:
    """A daphne of this module's own: what it starts (a chat turn, an approved run going on) goes
    to the module's queue, which its workers serve."""
    with serving(
        django_db_blocker,
        WORKFLOWS_QUEUE=refund_workers.queue,
        SANDBOX_PAYMENTS_URL=refund_workers.url,
        **WORKER_ENV,
    ) as process:
        yield process


@pytest.fixture
def slow_words(world: World) -> Iterator[Workers]:
    """The module's worker replaced by one whose rules model pauses before each word; put back after."""
    workers = world.workers
    workers.current.stop()
    workers.current = Worker(
        queue=workers.queue,
        beat=True,
        SANDBOX_PAYMENTS_URL=workers.url,
        AGENTS_RULES_WORD_DELAY=WORD_DELAY,
        **WORKER_ENV,
    )
    yield workers
    workers.current.stop()
    workers.current = workers.start()


def sign_in(page: Any, server: AsgiServer, username: str, password: str, next_path: str) -> None:
    page.goto(f"{server.url}/accounts/login/?next={next_path}")
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill(password)
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url(f"{server.url}{next_path}")


def ask(page: Any, text: str) -> None:
    page.fill("#text", text)
    page.click("#send")


def answer_of(page: Any, number: int) -> str:
    """Turn ``number``'s answer as the page shows it once the turn has ended (its written messages)."""
    turn = off_loop(lambda: wait_for(lambda: Turn.objects.filter(number=number, status__in=TURN_ENDED).first()))
    selector = f"#messages li.role-assistant[data-turn='{turn.pk}']"
    page.wait_for_selector(selector)
    assert page.locator(f"#messages li.streaming[data-turn='{turn.pk}']").count() == 0
    return "\n\n".join(page.locator(selector).all_inner_texts())


def approve_in_admin(page: Any, server: AsgiServer, approval: ApprovalRequest) -> str:
    """carol, signed in to the admin, opens the pending request and approves it: the admin's message."""
    page.goto(f"{server.url}/admin/login/?next=/admin/approvals/approvalrequest/")
    page.fill("#id_username", "carol")
    page.fill("#id_password", "carol-secret-pw")
    page.click("input[type=submit]")
    page.wait_for_url("**/admin/approvals/approvalrequest/**")
    page.click(f"a[href$='/approvalrequest/{approval.pk}/change/']")
    page.click("button[name=decision][value=approve]")
    page.wait_for_selector(".messagelist")
    return str(page.inner_text(".messagelist"))


def test_browser_alice_asks_for_a_refund_loses_her_connection_mid_answer_and_sees_it_confirmed(
    world: World, users: Users, server: AsgiServer, slow_words: Workers, settings: Any
) -> None:
    # given alice, a member of acme, with order 1042 (£300: above the approval limit), and carol an
    # approver; both with passwords the server process can check (the test process hashes with MD5)
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.PBKDF2PasswordHasher"]
    alice, carol = users.alice, users.carol
    for user, password in ((alice, "alice-secret-pw"), (carol, "carol-secret-pw")):
        user.set_password(password)
        user.save()
    account_ensure(slug="acme", name="Acme", members=[alice])
    new_order(alice, "1042")

    with chromium() as browser:
        page = new_page(browser)
        frames: list[list[dict[str, Any]]] = []  # what each socket the page opened received

        def opened(socket: Any) -> None:
            received: list[dict[str, Any]] = []
            frames.append(received)
            socket.on("framereceived", lambda payload: received.append(json.loads(payload)))

        page.on("websocket", opened)
        # when alice signs in to her chat, starts it (the page asks before a new agent is opened),
        # and asks for the refund
        sign_in(page, server, "alice", "alice-secret-pw", PAGE)
        page.click("#open")
        page.wait_for_selector("#connection:text-is('live')")
        page.evaluate(WATCH)
        page.evaluate("window.sameDocument = true")
        ask(page, ASK)

        # and her connection drops while the answer streams (Chromium's offline mode leaves an open
        # socket open: the page must notice by itself), and comes back a second later
        page.wait_for_selector("#messages li.streaming:has-text('refund of')")
        page.context.set_offline(True)
        page.wait_for_selector("#connection:not(:text-is('live'))")
        time.sleep(1)
        turn = off_loop(lambda: Turn.objects.get(agent__name="help", number=1))
        mid_answer = turn.status == TurnStatus.RUNNING
        page.context.set_offline(False)

        # then the page reconnects by itself and shows the whole answer
        page.wait_for_selector("#connection:text-is('live')")
        answer = answer_of(page, 1)
        turn = off_loop(lambda: Turn.objects.get(pk=turn.pk))
        shown = page.evaluate("window.shown")[str(turn.pk)]
        request = off_loop(lambda: RefundRequest.objects.get(order__number="1042"))
        approval = off_loop(lambda: pending_approval(request))

        # and asked how it is going, the agent says it awaits approval
        ask(page, STATUS)
        waiting = answer_of(page, 2)

        # when carol approves the refund in the admin
        decided = approve_in_admin(new_page(browser), server, approval)
        off_loop(lambda: assert_confirmed(request, world.sandbox))

        # then alice's chat, still the same page, says her refund is confirmed
        ask(page, STATUS)
        confirmed = answer_of(page, 3)
        same_document = page.evaluate("window.sameDocument === true")
        # and the state the refund process reports to the chat shows it too
        page.wait_for_selector("#state-body:has-text('confirmed')")
        state = page.inner_text("#state-body")

    assert mid_answer, "the answer had ended before the page went offline: nothing was tested"
    # the page reconnected by itself and the new socket replayed what the old one missed
    assert len(frames) >= 2
    assert any(f.get("replay") is True for socket in frames[1:] for f in socket)
    assert turn.status == TurnStatus.COMPLETED
    # every text the streaming answer showed was a beginning of the answer (no word twice), the
    # last one all of it, and the answer once written is the turn's text exactly
    assert shown and [text for text in shown if not turn.text.startswith(text)] == [], (shown, turn.text)
    assert shown[-1] == turn.text
    assert answer == turn.text
    assert turn.text.startswith("I've asked for a refund of £300.00 on order 1042.")
    assert waiting == f"Your refund of £300.00 on order 1042 (request {request.pk}) is awaiting approval."
    assert "approv" in decided.lower()
    approval.refresh_from_db()
    assert approval.status == ApprovalStatus.APPROVED and approval.decided_by_id == carol.pk
    assert confirmed == f"Your refund of £300.00 on order 1042 (request {request.pk}) is confirmed."
    assert same_document
    assert "1042" in state and "confirmed" in state, state
