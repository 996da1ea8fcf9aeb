from workflows.checks import check_settings


def test_the_default_settings_pass() -> None:
    assert check_settings() == []


def test_a_bad_step_commit_mode_is_an_error(settings) -> None:
    settings.WORKFLOWS = {**settings.WORKFLOWS, "STEP_COMMIT": "sometimes"}
    assert [e.id for e in check_settings()] == ["workflows.E001"]


def test_a_step_timeout_above_the_visibility_timeout_is_an_error(settings) -> None:
    settings.WORKFLOWS = {**settings.WORKFLOWS, "MAX_STEP_TIMEOUT_SECONDS": 99_999}
    assert [e.id for e in check_settings()] == ["workflows.E002"]
