from typing import Any

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


def test_a_budget_or_grace_of_zero_is_an_error(settings: Any) -> None:
    settings.WORKFLOWS = {**settings.WORKFLOWS, "TASK_BUDGET_SECONDS": 0}
    assert [e.id for e in check_settings()] == ["workflows.E004"]


def test_eager_celery_is_an_error(settings: Any) -> None:
    settings.CELERY_TASK_ALWAYS_EAGER = True
    assert [e.id for e in check_settings()] == ["workflows.E007"]
