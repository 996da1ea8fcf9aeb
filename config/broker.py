"""The Celery broker's settings, from its URL: Redis (the default) or RabbitMQ (``amqp://``).

Both brokers carry only messages that say "advance this run" or "run this try of a step": runs,
steps, timers and leases live in PostgreSQL, and the sweeper sends a lost message again
(docs/decisions/0020-redis-or-rabbitmq-as-the-broker.md). What differs is how each broker takes a
message back from a worker that holds it unacknowledged (``task_acks_late``), and how it keeps its
queues:

- Redis redelivers a message left unacknowledged for the *visibility timeout*, and keeps its
  queues in memory: a restart without persistence loses what they held.
- RabbitMQ closes the channel of a consumer that holds a message longer than its
  ``consumer_timeout`` (30 minutes by default, set in rabbitmq.conf) and requeues the message. Its
  queues here are quorum queues (durable, replicated on a cluster), and every publish waits for
  the broker's confirm.

Used by ``config/settings.py`` and by the tests that switch their own process to another broker
(``tests.support.use_broker``), so both configure Celery the same way.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

AMQP_SCHEMES = ("amqp://", "amqps://", "pyamqp://")

# RabbitMQ's own default consumer_timeout (rabbitmq.conf), in seconds.
RABBITMQ_DEFAULT_CONSUMER_TIMEOUT = 1800


def is_amqp(url: str) -> bool:
    return url.lower().startswith(AMQP_SCHEMES)


@dataclass(frozen=True)
class BrokerConfig:
    url: str
    #: Celery's broker_transport_options.
    transport_options: dict[str, Any] = field(default_factory=dict)
    #: task_default_queue_type and task_create_missing_queue_type: "classic" or "quorum".
    queue_type: str = "classic"
    #: task_default_exchange_type and task_create_missing_queue_exchange_type.
    exchange_type: str = "direct"
    #: Seconds a worker may hold a message unacknowledged before the broker takes it back.
    ack_timeout: float = 0.0

    @property
    def amqp(self) -> bool:
        return is_amqp(self.url)

    def celery_settings(self) -> dict[str, Any]:
        """The settings as Celery names them (``app.conf.update(**...)``); config/settings.py sets
        the same values as ``CELERY_*``."""
        return {
            "broker_url": self.url,
            "broker_transport_options": self.transport_options,
            "task_default_queue_type": self.queue_type,
            "task_create_missing_queue_type": self.queue_type,
            "task_default_exchange_type": self.exchange_type,
            "task_create_missing_queue_exchange_type": self.exchange_type,
        }


def broker_config(url: str, *, visibility_timeout: float, consumer_timeout: float) -> BrokerConfig:
    """The settings for the broker at ``url``. ``visibility_timeout`` applies to Redis,
    ``consumer_timeout`` states what RabbitMQ is configured with (this process cannot read it)."""
    if is_amqp(url):
        return BrokerConfig(
            url=url,
            # Every publish waits for the broker's confirm: a send that returned is on the queue
            # (a send that raised is logged by the outbox, and the sweeper sends again).
            transport_options={"confirm_publish": True},
            # Durable and replicated; they require per-consumer QoS, which Celery applies when it
            # sees them (worker_detect_quorum_queues, on by default).
            queue_type="quorum",
            # Topic exchanges, so that a countdown (the engine's short sleeps and backoffs) waits in
            # RabbitMQ's native delayed-delivery queues rather than unacknowledged in a worker: with
            # quorum queues a worker cannot raise its prefetch for such messages, and two of them
            # would stop a worker of concurrency 2 until they were due.
            exchange_type="topic",
            ack_timeout=consumer_timeout,
        )
    return BrokerConfig(
        url=url,
        transport_options={
            # Longer than the longest a task may run (CELERY_TASK_TIME_LIMIT, checked by
            # workflows.E006), or Redis hands an unacknowledged message to a second worker while the
            # first still runs it.
            "visibility_timeout": visibility_timeout,
            # A connection that died without a FIN (a restarted host, a dropped NAT entry) is noticed
            # instead of blocking a worker or a publisher on a dead socket: TCP keepalive, a read
            # timeout well above the transport's 1 s BRPOP, and kombu's check of a BRPOP overdue by
            # more than this interval (and redis-py's PING before reusing a connection idle as long).
            # Not retry_on_timeout: a publish repeated after a timeout may be sent twice.
            "socket_keepalive": True,
            "socket_connect_timeout": 5,
            "socket_timeout": 30,
            "health_check_interval": 10,
        },
        ack_timeout=visibility_timeout,
    )


def guard_restore_after_connection_loss() -> None:
    """Keep a worker alive when Redis goes away while it holds unacknowledged messages.

    kombu 5.7's Redis transport, on a lost connection, closes the channel, and closing puts the
    messages the worker had taken but not acknowledged back through a client built from the
    channel's connection, which the consumer has already let go: ``AttributeError: 'NoneType'
    object has no attribute 'hostname'`` escapes, and the worker exits ("Unrecoverable error"; the
    fault campaign saw it in 2 of 8 Redis restarts). With no connection there is nothing to send
    them through: they stay in Redis's unacknowledged index, which the next worker's
    ``restore_visible`` puts back once the visibility timeout passes (or they went with a Redis that
    restarted empty), and their runs are in PostgreSQL, where the sweeper finds them. So the
    restore is skipped, said in the log, and the worker reconnects as it would otherwise.
    Installed once, by ``config/celery.py``."""
    import logging

    from kombu.transport import redis as kombu_redis

    qos = kombu_redis.QoS
    if getattr(qos.restore_unacked, "guarded", False):
        return
    original: Any = qos.restore_unacked

    def restore_unacked(self: Any, client: Any = None) -> Any:
        connection = getattr(self.channel, "connection", None)
        if client is None and getattr(connection, "client", None) is None:
            logging.getLogger("config.broker").warning(
                "the broker connection is gone: %d unacknowledged message(s) left to Redis's visibility "
                "timeout (their runs are recovered from the database)",
                len(self._delivered),
            )
            self._delivered.clear()
            return None
        return original(self, client)

    setattr(restore_unacked, "guarded", True)  # noqa: B010
    setattr(qos, "restore_unacked", restore_unacked)  # noqa: B010  # a method replaced on kombu's class
