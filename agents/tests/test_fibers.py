"""Fibers: an agent's durable background jobs, with real workers (and their process groups SIGKILLed
mid-fiber), a real daphne for the pushes, and the refusals that need no worker."""

from __future__ import annotations

import json
import time
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.db import transaction
from django.test import Client
from django.urls import reverse

from agents.fibers import FiberConflict, FiberContext, FiberNotCancellable, InvalidFiber, fiber_data
from agents.models import FIBER_ENDED, Agent, Fiber, FiberStatus
from agents.services import fiber_cancel, fiber_start
from agents.tests.support import chat_agent
from tests.agents_fixtures import FiberAgent, broken_fiber, count, count_items
from tests.factories import Users
from tests.fixtures import NoEnqueue
from tests.support import AsgiServer, Worker, wait_for, wait_for_terminal, websocket
from workflows.hooks import fire_run_failed
from workflows.models import RunStatus, WorkflowRun
from workflows.tests.test_consumers import TIMEOUT, receive, session_cookie

pytestmark = pytest.mark.django_db(transaction=True)

COUNT_ITEMS = "tests.agents_fixtures:count_items"


def fiber_agent(user: User) -> FiberAgent:
    return FiberAgent(chat_agent(user, kind="test.fibers"))


def wait_fiber(fiber: Fiber, timeout: float = 60.0) -> Fiber:
    def ended() -> Fiber | None:
        fresh = Fiber.objects.get(pk=fiber.pk)
        return fresh if fresh.status in FIBER_ENDED else None

    return wait_for(ended, timeout=timeout, what=f"fiber {fiber.name} to end")


def run_status(fiber: Fiber) -> str:
    assert fiber.run_id is not None
    return str(WorkflowRun.objects.get(pk=fiber.run_id).status)


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


# --- starting: what is refused, and idempotency keys (no worker) ----------------------------------------
def test_a_fiber_function_must_be_importable_by_name(users: Users) -> None:
    # given alice's agent
    agent = fiber_agent(users.alice)

    def closure(ctx: FiberContext) -> None:
        pass

    # then a lambda, a closure, a method, a bad or unknown path are refused, saying why, and nothing is stored
    with pytest.raises(InvalidFiber, match="is a lambda"):
        agent.run_fiber("x", lambda ctx: None)
    with pytest.raises(InvalidFiber, match="is a closure or a method"):
        agent.run_fiber("x", closure)
    with pytest.raises(InvalidFiber, match="module-level function"):
        agent.run_fiber("x", agent.on_fiber_recovered)
    with pytest.raises(InvalidFiber, match="module:function"):
        agent.run_fiber("x", "tests.agents_fixtures.count_items")
    with pytest.raises(InvalidFiber, match="cannot be imported"):
        agent.run_fiber("x", "tests.agents_fixtures:no_such_function")
    with pytest.raises(InvalidFiber, match="module-level function"):
        agent.run_fiber("x", print)
    assert not Fiber.objects.exists()


def test_the_same_idempotency_key_returns_the_same_fiber_and_another_use_of_it_conflicts(
    users: Users, tmp_path: Path
) -> None:
    # given a fiber started with a key
    agent = fiber_agent(users.alice)
    data = {"path": str(tmp_path / "items"), "items": 1}
    first = agent.run_fiber("count", count_items, "key-1", input=data, user=users.alice)

    # when it is started again with the same key, by function or by path
    again = agent.run_fiber("count", count_items, "key-1", input=data)
    by_path = fiber_start(agent=agent.row, name="count", fn=COUNT_ITEMS, input=data, idempotency_key="key-1")  # type: ignore[arg-type]

    # then it is the same fiber, with one run
    assert again.pk == by_path.pk == first.pk
    assert Fiber.objects.count() == 1
    assert WorkflowRun.objects.filter(workflow="agents.fiber").count() == 1
    assert first.run is not None and first.run.owner_id == users.alice.pk
    assert first.fn == COUNT_ITEMS and first.status == FiberStatus.PENDING

    # and the same key with another name, function or input is a conflict
    with pytest.raises(FiberConflict):
        agent.run_fiber("other", count_items, "key-1", input=data)
    with pytest.raises(FiberConflict):
        agent.run_fiber("count", broken_fiber, "key-1", input=data)
    with pytest.raises(FiberConflict):
        agent.run_fiber("count", count_items, "key-1", input={**data, "items": 2})
    # while another key, or none, starts another fiber
    assert agent.run_fiber("count", count_items, "key-2", input=data).pk != first.pk
    assert agent.run_fiber("count", count_items, input=data).pk != first.pk
    assert Fiber.objects.count() == 3


# --- running, with a worker -------------------------------------------------------------------------------
def test_a_fiber_runs_in_a_worker_its_result_is_stored_and_the_agents_clients_are_told(
    users: Users, tmp_path: Path, asgi_server: AsgiServer, worker: Worker
) -> None:
    # given alice's chat socket on her agent
    agent = fiber_agent(users.alice)
    path = tmp_path / "items"
    url, cookie = f"{asgi_server.ws_url}/ws/agents/test.fibers/t/", session_cookie(users.alice)
    with websocket(url, origin=asgi_server.url, cookie=cookie, timeout=TIMEOUT) as ws:
        assert receive(ws)["type"] == "snapshot"

        # when a fiber of three items runs
        fiber = agent.run_fiber("count", count_items, input={"path": str(path), "items": 3})
        frames = [receive(ws, timeout=30)]
        while frames[-1]["status"] not in FIBER_ENDED:
            frames.append(receive(ws, timeout=30))

    # then it completes with the function's result, each item done once, stashed as it went
    fiber = wait_fiber(fiber)
    assert fiber.status == FiberStatus.COMPLETED, fiber.end_reason
    assert fiber.result == {"items": 3, "attempt": 1}
    assert lines(path) == ["item 1", "item 2", "item 3"]
    assert fiber.stash == {"done": 3} and fiber.stash_version == 3 and fiber.attempts == 1
    # (its run ends in the commit after the step that ended the fiber: waited for, not raced)
    assert fiber.run_id is not None and wait_for_terminal(fiber.run_id).status == RunStatus.COMPLETED
    assert not (tmp_path / "items.recovered").exists()
    # and the agent's clients were told each change of its status, as fiber frames
    assert all(f["type"] == "fiber" and f["id"] == str(fiber.pk) and f["name"] == "count" for f in frames)
    # ('pending' comes from this process and 'running' from the worker: when they cross, the socket
    # drops the older, test_consumers.py)
    assert [f["status"] for f in frames] in (["pending", "running", "completed"], ["running", "completed"])


def test_a_fiber_whose_function_raises_fails_with_the_error_and_is_not_retried(users: Users, worker: Worker) -> None:
    agent = fiber_agent(users.alice)
    fiber = agent.run_fiber("broken", broken_fiber, input={"path": "unused"})

    fiber = wait_fiber(fiber)
    assert fiber.status == FiberStatus.FAILED
    assert fiber.error is not None and fiber.error["type"] == "RuntimeError"
    assert fiber.end_reason == "RuntimeError: the fiber broke"
    assert fiber.attempts == 1 and fiber.result is None
    # and members are told it failed, not the exception's text (staff read that in the admin)
    assert fiber_data(fiber)["end_reason"] == "it failed"


# --- crashes ------------------------------------------------------------------------------------------
def start_and_kill(agent: FiberAgent, path: Path, queue: str, workers: list[Worker], **input: Any) -> Fiber:
    """Start a fiber of ten items whose first attempt hangs after item 3; SIGKILL the worker's process
    group there; start another worker."""
    workers.append(Worker(queue=queue, beat=True))
    fiber = agent.run_fiber("count", count_items, input={"path": str(path), "items": 10, "hang_after": 3, **input})
    wait_for(lambda: Path(f"{path}.hung").exists(), timeout=60, what="the fiber to reach item 3")
    workers[0].kill()
    workers.append(Worker(queue=queue, beat=True))
    return fiber


@pytest.mark.slow
def test_a_fiber_killed_mid_way_is_recovered_from_its_stash_and_does_each_item_once(
    users: Users, tmp_path: Path, queue: str, workers: list[Worker]
) -> None:
    # given a fiber that stashed item 3 as done when its worker's process group was SIGKILLed
    agent = fiber_agent(users.alice)
    path = tmp_path / "items"
    fiber = start_and_kill(agent, path, queue, workers)

    # then it completes, on its second attempt
    fiber = wait_fiber(fiber)
    assert fiber.status == FiberStatus.COMPLETED, fiber.end_reason
    assert fiber.attempts == 2
    assert fiber.result == {"items": 10, "attempt": 2}
    # and on_fiber_recovered was shown the last stash, once
    seen = [json.loads(line) for line in lines(Path(f"{path}.recovered"))]
    assert seen == [{"name": "count", "attempt": 2, "recovered": True, "stashed": {"done": 3}}]
    # and the function went on from it: each item done exactly once
    assert lines(Path(f"{path}.attempts")) == ["1 0", "2 3"]
    assert lines(path) == [f"item {i}" for i in range(1, 11)]
    assert fiber.stash == {"done": 10}


@pytest.mark.slow
def test_an_agent_may_restart_a_recovered_fiber_from_scratch(
    users: Users, tmp_path: Path, queue: str, workers: list[Worker]
) -> None:
    agent = fiber_agent(users.alice)
    path = tmp_path / "items"
    fiber = start_and_kill(agent, path, queue, workers, on_recovery="restart")

    fiber = wait_fiber(fiber)
    assert fiber.status == FiberStatus.COMPLETED, fiber.end_reason
    assert lines(Path(f"{path}.attempts")) == ["1 0", "2 0"]  # the stash was cleared first
    assert lines(path) == [f"item {i}" for i in (1, 2, 3, *range(1, 11))]


@pytest.mark.slow
def test_an_agent_may_cancel_a_recovered_fiber(users: Users, tmp_path: Path, queue: str, workers: list[Worker]) -> None:
    agent = fiber_agent(users.alice)
    path = tmp_path / "items"
    fiber = start_and_kill(agent, path, queue, workers, on_recovery="cancel")

    fiber = wait_fiber(fiber)
    assert fiber.status == FiberStatus.CANCELLED
    assert fiber.end_reason == "cancelled on recovery (attempt 2)"
    assert fiber.stash == {"done": 3}  # kept, for whoever looks
    assert lines(Path(f"{path}.attempts")) == ["1 0"]  # the function did not run again
    assert lines(path) == ["item 1", "item 2", "item 3"]
    assert fiber.run_id is not None and wait_for_terminal(fiber.run_id).status == RunStatus.COMPLETED


# --- cancel ------------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_a_cancelled_fiber_stores_nothing_more_and_a_worker_restart_does_not_revive_it(
    users: Users, tmp_path: Path, queue: str, workers: list[Worker]
) -> None:
    # given a fiber working slowly through many items
    agent = fiber_agent(users.alice)
    path = tmp_path / "items"
    workers.append(Worker(queue=queue, beat=True))
    fiber = agent.run_fiber("count", count_items, input={"path": str(path), "items": 200, "delay": 0.1})
    wait_for(lambda: Fiber.objects.get(pk=fiber.pk).stash_version >= 3, what="three items stashed")

    # when alice cancels it
    fiber = fiber_cancel(fiber=fiber, user=users.alice)

    # then it is cancelled, its run terminated, and its function's next stash is fenced out: it stops
    assert fiber.status == FiberStatus.CANCELLED and fiber.end_reason == "cancelled by alice"
    assert run_status(fiber) == RunStatus.TERMINATED
    version = Fiber.objects.get(pk=fiber.pk).stash_version
    time.sleep(1.0)
    done = count(str(path))
    assert done <= version + 1  # at most the item in flight when it was cancelled
    # and a worker restart does not revive it
    workers[0].kill()
    workers.append(Worker(queue=queue, beat=True))
    time.sleep(3.0)  # longer than a lease: a revived run would have done items by now
    fresh = Fiber.objects.get(pk=fiber.pk)
    assert fresh.status == FiberStatus.CANCELLED and fresh.stash_version == version
    assert count(str(path)) == done
    # and an ended fiber cannot be cancelled again
    with pytest.raises(FiberNotCancellable):
        fiber_cancel(fiber=fresh, user=users.alice)


def test_cancelling_a_fiber_no_worker_began_cancels_it_and_its_run(
    users: Users, tmp_path: Path, no_enqueue: NoEnqueue
) -> None:
    # (no_enqueue: a worker of another test of this process would otherwise take and finish it first)
    agent = fiber_agent(users.alice)
    fiber = agent.run_fiber("count", count_items, input={"path": str(tmp_path / "items"), "items": 1})

    fiber = fiber_cancel(fiber=fiber, user=None)

    assert fiber.status == FiberStatus.CANCELLED and fiber.end_reason == "cancelled by someone"
    assert run_status(fiber) == RunStatus.TERMINATED


def test_fibers_belong_to_their_agent(users: Users, tmp_path: Path) -> None:
    agent = fiber_agent(users.alice)
    other = Agent.objects.create(account=agent.row.account, kind="test.fibers", name="other")  # type: ignore[union-attr]
    data = {"path": str(tmp_path / "items"), "items": 1}
    mine = agent.run_fiber("count", count_items, "same-key", input=data)
    theirs = FiberAgent(other).run_fiber("count", count_items, "same-key", input=data)
    assert mine.pk != theirs.pk  # keys are scoped to the agent
    assert list(other.fibers.all()) == [theirs]


def test_staff_read_an_agents_fibers_in_the_admin_and_cannot_change_them(
    users: Users, tmp_path: Path, admin_client: Client
) -> None:
    agent = fiber_agent(users.alice)
    assert agent.row is not None
    fiber = agent.run_fiber("count", count_items, "k", input={"path": str(tmp_path / "items"), "items": 1})

    page = admin_client.get(reverse("admin:agents_agent_change", args=[agent.row.pk]))
    assert page.status_code == 200
    assert "count" in page.content.decode() and COUNT_ITEMS in page.content.decode()
    page = admin_client.get(reverse("admin:agents_fiber_change", args=[fiber.pk]))
    assert page.status_code == 200
    assert str(fiber.run_id) in page.content.decode()
    assert admin_client.get(reverse("admin:agents_fiber_changelist")).status_code == 200
    assert admin_client.post(reverse("admin:agents_fiber_delete", args=[fiber.pk]), {"post": "yes"}).status_code == 403
    assert Fiber.objects.filter(pk=fiber.pk).exists()


def test_manage_py_agents_fibers_lists_the_newest_fibers(users: Users, tmp_path: Path, no_enqueue: NoEnqueue) -> None:
    # (no_enqueue: no worker of another test takes the pending fiber between the two listings)
    agent = fiber_agent(users.alice)
    data = {"path": str(tmp_path / "items"), "items": 1}
    done = agent.run_fiber("first", count_items, input=data)
    fiber_cancel(fiber=done, user=users.alice)
    pending = agent.run_fiber("second", count_items, input=data)

    out = StringIO()
    call_command("agents", "fibers", stdout=out)
    listed = out.getvalue().splitlines()
    assert [line.split("\t")[:4] for line in listed] == [
        [str(pending.pk), "acme/test.fibers/t", "second", "pending"],
        [str(done.pk), "acme/test.fibers/t", "first", "cancelled"],
    ]
    assert listed[1].endswith("cancelled by alice")

    out = StringIO()
    call_command("agents", "fibers", "--status", "pending", stdout=out)
    assert [line.split("\t")[2] for line in out.getvalue().splitlines()] == ["second"]

    # and a listing with nothing in it says so
    out = StringIO()
    call_command("agents", "fibers", "--status", "running", stdout=out)
    assert out.getvalue() == "No running fibers.\n"


def test_a_fiber_whose_run_the_engine_failed_is_failed_when_the_agent_next_starts_one(
    users: Users, tmp_path: Path
) -> None:
    # given a fiber whose run the engine failed outside its steps (too many lost workers)
    agent = fiber_agent(users.alice)
    data = {"path": str(tmp_path / "items"), "items": 1}
    stuck = agent.run_fiber("count", count_items, input=data)
    Fiber.objects.filter(pk=stuck.pk).update(status=FiberStatus.RUNNING)
    error = {"type": "MaxRecoveryAttempts", "message": "the run's worker was lost 6 times"}
    WorkflowRun.objects.filter(agent_fiber=stuck).update(status=RunStatus.FAILED, error=error)

    # when the agent starts another
    agent.run_fiber("count", count_items, input=data)

    # then the stuck one has failed, saying why
    stuck = Fiber.objects.get(pk=stuck.pk)
    assert stuck.status == FiberStatus.FAILED
    assert stuck.end_reason == "its run ended: the run's worker was lost 6 times"
    assert stuck.error == error


def test_a_fiber_whose_run_the_engine_fails_fails_at_once(users: Users, tmp_path: Path) -> None:
    # given a running fiber
    agent = fiber_agent(users.alice)
    fiber = agent.run_fiber("count", count_items, input={"path": str(tmp_path / "items"), "items": 1})
    Fiber.objects.filter(pk=fiber.pk).update(status=FiberStatus.RUNNING)

    # when the engine fails its run outside its steps (and fires the hook, the run row locked)
    error = {"type": "MaxRecoveryAttempts", "message": "the run's worker was lost 6 times"}
    with transaction.atomic():
        WorkflowRun.objects.filter(agent_fiber=fiber).update(status=RunStatus.FAILED, error=error)
        fire_run_failed(WorkflowRun.objects.select_for_update().get(agent_fiber=fiber))

    # then the fiber has failed, saying why, without waiting for the agent's next fiber
    fiber = Fiber.objects.get(pk=fiber.pk)
    assert (fiber.status, fiber.end_reason) == (FiberStatus.FAILED, "its run ended: the run's worker was lost 6 times")
