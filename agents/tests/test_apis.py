"""The agents' HTTP API in process: the snapshot, a turn, stop, send a message; tenancy and errors."""

from __future__ import annotations

from uuid import uuid4

import pytest

from agents import selectors, services
from agents.models import Agent, Chunk, Message, Turn, TurnStatus
from agents.tests.test_consumers import KIND, World, as_json, make_turn, stored_counts
from agents.tests.test_consumers import world as world  # noqa: F401  the fixture
from tests.factories import api_login

pytestmark = pytest.mark.django_db

BASE = f"/api/agents/{KIND}/help"


def test_the_snapshot_is_the_members_and_nobody_elses(world: World) -> None:
    Message.objects.create(agent=world.agent, role="user", text="hello", author=world.users.alice)
    turn = make_turn(world.agent)
    Chunk.objects.create(turn=turn, seq=1, type="start", data={})

    alices = api_login(world.users.alice).get(BASE)
    bobs = api_login(world.users.bob).get(f"{BASE}?account=acme")

    assert alices.status_code == bobs.status_code == 200
    assert alices.json() == bobs.json() == as_json(selectors.agent_snapshot(agent=world.agent))
    assert alices.json()["turn"] == {"id": str(turn.pk), "number": 1, "status": "running", "seq": 1}
    # mallory naming alice's account, an unknown account, an unknown kind: the same 404
    mallory = api_login(world.users.mallory)
    for path in (
        f"{BASE}?account=acme",
        f"{BASE}?account=nope",
        "/api/agents/nope/help",
        f"/api/agents/{KIND}/{'x' * 129}",
    ):
        answer = mallory.get(path)
        assert (answer.status_code, answer.json()["error"]["code"]) == (404, "not_found"), path
    assert mallory.get(f"{BASE}?account=ac%20me").status_code == 400
    assert mallory.get(f"{BASE}?other=1").status_code == 400
    assert api_login(None).get(BASE).status_code == 401


def test_the_snapshot_since_a_message_holds_only_the_later_ones(world: World) -> None:
    first, second = (
        Message.objects.create(agent=world.agent, role="user", text=text, author=world.users.alice)
        for text in ("one", "two")
    )
    alice = api_login(world.users.alice)

    answer = alice.get(f"{BASE}?since={first.pk}")

    assert answer.status_code == 200
    assert ([m["id"] for m in answer.json()["messages"]], answer.json()["since"]) == ([second.pk], first.pk)
    # read as the socket reads it: ASCII digits only, at most 18 (not "1.0", not Arabic-Indic digits)
    for bad in ("x", "-1", str(2**63), "1.0", "\u0661", "+1", "1_0", " 1"):
        refused = alice.get(f"{BASE}", {"since": bad})
        assert refused.status_code == 400, bad
        assert refused.json()["error"]["detail"] == {
            "since": ["A message id is 1 to 18 digits (0 to 9), nothing else."]
        }, bad
    # only the snapshot takes it
    assert alice.post(f"{BASE}/messages?since={first.pk}", {"text": "hi"}, format="json").status_code == 400


def test_a_turn_is_read_only_through_its_own_agent(world: World) -> None:
    turn = make_turn(world.agent, status=TurnStatus.COMPLETED)
    Chunk.objects.create(turn=turn, seq=1, type="start", data={})
    Chunk.objects.create(turn=turn, seq=2, type="finish", data={"reason": "stop"})
    alice = api_login(world.users.alice)

    answer = alice.get(f"{BASE}/turns/{turn.pk}")

    assert answer.status_code == 200
    body = answer.json()
    assert {k: body[k] for k in ("id", "number", "status", "seq", "text")} == {
        "id": str(turn.pk),
        "number": 1,
        "status": "completed",
        "seq": 2,
        "text": "",
    }
    assert alice.get(f"{BASE}/turns/{str(turn.pk).upper()}").status_code == 200
    for path in (
        f"{BASE}/turns/{uuid4()}",
        f"{BASE}/turns/{turn.pk.hex}",
        f"{BASE}/turns/nope",
        f"/api/agents/{KIND}/other/turns/{turn.pk}",  # another agent of the account
    ):
        assert alice.get(path).status_code == 404, path
    assert api_login(world.users.mallory).get(f"{BASE}/turns/{turn.pk}?account=acme").status_code == 404


def test_stopping_an_ended_turn_is_a_409_and_changes_nothing(world: World) -> None:
    turn = make_turn(world.agent, status=TurnStatus.COMPLETED)
    before = stored_counts()

    answer = api_login(world.users.alice).post(f"{BASE}/turns/{turn.pk}/stop")

    assert answer.status_code == 409
    assert answer.json()["error"] == {
        "code": "turn_ended",
        "message": "Turn 1 has already ended (completed).",
        "detail": {"status": "completed"},
    }
    assert stored_counts() == before
    assert api_login(world.users.mallory).post(f"{BASE}/turns/{turn.pk}/stop?account=acme").status_code == 404


@pytest.mark.parametrize(
    "body",
    [{}, {"text": ""}, {"text": "  "}, {"text": 5}, {"text": "a\x00b"}, {"text": "x" * 4001}, {"text": "hi", "x": 1}],
)
def test_a_bad_message_is_a_400_and_stores_nothing(world: World, body: dict[str, object]) -> None:
    before = stored_counts()

    answer = api_login(world.users.alice).post(f"{BASE}/messages", body, format="json")

    assert answer.status_code == 400, answer.content
    assert answer.json()["error"]["code"] == "invalid"
    assert stored_counts() == before


def test_a_non_member_cannot_send_a_message(world: World) -> None:
    before = stored_counts()

    answer = api_login(world.users.mallory).post(f"{BASE}/messages?account=acme", {"text": "hi"}, format="json")

    assert answer.status_code == 404
    assert stored_counts() == before


# --- writes through agents.services ------------------------------------------------------------------
def test_a_message_is_a_202_with_its_turn(world: World) -> None:
    answer = api_login(world.users.bob).post(f"{BASE}/messages", {"text": "Where is order 1042?"}, format="json")

    assert answer.status_code == 202, answer.content
    turn = Turn.objects.get(pk=answer.json()["id"])
    assert turn.agent_id == world.agent.pk and turn.requested_by == world.users.bob
    assert answer.json()["number"] == 1
    assert Message.objects.get(turn=turn, role="user").text == "Where is order 1042?"


def test_a_stop_that_could_not_stop_a_turn_that_kept_changing_does_not_say_it_ended(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    turn = make_turn(world.agent, status=TurnStatus.QUEUED)
    monkeypatch.setattr(services, "_turn_stop_once", lambda **kwargs: None)  # changed under every try

    answer = api_login(world.users.alice).post(f"{BASE}/turns/{turn.pk}/stop")

    assert answer.status_code == 409 and answer.json()["error"]["code"] != "turn_ended"
    assert "try again" in answer.json()["error"]["message"] and answer.json()["error"]["detail"] == {"status": "queued"}
    assert Turn.objects.get(pk=turn.pk).status == TurnStatus.QUEUED


def test_a_stop_with_a_body_is_refused_and_stops_nothing(world: World) -> None:
    turn = make_turn(world.agent, status=TurnStatus.QUEUED)
    client = api_login(world.users.alice)

    with_a_field = client.post(f"{BASE}/turns/{turn.pk}/stop", {"force": True}, format="json")
    not_json = client.post(f"{BASE}/turns/{turn.pk}/stop", "zzz", content_type="text/plain")

    assert with_a_field.status_code == 400 and with_a_field.json()["error"]["detail"] == {"force": ["Unknown field."]}
    assert not_json.status_code == 415
    assert Turn.objects.get(pk=turn.pk).status == TurnStatus.QUEUED
    assert client.post(f"{BASE}/turns/{turn.pk}/stop", {}, format="json").status_code == 200  # {} is no body


def test_stop_cancels_a_queued_turn(world: World) -> None:
    turn = make_turn(world.agent, status=TurnStatus.QUEUED)

    answer = api_login(world.users.alice).post(f"{BASE}/turns/{turn.pk}/stop")

    assert answer.status_code == 200, answer.content
    assert answer.json()["status"] == "cancelled"
    assert Turn.objects.get(pk=turn.pk).status == TurnStatus.CANCELLED
    assert Agent.objects.count() == 1
