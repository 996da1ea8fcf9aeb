"""Celery messages written straight to a Redis broker: what ``Celery.send_task`` sends, for a tenth
of its cost.

Every enqueue goes through ``workflows.outbox`` after a commit: a webhook's run, a chat message's
turn, a run woken by an approval. Celery's ``send_task`` and kombu's Redis transport spent about
0.9 ms of CPU on each message here, more than the statements of the request that sent it (a fifth
of a daphne's time under signed webhooks): kombu builds a new ``redis.Redis`` client for every
message (its ``__init__`` fills a case-insensitive table of some 170 response callbacks), and
Celery reads its configuration about nine times a message, each a walk through layered views onto
Django's settings. ``RedisPublisher`` writes the same message (Celery's task protocol 2 in kombu's
Redis envelope) from values read once per Celery app, and LPUSHes it with a client kept for the
process: about 0.1 ms.

A worker cannot tell the two apart (``workflows/tests/test_publish.py`` compares them field by
field, and every test with a worker consumes these). What kombu's Redis transport does with such a
message, this does too: a task's queue is a Redis list of that name (priority 0, the only one the
engine sends, is the bare name), a message is LPUSHed on it, and workers BRPOP it.

Used only where nothing else could see the difference (``publisher_for``): one ``redis://`` broker
without TLS, no receivers of Celery's publish signals (``before_task_publish``, ``after_task_publish``,
``task_sent``: tracing integrations add headers there), no ``task_send_sent_event``, no
``global_keyprefix``, no routes, declared queues or priorities. Otherwise, and on RabbitMQ, the
outbox sends through Celery.
"""

from __future__ import annotations

import base64
import json
import uuid
import weakref
from datetime import UTC, datetime, timedelta
from typing import Any

import redis
from celery import Celery, signals
from celery._state import get_current_worker_task
from celery.utils.nodenames import anon_nodename
from celery.utils.saferepr import saferepr

# kombu's Redis transport options that shape its connections (kombu.transport.redis
# Channel._connparams), taken over so that a published message travels as kombu's would.
CONNECTION_OPTIONS = (
    "socket_timeout",
    "socket_connect_timeout",
    "socket_keepalive",
    "socket_keepalive_options",
    "health_check_interval",
    "retry_on_timeout",
    "max_connections",
)


class RedisPublisher:
    """Sends task messages for one Celery app whose broker is Redis. Thread-safe: the client is
    redis-py's, over a connection pool."""

    def __init__(self, app: Celery) -> None:
        conf = app.conf
        options = conf.broker_transport_options or {}
        self._app = weakref.ref(app)  # not the app itself: it keys the cache of publishers
        self.client = redis.Redis(
            connection_pool=redis.ConnectionPool.from_url(
                conf.broker_url, **{name: options[name] for name in CONNECTION_OPTIONS if name in options}
            )
        )
        self.time_limit, self.soft_time_limit = conf.task_time_limit, conf.task_soft_time_limit
        self.ignore_result = bool(conf.task_ignore_result)
        self.repr_maxlevels = conf.task_repr_maxlevels
        self.argsrepr_maxsize = app.amqp.argsrepr_maxsize

    def send(self, task: str, args: tuple[Any, ...], *, queue: str, countdown: float | None = None) -> str:
        """LPUSH the message that ``app.send_task(task, args, queue=queue, countdown=countdown,
        time_limit=..., soft_time_limit=..., ignore_result=...)`` sends, the last three as this
        app's settings give them (as the outbox sends every task); the task's id.

        A connection that died (Redis restarted) is tried once more at once, on a new one, with a
        new delivery tag as kombu's retries have: should the first push have reached Redis after
        all, the two copies are two messages to the broker, not one acknowledged twice (a worker
        finds the run's lease taken by the other). A send that still fails raises: the outbox logs
        it, and the sweeper sends the run again. Not after a timeout: 30 s more in a request's thread."""
        task_id = str(uuid.uuid4())
        try:
            self.client.lpush(queue, self.message(task, args, queue, countdown, task_id=task_id))
        except redis.ConnectionError:
            self.client.lpush(queue, self.message(task, args, queue, countdown, task_id=task_id))
        return task_id

    def message(self, task: str, args: tuple[Any, ...], queue: str, countdown: float | None, *, task_id: str) -> bytes:
        """The message as kombu's Redis transport stores it (celery.app.amqp.AMQP.as_task_v2 inside
        kombu's envelope: the body JSON, then base64)."""
        app = self._app()
        parent = get_current_worker_task()  # as send_task: a message sent from a task names it
        root_id = (parent.request.root_id or parent.request.id) if parent else None
        eta = (datetime.now(UTC) + timedelta(seconds=countdown)).isoformat() if countdown else None
        body = json.dumps((list(args), {}, {"callbacks": None, "errbacks": None, "chain": None, "chord": None}))
        headers = {
            "lang": "py",
            "task": task,
            "id": task_id,
            "shadow": None,
            "eta": eta,
            "expires": None,
            "group": None,
            "group_index": None,
            "retries": 0,
            "timelimit": [self.time_limit, self.soft_time_limit],
            "root_id": root_id or task_id,
            "parent_id": parent.request.id if parent else None,
            "argsrepr": saferepr(args, self.argsrepr_maxsize, maxlevels=self.repr_maxlevels),
            "kwargsrepr": "{}",
            "origin": anon_nodename(),
            "ignore_result": self.ignore_result,
            "replaced_task_nesting": 0,
            "stamped_headers": None,
            "stamps": {},
        }
        envelope = {
            "body": base64.b64encode(body.encode()).decode(),
            "content-encoding": "utf-8",
            "content-type": "application/json",
            "headers": headers,
            "properties": {
                "correlation_id": task_id,
                "reply_to": app.thread_oid if app is not None else "",
                "delivery_mode": 2,
                "delivery_info": {"exchange": "", "routing_key": queue},
                "priority": 0,
                "body_encoding": "base64",
                "delivery_tag": str(uuid.uuid4()),
            },
        }
        return json.dumps(envelope).encode()


_publishers: weakref.WeakKeyDictionary[Celery, RedisPublisher | None] = weakref.WeakKeyDictionary()


def publisher_for(app: Celery) -> RedisPublisher | None:
    """The app's RedisPublisher, or None where Celery's own publish must send (see the module).

    Decided once per app, as Celery itself builds its broker connection pool once per app; the
    signals are looked at on every call, since a receiver may connect at any time."""
    if signals.before_task_publish.receivers or signals.after_task_publish.receivers or signals.task_sent.receivers:
        return None
    try:
        return _publishers[app]
    except KeyError:
        pass
    conf = app.conf
    url = conf.broker_url
    usable = (
        isinstance(url, str)
        and url.lower().startswith("redis://")
        and ";" not in url  # failover URLs: Celery's connection picks among them
        and not conf.broker_use_ssl
        and conf.task_serializer == "json"
        and not conf.task_compression
        and not conf.task_send_sent_event
        and not (conf.broker_transport_options or {}).get("global_keyprefix")
        and conf.broker_write_url in (None, url)
        # What would route or mark a message otherwise than "its queue, priority 0".
        and conf.task_protocol == 2
        and conf.task_default_priority is None
        and not conf.task_inherit_parent_priority
        and not conf.task_routes
        and conf.task_queues is None
        and conf.task_create_missing_queues
    )
    publisher = _publishers[app] = RedisPublisher(app) if usable else None
    return publisher
