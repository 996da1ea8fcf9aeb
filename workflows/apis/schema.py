"""What the OpenAPI schema (``/api/schema/``) states beyond what drf-spectacular reads by itself.

The schema is a contract a client (or a fuzzer) may take literally: every request it calls valid is
accepted, every one it calls invalid is refused with a 4xx. So what the API checks is stated here:

- strict serializers refuse unknown fields: ``additionalProperties: false``;
- text fields refuse a NUL character and, unless blank is allowed, the empty string; a field with a
  ``pattern`` refuses what does not match it (the same expression, checked with ``re.fullmatch``);
- JSON fields take any JSON PostgreSQL can store (``JsonValue``: no NUL in any string or key);
- links between operations (``add_links``): which response field names which object of another
  operation, so a client, or a stateful fuzzer, can follow them.

Imported by ``WorkflowsConfig.ready`` (the extensions register themselves on import); ``add_links``,
``add_json_value`` and ``fix_one_of`` are drf-spectacular postprocessing hooks
(settings.SPECTACULAR_SETTINGS).
"""

from __future__ import annotations

import json
import re
import sys
from typing import Any

from drf_spectacular.extensions import OpenApiSerializerExtension, OpenApiSerializerFieldExtension
from drf_spectacular.openapi import AutoSchema
from drf_spectacular.utils import Direction

from workflows.apis.common import JsonObjectField, JsonValueField, StrictCharField, StrictSerializer
from workflows.registry import get_workflow, workflow_names

JSON_VALUE = "#/components/schemas/JsonValue"
# Every character str.strip() removes, spelled out: regex engines disagree on what \s means.
WHITESPACE = "".join(f"\\u{code:04x}" for code in range(sys.maxunicode + 1) if chr(code).isspace())
NO_NUL = "[^\\x00]*"
# Text with at least one character that is not whitespace (and no NUL).
NOT_BLANK = f"{NO_NUL}[^\\x00{WHITESPACE}]{NO_NUL}"


def anchored(pattern: str) -> str:
    """The schema's form of a pattern the server checks with re.fullmatch."""
    return f"^(?:{pattern})$"


class StrictSerializerSchema(OpenApiSerializerExtension):
    target_class = StrictSerializer
    match_subclasses = True

    def map_serializer(self, auto_schema: AutoSchema, direction: Direction) -> dict[str, Any]:
        schema: dict[str, Any] = auto_schema._map_serializer(self.target, direction, bypass_extensions=True)
        schema["additionalProperties"] = False
        return schema


class StrictCharFieldSchema(OpenApiSerializerFieldExtension):
    target_class = StrictCharField
    match_subclasses = True

    def map_serializer_field(self, auto_schema: AutoSchema, direction: Direction) -> dict[str, Any]:
        field: StrictCharField = self.target
        schema: dict[str, Any] = auto_schema._map_serializer_field(field, direction, bypass_extensions=True)
        if isinstance(schema.get("type"), list):  # nullable: drf-spectacular adds "null" again to what this returns
            schema["type"] = "string"
        schema["pattern"] = anchored(field.pattern if field.pattern is not None else NO_NUL)
        if not field.allow_blank:
            schema["minLength"] = max(int(schema.get("minLength", 0)), 1)
        return schema


class JsonValueFieldSchema(OpenApiSerializerFieldExtension):
    target_class = JsonValueField
    match_subclasses = True

    def map_serializer_field(self, auto_schema: AutoSchema, direction: Direction) -> dict[str, Any]:
        if self.target.allow_null:
            return {"$ref": JSON_VALUE}
        return {"$ref": JSON_VALUE, "not": {"type": "null"}}


class JsonObjectFieldSchema(OpenApiSerializerFieldExtension):
    target_class = JsonObjectField
    match_subclasses = True

    def map_serializer_field(self, auto_schema: AutoSchema, direction: Direction) -> dict[str, Any]:
        field: JsonObjectField = self.target
        names: dict[str, Any] = {"pattern": anchored(field.key_pattern or NO_NUL)}
        if field.key_max_length is not None:
            names.update(minLength=1, maxLength=field.key_max_length)
        values: dict[str, Any] = {"$ref": JSON_VALUE}
        if not field.child.allow_null:
            values["not"] = {"type": "null"}
        schema: dict[str, Any] = {"type": "object", "propertyNames": names, "additionalProperties": values}
        if not field.allow_empty:
            schema["minProperties"] = 1
        return schema


def add_json_value(result: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
    """The JsonValue component the JSON fields refer to (recursive, so written by hand)."""
    no_nul = {"type": "string", "pattern": anchored(NO_NUL)}
    result.setdefault("components", {}).setdefault("schemas", {})["JsonValue"] = {
        "description": "Any JSON value PostgreSQL can store: no NUL character (\\u0000) in any string or key, "
        "no unpaired surrogate, nested at most 100 levels (else 400 invalid_payload).",
        "anyOf": [
            {"type": "null"},
            {"type": "boolean"},
            {"type": "number"},
            no_nul,
            {"type": "array", "items": {"$ref": JSON_VALUE}},
            {
                "type": "object",
                "propertyNames": {"pattern": anchored(NO_NUL)},
                "additionalProperties": {"$ref": JSON_VALUE},
            },
        ],
    }
    return result


def fix_one_of(result: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
    """Two of drf-spectacular's OpenAPI 3.1 translations say less than they mean: a nullable JSON
    field becomes ``oneOf: [{}, {type: null}]``, which null matches twice (so null is invalid), and
    a blank-allowed text field with a pattern ``oneOf: [<pattern>, {maxLength: 0}]``, which "" matches
    twice whenever the pattern takes it. Any JSON, and "pattern or blank" (anyOf), is what is meant."""

    def walk(node: Any) -> Any:
        if isinstance(node, dict):
            node = {key: walk(value) for key, value in node.items()}
            alternatives = node.get("oneOf")
            if alternatives == [{}, {"type": "null"}]:
                del node["oneOf"]
            elif isinstance(alternatives, list) and {"type": "string", "maxLength": 0} in alternatives:
                node["anyOf"] = node.pop("oneOf")
            return node
        if isinstance(node, list):
            return [walk(item) for item in node]
        return node

    fixed: dict[str, Any] = walk(result)
    return fixed


def add_workflow_operations(result: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
    """One operation for each public workflow that states its payload (``Workflow.payload_schema``):
    ``POST /api/workflows/<name>/runs`` with that payload, so what the schema calls valid is what
    the workflow's validate_payload takes. The generic operation is for the other workflows."""
    generic_path = "/api/workflows/{name}/runs"
    generic = result.get("paths", {}).get(generic_path, {}).get("post")
    if generic is None:
        return result
    stated = [
        name for name in workflow_names() if get_workflow(name).public and get_workflow(name).payload_schema is not None
    ]
    for name in stated:
        payload = dict(get_workflow(name).payload_schema or {})
        payload.setdefault("description", f"The input of {name}; its validate_payload checks exactly this.")
        operation = json.loads(json.dumps(generic))  # a deep copy, links included
        operation["operationId"] = "run_start_" + re.sub(r"\W", "_", name)
        operation["description"] = f"Start a run of {name}."
        operation["parameters"] = [p for p in operation.get("parameters", []) if p.get("name") != "name"]
        body: dict[str, Any] = {"type": "object", "additionalProperties": False, "properties": {"payload": payload}}
        if payload.get("required"):
            body["required"] = ["payload"]  # the default {} would not do
        for media in operation["requestBody"]["content"].values():
            media["schema"] = body
            media.pop("examples", None)
        operation["responses"].pop("404", None)  # the workflow exists
        result["paths"][generic_path.replace("{name}", name)] = {"post": operation}
    if stated:
        # Described, not excluded with "not": OpenAPI matches a concrete path before a template, so
        # /api/workflows/demo.onboarding/runs is that operation's, never this one's.
        for parameter in generic.get("parameters", []):
            if parameter.get("name") == "name" and parameter.get("in") == "path":
                parameter["description"] = (
                    f"A public workflow's name, except those with an operation of their own: {', '.join(stated)}."
                )
    return result


# --- Links ------------------------------------------------------------------------------------------
# (source operation, its status codes) -> {link name: (target operation, parameters, request body)}.
# Expressions are OpenAPI runtime expressions on the source's response.
RUN_CONTROLS = ("run_retrieve", "run_send_event", "run_pause", "run_resume", "run_terminate", "run_restart")
ASSESSMENT_OPERATIONS = ("assessment_retrieve", "assessment_source_add", "assessment_submit")


# {link name: (target operation, its parameters, its request body or None)}
Links = dict[str, tuple[str, dict[str, str], dict[str, str] | None]]


def _to_runs(pointer: str) -> Links:
    return {target: (target, {"run_id": f"$response.body#{pointer}"}, None) for target in RUN_CONTROLS}


def _to_assessment(pointer: str) -> Links:
    return {target: (target, {"assessment_id": f"$response.body#{pointer}"}, None) for target in ASSESSMENT_OPERATIONS}


LINKS: dict[tuple[str, tuple[int, ...]], Links] = {
    ("run_start", (200, 201)): _to_runs("/id"),
    ("run_list", (200,)): _to_runs("/results/0/id"),
    ("run_retrieve", (200,)): _to_runs("/id"),
    **{(control, (200,)): _to_runs("/id") for control in RUN_CONTROLS[2:]},
    ("run_send_event", (200, 201)): {"run_retrieve": ("run_retrieve", {"run_id": "$response.body#/run"}, None)},
    ("refund_create", (200, 201)): {
        "refund_get": ("refund_get", {"refund_id": "$response.body#/id"}, None),
        "run_retrieve": ("run_retrieve", {"run_id": "$response.body#/run"}, None),
    },
    ("refund_get", (200,)): {
        "refund_create": ("refund_create", {"number": "$response.body#/order"}, None),
        "run_retrieve": ("run_retrieve", {"run_id": "$response.body#/run"}, None),
    },
    ("approval_list", (200,)): {
        "approval_retrieve": ("approval_retrieve", {"request_id": "$response.body#/results/0/id"}, None),
        "approval_decide": (
            "approval_decide",
            {"request_id": "$response.body#/results/0/id"},
            {"version": "$response.body#/results/0/version"},
        ),
    },
    ("approval_retrieve", (200,)): {
        "approval_decide": (
            "approval_decide",
            {"request_id": "$response.body#/id"},
            {"version": "$response.body#/version"},
        ),
        "run_retrieve": ("run_retrieve", {"run_id": "$response.body#/run"}, None),
    },
    ("approval_decide", (200,)): {
        "approval_retrieve": ("approval_retrieve", {"request_id": "$response.body#/id"}, None),
    },
    ("assessment_create", (201,)): {
        **_to_assessment("/id"),
        "assessment_review": ("assessment_review", {"assessment_id": "$response.body#/id"}, None),
    },
    ("assessment_list", (200,)): {
        **_to_assessment("/results/0/id"),
        "assessment_review": ("assessment_review", {"assessment_id": "$response.body#/results/0/id"}, None),
    },
    **{
        (source, (200,)): {
            **_to_assessment("/id"),
            "assessment_review": (
                "assessment_review",
                {"assessment_id": "$response.body#/id"},
                {"report_version": "$response.body#/review/report_version"},
            ),
            "approval_retrieve": ("approval_retrieve", {"request_id": "$response.body#/review/request"}, None),
            "run_retrieve": ("run_retrieve", {"run_id": "$response.body#/run"}, None),
        }
        for source in ("assessment_retrieve", "assessment_submit", "assessment_review")
    },
}


def add_links(result: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
    """OpenAPI links from each response that names another object to the operations on it."""
    operations = {
        op["operationId"]: op
        for item in result.get("paths", {}).values()
        for op in item.values()
        if isinstance(op, dict) and "operationId" in op
    }
    for (source, statuses), links in LINKS.items():
        if source not in operations:
            continue  # a partial schema (one app's patterns)
        for code in statuses:
            response = operations[source]["responses"].get(str(code))
            if response is None:
                continue
            for name, (target, parameters, body) in links.items():
                if target not in operations:
                    continue
                link: dict[str, Any] = {"operationId": target, "parameters": dict(parameters)}
                if body is not None:
                    link["requestBody"] = dict(body)
                response.setdefault("links", {})[name] = link
    return result
