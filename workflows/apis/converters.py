"""Path converters of the API's URLs. Importing this module registers them.

A path that does not match a converter matches no API at all, and the catch-all at the end of the
``api/`` routes (``notfound.ApiNotFound``) answers the API's JSON 404: bad ids never reach a view.
"""

from __future__ import annotations

from django.urls import register_converter
from drf_spectacular.utils import OpenApiParameter

ID_MAX = 10**18 - 1
NAME_MAX = 200
NAME_CHARACTER = "[^/\\x00-\\x1f\\x7f]"  # the regex escapes, not the characters: also valid in the schema


class IdConverter:
    """``<id:...>``: a database id, 1 to 18 ASCII digits, so it always fits a bigint. ``²`` (a
    digit to ``str.isdigit`` and to no database) and ids of thousands of digits do not match."""

    regex = "[0-9]{1,18}"

    def to_python(self, value: str) -> int:
        return int(value)

    def to_url(self, value: int) -> str:
        return str(value)


class NameConverter:
    """``<name:...>``: a name or number chosen by people (an order number): 1 to 200 characters,
    no slash and no control character (PostgreSQL cannot compare a text column with a NUL)."""

    regex = f"{NAME_CHARACTER}{{1,{NAME_MAX}}}"

    def to_python(self, value: str) -> str:
        return value

    def to_url(self, value: str) -> str:
        return value


register_converter(IdConverter, "id")
register_converter(NameConverter, "name")


def id_parameter(name: str, description: str) -> OpenApiParameter:
    """The schema's path parameter for ``<id:name>``: the range the route takes (drf-spectacular
    cannot read a custom converter, and would call it a string)."""
    return OpenApiParameter(
        name, {"type": "integer", "minimum": 0, "maximum": ID_MAX}, OpenApiParameter.PATH, description=description
    )


def name_parameter(name: str, description: str) -> OpenApiParameter:
    """The schema's path parameter for ``<name:name>``."""
    return OpenApiParameter(
        name,
        {"type": "string", "minLength": 1, "maxLength": NAME_MAX, "pattern": f"^{NAME_CHARACTER}+$"},
        OpenApiParameter.PATH,
        description=description,
    )
