"""The ASGI server keeps no database connection once its requests are answered: persistent
connections in its thread pool piled up one per thread until PostgreSQL refused everyone else."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator

import httpx
import pytest
from django.db import connection

from tests.support import AsgiServer, wait_for

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def named_server() -> Iterator[tuple[AsgiServer, str]]:
    """A daphne whose database connections carry an application name of their own (libpq's
    PGAPPNAME), so this test counts only them."""
    name = f"daphne-{uuid.uuid4().hex[:8]}"
    server = AsgiServer(PGAPPNAME=name)
    yield server, name
    server.stop()


def connections_of(name: str) -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", [name])
        (count,) = cursor.fetchone()
    return int(count)


def test_a_burst_of_requests_leaves_no_database_connection_behind(named_server: tuple[AsgiServer, str]) -> None:
    server, name = named_server
    barrier = threading.Barrier(30)
    statuses: list[int] = []

    def call() -> None:
        barrier.wait()
        # A token the database must be asked about: every request uses a connection.
        response = httpx.get(f"{server.url}/api/runs", headers={"Authorization": "Token " + "0" * 40}, timeout=60)
        statuses.append(response.status_code)

    # when 30 requests arrive at once
    threads = [threading.Thread(target=call) for _ in range(30)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=90)

    # then each was answered, and once they are, the server holds no connection
    assert statuses == [401] * 30
    wait_for(lambda: connections_of(name) == 0, timeout=10, what="daphne's connections to close")
    time.sleep(1)
    assert connections_of(name) == 0
