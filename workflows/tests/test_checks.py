from typing import Any

from config.broker import RABBITMQ_DEFAULT_CONSUMER_TIMEOUT, broker_config
from workflows.checks import check_settings


def test_the_default_settings_pass() -> None:
    assert check_settings() == []


def test_a_bad_step_commit_mode_is_an_error(settings: Any) -> None:
    settings.WORKFLOWS = {**settings.WORKFLOWS, "STEP_COMMIT": "sometimes"}
    assert [e.id for e in check_settings()] == ["workflows.E001"]


def test_a_step_timeout_above_the_visibility_timeout_is_an_error(settings: Any) -> None:
    settings.WORKFLOWS = {**settings.WORKFLOWS, "MAX_STEP_TIMEOUT_SECONDS": 99_999}
    # and Celery's hard time limit, computed from the old timeout, is now below the step's
    assert [e.id for e in check_settings()] == ["workflows.E002", "workflows.E005"]


def test_a_hard_time_limit_a_healthy_task_can_reach_is_an_error(settings: Any) -> None:
    workflows = settings.WORKFLOWS
    settings.CELERY_TASK_TIME_LIMIT = int(
        workflows["TASK_BUDGET_SECONDS"]
        + workflows["MAX_STEP_TIMEOUT_SECONDS"]
        + workflows["STEP_TIMEOUT_GRACE_SECONDS"]
    )
    assert [e.id for e in check_settings()] == ["workflows.E005"]


def test_no_hard_time_limit_is_an_error(settings: Any) -> None:
    settings.CELERY_TASK_TIME_LIMIT = None
    assert [e.id for e in check_settings()] == ["workflows.E005"]


def test_a_hard_time_limit_above_the_visibility_timeout_is_an_error(settings: Any) -> None:
    settings.CELERY_TASK_TIME_LIMIT = settings.CELERY_BROKER_TRANSPORT_OPTIONS["visibility_timeout"]
    assert [e.id for e in check_settings()] == ["workflows.E006"]


def rabbitmq(settings: Any, consumer_timeout: int) -> None:
    broker = broker_config("amqp://127.0.0.1:5672//", visibility_timeout=0, consumer_timeout=consumer_timeout)
    settings.BROKER, settings.BROKER_ACK_TIMEOUT = broker, broker.ack_timeout


def test_on_rabbitmq_its_default_consumer_timeout_is_below_the_default_limits(settings: Any) -> None:
    # given RabbitMQ with its default consumer_timeout of 30 minutes
    rabbitmq(settings, RABBITMQ_DEFAULT_CONSUMER_TIMEOUT)

    # then the hour a step may take, and the hard time limit above it, are errors that say so
    errors = check_settings()
    assert [e.id for e in errors] == ["workflows.E002", "workflows.E006"]
    assert "consumer timeout (RABBITMQ_CONSUMER_TIMEOUT) (1800 s)" in errors[1].msg


def test_on_rabbitmq_a_consumer_timeout_above_the_hard_time_limit_passes(settings: Any) -> None:
    rabbitmq(settings, settings.CELERY_TASK_TIME_LIMIT + 1)
    assert check_settings() == []


def test_a_budget_or_grace_of_zero_is_an_error(settings: Any) -> None:
    settings.WORKFLOWS = {**settings.WORKFLOWS, "TASK_BUDGET_SECONDS": 0}
    assert [e.id for e in check_settings()] == ["workflows.E004"]


def test_eager_celery_is_an_error(settings: Any) -> None:
    settings.CELERY_TASK_ALWAYS_EAGER = True
    assert [e.id for e in check_settings()] == ["workflows.E007"]
