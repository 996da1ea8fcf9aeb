"""Per-run progress streams: best effort, sequence-numbered, resumable.

Each event gets the next number of the run's counter (Redis INCR), is kept in a capped sorted set
scored by that number (so a client can ask for everything after N), and is pushed live to the
run's Channels group. The database stays the authority: a client's snapshot comes from there.
"""
from __future__ import annotations

import json
import logging
import os
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
    """Append an event to the run's stream and push it live. Returns its seq, or None on failure."""
    conf_ = conf()
    seq_key, events_key = _keys(run_id)
    try:
        client = redis_client()
        seq = int(client.incr(seq_key))
        text = json.dumps(
            {"type": kind, "seq": seq, "run": str(run_id), "data": data, "at": timezone.now().isoformat()},
            default=str,
        )
        # The live push carries exactly what is stored (plain JSON), never what msgpack can't encode.
        event: StreamEvent = json.loads(text)
        pipe = client.pipeline(transaction=False)
        pipe.zadd(events_key, {text: seq})
        pipe.zremrangebyrank(events_key, 0, -conf_["STREAM_MAX_EVENTS"] - 1)
        pipe.expire(events_key, conf_["STREAM_TTL_SECONDS"])
        if kind == "status" and isinstance(data, dict) and data.get("terminal"):
            pipe.expire(seq_key, conf_["STREAM_TTL_SECONDS"])
        else:
            # A live run keeps its counter however long it waits: a counter that expired and
            # restarted at 1 would make every client drop the new events as already seen.
            pipe.persist(seq_key)
        pipe.execute()
    except redis.RedisError:
        logger.warning("progress stream of run %s unavailable; event dropped", run_id, exc_info=True)
        return None
    layer = get_channel_layer()
    if layer is not None:
        try:
            async_to_sync(layer.group_send)(group_name(run_id), {"type": "run.event", "event": event})
        except Exception:  # best effort: a live push lost is recovered by resume
            logger.warning("live push for run %s failed", run_id, exc_info=True)
    return seq


def publish_progress(run_id: UUID | str, data: Any) -> int | None:
    from workflows.models import WorkflowRun

    data = json.loads(json.dumps(data, default=str))
    try:
        WorkflowRun.objects.filter(pk=run_id).update(progress=data)
    except Exception:
        logger.warning("could not store progress of run %s", run_id, exc_info=True)
    return publish(run_id, "progress", data)


def publish_status(run_id: UUID | str) -> int | None:
    from workflows.selectors import run_status_summary

    summary = run_status_summary(run_id=run_id)
    if summary is None:
        return None
    return publish(run_id, "status", summary)


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
