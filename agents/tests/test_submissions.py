"""Submissions: messages other systems hand an agent, once per key, in the chat's own queue.

In-process through the API (nothing is sent to Celery: ``no_enqueue``; the test runs the task that
queues an accepted submission's turn itself, ``worker_queues``) for keys, refusals, tenancy and
cancel in each status; with a real worker for FIFO and the answers."""

from __future__ import annotations

import json
from datetime import datetime
from io import StringIO
from typing import Any

import pytest
from django.core.management import CommandError, call_command

from agents import services
from agents.models import Message, Submission, SubmissionStatus, Turn, TurnStatus
from agents.services import TooManyQueuedTurns, message_send
from agents.submission_apis import MAX_CONTENT_CHARS, MAX_MESSAGES, AgentSubmissionsApi, plainly_valid
from agents.submissions import (
    check_submission,
    fingerprint,
    submission_accept,
    submission_create,
    submissions_queue,
    submissions_sweep,
)
from agents.tests.support import chat_agent, streamed_text, wait_ended
from agents.workflows import message_for_model, recent_history
from tests.factories import Users, api_login, login
from tests.fixtures import NoEnqueue
from tests.support import Worker, statements_sent, thread_of, wait_for
from workflows.exceptions import InvalidPayload
from workflows.models import RunStatus, WorkflowRun

BASE = "/api/agents/test.chat/t/submissions"


def post(client: Any, body: dict[str, Any], key: str | None = None, agent: str = "t") -> Any:
    headers = {"Idempotency-Key": key} if key is not None else {}
    return client.post(BASE.replace("/t/", f"/{agent}/"), body, format="json", headers=headers)


def said(text: str) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": text}], "metadata": {"ticket": 7}}


def worker_queues(agent: Any) -> None:
    """What the task an accepted submission sends does in a worker: its turn queued."""
    submissions_queue(agent.pk)


@pytest.mark.django_db
def test_a_key_gives_one_submission_and_another_body_with_it_is_a_409(users: Users, no_enqueue: NoEnqueue) -> None:
    # given alice's agent and a CRM signed in as alice
    agent = chat_agent(users.alice)
    crm = api_login(users.alice)

    # when it submits, retries with the same key and body, then reuses the key for something else
    first = post(crm, said("order 1042 arrived damaged"), key="crm-7")
    again = post(crm, said("order 1042 arrived damaged"), key="crm-7")
    other = post(crm, said("order 1043 too"), key="crm-7")

    # then one submission: 202, then 200 with the same one, then 409 and nothing stored
    assert first.status_code == 202 and first.json()["accepted"] is True and first.json()["status"] == "pending"
    assert again.status_code == 200 and again.json() == {**first.json(), "accepted": False}
    assert other.status_code == 409 and other.json()["error"]["code"] == "idempotency_conflict"
    assert Submission.objects.count() == 1 and not Turn.objects.exists()  # a worker queues its turn
    worker_queues(agent)
    submission = Submission.objects.get()
    assert submission.turn is not None and submission.turn.status == TurnStatus.RUNNING  # the agent was idle
    assert submission.status == SubmissionStatus.RUNNING and Turn.objects.count() == 1
    assert first["Location"] == f"/api/submissions/{submission.pk}"
    assert (submission.metadata, submission.messages) == (
        {"ticket": 7},
        [{"role": "user", "content": "order 1042 arrived damaged"}],
    )
    # and without a key every call is a new submission
    assert post(crm, said("hello")).status_code == post(crm, said("hello")).status_code == 202
    assert Submission.objects.count() == 3


@pytest.mark.django_db
def test_a_key_is_its_callers_own_so_nobody_takes_another_callers_key_first(
    users: Users, no_enqueue: NoEnqueue
) -> None:
    # given bob, who shares alice's account, using keys a webhook source and a schedule will use
    agent = chat_agent(users.alice)
    chat_agent(users.bob)  # a member of the same account
    bob = api_login(users.bob)
    assert post(bob, said("not from the crm"), key="crm:evt_1").status_code == 202
    assert post(bob, said("not from the schedule"), key="schedule:daily:2026-12-01T09:00:00+00:00").status_code == 202

    # when the webhook source, the schedule and alice use them
    webhook = submission_create(
        agent=agent,
        user=None,
        messages=[{"content": "from the crm"}],
        idempotency_key="crm:evt_1",
        caller="webhook:crm",
    )
    scheduled = submission_create(
        agent=agent,
        user=None,
        messages=[{"content": "the daily review"}],
        idempotency_key="schedule:daily:2026-12-01T09:00:00+00:00",
        caller="schedule:daily",
    )
    alices = post(api_login(users.alice), said("mine"), key="crm:evt_1")

    # then each is its caller's own submission, with what that caller sent
    assert webhook.accepted and scheduled.accepted and alices.status_code == 202
    assert webhook.submission.messages == [{"role": "user", "content": "from the crm"}]
    assert scheduled.submission.messages == [{"role": "user", "content": "the daily review"}]
    assert sorted(Submission.objects.values_list("caller", flat=True)) == sorted(
        [f"user:{users.bob.pk}", f"user:{users.bob.pk}", "webhook:crm", "schedule:daily", f"user:{users.alice.pk}"]
    )
    # and the same caller's key again is still that caller's first submission
    again = submission_create(
        agent=agent,
        user=None,
        messages=[{"content": "from the crm"}],
        idempotency_key="crm:evt_1",
        caller="webhook:crm",
    )
    assert (again.accepted, again.submission.pk) == (False, webhook.submission.pk)


@pytest.mark.django_db
@pytest.mark.parametrize(
    "body",
    [
        {"messages": []},
        {"messages": "hello"},
        {"messages": [{"role": "assistant", "content": "I said so"}]},
        {"messages": [{"content": ""}]},
        {"messages": [{"content": "x" * 4001}]},
        {"messages": [{"content": "nul \x00"}]},
        {"messages": [{"content": "hi", "extra": 1}]},
        {"messages": [{"content": "hi"}] * 21},
        {"messages": [{"content": "hi"}], "metadata": [1]},
        {"messages": [{"content": "hi"}], "other": 1},
        # 20 messages the model could not all read: 96,000 characters, 480,000 as its JSON
        {"messages": [{"content": f"{i:02}" + "\u6f22" * 3998} for i in range(20)]},
    ],
)
def test_a_bad_submission_is_a_400_and_nothing_is_stored(
    users: Users, no_enqueue: NoEnqueue, body: dict[str, Any]
) -> None:
    chat_agent(users.alice)

    answer = post(api_login(users.alice), body, key="k")

    assert answer.status_code == 400, answer.json()
    assert not Submission.objects.exists() and not Turn.objects.exists() and not Message.objects.exists()


@pytest.mark.django_db
@pytest.mark.parametrize("content", ["", "   "])
def test_a_blank_message_is_refused_saying_so(users: Users, no_enqueue: NoEnqueue, content: str) -> None:
    chat_agent(users.alice)
    answer = post(api_login(users.alice), said(content), key="k")
    assert answer.status_code == 400
    assert "must be a non-empty string" in json.dumps(answer.json()["error"])


@pytest.mark.django_db
def test_another_accounts_agent_and_submission_are_not_found(users: Users, no_enqueue: NoEnqueue) -> None:
    from accounts.services import account_ensure

    chat_agent(users.alice)
    account_ensure(slug="evil", members=[users.mallory])
    mine = post(api_login(users.alice), said("hello"), key="k").json()["id"]
    mallory = api_login(users.mallory)

    # without ?account= her submission goes to her own account's agent of that name, a different one
    hers = post(mallory, said("hello"), key="k")
    assert hers.status_code == 202 and hers.json()["id"] != mine
    assert Submission.objects.get(pk=hers.json()["id"]).agent.account.slug == "evil"
    assert mallory.post(f"{BASE}?account=acme", said("x"), format="json").status_code == 404
    assert mallory.get(f"/api/submissions/{mine}").status_code == 404
    assert mallory.post(f"/api/submissions/{mine}/cancel").status_code == 404
    assert mallory.get(f"{BASE}?account=acme").status_code == 404
    assert Submission.objects.get(pk=mine).status != SubmissionStatus.CANCELLED
    assert api_login(None).post(BASE, said("x"), format="json").status_code == 401


@pytest.mark.django_db
def test_a_retry_is_answered_as_the_first_even_at_the_users_limit(
    users: Users, no_enqueue: NoEnqueue, settings: Any
) -> None:
    # given alice's submission, then her open turns at her limit
    settings.AGENTS_MAX_OPEN_TURNS_PER_USER = 2
    chat_agent(users.alice)
    crm = api_login(users.alice)
    first = post(crm, said("order 1042 arrived damaged"), key="crm-7")
    assert first.status_code == 202
    assert post(crm, said("another"), key="crm-8").status_code == 202

    # when the CRM retries the first (its answer was lost), reuses its key, and sends a new one
    again = post(crm, said("order 1042 arrived damaged"), key="crm-7")
    other = post(crm, said("order 1043 too"), key="crm-7")
    new = post(crm, said("a third"), key="crm-9")

    # then the retry is the first submission, the reuse a conflict, and only the new one is over the cap
    assert again.status_code == 200 and again.json() == {**first.json(), "accepted": False}
    assert other.status_code == 409
    assert new.status_code == 429
    assert Submission.objects.count() == 2


@pytest.mark.django_db
def test_every_message_of_a_submission_that_is_accepted_reaches_the_model(
    users: Users, no_enqueue: NoEnqueue, settings: Any
) -> None:
    # the largest submission accepted, in characters that JSON writes as six each, behind a long
    # conversation: the model's history keeps all of it (older messages make room)
    settings.AGENTS_HISTORY_CHARS = 40_000
    chat_agent(users.alice)
    big = [{"content": f"{i:02}" + "\u6f22" * 300} for i in range(19)]  # 1,832 characters each as JSON
    assert post(api_login(users.alice), {"messages": [*big, {"content": "\u6f22" * 900}]}, key="x").status_code == 400
    big.append({"content": "19" + "\u6f22" * 300})  # 36,640 in all
    older = [message_for_model("user", "earlier " * 500, None)] * 30
    history = recent_history([*older, *(message_for_model("user", m["content"], None) for m in big)])
    assert [m["content"][:2] for m in history[-20:]] == [f"{i:02}" for i in range(20)]
    assert post(api_login(users.alice), {"messages": big}, key="y").status_code == 202


@pytest.mark.django_db
def test_agents_submit_refuses_a_bad_key_caller_or_metadata_with_invalid_payload(users: Users) -> None:
    agent = chat_agent(users.alice)
    bad: list[dict[str, Any]] = [
        {"idempotency_key": "k" * 256},
        {"idempotency_key": "a\x00b"},
        {"idempotency_key": 5},
        {"idempotency_key": "a\ud800"},
        {"caller": "c" * 301},
        {"metadata": {1: "x", "a": "y"}},
    ]
    for extra in bad:
        with pytest.raises(InvalidPayload):
            submission_create(agent=agent, user=users.alice, messages=[{"content": "hi"}], **extra)
    assert not Submission.objects.exists() and not Turn.objects.exists()


@pytest.mark.django_db
def test_a_cancel_that_could_not_stop_the_turn_is_never_a_200(
    users: Users, no_enqueue: NoEnqueue, monkeypatch: pytest.MonkeyPatch
) -> None:
    # given a pending submission whose turn keeps changing while it is being stopped
    agent = chat_agent(users.alice)
    crm = api_login(users.alice)
    message_send(agent=agent, user=users.alice, text="hello")
    pending = post(crm, said("first"), key="a").json()
    worker_queues(agent)
    monkeypatch.setattr(services, "_turn_stop_once", lambda **kwargs: None)

    # when it is cancelled
    answer = crm.post(f"/api/submissions/{pending['id']}/cancel")

    # then the caller is told it was not (to try again), and it is still pending
    assert answer.status_code == 409 and "try again" in answer.json()["error"]["message"]
    assert Submission.objects.get(pk=pending["id"]).status == "pending"


@pytest.mark.django_db
def test_cancel_in_each_status(users: Users, no_enqueue: NoEnqueue) -> None:
    # given a chat turn running, then three submissions accepted behind it
    agent = chat_agent(users.alice)
    crm = api_login(users.alice)
    running_chat = message_send(agent=agent, user=users.alice, text="hello")
    inbox = post(crm, said("first"), key="a").json()
    pending = post(crm, said("second"), key="b").json()
    later = post(crm, said("third"), key="c").json()
    assert inbox["status"] == pending["status"] == later["status"] == "pending"
    assert crm.get(f"/api/submissions/{inbox['id']}").json()["turn"] is None  # in the inbox: no turn yet

    # (a cancel with a field it would not read is refused, and cancels nothing)
    refused = crm.post(f"/api/submissions/{inbox['id']}/cancel", {"reason": "x"}, format="json")
    assert refused.status_code == 400 and refused.json()["error"]["detail"] == {"reason": ["Unknown field."]}
    assert crm.post(f"/api/submissions/{inbox['id']}/cancel", "zzz", content_type="text/plain").status_code == 415
    assert Submission.objects.get(pk=inbox["id"]).status == "pending"

    # when the first is cancelled before a worker queued its turn
    cancelled = crm.post(f"/api/submissions/{inbox['id']}/cancel")

    # then it is cancelled, with no turn, and a worker never queues one for it
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
    assert cancelled.json()["turn"] is None and cancelled.json()["finished_at"] is not None
    worker_queues(agent)
    assert Submission.objects.get(pk=inbox["id"]).turn is None
    assert crm.get(f"/api/submissions/{pending['id']}").json()["delivered_at"] is None
    assert [t.number for t in Turn.objects.order_by("number")] == [1, 2, 3]

    # when the second, its turn queued now, is cancelled
    cancelled = crm.post(f"/api/submissions/{pending['id']}/cancel")

    # then it is cancelled, its turn too, and neither message ever joined the conversation
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
    assert cancelled.json()["turn"]["status"] == "cancelled"
    assert cancelled.json()["delivered_at"] is None
    assert not Message.objects.filter(text__in=["first", "second"]).exists()

    # when the chat turn ends, the third starts: running, its message now in the conversation
    from agents.services import turn_stop

    turn_stop(turn=running_chat, user=users.alice)
    running = crm.get(f"/api/submissions/{later['id']}").json()
    assert running["status"] == "running"
    assert Message.objects.filter(text="third", role="user").count() == 1
    started = Turn.objects.get(pk=running["turn"]["id"]).started_at
    assert started is not None and datetime.fromisoformat(running["delivered_at"]) == started

    # and cancelling a running one stops its turn; an ended one is a 409 that says how it ended
    stopped = crm.post(f"/api/submissions/{later['id']}/cancel")
    assert stopped.status_code == 200 and stopped.json()["status"] == "cancelled"
    # which the API tells from one never delivered: it was, and its message stays in the conversation
    assert stopped.json()["delivered_at"] == running["delivered_at"]
    for ended in (later, inbox):
        again = crm.post(f"/api/submissions/{ended['id']}/cancel")
        assert again.status_code == 409 and again.json()["error"]["detail"] == {"status": "cancelled"}

    # and the list filters by status, newest first
    listed = crm.get(f"{BASE}?status=cancelled").json()["results"]
    assert [s["id"] for s in listed] == [later["id"], pending["id"], inbox["id"]]
    assert crm.get(f"{BASE}?status=nope").status_code == 400


@pytest.mark.django_db(transaction=True)
def test_submissions_and_chat_messages_share_one_fifo_queue_and_each_is_answered(worker: Worker, users: Users) -> None:
    # given a slow chat answer running
    agent = chat_agent(users.alice)
    chat = message_send(agent=agent, user=users.alice, text="story 8 0.05")

    # when two submissions and another chat message arrive behind it
    first = submission_create(agent=agent, user=None, messages=[{"content": "from the crm"}], idempotency_key="1")
    second = submission_create(
        agent=agent, user=users.alice, messages=[{"content": "two"}, {"content": "lines"}], idempotency_key="2"
    )
    later_chat = message_send(agent=agent, user=users.alice, text="after them")

    # then all are answered in the order they came, each submission by its own turn
    assert first.submission.turn is not None and second.submission.turn is not None
    turns = [wait_ended(t, timeout=60) for t in (chat, first.submission.turn, second.submission.turn, later_chat)]
    assert [t.number for t in turns] == [1, 2, 3, 4] and all(t.status == TurnStatus.COMPLETED for t in turns)
    for turn in turns[1:]:
        assert turn.started_at is not None
    assert all(a.finished_at <= b.started_at for a, b in zip(turns, turns[1:], strict=False))  # type: ignore[operator]
    assert streamed_text(turns[1]) == "You said: from the crm"
    assert streamed_text(turns[2]) == "You said: lines"  # the model reads the last user message
    assert list(Message.objects.filter(turn=turns[2], role="user").values_list("text", flat=True)) == ["two", "lines"]
    wait_for(
        lambda: set(Submission.objects.values_list("status", flat=True)) == {SubmissionStatus.COMPLETED},
        timeout=10,
        what="both submissions to complete",
    )


@pytest.mark.django_db(transaction=True)
def test_submissions_accepted_over_http_are_answered_in_order_with_the_chats(worker: Worker, users: Users) -> None:
    # given a slow chat answer running
    agent = chat_agent(users.alice)
    chat = message_send(agent=agent, user=users.alice, text="story 8 0.05")

    # when a CRM submits three times over HTTP, and alice sends a message right after
    crm = api_login(users.alice)
    accepted = [post(crm, said(f"crm {i}"), key=str(i)) for i in range(3)]
    later_chat = message_send(agent=agent, user=users.alice, text="after them")

    # then each was accepted pending, and all are answered in the order they were accepted
    assert [(a.status_code, a.json()["status"]) for a in accepted] == [(202, "pending")] * 3
    ended = wait_ended(later_chat, timeout=60)
    submissions = [Submission.objects.select_related("turn").get(pk=a.json()["id"]) for a in accepted]
    turns = [chat, *(s.turn for s in submissions), ended]
    assert [t.number for t in turns if t is not None] == [1, 2, 3, 4, 5]
    assert [s.status for s in submissions] == [SubmissionStatus.COMPLETED] * 3
    assert [streamed_text(s.turn) for s in submissions if s.turn is not None] == [
        f"You said: crm {i}" for i in range(3)
    ]


@pytest.mark.django_db
def test_a_chat_message_sent_after_an_accepted_submission_is_answered_after_it(
    users: Users, no_enqueue: NoEnqueue
) -> None:
    # given an idle agent, and a submission accepted that no worker has queued yet
    agent = chat_agent(users.alice)
    crm = api_login(users.alice)
    accepted = post(crm, said("from the crm"), key="a").json()

    # when alice sends a message before the worker comes
    chat = message_send(agent=agent, user=users.alice, text="hello")

    # then the submission was queued first, and runs; her message waits behind it
    submission = Submission.objects.select_related("turn").get(pk=accepted["id"])
    assert submission.turn is not None and (submission.turn.number, chat.number) == (1, 2)
    assert submission.status == SubmissionStatus.RUNNING and chat.status == TurnStatus.QUEUED

    # when another is accepted while that runs, and she sends again
    second = post(crm, said("again"), key="b").json()
    again = message_send(agent=agent, user=users.alice, text="and again")

    # then it is queued before her second message too, and the worker finds nothing left to queue
    assert Submission.objects.select_related("turn").get(pk=second["id"]).turn.number == 3  # type: ignore[union-attr]
    assert again.number == 4
    worker_queues(agent)
    assert Turn.objects.count() == 4


@pytest.mark.django_db
def test_an_accept_is_one_statement_and_a_retry_two(users: Users, no_enqueue: NoEnqueue) -> None:
    # Another system waits for each: the insert checks the key and the caps itself; a retry is
    # looked up only when it stored nothing.
    agent = chat_agent(users.alice)
    said = [{"role": "user", "content": "hi"}]

    with statements_sent() as accepted:
        result = submission_accept(agent=agent, user=users.alice, messages=said, idempotency_key="k")
    with statements_sent() as replayed:
        again = submission_accept(agent=agent, user=users.alice, messages=said, idempotency_key="k")

    assert result.accepted and result.submission.status == SubmissionStatus.PENDING and result.submission.turn is None
    assert len(accepted) == 1, accepted
    assert not again.accepted and again.submission.pk == result.submission.pk
    assert len(replayed) == 2, replayed


@pytest.mark.django_db
def test_the_sweep_queues_a_submission_whose_task_was_lost(users: Users, no_enqueue: NoEnqueue) -> None:
    from datetime import timedelta

    from django.utils import timezone

    # given a submission accepted whose task never reached a worker (no_enqueue drops it)
    agent = chat_agent(users.alice)
    accepted = post(api_login(users.alice), said("hello"), key="a").json()

    # then the sweep leaves it within AGENTS_SUBMISSION_QUEUE_GRACE_SECONDS (its task may be on the way)
    assert submissions_sweep() == 0
    assert Submission.objects.get(pk=accepted["id"]).turn is None

    # and queues it after: its turn starts, on the idle agent
    assert submissions_sweep(now=timezone.now() + timedelta(seconds=11)) == 1
    submission = Submission.objects.select_related("turn").get(pk=accepted["id"])
    assert submission.status == SubmissionStatus.RUNNING and submission.turn is not None
    assert submission.turn.agent_id == agent.pk and submission.turn.run_id is not None

    # and an operator queues what waits at once, without the grace
    later = post(api_login(users.alice), said("again"), key="b").json()
    out = StringIO()
    call_command("agents", "queue-submissions", stdout=out)
    assert out.getvalue() == "Queued the inbox of 1 agent(s).\n"
    assert Submission.objects.get(pk=later["id"]).turn is not None


@pytest.mark.django_db
def test_the_caps_count_submissions_not_queued_yet(settings: Any, users: Users, no_enqueue: NoEnqueue) -> None:
    # given an agent allowed two pending submissions
    settings.AGENTS_MAX_PENDING_SUBMISSIONS = 2
    agent = chat_agent(users.alice)
    crm = api_login(users.alice)
    message_send(agent=agent, user=users.alice, text="hello")  # running: what follows stays pending
    assert [post(crm, said(k), key=k).status_code for k in ("a", "b")] == [202, 202]

    # then a third is refused while the two wait in the inbox, and after a worker queued them
    refused = post(crm, said("c"), key="c")
    assert refused.status_code == 429 and "2 submissions are waiting" in refused.json()["error"]["message"]
    worker_queues(agent)
    assert post(crm, said("c"), key="c").status_code == 429
    assert Submission.objects.count() == 2

    # and with alice allowed four open turns or submissions, her chat counts one waiting in another
    # agent's inbox as hers (with her turn and the two queued here)
    settings.AGENTS_MAX_OPEN_TURNS_PER_USER = 4
    assert post(crm, said("d"), key="d", agent="other").status_code == 202  # another agent's inbox
    with pytest.raises(TooManyQueuedTurns):
        message_send(agent=agent, user=users.alice, text="more")
    # while a retry is still answered as the first
    assert post(crm, said("a"), key="a").status_code == 200


@pytest.mark.django_db
def test_the_command_submits_once_per_key(users: Users, no_enqueue: NoEnqueue) -> None:
    chat_agent(users.alice)

    def submit(*extra: str) -> str:
        out = StringIO()
        call_command("agents", "submit", "--account", "acme", "--kind", "test.chat", "--name", "t", *extra, stdout=out)
        return out.getvalue()

    first = submit("--text", "nightly report", "--key", "2026-11-30")
    again = submit("--text", "nightly report", "--key", "2026-11-30")

    submission = Submission.objects.get()
    assert first == f"Submitted: {submission.pk} running\n"
    assert again.startswith(f"Already submitted (same key and text): {submission.pk}")
    # the same key with another text: refused, in words that fit a command's --key as the API's header
    with pytest.raises(CommandError, match="^the idempotency key '2026-11-30' was used for another submission"):
        submit("--text", "another report", "--key", "2026-11-30")


@pytest.mark.django_db
def test_a_members_submissions_count_against_their_open_turns(
    users: Users, no_enqueue: NoEnqueue, settings: Any
) -> None:
    # given a limit of two open turns per member, and alice's two agents
    settings.AGENTS_MAX_OPEN_TURNS_PER_USER = 2
    chat_agent(users.alice)
    chat_agent(users.alice, name="other")
    crm = api_login(users.alice)

    # when she submits to one agent, then to the other, then once more
    first = post(crm, said("one"))
    second = crm.post("/api/agents/test.chat/other/submissions", said("two"), format="json")
    third = post(crm, said("three"))

    # then the third is refused as her third chat message would be, and nothing of it is stored
    assert (first.status_code, second.status_code, third.status_code) == (202, 202, 429)
    assert Submission.objects.count() == 2


@pytest.mark.django_db
def test_a_refused_submission_opens_no_agent(users: Users, no_enqueue: NoEnqueue) -> None:
    from agents.models import Agent

    chat_agent(users.alice)
    before = Agent.objects.count()

    answer = api_login(users.alice).post("/api/agents/test.chat/fresh/submissions", {"messages": []}, format="json")

    assert answer.status_code == 400 and Agent.objects.count() == before


@pytest.mark.django_db
@pytest.mark.parametrize(
    "args",
    [
        ["--name", "a/b", "--text", "hi"],
        ["--name", "", "--text", "hi"],
        ["--name", "x" * 129, "--text", "hi"],
        ["--name", "new", "--text", ""],
        ["--name", "new", "--text", "hi", "--metadata", "NaN"],
        ["--name", "new", "--text", "hi", "--metadata", "[1]"],
        ["--name", "new", "--text", "hi", "--key", " spaced "],
        ["--name", "new", "--text", "hi", "--key", "k" * 300],
        ["--name", "new", "--text", "hi", "--key", ""],  # an unset variable: not "no key"
    ],
)
def test_the_command_refuses_bad_input_and_opens_no_agent(users: Users, no_enqueue: NoEnqueue, args: list[str]) -> None:
    from django.core.management.base import CommandError

    from agents.models import Agent

    chat_agent(users.alice)
    before = Agent.objects.count()

    with pytest.raises(CommandError):
        call_command("agents", "submit", "--account", "acme", "--kind", "test.chat", *args, stdout=StringIO())

    assert Agent.objects.count() == before and not Submission.objects.exists()


@pytest.mark.django_db
def test_a_submission_costs_few_statements(users: Users, no_enqueue: NoEnqueue) -> None:
    # Another system waits for each statement (a round trip): the locks are one, the key's earlier
    # submission and the pending count one, what is open one, then the turn and the submission.
    # (Inside the test's transaction, submission_create's own is a savepoint and its release.)
    agent = chat_agent(users.alice)
    said = [{"role": "user", "content": "hi"}]
    submission_create(agent=agent, user=users.alice, messages=said, idempotency_key="first")  # starts at once

    with statements_sent() as queued:
        result = submission_create(agent=agent, user=users.alice, messages=said, idempotency_key="queued")
    with statements_sent() as replayed:
        again = submission_create(agent=agent, user=users.alice, messages=said, idempotency_key="queued")

    assert result.accepted and result.submission.status == SubmissionStatus.PENDING
    assert len(queued) == 7, queued
    assert not again.accepted and again.submission == result.submission
    assert len(replayed) == 4, replayed  # the locks and the key's submission


@pytest.mark.django_db
def test_past_the_pending_cap_a_submission_is_refused_until_one_runs(
    settings: Any, users: Users, no_enqueue: NoEnqueue
) -> None:
    # given an agent allowed one pending submission, with one running and one pending
    settings.AGENTS_MAX_PENDING_SUBMISSIONS = 1
    agent = chat_agent(users.alice)
    said = [{"role": "user", "content": "hi"}]
    first = submission_create(agent=agent, user=users.alice, messages=said).submission
    second = submission_create(agent=agent, user=users.alice, messages=said).submission
    assert (first.status, second.status) == (SubmissionStatus.RUNNING, SubmissionStatus.PENDING)

    # then a third is refused, and nothing of it is stored
    with pytest.raises(TooManyQueuedTurns):
        submission_create(agent=agent, user=users.alice, messages=said)
    assert Submission.objects.count() == 2 and Turn.objects.count() == 2

    # when the first's run ended without ending its turn (its hook never ran), the next submission
    # repairs the queue first: the first fails, the second runs, and the third is taken
    assert first.turn is not None and first.turn.run_id is not None
    WorkflowRun.objects.filter(pk=first.turn.run_id).update(status=RunStatus.FAILED)
    third = submission_create(agent=agent, user=users.alice, messages=said)

    assert third.accepted and third.submission.status == SubmissionStatus.PENDING
    assert Submission.objects.get(pk=second.pk).status == SubmissionStatus.RUNNING
    assert Submission.objects.get(pk=first.pk).status == SubmissionStatus.ERROR


@pytest.mark.django_db
def test_the_admin_shows_whose_key_a_submission_is_under(users: Users, no_enqueue: NoEnqueue) -> None:
    agent = chat_agent(users.alice)
    webhook = submission_create(
        agent=agent, user=None, messages=[{"content": "hi"}], idempotency_key="crm:evt_1", caller="webhook:crm"
    )
    staff = users.carol
    staff.is_staff = staff.is_superuser = True
    staff.save()

    page = login(staff).get(f"/admin/agents/submission/{webhook.submission.pk}/change/").content.decode()
    listed = login(staff).get("/admin/agents/submission/").content.decode()

    assert "webhook:crm" in page and webhook.submission.fingerprint in page
    assert "webhook:crm" in listed


# Inputs near every edge of InputSerializer: each either read by plainly_valid exactly as the
# serializer validates it, or left to the serializer.
EDGES: list[Any] = [
    said("hi"),
    {"messages": [{"content": "hi"}]},
    {"messages": [{"role": "user", "content": " padded\n"}], "metadata": {}},
    {"messages": [{"content": "a"}] * MAX_MESSAGES, "metadata": {"nested": {"list": [1, None, "x"]}}},
    {"messages": [{"content": "\u6f22" * MAX_CONTENT_CHARS}]},
    {"messages": [{"content": "\U0001f600 emoji"}], "metadata": {"": None}},
    {"messages": [{"content": "\u3000x\u3000"}]},  # ideographic spaces around a character
    # refused, by the one or the other
    {"messages": [{"content": "a"}] * (MAX_MESSAGES + 1)},
    {"messages": [{"content": "\u6f22" * (MAX_CONTENT_CHARS + 1)}]},
    {"messages": []},
    {"messages": [{"content": ""}]},
    {"messages": [{"content": " \t\n\u3000\u2028"}]},
    {"messages": [{"content": "nul\x00"}]},
    {"messages": [{"content": "lone \ud800"}]},
    {"messages": [{"content": 7}]},
    {"messages": [{"content": None}]},
    {"messages": [{"role": "assistant", "content": "hi"}]},
    {"messages": [{"role": None, "content": "hi"}]},
    {"messages": [{"role": "user"}]},
    {"messages": [{"content": "hi", "name": "x"}]},
    {"messages": ["hi"]},
    {"messages": "hi"},
    {"messages": {"content": "hi"}},
    {"messages": [{"content": "hi"}], "metadata": None},
    {"messages": [{"content": "hi"}], "metadata": []},
    {"messages": [{"content": "hi"}], "metadata": "x"},
    {"messages": [{"content": "hi"}], "other": 1},
    {"metadata": {}},
    [],
    "text",
    None,
]


@pytest.mark.parametrize("data", EDGES)
def test_the_plain_reading_of_a_submission_takes_only_what_the_serializer_does_and_reads_it_alike(data: Any) -> None:
    serializer = AgentSubmissionsApi.InputSerializer(data=data)
    valid = serializer.is_valid()

    plain = plainly_valid(data)

    if plain is not None:  # taken without DRF: DRF would take it, and read the same
        assert valid, serializer.errors
        assert check_submission(plain["messages"], plain["metadata"]) == check_submission(
            serializer.validated_data["messages"], serializer.validated_data["metadata"]
        )
    # what a caller sends when all is well is taken without DRF
    assert (plain is not None) == (valid and data in EDGES[:7])


@pytest.mark.django_db
def test_a_submission_by_token_is_accepted_by_one_statement_as_the_api_accepts_it(
    users: Users, no_enqueue: NoEnqueue
) -> None:
    # given alice's agent and her CRM's token
    chat_agent(users.alice)
    crm = api_login(users.alice)

    # when the CRM submits, then submits the same way through the API's own view (?account= is
    # read by AgentSubmissionsApi only)
    with statements_sent() as sent:
        quick = post(crm, said("one"), key="q")
    slow = crm.post(f"{BASE}?account=acme", said("two"), format="json", headers={"Idempotency-Key": "s"})

    # then the first was one statement, and the two answers and rows are alike
    assert len(sent) == 1, sent
    assert (quick.status_code, slow.status_code) == (202, 202)
    assert set(quick.headers) == set(slow.headers)
    for header in ("Content-Type", "Allow"):
        assert quick[header] == slow[header], header
    assert quick.content == f'{{"id":"{quick.json()["id"]}","status":"pending","accepted":true}}'.encode()
    assert slow.content == f'{{"id":"{slow.json()["id"]}","status":"pending","accepted":true}}'.encode()
    assert quick["Location"] == f"/api/submissions/{quick.json()['id']}"
    # and a retry is answered by a second statement, as the API answers it
    with statements_sent() as replayed:
        again = post(crm, said("one"), key="q")
    slow_again = crm.post(f"{BASE}?account=acme", said("one"), format="json", headers={"Idempotency-Key": "q"})
    assert len(replayed) == 2, replayed
    assert again.status_code == slow_again.status_code == 200
    assert again.content == slow_again.content and set(again.headers) == set(slow_again.headers)
    assert again.json() == {**quick.json(), "accepted": False}
    mine, theirs = (Submission.objects.get(pk=answer.json()["id"]) for answer in (quick, slow))
    for field in ("agent_id", "caller", "submitted_by_id", "status", "turn_id", "metadata", "delivered_at"):
        assert getattr(mine, field) == getattr(theirs, field), field
    assert (mine.idempotency_key, mine.messages) == ("q", [{"role": "user", "content": "one"}])
    assert mine.fingerprint == fingerprint(mine.messages, mine.metadata)


@pytest.mark.django_db
def test_what_the_one_statement_stores_nothing_for_is_answered_by_the_api(
    users: Users, no_enqueue: NoEnqueue, settings: Any
) -> None:
    # given alice's agent, her CRM's token, and a first submission
    agent = chat_agent(users.alice)
    crm = api_login(users.alice)
    first = post(crm, said("one"), key="k")

    # then a retry is the first, a key reused a conflict, a new name creates its agent
    assert post(crm, said("one"), key="k").json() == {**first.json(), "accepted": False}
    assert post(crm, said("two"), key="k").status_code == 409
    assert post(crm, said("one"), key="k", agent="brand-new").status_code == 202
    assert agent.account.agents.filter(name="brand-new").exists()
    # and a cap reached is a 429, a body in another charset is read as the API reads it
    settings.AGENTS_MAX_PENDING_SUBMISSIONS = 1
    assert post(crm, said("three"), key="k3").status_code == 429
    settings.AGENTS_MAX_PENDING_SUBMISSIONS = 100
    latin = crm.post(BASE, b'{"messages": [{"content": "caf\xe9"}]}', content_type="application/json; charset=latin-1")
    assert latin.status_code == 202 and Submission.objects.get(pk=latin.json()["id"]).messages[0]["content"] == "café"
    # and an inactive user's token is refused, storing nothing
    users.alice.is_active = False
    users.alice.save(update_fields=["is_active"])
    before = Submission.objects.count()
    assert post(crm, said("four"), key="k4").status_code == 401
    assert Submission.objects.count() == before


@pytest.mark.django_db
def test_a_caller_without_a_valid_token_costs_no_more_than_drfs_refusal(users: Users, no_enqueue: NoEnqueue) -> None:
    # given alice's agent, and bodies only DRF reads: one larger than the quick path takes, one of
    # many brackets (cheap to send, dear to parse and walk)
    chat_agent(users.alice)
    forged = api_login(None)
    forged.credentials(HTTP_AUTHORIZATION="Token " + "a" * 40)
    large = {"messages": [{"content": "x" * 1000}] * 17}  # else a valid submission
    assert len(json.dumps(large)) > 16 * 1024  # more than the quick path reads (QUICK_BODY_BYTES)
    nested = {"messages": [{"content": "hi"}], "metadata": {"x": [[] for _ in range(5000)]}}

    for body in (large, nested):
        # when a caller with a made-up token posts it
        with statements_sent() as sent:
            answer = post(forged, body, key="k")

        # then DRF refuses it after its one token read, the body never parsed or stored
        assert answer.status_code == 401
        assert len(sent) == 1 and "authtoken_token" in sent[0], sent
    assert not Submission.objects.exists()


@pytest.mark.django_db
def test_a_caller_who_does_not_accept_json_is_answered_by_the_api(users: Users, no_enqueue: NoEnqueue) -> None:
    chat_agent(users.alice)
    crm = api_login(users.alice)

    refused = crm.post(BASE, said("one"), format="json", headers={"Idempotency-Key": "a", "Accept": "text/html"})
    pretty = crm.post(BASE, said("two"), format="json", headers={"Accept": "application/json; indent=4"})

    assert refused.status_code == 406 and not Submission.objects.filter(idempotency_key="a").exists()
    assert pretty.status_code == 202 and pretty.content.startswith(b'{\n    "id"')


@pytest.mark.django_db
def test_the_inbox_is_queued_in_the_databases_order_whatever_a_web_servers_clock_says(
    users: Users, no_enqueue: NoEnqueue, monkeypatch: pytest.MonkeyPatch
) -> None:
    from datetime import timedelta

    from django.utils import timezone

    # given a submission accepted by a server whose clock is an hour ahead, then one by a server on time
    agent = chat_agent(users.alice)
    crm = api_login(users.alice)
    now = timezone.now
    monkeypatch.setattr(timezone, "now", lambda: now() + timedelta(hours=1))
    ahead = post(crm, said("first"), key="a").json()
    monkeypatch.setattr(timezone, "now", now)
    on_time = post(crm, said("second"), key="b").json()

    # when the worker queues them
    worker_queues(agent)

    # then they are queued in the order they were accepted, stamped by the database
    first, second = (Submission.objects.select_related("turn").get(pk=s["id"]) for s in (ahead, on_time))
    assert first.turn is not None and second.turn is not None and (first.turn.number, second.turn.number) == (1, 2)
    assert abs(first.created_at - now()) < timedelta(minutes=1)


@pytest.mark.django_db(transaction=True)
def test_agents_submit_and_an_http_accept_of_one_key_at_once_make_one_submission(
    users: Users, no_enqueue: NoEnqueue, monkeypatch: pytest.MonkeyPatch
) -> None:
    import threading

    from agents import statements

    # given agents.submit holding the agent's lock after it looked the key up, and finding nothing
    agent = chat_agent(users.alice)
    crm = api_login(users.alice)
    looked_up, answered = threading.Event(), threading.Event()
    real = statements.submission_by_key

    def slow(**kwargs: Any) -> Any:
        found = real(**kwargs)
        if not looked_up.is_set():
            looked_up.set()
            answered.wait(15)
        return found

    monkeypatch.setattr(statements, "submission_by_key", slow)
    outcome: dict[str, Any] = {}

    def submit() -> None:
        try:
            one = said("one")
            outcome["result"] = submission_create(
                agent=agent, user=users.alice, idempotency_key="K", messages=one["messages"], metadata=one["metadata"]
            )
        except Exception as exc:  # reported below
            outcome["error"] = exc

    thread = thread_of(submit)
    thread.start()
    assert looked_up.wait(15)

    # when the same member's integration submits the same key and body over HTTP meanwhile
    http = post(crm, said("one"), key="K")
    answered.set()
    thread.join(30)

    # then the HTTP one is accepted at once, and agents.submit answers with it: one submission
    assert http.status_code == 202, http.content
    assert "error" not in outcome, outcome
    assert not outcome["result"].accepted and str(outcome["result"].submission.pk) == http.json()["id"]
    assert Submission.objects.count() == 1 and not Turn.objects.exists()


@pytest.mark.django_db
def test_a_submission_refused_by_a_stuck_queue_is_taken_once_the_refusal_repaired_it(
    settings: Any, users: Users, no_enqueue: NoEnqueue
) -> None:
    # given an agent allowed two pending submissions: one running, two pending, a third refused
    settings.AGENTS_MAX_PENDING_SUBMISSIONS = 2
    agent = chat_agent(users.alice)
    crm = api_login(users.alice)
    running = post(crm, said("a"), key="a").json()
    worker_queues(agent)
    assert [post(crm, said(k), key=k).status_code for k in ("b", "c", "d")] == [202, 202, 429]

    # when the running one's run ended without ending its turn (its hook never ran)
    turn = Submission.objects.select_related("turn").get(pk=running["id"]).turn
    assert turn is not None and turn.run_id is not None
    WorkflowRun.objects.filter(pk=turn.run_id).update(status=RunStatus.FAILED)

    # then the next submission repairs the queue and is taken
    assert post(crm, said("d"), key="d").status_code == 202
    assert Submission.objects.get(pk=running["id"]).status == SubmissionStatus.ERROR
