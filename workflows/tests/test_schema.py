"""What ``workflows.apis.schema`` adds to the OpenAPI schema: a public workflow's own start
operation with the payload it states, and that payload checked by ``validate_payload``; links.
(tests/test_fuzz_api.py holds the whole schema to the API's answers.)"""

from __future__ import annotations

from typing import Any

import pytest
from drf_spectacular.generators import SchemaGenerator

from workflows import Workflow
from workflows.exceptions import InvalidPayload


@pytest.fixture(scope="module")
def schema() -> dict[str, Any]:
    generated: dict[str, Any] = SchemaGenerator().get_schema(request=None, public=True)
    return generated


def test_a_public_workflow_that_states_its_payload_has_its_own_start_operation(schema: dict[str, Any]) -> None:
    from examples.demo.workflows import Onboarding

    operation = schema["paths"]["/api/workflows/demo.onboarding/runs"]["post"]
    body = operation["requestBody"]["content"]["application/json"]["schema"]

    assert operation["operationId"] == "run_start_demo_onboarding"
    assert body["additionalProperties"] is False
    assert body["properties"]["payload"]["properties"] == Onboarding.payload_schema["properties"]
    assert "404" not in operation["responses"] and {"201", "200", "400", "401", "409"} <= set(operation["responses"])
    assert operation["responses"]["201"]["links"]["run_retrieve"] == {
        "operationId": "run_retrieve",
        "parameters": {"run_id": "$response.body#/id"},
    }
    # the generic operation stays, for the public workflows that take any payload object
    assert "/api/workflows/{name}/runs" in schema["paths"]


def test_the_default_validate_payload_checks_payload_schema() -> None:
    class Sized(Workflow):
        payload_schema = {
            "type": "object",
            "properties": {"size": {"type": "integer", "maximum": 3}},
            "required": ["size"],
            "additionalProperties": False,
        }

    assert Sized.validate_payload({"size": 2}) == {"size": 2}
    invalid: list[tuple[dict[str, Any], str]] = [
        ({}, "payload"),
        ({"size": 4}, "payload['size']"),
        ({"size": "2"}, "payload['size']"),
        ({"size": 1, "more": 1}, "payload"),
    ]
    for bad, where in invalid:
        with pytest.raises(InvalidPayload) as refused:
            Sized.validate_payload(bad)
        assert str(refused.value).startswith(f"{where}: "), refused.value
    assert Workflow.validate_payload({"anything": [1]}) == {"anything": [1]}  # no schema: any object


def test_text_fields_state_their_pattern_and_json_fields_refer_to_json_value(schema: dict[str, Any]) -> None:
    components = schema["components"]["schemas"]
    event = components["RunEventInput"]

    assert event["additionalProperties"] is False
    assert event["properties"]["type"]["pattern"] == "^(?:[^\\x00]*)$" and event["properties"]["type"]["minLength"] == 1
    assert event["properties"]["payload"]["allOf"] == [{"$ref": "#/components/schemas/JsonValue"}]
    assert event["properties"]["payload"]["not"] == {"type": "null"}
    assert {"type": "null"} in components["JsonValue"]["anyOf"]
    # no ambiguous oneOf left (null or "" matching twice)
    assert "oneOf" not in components["ErrorBody"]["properties"]["detail"]


def test_the_schema_is_generated_without_a_warning(tmp_path: Any) -> None:
    """A warning is a schema that says something other than the API: two serializers of one name
    (an operation's nested ``InputSerializer`` without a component name of its own) once gave the
    restart operation the body of a refund request."""
    from django.core.management import call_command

    call_command("spectacular", "--fail-on-warn", "--file", str(tmp_path / "schema.yml"))
