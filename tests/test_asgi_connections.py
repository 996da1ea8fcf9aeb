"""The ASGI server borrows its database connections from a bounded pool (DATABASE_POOL, set by
config/asgi.py): persistent connections of its own once piled up one per thread until PostgreSQL
refused everyone else, and opening one per visit made every read of a socket pay for a new
PostgreSQL process."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator

import httpx
import pytest
from django.db import connection

from tests.support import AsgiServer

pytestmark = pytest.mark.django_db(transaction=True)

POOL_MAX = 4
BAD_TOKEN = {"Authorization": "Token " + "0" * 40}  # a token the database must be asked about


@pytest.fixture
def named_server() -> Iterator[tuple[AsgiServer, str]]:
    """A daphne with a pool of at most POOL_MAX whose connections carry an application name of
    their own (libpq's PGAPPNAME), so this test counts only them."""
    name = f"daphne-{uuid.uuid4().hex[:8]}"
    server = AsgiServer(PGAPPNAME=name, DATABASE_POOL_MAX_SIZE=str(POOL_MAX))
    yield server, name
    server.stop()


def backends_of(name: str) -> set[int]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pid FROM pg_stat_activity WHERE application_name = %s", [name])
        return {pid for (pid,) in cursor.fetchall()}


def test_requests_one_after_another_reuse_the_pools_connections(named_server: tuple[AsgiServer, str]) -> None:
    server, name = named_server
    seen: list[set[int]] = []

    # when requests that each use the database come one after another
    for _ in range(10):
        assert httpx.get(f"{server.url}/api/runs", headers=BAD_TOKEN, timeout=30).status_code == 401
        seen.append(backends_of(name))

    # then they were served by the same few connections, kept open between them
    assert all(1 <= len(backends) <= POOL_MAX for backends in seen), seen
    assert len(set().union(*seen)) <= POOL_MAX, seen


def test_a_burst_of_requests_never_holds_more_connections_than_the_pool(
    named_server: tuple[AsgiServer, str],
) -> None:
    server, name = named_server
    barrier = threading.Barrier(30)
    statuses: list[int] = []
    peak = 0
    done = threading.Event()

    def call() -> None:
        barrier.wait()
        response = httpx.get(f"{server.url}/api/runs", headers=BAD_TOKEN, timeout=60)
        statuses.append(response.status_code)

    # when 30 requests arrive at once, while the server's connections are counted
    threads = [threading.Thread(target=call) for _ in range(30)]
    for thread in threads:
        thread.start()
    while not done.is_set():
        peak = max(peak, len(backends_of(name)))
        done.wait(0.005) if any(t.is_alive() for t in threads) else done.set()
    for thread in threads:
        thread.join(timeout=90)

    # then each was answered, and the server never held more connections than its pool
    assert statuses == [401] * 30
    assert 1 <= peak <= POOL_MAX
    assert len(backends_of(name)) <= POOL_MAX


def test_connections_the_server_ended_are_replaced_without_a_failed_request(
    named_server: tuple[AsgiServer, str],
) -> None:
    # given a server whose pool holds connections, all ended by PostgreSQL while idle (as when it
    # restarts, or an operator terminates them)
    server, name = named_server
    for _ in range(3):
        assert httpx.get(f"{server.url}/api/runs", headers=BAD_TOKEN, timeout=30).status_code == 401
    ended = backends_of(name)
    assert ended
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s", [name])

    # when requests that use the database come next
    statuses = [httpx.get(f"{server.url}/api/runs", headers=BAD_TOKEN, timeout=30).status_code for _ in range(6)]

    # then none failed: the pool's check saw each ended connection and opened another
    assert statuses == [401] * 6
    assert backends_of(name).isdisjoint(ended)
