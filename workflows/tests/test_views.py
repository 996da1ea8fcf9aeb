"""The run page ``/runs/<id>/``: who may see it, what it renders, and (in a real browser) that it
follows the run live and recovers after the server goes away."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any, TypeVar
from uuid import uuid4

import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone

import tests.support
from tests.browser import chromium, new_page, off_loop
from tests.factories import Users, login, make_run
from tests.support import AsgiServer, Worker, wait_for_status, wait_for_terminal
from workflows import public as wf
from workflows import streams
from workflows.models import RunAttempt, RunStatus, StepKind, StepResult, StepStatus, WorkflowRun
from workflows.views import progress_view

T = TypeVar("T")


def page_url(run: WorkflowRun) -> str:
    return f"/runs/{run.id}/"


def restarted_run(owner: User) -> tuple[WorkflowRun, dict[str, str]]:
    """A second attempt waiting for a reply, after a first attempt that was restarted mid-retry."""
    now = timezone.now().replace(microsecond=0)
    times = {"retry": (now + timedelta(seconds=30)).isoformat(), "until": (now + timedelta(hours=1)).isoformat()}
    run = make_run(
        workflow="test.refundish",
        status=RunStatus.WAITING,
        owner=owner,
        attempt=2,
        wait_event_type="reply",
        wait_step="wait for reply",
        wake_at=now + timedelta(hours=1),
        current_step="",
        progress={"done": 2, "total": 4},
    )
    RunAttempt.objects.create(
        run=run,
        number=1,
        status=RunStatus.TERMINATED,
        finished_at=now,
        error={"type": "Restarted", "message": "restarted"},
    )
    steps = [
        (1, 1, "load order", StepKind.DO, StepStatus.COMPLETED, 1, None, None),
        (
            1,
            2,
            "submit",
            StepKind.DO,
            StepStatus.RETRYING,
            2,
            {"type": "ValueError", "message": "gateway down"},
            now + timedelta(seconds=30),
        ),
        (2, 1, "load order", StepKind.DO, StepStatus.COMPLETED, 1, None, None),
        (2, 2, "submit", StepKind.DO, StepStatus.COMPLETED, 3, None, None),
        (2, 3, "wait for reply", StepKind.WAIT, StepStatus.WAITING, 0, None, now + timedelta(hours=1)),
    ]
    for attempt, position, name, kind, status, tries, error, wake_at in steps:
        StepResult.objects.create(
            run=run,
            attempt=attempt,
            position=position,
            name=name,
            kind=kind,
            status=status,
            tries=tries,
            error=error,
            wake_at=wake_at,
            result={"ok": True} if status == StepStatus.COMPLETED else None,
            finished_at=now if status == StepStatus.COMPLETED else None,
        )
    return run, times


def text_of(html: str) -> str:
    """The page's text with tags dropped and whitespace collapsed, for sentence-like asserts."""
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html))


# --- access ---------------------------------------------------------------------------------------
@pytest.mark.django_db
def test_the_page_requires_a_login(users: Users) -> None:
    run = make_run(owner=users.alice)

    response = Client().get(page_url(run))

    assert response.status_code == 302
    assert response["Location"] == f"{settings.LOGIN_URL}?next={page_url(run)}"


@pytest.mark.django_db
def test_another_users_run_is_a_404_like_a_missing_one(users: Users) -> None:
    run = make_run(owner=users.alice)

    mallory = login(users.mallory).get(page_url(run))
    bob = login(users.bob).get(page_url(run))
    missing = login(users.mallory).get(f"/runs/{uuid4()}/")

    assert mallory.status_code == bob.status_code == missing.status_code == 404
    assert mallory.content == missing.content
    assert str(run.id) not in mallory.content.decode()
    assert login(users.carol).get(page_url(run)).status_code == 200  # staff with the view permission


# --- content --------------------------------------------------------------------------------------
@pytest.mark.django_db
def test_the_page_shows_every_attempts_steps_with_tries_errors_and_waits(users: Users) -> None:
    run, times = restarted_run(users.alice)

    response = login(users.alice).get(page_url(run))

    assert response.status_code == 200
    html = response.content.decode()
    text = text_of(html)
    assert f'data-ws-path="/ws/runs/{run.id}/"' in html
    # status, and what the run waits for until when
    assert 'class="status status-waiting">waiting<' in html
    assert f"event “reply” until {times['until']}" in text
    # progress bar
    assert 'aria-valuenow="50"' in html and "width: 50%" in html
    assert "2 / 4 (50%)" in text
    # both attempts, newest first, each with its steps
    assert text.index("Attempt 2") < text.index("Attempt 1")
    assert "Attempt 2 waiting" in text and "Attempt 1 terminated Restarted: restarted" in text
    first, second = text[text.index("Attempt 1") :], text[text.index("Attempt 2") : text.index("Attempt 1")]
    # the restarted attempt's step keeps the status it stopped in, without its timer: it never fires
    assert "2 submit do retrying 2 ValueError: gateway down" in first and times["retry"] not in first
    assert "2 submit do completed 3" in second
    assert f"3 wait for reply wait waiting 0 waiting until {times['until']}" in second


@pytest.mark.django_db
def test_the_page_shows_the_result_or_the_error(users: Users) -> None:
    done = make_run(owner=users.alice, result={"refund": "120.00"})
    failed = make_run(
        owner=users.alice,
        status=RunStatus.FAILED,
        failure_reason="error",
        error={"type": "StepError", "message": "step submit failed"},
    )
    alice = login(users.alice)

    done_html = alice.get(page_url(done)).content.decode()
    failed_text = text_of(alice.get(page_url(failed)).content.decode())

    assert 'id="result"' in done_html and "&quot;refund&quot;: &quot;120.00&quot;" in done_html
    assert 'id="error"' not in done_html
    assert "failure reason error" in failed_text and "step submit failed" in failed_text


def test_progress_view_reads_percent_or_done_of_total_and_shows_anything_else_as_json() -> None:
    assert progress_view({"done": 1, "total": 3}) == {"percent": 33, "text": "1 / 3 (33%)"}
    assert progress_view({"percent": 99.9}) == {"percent": 99, "text": "99%"}
    assert progress_view({"done": 5, "total": 0})["percent"] is None
    assert progress_view({"stage": "awaiting approval"}) == {"percent": None, "text": "awaiting approval"}
    assert progress_view({"done": 1, "total": 3, "stage": "account created"}) == {
        "percent": 33,
        "text": "account created · 1 / 3 (33%)",
    }
    assert progress_view({"step": 2}) == {"percent": None, "text": '{"step": 2}'}
    assert progress_view(None) == {"percent": None, "text": ""}


# --- a real browser -------------------------------------------------------------------------------
@contextmanager
def browser_page(server_url: str, user: User) -> Iterator[Any]:
    """A headless Chromium page logged in as ``user`` (the session cookie, as after a login)."""
    cookie = login(user).cookies[settings.SESSION_COOKIE_NAME].value
    with chromium() as browser:
        page = new_page(browser)
        page.context.add_cookies([{"name": settings.SESSION_COOKIE_NAME, "value": cookie, "url": server_url}])
        yield page


def logged_seqs(page: Any) -> list[int]:
    return sorted(int(s) for s in page.eval_on_selector_all("#events li", "items => items.map(i => i.dataset.seq)"))


@pytest.mark.django_db(transaction=True)
def test_browser_progress_bar_reaches_100_percent_as_a_real_run_advances(
    asgi_server: AsgiServer, worker: Worker, users: Users
) -> None:
    # given a run held paused until the page is live, so the page sees it advance
    run = wf.start("test.progress", {"steps": 5, "seconds": 0.4}, owner=users.alice)
    wf.pause(run)  # a run already claimed pauses at its next step boundary
    wait_for_status(run.id, RunStatus.PAUSED, timeout=60)

    with browser_page(asgi_server.url, users.alice) as page:
        page.goto(asgi_server.url + page_url(run))
        page.wait_for_selector("#connection:text-is('live')")
        assert page.text_content("#status") == "paused"

        # when it resumes, the bar fills and the status and timeline follow
        off_loop(lambda: wf.resume(run))
        page.wait_for_selector('#progress-bar[aria-valuenow="100"]')
        page.wait_for_selector("#status.status-completed")
        # the timeline is redrawn from a fresh snapshot after the status change
        page.wait_for_function("document.querySelectorAll('#timeline tr.step .status-completed').length === 5")
        progress_text = page.text_content("#progress-text")
        log = page.eval_on_selector_all("#events li", "items => items.map(i => i.textContent)")
        seqs = logged_seqs(page)

    assert progress_text == "5 / 5 (100%)"
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))  # every event once, in a row
    assert log[0] == f"#{seqs[-1]} status: completed"  # newest on top
    assert log[1].endswith('progress: {"done":5,"total":5}') and any(line.endswith("status: running") for line in log)
    assert wait_for_terminal(run.id).status == RunStatus.COMPLETED


@pytest.mark.django_db(transaction=True)
def test_browser_reconnects_after_the_server_restarts_and_resumes_what_it_missed(
    users: Users, monkeypatch: pytest.MonkeyPatch
) -> None:
    # given a run whose progress this test publishes, shown by a server this test owns
    run = make_run(
        workflow="test.wait",
        status=RunStatus.WAITING,
        owner=users.alice,
        wait_event_type="reply",
        wait_step="wait for reply",
        wake_at=timezone.now() + timedelta(hours=1),
    )
    server = AsgiServer()
    # the browser reconnects to the same address: the replacement server must take the same port
    monkeypatch.setattr(tests.support, "free_port", lambda: server.port)
    try:
        with browser_page(server.url, users.alice) as page:
            page.goto(server.url + page_url(run))
            page.wait_for_selector("#connection:text-is('live')")
            off_loop(lambda: streams.publish_progress(run.id, {"done": 1, "total": 4}))
            page.wait_for_selector('#progress-bar[aria-valuenow="25"]')

            # when the server goes away, progress goes on, and a new server comes up
            server.stop()
            page.wait_for_selector("#connection:text-matches('reconnecting')")
            off_loop(lambda: streams.publish_progress(run.id, {"done": 2, "total": 4}))
            off_loop(lambda: streams.publish_progress(run.id, {"done": 3, "total": 4}))
            server = AsgiServer()

            # then the page reconnects: the snapshot shows 75%, the missed events are replayed
            page.wait_for_selector('#progress-bar[aria-valuenow="75"]')
            page.wait_for_selector("#events li[data-seq='3']")
            off_loop(lambda: streams.publish_progress(run.id, {"done": 4, "total": 4}))
            page.wait_for_selector('#progress-bar[aria-valuenow="100"]')
            page.wait_for_selector("#events li[data-seq='4']")
            log = page.eval_on_selector_all("#events li", "items => items.map(i => i.textContent)")
            seqs = logged_seqs(page)
    finally:
        server.stop()

    assert seqs == [1, 2, 3, 4]  # each event once, none missing
    assert [line.endswith("(replayed)") for line in reversed(log)] == [False, True, True, False]


@pytest.mark.django_db(transaction=True)
def test_browser_a_terminated_runs_redrawn_timeline_shows_no_timer_that_cannot_fire(
    asgi_server: AsgiServer, users: Users
) -> None:
    # given alice's page of a run that waits for a reply until a time, after a restarted attempt
    run, _ = restarted_run(users.alice)

    def when(page: Any, attempt: int, position: int) -> str:
        cell = f"[data-attempt='{attempt}'] tr.step[data-position='{position}'] td:nth-child(6)"
        return str(page.text_content(cell))

    with browser_page(asgi_server.url, users.alice) as page:
        page.goto(asgi_server.url + page_url(run))
        page.wait_for_selector("#connection:text-is('live')")
        assert when(page, 2, 3).startswith("waiting until ")

        # when the run is terminated, the page redraws its timeline from a fresh snapshot
        off_loop(lambda: wf.terminate(run))
        page.wait_for_selector("#status.status-terminated")
        page.wait_for_selector("[data-attempt='2'] h3 .status-terminated")
        waited, retried = when(page, 2, 3), when(page, 1, 2)

    # then the wait that can no longer end it shows no time, and nothing reads "null"
    assert waited == "" and retried == "", (waited, retried)
    assert StepResult.objects.get(run=run, attempt=2, position=3).status == StepStatus.WAITING
