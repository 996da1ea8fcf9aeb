"""Tools that need approval and tools with effects, in real workers; the writer's fence and the
tool schema, in-process."""

from __future__ import annotations

import types
from datetime import timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any, Literal

import pytest
from django.contrib.auth.models import Group
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from agents import chunks as chunk_store
from agents.chunks import ChunkWriter, FencedOut
from agents.models import Chunk, Message, Turn, TurnStatus
from agents.registry import ToolContext, schema_of, tool
from agents.services import message_send
from agents.tests.support import assert_seq_complete, chat_agent, chunks, wait_chunks, wait_ended, wait_status
from approvals import decide
from approvals.models import ApprovalRequest
from ledger.models import ExternalOperation
from tests.agents_fixtures import APPROVERS, count
from tests.factories import Users, make_run
from tests.support import Worker, wait_for
from workflows.models import RunStatus


@pytest.mark.django_db(transaction=True)
@pytest.mark.slow
@pytest.mark.parametrize("approve", [True, False])
def test_a_tool_needing_approval_waits_and_the_decision_continues_the_turn(
    worker: Worker, users: Users, tmp_path: Path, approve: bool
) -> None:
    # given carol in the approvers' group, and alice asking for something that needs approval
    Group.objects.get_or_create(name=APPROVERS)[0].user_set.add(users.carol)
    agent = chat_agent(users.alice)
    path = str(tmp_path / "refund")
    turn = message_send(agent=agent, user=users.alice, text=f"refund 20.00 {path}")

    # then the turn waits, and the chat says for whom
    turn = wait_status(turn, TurnStatus.WAITING)
    wait_chunks(turn, "data-notice")
    assert [c.data for c in chunks(turn) if c.type == "data-notice"] == [
        {"text": f"Waiting for approval by {APPROVERS}…"}
    ]
    # (the request is raised by the step after the notice's: wait for it)
    request = wait_for(
        lambda: ApprovalRequest.objects.filter(subject_type="agents.turn", subject_id=str(turn.pk)).first(),
        timeout=30,
        what="the approval request",
    )
    assert request.requested_by_id == users.alice.pk
    assert request.summary == "Refund 20.00 for the test"
    assert count(path) == 0

    # when carol decides
    decide(request, by=users.carol, approve=approve, version=request.version)

    # then the turn goes on: the tool runs once if approved, its result says so if not
    turn = wait_ended(turn)
    assert turn.status == TurnStatus.COMPLETED, turn.end_reason
    assert_seq_complete(turn)
    result = Message.objects.get(turn=turn, role="tool").parts["result"]
    if approve:
        assert count(path) == 1
        assert result == {"refunded": "20.00"}
    else:
        assert count(path) == 0
        assert result == {"error": "The request was not approved: an approver rejected it."}


@pytest.mark.django_db(transaction=True)
@pytest.mark.slow
def test_an_effect_tool_is_performed_once_under_its_call_key(worker: Worker, users: Users, tmp_path: Path) -> None:
    agent = chat_agent(users.alice)
    path = str(tmp_path / "pay")

    turn = wait_ended(message_send(agent=agent, user=users.alice, text=f"pay {path}"))

    assert turn.status == TurnStatus.COMPLETED, turn.end_reason
    key = f"agent:{agent.pk}:turn:{turn.pk}:call:t1"
    assert Path(path).read_text().splitlines() == [key]
    operation = ExternalOperation.objects.get(key=key)
    assert operation.status == "succeeded"
    assert Message.objects.get(turn=turn, role="tool").parts["result"] == {"paid": True, "key": key}


@pytest.mark.django_db
@pytest.mark.parametrize("portable", [False, True], ids=["postgresql", "orm"])
def test_a_writer_without_the_lease_cannot_append(
    users: Users, portable: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # (orm: the writes the SQLite demo makes, where PostgreSQL's one fenced INSERT is not available)
    if portable:
        monkeypatch.setattr(chunk_store, "_postgresql", lambda: False)
    # given a turn whose run is leased to another worker
    agent = chat_agent(users.alice)
    later = timezone.now() + timedelta(minutes=1)
    run = make_run(workflow="agents.turn", status=RunStatus.RUNNING, lease_owner="other", lease_expires_at=later)
    turn = Turn.objects.create(agent=agent, number=1, run=run)

    # when a writer that is not the lease holder appends, it is fenced out and stores nothing
    writer = ChunkWriter(turn=turn, run_id=run.pk, owner="me")
    writer.add("text-delta", {"delta": "late"})
    with pytest.raises(FencedOut):
        writer.close()
    with pytest.raises(FencedOut):
        writer.add_once("tool-output-available", {"output": 1}, key="output:x")
    assert not Chunk.objects.filter(turn=turn).exists()

    # and the lease holder can, while its lease lasts
    holder = ChunkWriter(turn=turn, run_id=run.pk, owner="other")
    holder.add("text-delta", {"delta": "a"})
    holder.add("text-delta", {"delta": "b"})
    holder.close()
    assert holder.add_once("tool-output-available", {"output": 1}, key="output:x")
    assert not holder.add_once("tool-output-available", {"output": 1}, key="output:x")  # once, and no seq used
    holder.add("finish", {})
    holder.close()
    assert list(Chunk.objects.filter(turn=turn).order_by("seq").values_list("seq", "type")) == [
        (1, "text-delta"),
        (2, "text-delta"),
        (3, "tool-output-available"),
        (4, "finish"),
    ]

    # and not once the lease has expired
    type(run).objects.filter(pk=run.pk).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    with pytest.raises(FencedOut):
        ChunkWriter(turn=turn, run_id=run.pk, owner="other").add_once("data-notice", {"text": "x"}, key="late")


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> types.SimpleNamespace:
    """The chunk writer's monotonic clock, at ``clock.now`` seconds until the test moves it."""
    clock = types.SimpleNamespace(now=1000.0)
    monkeypatch.setattr(chunk_store, "time", types.SimpleNamespace(monotonic=lambda: clock.now))
    return clock


@pytest.mark.django_db
def test_a_chunk_as_slow_as_the_flush_interval_is_stored_at_once_however_long_a_batch_took(
    users: Users, settings: Any, monkeypatch: pytest.MonkeyPatch, clock: types.SimpleNamespace
) -> None:
    # given a writer whose batches take 15 ms to store, a 20 ms flush interval, and a model that
    # yields a chunk every 25 ms (on its own schedule: a slow commit does not delay the next chunk),
    # all on the writer's clock, which the test moves: a loaded machine cannot shift the 5 ms between
    settings.AGENTS_CHUNK_FLUSH_MS = 20
    agent = chat_agent(users.alice)
    later = timezone.now() + timedelta(minutes=1)
    run = make_run(workflow="agents.turn", status=RunStatus.RUNNING, lease_owner="me", lease_expires_at=later)
    turn = Turn.objects.create(agent=agent, number=1, run=run)
    writer = ChunkWriter(turn=turn, run_id=run.pk, owner="me")
    start, store = clock.now, writer._insert

    def slow(batch: list[tuple[str, Any]], *, key: str = "") -> int:
        clock.now += 0.015
        return store(batch, key=key)

    monkeypatch.setattr(writer, "_insert", slow)
    for i in range(1, 5):
        clock.now = start + i * 0.025

        # when the chunk comes
        writer.add("text-delta", {"delta": str(i)})

        # then it is stored then and there, not held until the next one
        assert Chunk.objects.filter(turn=turn).count() == i


@pytest.mark.django_db
def test_an_answer_given_whole_within_the_flush_interval_is_one_batch(
    users: Users, settings: Any, clock: types.SimpleNamespace
) -> None:
    # given a 50 ms flush interval, and a writer that has just started (a model round)
    settings.AGENTS_CHUNK_FLUSH_MS = 50
    agent = chat_agent(users.alice)
    later = timezone.now() + timedelta(minutes=1)
    run = make_run(workflow="agents.turn", status=RunStatus.RUNNING, lease_owner="me", lease_expires_at=later)
    turn = Turn.objects.create(agent=agent, number=1, run=run)
    writer = ChunkWriter(turn=turn, run_id=run.pk, owner="me")

    # when a model yields its whole answer at once
    for word in ("all", " at", " once"):
        writer.add("text-delta", {"delta": word})

    # then nothing is stored until the round's end stores it, in one batch
    assert not Chunk.objects.filter(turn=turn).exists()
    with CaptureQueriesContext(connection) as queries:
        writer.close()
    assert [q["sql"].split()[0] for q in queries.captured_queries] == ["INSERT"]
    assert list(Chunk.objects.filter(turn=turn).values_list("seq", flat=True).order_by("seq")) == [1, 2, 3]

    # and a model slower to begin than the interval has its first chunk stored at once
    slower = ChunkWriter(turn=turn, run_id=run.pk, owner="me")
    clock.now += 0.06
    slower.add("text-delta", {"delta": "late"})
    assert Chunk.objects.filter(turn=turn).count() == 4


def test_a_tool_schema_comes_from_its_signature_and_docstring() -> None:
    @tool
    def lookup(
        ctx: ToolContext,
        number: str,
        amount: Decimal,
        count: int = 1,
        ratio: float | None = None,
        urgent: bool = False,
        mode: Literal["fast", "slow"] = "fast",
        tags: list[str] | None = None,
        extra: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Find an order.

        Longer words that are not the description.

        Args:
            number: the order's number,
                as printed on the receipt.
            amount (Decimal): how much.
        """
        return {}

    assert lookup.name == "lookup"
    assert lookup.description == "Find an order."
    assert lookup.decimals == frozenset({"amount"})
    props = lookup.parameters["properties"]
    assert lookup.parameters["required"] == ["number", "amount"]
    assert lookup.parameters["additionalProperties"] is False
    assert props["number"] == {"type": "string", "description": "the order's number, as printed on the receipt."}
    assert props["amount"]["type"] == "string" and props["amount"]["description"] == "how much."
    assert props["count"] == {"type": "integer", "default": 1}
    assert props["ratio"] == {"anyOf": [{"type": "number"}, {"type": "null"}], "default": None}
    assert props["urgent"] == {"type": "boolean", "default": False}
    assert props["mode"] == {"enum": ["fast", "slow"], "type": "string", "default": "fast"}
    assert props["tags"]["anyOf"][0] == {"type": "array", "items": {"type": "string"}}
    assert props["extra"]["anyOf"][0] == {"type": "object"}
    assert "ctx" not in props


def test_a_tool_with_an_unsupported_type_is_refused_when_declared() -> None:
    from agents.registry import ToolDefinitionError

    with pytest.raises(ToolDefinitionError):

        @tool
        def odd(ctx: ToolContext, when: object) -> None:
            """Odd."""

    assert schema_of(lambda ctx: None)[0]["properties"] == {}


def test_agents_list_names_the_registered_kinds() -> None:
    from io import StringIO

    from django.core.management import call_command

    out = StringIO()
    call_command("agents", "list", stdout=out)
    line = next(line for line in out.getvalue().splitlines() if line.startswith("test.chat\t"))
    assert "tests.agents_fixtures.TestChat" in line and "tools record, refund, pay, explode" in line
