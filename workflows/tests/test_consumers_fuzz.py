"""``/ws/runs/<id>/`` fed random and malformed frames against a real daphne: every frame the protocol
does not allow is answered ``{"type": "error", ...}`` on a connection that stays open (a snapshot
asked for afterwards still comes), and nothing is written: no row of any table changes, and the run's
progress stream gets no event.

The frames come from a seeded generator (``FUZZ_EXAMPLES`` x 10 random frames, default 150, plus
the fixed ones below), so a run is repeatable; ``FUZZ_SEED`` picks another sequence.
Two kinds of frame never reach the consumer: text that is not UTF-8 and a message larger than
daphne's limit (``--websocket-max-message-size``, 1 MiB by default): daphne fails those connections,
as the WebSocket protocol says; their tests check that, that nothing is written, and that the next
connection is served.
"""

from __future__ import annotations

import json
import os
import random
import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection

from tests.factories import Users, make_run
from tests.support import AsgiServer, serving
from workflows import streams
from workflows.consumers import LEADING_TYPE, MAX_MESSAGE_CHARS
from workflows.models import WorkflowRun
from workflows.tests.test_consumers import TIMEOUT, open_socket, receive

pytestmark = pytest.mark.django_db(transaction=True)

EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "15"))
SEED = int(os.environ.get("FUZZ_SEED", "20261130"))
Frame = str | bytes


# --- what must not change -----------------------------------------------------------------------------
def database_fingerprint() -> dict[str, tuple[int, str]]:
    """Every table's row count and a digest of all its rows."""
    fingerprint = {}
    with connection.cursor() as cursor:
        for table in connection.introspection.table_names():
            quoted = connection.ops.quote_name(table)
            cursor.execute(
                f"SELECT count(*), md5(coalesce(string_agg(t::text, '|' ORDER BY t::text), '')) FROM {quoted} t"
            )
            count, digest = cursor.fetchone()
            fingerprint[table] = (count, digest)
    return fingerprint


# --- frames -------------------------------------------------------------------------------------------
NEAR_MISSES = [
    "Snapshot",
    "snapshot ",
    " resume",
    "RESUME",
    "resumes",
    "",
    "error",
    "progress",
    "replay_complete",
    "snap\x00shot",
    "résumé",
    "\ud800",
    "type",
]
BAD_AFTERS: list[Any] = [
    "3",
    "",
    -1,
    -(2**63),
    2**53,
    2**60,
    10**100,
    1.5,
    0.0,
    -0.0,
    1e308,
    True,
    False,
    None,
    [],
    [1],
    {},
    {"after": 1},
    "NaN",
]


def random_json(rng: random.Random, depth: int = 0) -> Any:
    kind = rng.choice(["null", "bool", "int", "float", "str", "list", "dict"] if depth < 4 else ["int", "str"])
    if kind == "null":
        return None
    if kind == "bool":
        return rng.random() < 0.5
    if kind == "int":
        return rng.choice([0, -1, 1, 2**31, 2**53, 2**64, -(2**70), rng.randint(-(10**6), 10**6)])
    if kind == "float":
        return rng.choice([0.5, -1e-300, 1e308, rng.uniform(-1e6, 1e6)])
    if kind == "str":
        return (
            "".join(
                chr(rng.choice([rng.randint(32, 126), rng.randint(0, 0x2FF), rng.randint(0x300, 0xFFFF)]))
                for _ in range(rng.randint(0, 20))
            )
            .encode("utf-8", "replace")
            .decode("utf-8", "replace")
        )
    if kind == "list":
        return [random_json(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    return {
        random_json(rng, 4) if rng.random() < 0.8 else "type": random_json(rng, depth + 1)
        for _ in range(rng.randint(0, 4))
    }


def random_frame(rng: random.Random) -> Frame:
    """A frame the protocol does not allow: never a snapshot request or a resume with a valid ``after``."""
    roll = rng.random()
    if roll < 0.15:
        return rng.randbytes(rng.randint(0, 200))  # a binary frame
    if roll < 0.3:  # text that is not JSON
        return rng.choice(
            [
                "{",
                "}",
                "[1,",
                "'snapshot'",
                '{"type": "snapshot"',
                "nul",
                "01",
                "{'a': 1}",
                "\x00",
                '{"type": "snapshot"} x',
            ]
        ) + random_text(rng)
    if roll < 0.55:
        message: dict[str, Any] = {"type": "resume", "after": rng.choice(BAD_AFTERS)}
        if rng.random() < 0.3:
            del message["after"]
        return json.dumps(message)
    if roll < 0.75:
        return json.dumps({"type": rng.choice(NEAR_MISSES + [random_json(rng)]), "after": random_json(rng)})
    value = random_json(rng)
    if isinstance(value, dict) and value.get("type") in ("snapshot", "resume"):
        value["type"] = "snapshot?"
    return json.dumps(value)


def random_text(rng: random.Random) -> str:
    return "".join(chr(rng.randint(32, 0x7E)) for _ in range(rng.randint(0, 30)))


FIXED_FRAMES: list[tuple[str, Frame]] = [
    ("empty text", ""),
    ("empty binary", b""),
    ("binary JSON", json.dumps({"type": "snapshot"}).encode()),
    ("NUL byte", "\x00"),
    ("JSON null", "null"),
    ("a JSON string", '"snapshot"'),
    ("a number", "5"),
    ("an array", '["snapshot"]'),
    ("NaN after", '{"type": "resume", "after": NaN}'),
    ("Infinity after", '{"type": "resume", "after": Infinity}'),
    ("a 5,000-digit after", '{"type": "resume", "after": ' + "9" * 5000 + "}"),
    ("a lone surrogate", '{"type": "\\ud800"}'),
    ("type of 10,000 characters", json.dumps({"type": "x" * 10_000})),
    ("type nested 500 deep", '{"type": ' + "[" * 500 + "]" * 500 + "}"),
    ("100,000 [", "[" * 100_000),
    ("4,000 [, within the size limit", "[" * 4_000),
    ("nested 2,000 deep, well-formed", "[" * 2_000 + "]" * 2_000),
    ("just above the consumer's limit", json.dumps({"type": "snapshot", "pad": "x" * MAX_MESSAGE_CHARS})),
    ("900 KB of JSON", json.dumps([0] * 300_000)),
    ("900 KB binary", bytes(900_000)),
]


# --- servers --------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def asgi_server(django_db_setup: None, django_db_blocker: Any) -> Iterator[AsgiServer]:
    """A daphne of this module's own that reads every message: the frames here go back to back,
    hundreds a second, far past WEBSOCKET_MAX_FRAMES_PER_SECOND (tested on its own below)."""
    with serving(django_db_blocker, WEBSOCKET_MAX_FRAMES_PER_SECOND="0") as server:
        yield server


@pytest.fixture(scope="module")
def limited_server(django_db_setup: None, django_db_blocker: Any) -> Iterator[AsgiServer]:
    with serving(django_db_blocker, WEBSOCKET_MAX_FRAMES_PER_SECOND="5") as server:
        yield server


# --- helpers --------------------------------------------------------------------------------------------
def assert_error_and_open(ws: ClientConnection, frame: Frame, what: str) -> None:
    ws.send(frame)
    answer = receive(ws)
    assert answer["type"] == "error" and isinstance(answer["message"], str) and answer["message"], (what, answer)
    assert len(answer["message"]) < 500, (what, "the error must not echo the whole frame")


def assert_still_serves(ws: ClientConnection, run: WorkflowRun) -> None:
    ws.send(json.dumps({"type": "snapshot"}))
    snapshot = receive(ws)
    assert snapshot["type"] == "snapshot" and snapshot["run"]["id"] == str(run.id), snapshot


# --- tests ------------------------------------------------------------------------------------------------
def test_malformed_frames_are_answered_with_an_error_on_a_connection_that_stays_open(
    asgi_server: AsgiServer, users: Users
) -> None:
    # given alice watching her run, and everything as it is
    alice = users.alice
    run = make_run(owner=alice)
    with open_socket(asgi_server, run.id, alice) as ws:
        assert receive(ws)["type"] == "snapshot"
        before, seq_before = database_fingerprint(), streams.current_seq(run.id)

        # when she sends each malformed frame, then random ones, with a snapshot request now and then
        for what, frame in FIXED_FRAMES:
            assert_error_and_open(ws, frame, what)
        assert_still_serves(ws, run)
        rng = random.Random(SEED)
        for n in range(EXAMPLES * 10):
            frame = random_frame(rng)
            assert_error_and_open(ws, frame, f"random frame {n}: {frame[:200]!r}")
            if n % 25 == 24:
                assert_still_serves(ws, run)

        # then every one got an error, the connection still serves, and nothing was written
        assert_still_serves(ws, run)
        ws.send(json.dumps({"type": "resume", "after": 0}))
        assert receive(ws) == {"type": "replay_complete", "seq": seq_before}
    assert database_fingerprint() == before
    assert streams.current_seq(run.id) == seq_before


@pytest.mark.parametrize(
    "frame",
    [
        pytest.param(b"\xff\xfe\xfd", id="not UTF-8"),
        pytest.param(b'{"type": "snapshot"}\xc3', id="a truncated character"),
        pytest.param("\ud800".encode("utf-8", "surrogatepass"), id="an encoded surrogate"),
    ],
)
def test_a_text_frame_that_is_not_utf8_closes_the_connection_and_writes_nothing(
    asgi_server: AsgiServer, users: Users, frame: bytes
) -> None:
    alice = users.alice
    run = make_run(owner=alice)
    with open_socket(asgi_server, run.id, alice) as ws:
        assert receive(ws)["type"] == "snapshot"
        before = database_fingerprint()

        ws.send(frame, text=True)

        # the WebSocket protocol's answer (RFC 6455 section 8.1): daphne fails the connection
        with pytest.raises(ConnectionClosed):
            receive(ws)
    assert database_fingerprint() == before
    # and a new connection is served as before
    with open_socket(asgi_server, run.id, alice) as ws:
        assert receive(ws)["type"] == "snapshot"


def test_a_message_over_daphnes_limit_closes_the_connection_and_writes_nothing(
    asgi_server: AsgiServer, users: Users
) -> None:
    alice = users.alice
    run = make_run(owner=alice)
    with open_socket(asgi_server, run.id, alice) as ws:
        assert receive(ws)["type"] == "snapshot"
        before = database_fingerprint()

        # daphne may close the connection while the client is still writing
        # the frame, so the send itself can be what finds it closed.
        with pytest.raises(ConnectionClosed):
            ws.send(json.dumps({"type": "snapshot", "pad": "x" * (2 * 1024 * 1024)}))
            receive(ws, timeout=TIMEOUT)
    assert database_fingerprint() == before
    with open_socket(asgi_server, run.id, alice) as ws:
        assert receive(ws)["type"] == "snapshot"


def test_a_client_sending_past_its_rate_is_answered_with_errors_and_not_read(
    limited_server: AsgiServer, users: Users
) -> None:
    # given alice watching her run on a server that reads 5 messages a second, 10 at once
    alice = users.alice
    run = make_run(owner=alice)
    with open_socket(limited_server, run.id, alice) as ws:
        assert receive(ws)["type"] == "snapshot"

        # when she sends 40 snapshot requests back to back
        started = time.monotonic()
        for _ in range(40):
            ws.send(json.dumps({"type": "snapshot"}))
        answers = [receive(ws) for _ in range(40)]
        elapsed = time.monotonic() - started

        # then the burst and what the rate allows meanwhile are read, each other one refused
        read = [a for a in answers if a["type"] == "snapshot"]
        refused = [a for a in answers if a["type"] == "error"]
        assert len(read) + len(refused) == 40
        assert 10 <= len(read) <= 10 + 5 * elapsed + 1, (len(read), elapsed)
        assert refused and all(a["message"].startswith("too many messages: at most 5 a second") for a in refused)
        # each saying what it refused and when one more is read
        assert all(a["about"] == "snapshot" and a["retry_after"] == 0.2 for a in refused), refused[0]

        # and after a pause she is read again, on the same connection
        time.sleep(1)
        ws.send(json.dumps({"type": "snapshot"}))
        assert receive(ws)["type"] == "snapshot"


def test_a_refused_frames_type_is_read_from_its_first_characters_only() -> None:
    # a frame refused unread is not parsed (tens of kilobytes of JSON would cost more than the
    # refusal saves): its type is what it starts with, as the pages write it
    def leading(text: str) -> str | None:
        found = LEADING_TYPE.match(text, 0, 64)
        return found.group(1) if found else None

    assert leading('{"type": "message", "text": "hello"}') == "message"
    assert leading(' { "type" : "resume", "turn": "t", "after": 0}') == "resume"
    assert leading('{"text": "hello", "type": "message"}') is None  # the type elsewhere: not looked for
    assert leading("[" + "0," * 30_000 + "0]") is None
    assert leading(" " * 70 + '{"type": "message"}') is None  # nothing past the first characters is read
