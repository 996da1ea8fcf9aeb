"""WEBHOOK_SOURCES from the environment: the sandbox provider's source by default, its secret
SANDBOX_WEBHOOK_SECRET's and none without it, DEBUG or not; WEBHOOK_SOURCES_JSON replaces it. Each case imports the
settings in a fresh interpreter, as a process starting would."""

from __future__ import annotations

import json

from tests.test_settings import fresh_python

CODE = "import json, config.settings as s; print(json.dumps(s.WEBHOOK_SOURCES))"
UNSET = ("SECRET_KEY", "DEBUG", "WEBHOOK_SOURCES_JSON", "SANDBOX_WEBHOOK_SECRET", "INSTALL_EXAMPLES")


def sources(**env: str) -> dict[str, dict[str, object]]:
    result = fresh_python(CODE, {"SECRET_KEY": "k" * 50, "INSTALL_EXAMPLES": "1", **env}, unset=UNSET)
    assert result.returncode == 0, result.stderr
    found: dict[str, dict[str, object]] = json.loads(result.stdout)
    return found


def test_without_debug_the_sandbox_source_has_no_secret_unless_given() -> None:
    default = sources()
    assert list(default) == ["sandbox-payments"]
    assert default["sandbox-payments"]["scheme"] == "standard"
    assert default["sandbox-payments"]["secrets"] == []
    assert default["sandbox-payments"]["action"] == {"type": "operation_outcome", "system": "payments"}
    assert sources(SANDBOX_WEBHOOK_SECRET="whsec_c2VjcmV0LWZyb20tdGhlLWVudg==")["sandbox-payments"]["secrets"] == [
        "whsec_c2VjcmV0LWZyb20tdGhlLWVudg=="
    ]


def test_without_the_examples_there_is_no_default_source() -> None:
    assert sources(INSTALL_EXAMPLES="0") == {}


def test_with_debug_there_is_no_default_secret_either() -> None:
    # A default secret would be one anyone can read here, and sign the provider's outcomes with.
    assert sources(DEBUG="1")["sandbox-payments"]["secrets"] == []


def test_the_json_variable_replaces_the_default() -> None:
    mine = {"hub": {"scheme": "github", "secrets": ["s" * 20], "action": {"type": "operation_outcome", "system": "x"}}}
    assert sources(WEBHOOK_SOURCES_JSON=json.dumps(mine)) == mine


def test_json_that_is_not_json_refuses_to_start() -> None:
    result = fresh_python(CODE, {"SECRET_KEY": "k" * 50, "WEBHOOK_SOURCES_JSON": "{nope"}, unset=UNSET)
    assert result.returncode != 0
    assert "WEBHOOK_SOURCES_JSON is not valid JSON" in result.stderr
