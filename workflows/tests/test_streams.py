"""The run's progress stream in Redis (``workflows.streams``): numbering, storing and keeping."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from workflows import streams
from workflows.conf import conf


@pytest.fixture
def run_id() -> Iterator[uuid.UUID]:
    run_id = uuid.uuid4()
    yield run_id
    streams.redis_client().delete(*streams._keys(run_id))


def test_an_event_is_stored_as_it_is_returned_and_numbered_from_one(run_id: uuid.UUID) -> None:
    first = streams.publish(run_id, "progress", {"n": 1, "text": 'quote " and \\ and é'})
    second = streams.publish(run_id, "status", {"status": "running", "terminal": False})

    stored = streams.events_after(run_id, 0)
    assert (first, second) == (1, 2) and [e["seq"] for e in stored] == [1, 2]
    assert stored[0]["type"] == "progress" and stored[0]["run"] == str(run_id)
    assert stored[0]["data"] == {"n": 1, "text": 'quote " and \\ and é'}
    assert stored[1]["data"] == {"status": "running", "terminal": False}
    assert streams.current_seq(run_id) == 2


def test_whatever_number_a_reader_sees_every_lower_one_is_already_stored(run_id: uuid.UUID) -> None:
    """The socket fills a gap in live events from the store: an event numbered but not yet stored
    would be missed there and arrive late, out of order."""
    writers, each = 4, 150
    done = threading.Event()
    holes: list[tuple[int, list[int]]] = []

    def write() -> None:
        for n in range(each):
            streams.publish(run_id, "progress", {"n": n})

    def read() -> None:
        while not done.is_set():
            seq = streams.current_seq(run_id)
            found = [e["seq"] for e in streams.events_after(run_id, 0, until=seq)]
            if found != list(range(1, seq + 1)):
                holes.append((seq, found[-3:]))

    reader = threading.Thread(target=read)
    reader.start()
    threads = [threading.Thread(target=write) for _ in range(writers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    done.set()
    reader.join()

    assert holes == []
    assert streams.current_seq(run_id) == writers * each


def test_the_store_keeps_the_newest_events_and_a_live_runs_counter_never_expires(
    run_id: uuid.UUID, settings: Any
) -> None:
    settings.WORKFLOWS = {**settings.WORKFLOWS, "STREAM_MAX_EVENTS": 3, "STREAM_TTL_SECONDS": 60}
    assert conf()["STREAM_MAX_EVENTS"] == 3
    client = streams.redis_client()
    seq_key, events_key = streams._keys(run_id)
    for n in range(5):
        streams.publish(run_id, "progress", {"n": n})

    assert [e["seq"] for e in streams.events_after(run_id, 0)] == [3, 4, 5]
    assert client.ttl(seq_key) == -1  # no expiry while the run may go on
    assert 0 < int(client.ttl(events_key)) <= 60

    streams.publish(run_id, "status", {"status": "completed", "terminal": True})
    assert 0 < int(client.ttl(seq_key)) <= 60  # an ended run's counter goes with its events
    assert [e["seq"] for e in streams.events_after(run_id, 0)] == [4, 5, 6]
