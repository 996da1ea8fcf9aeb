"""Per-run progress streams: best effort, sequence-numbered, resumable.

Each event gets the next number of the run's counter (Redis INCR) and is kept in a capped sorted set
scored by that number (so a client can ask for everything after N), both in one Lua script; then it
is pushed live to the run's Channels group. The database stays the authority: a client's snapshot comes from there.
"""

from __future__ import annotations

import asyncio
import atexit
import json
import logging
import os
import queue
import threading
from collections.abc import Callable
from typing import Any, TypedDict, cast
from uuid import UUID

import redis
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.conf import settings
from django.utils import timezone

from workflows.conf import conf

logger = logging.getLogger(__name__)

_client: tuple[int, redis.Redis] | None = None


class StreamEvent(TypedDict):
    type: str
    seq: int
    run: str
    data: Any
    at: str


def redis_client() -> redis.Redis:
    """One client per process (a forked worker child makes its own)."""
    global _client
    if _client is None or _client[0] != os.getpid():
        _client = (os.getpid(), redis.Redis.from_url(settings.REDIS_URL, socket_timeout=5))
    return _client[1]


def group_name(run_id: UUID | str) -> str:
    return f"run.{UUID(str(run_id)).hex}"


def _keys(run_id: UUID | str) -> tuple[str, str]:
    hex_id = UUID(str(run_id)).hex
    return f"wf:run:{hex_id}:seq", f"wf:run:{hex_id}:events"


def publish(run_id: UUID | str, kind: str, data: Any) -> int | None:
    """Append an event to the run's stream and push it live, now. Returns its seq, or None."""
    event = _store(run_id, kind, data)
    if event is None:
        return None
    layer = get_channel_layer()
    if layer is not None:
        try:
            async_to_sync(layer.group_send)(group_name(run_id), {"type": "run.event", "event": event})
        except Exception:  # best effort: a live push lost is recovered by resume
            logger.warning("live push for run %s failed", run_id, exc_info=True)
    return event["seq"]


# Numbering and storing an event in one step: a client that sees seq N live can always find every
# seq below N in the store (the socket fills a gap from there), so live events arrive in order. Two
# calls let a reader see N while N-1 was numbered but not yet stored. The JSON text around the seq
# comes from Python, so what is stored is exactly what Python's json writes.
STORE_SCRIPT = """
local seq = redis.call('INCR', KEYS[1])
redis.call('ZADD', KEYS[2], seq, ARGV[1] .. seq .. ARGV[2])
redis.call('ZREMRANGEBYRANK', KEYS[2], 0, -tonumber(ARGV[3]) - 1)
redis.call('EXPIRE', KEYS[2], ARGV[4])
if ARGV[5] == '1' then
    redis.call('EXPIRE', KEYS[1], ARGV[4])
else
    redis.call('PERSIST', KEYS[1])
end
return seq
"""

_store_script: tuple[redis.Redis, Any] | None = None


def _store(run_id: UUID | str, kind: str, data: Any) -> StreamEvent | None:
    """Give the event the run's next seq and keep it for resuming clients. None if Redis failed."""
    global _store_script
    conf_ = conf()
    seq_key, events_key = _keys(run_id)
    body = json.dumps({"run": str(run_id), "data": data, "at": timezone.now().isoformat()}, default=str)
    head, tail = f'{{"type": {json.dumps(kind)}, "seq": ', f", {body[1:]}"
    # A live run keeps its counter however long it waits: a counter that expired and restarted at
    # 1 would make every client drop the new events as already seen. A run that ended lets it go.
    ended = kind == "status" and isinstance(data, dict) and bool(data.get("terminal"))
    try:
        client = redis_client()
        if _store_script is None or _store_script[0] is not client:
            _store_script = (client, client.register_script(STORE_SCRIPT))
        seq = int(
            _store_script[1](
                keys=[seq_key, events_key],
                args=[head, tail, conf_["STREAM_MAX_EVENTS"], conf_["STREAM_TTL_SECONDS"], "1" if ended else "0"],
            )
        )
    except redis.RedisError:
        logger.warning("progress stream of run %s unavailable; event dropped", run_id, exc_info=True)
        return None
    # The live push carries exactly what is stored (plain JSON), never what msgpack can't encode.
    event: StreamEvent = json.loads(f"{head}{seq}{tail}")
    return event


# How long a process's exit waits for what it handed the publisher to be sent.
EXIT_FLUSH_SECONDS = 5.0


class _Publisher:
    """One daemon thread per process that publishes events in the order they were handed over.

    Engine and services hand events here instead of publishing inline: a Redis round trip and a
    channel-layer send (which from sync code means an event loop per call) stay off the worker's
    path between steps. The thread keeps one event loop, so the channel layer keeps its
    connections. Best effort, like every progress event: a crash loses what was not yet sent, and
    a resuming client finds the gap closed by the next snapshot.
    """

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[Callable[[asyncio.AbstractEventLoop], None]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._pid = 0
        self._idle = threading.Event()
        self._idle.set()

    def submit(self, run_id: UUID | str, kind: str, data: Any) -> None:
        """Store the event in the run's stream and push it to the run's group."""
        run_key = str(run_id)

        def job(loop: asyncio.AbstractEventLoop) -> None:
            event = _store(run_key, kind, data)
            layer = get_channel_layer()
            if event is not None and layer is not None:
                loop.run_until_complete(layer.group_send(group_name(run_key), {"type": "run.event", "event": event}))

        self._put(job, f"{kind} for run {run_key}")

    def group_send(self, group: str, message: dict[str, Any]) -> None:
        """Push ``message`` to a channel-layer group (for apps whose stream lives in the database)."""

        def job(loop: asyncio.AbstractEventLoop) -> None:
            layer = get_channel_layer()
            if layer is not None:
                loop.run_until_complete(layer.group_send(group, message))

        self._put(job, f"{message.get('type')} to {group}")

    def _put(self, job: Callable[[asyncio.AbstractEventLoop], None], what: str) -> None:
        def logged(loop: asyncio.AbstractEventLoop) -> None:
            try:
                job(loop)
            except Exception:
                logger.warning("publishing %s failed", what, exc_info=True)

        with self._lock:
            if self._pid != os.getpid():  # first use, or a forked worker child
                self._pid = os.getpid()
                self._queue = queue.SimpleQueue()
                threading.Thread(target=self._loop, name="workflows-publisher", daemon=True).start()
                # A short-lived process (a management command, a shell, a script) exits right after
                # handing over its last pushes: the daemon thread would die with them unsent (a
                # membership removed from a shell closed its member's sockets only at their next
                # re-check). At exit it has EXIT_FLUSH_SECONDS to send them.
                atexit.register(self.flush, EXIT_FLUSH_SECONDS)
            self._idle.clear()
            self._queue.put(logged)

    def flush(self, timeout: float = 5.0) -> bool:
        """Wait until everything submitted so far is published (for tests and shutdown)."""
        return self._idle.wait(timeout)

    def _loop(self) -> None:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        pending = self._queue
        while True:
            pending.get()(loop)
            if pending.empty():
                self._idle.set()


publisher = _Publisher()


def publish_later(run_id: UUID | str, kind: str, data: Any) -> None:
    """Publish from the background thread, in order with everything else this process publishes."""
    publisher.submit(run_id, kind, data)


def group_send_later(group: str, message: dict[str, Any]) -> None:
    """Push ``message`` to a channel-layer group from the background thread, in order with every
    other event this process publishes. Best effort: receivers resume from their own store."""
    publisher.group_send(group, message)


def publish_progress(run_id: UUID | str, data: Any) -> None:
    from workflows.models import WorkflowRun

    data = json.loads(json.dumps(data, default=str))
    try:
        WorkflowRun.objects.filter(pk=run_id).update(progress=data)
    except Exception:
        logger.warning("could not store progress of run %s", run_id, exc_info=True)
    publish_later(run_id, "progress", data)


def current_seq(run_id: UUID | str) -> int:
    seq_key, _ = _keys(run_id)
    try:
        value = redis_client().get(seq_key)
    except redis.RedisError:
        return 0
    return int(value) if value else 0


def events_after(run_id: UUID | str, after: int, *, until: int | None = None) -> list[StreamEvent]:
    """Stored events with ``after < seq <= until``, oldest first."""
    _, events_key = _keys(run_id)
    high = "+inf" if until is None else until
    raw = redis_client().zrangebyscore(events_key, f"({after}", high)
    return [json.loads(item) for item in cast(list[bytes], raw)]
