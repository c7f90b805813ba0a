"""Declared function tools as the output decoder sees them: names and per-parameter JSON types.

Owns reading OpenAI Chat / Responses / Anthropic tool dicts and the spec's rule for typing Qwen's
untyped parameter text. Imports only the standard library (never torch). Typing is a pure function
of (text, admitted types), so the streaming decoder and its tests share exactly one rule.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

__all__ = [
    "JSON_TYPES",
    "Coerced",
    "ToolCatalog",
    "ToolSchemaError",
    "admitted_types",
    "coerce_parameter",
]

# JSON Schema's seven primitive type names; anything else is not an "explicit primitive type".
JSON_TYPES = frozenset({"string", "number", "integer", "boolean", "null", "array", "object"})

ParamTypes = frozenset[str] | None  # None: no supported explicit type, use untyped inference


class ToolSchemaError(ValueError):
    """A tool declaration the decoder cannot use (no function name)."""


class Coerced(NamedTuple):
    """One typed parameter value; `omitted` drops it from the arguments object."""

    value: Any
    omitted: bool = False
    mismatched: bool = False


_OMITTED = Coerced(None, omitted=True)


def _explicit_type(type_field: object) -> frozenset[str] | None:
    if isinstance(type_field, str):
        return frozenset({type_field}) if type_field in JSON_TYPES else None
    if (
        isinstance(type_field, list)
        and type_field
        and all(isinstance(t, str) and t in JSON_TYPES for t in type_field)
    ):
        return frozenset(type_field)
    return None


def admitted_types(schema: object) -> ParamTypes:
    """JSON types a parameter schema admits, or None when it has no supported explicit type.

    Supported: a direct `type` (name or list of names), or an anyOf/oneOf whose every member has an
    explicit primitive `type`. Anything richer ($ref, enum-only, nested compositions) keeps the
    spec's untyped inference rather than guessing.
    """
    if not isinstance(schema, Mapping):
        return None
    if "type" in schema:
        return _explicit_type(schema["type"])
    for key in ("anyOf", "oneOf"):
        members = schema.get(key)
        if members is None:
            continue
        if not isinstance(members, list) or not members:
            return None
        union: set[str] = set()
        for member in members:
            member_type = member.get("type") if isinstance(member, Mapping) else None
            member_types = _explicit_type(member_type)
            if member_types is None:
                return None
            union |= member_types
        return frozenset(union)
    return None


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e400 parses to inf, which has no JSON spelling
        raise ValueError("non-finite number")
    return value


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _parse_json(text: str) -> tuple[bool, Any]:
    try:
        return True, json.loads(text, parse_float=_finite_float, parse_constant=_reject_constant)
    except (ValueError, RecursionError):
        return False, None


def _json_type_admitted(value: Any, types: frozenset[str]) -> bool:
    if isinstance(value, bool):
        return "boolean" in types
    if value is None:
        return "null" in types
    if isinstance(value, int):
        return "integer" in types or "number" in types
    if isinstance(value, float):
        return "number" in types or ("integer" in types and value.is_integer())
    if isinstance(value, str):
        return "string" in types
    if isinstance(value, list):
        return "array" in types
    return "object" in types


def _boolean_text(text: str) -> bool | None:
    lowered = text.lower()
    if lowered == "true":
        return True
    if lowered == "false":
        return False
    return None


def coerce_parameter(text: str, types: ParamTypes) -> Coerced:
    """Type one parameter's text (format newlines already removed) by the spec's rule.

    String-admitting schemas keep the exact text, even "". A declared non-string parameter with an
    empty block is omitted. Otherwise admitted JSON keeps its JSON type and case-insensitive
    true/false becomes a boolean; a mismatch is still returned (valid JSON as parsed, other text as
    a string) and flagged, so the tool consumer can report the validation error itself.
    """
    stripped = text.strip()
    if types is None:
        return _infer_untyped(text, stripped)
    if "string" in types:
        return Coerced(text)
    if not stripped:
        return _OMITTED
    if "boolean" in types:
        flag = _boolean_text(stripped)
        if flag is not None:
            return Coerced(flag)
    ok, value = _parse_json(stripped)
    if ok and _json_type_admitted(value, types):
        return Coerced(value)
    return Coerced(value if ok else text, mismatched=True)


def _infer_untyped(text: str, stripped: str) -> Coerced:
    # Qwen prints untyped values bare: JSON where the text is JSON, Python-style True/False for
    # booleans (the template renders them with `| string`), and anything else as a string.
    if not stripped:
        return Coerced(text)
    ok, value = _parse_json(stripped)
    if ok:
        return Coerced(value)
    flag = _boolean_text(stripped)
    return Coerced(text if flag is None else flag)


@dataclass(frozen=True)
class ToolCatalog:
    """Declared tool names, each with the admitted JSON types of its declared parameters."""

    params_by_tool: Mapping[str, Mapping[str, ParamTypes]]

    @classmethod
    def from_tools(cls, tools: Sequence[Mapping[str, Any]]) -> ToolCatalog:
        """Read function tools in any of the wire shapes the protocols use.

        Accepted: Chat Completions `{"type": "function", "function": {"name", "parameters"}}`,
        Responses `{"type": "function", "name", "parameters"}` and Anthropic
        `{"name", "input_schema"}`. The name must be what the model writes in `<function=NAME>`.
        """
        params_by_tool: dict[str, dict[str, ParamTypes]] = {}
        for tool in tools:
            function = tool.get("function")
            spec = function if isinstance(function, Mapping) else tool
            name = spec.get("name")
            if not isinstance(name, str) or not name:
                raise ToolSchemaError("tool declaration has no function name")
            schema = spec.get("parameters", spec.get("input_schema"))
            properties = schema.get("properties") if isinstance(schema, Mapping) else None
            if not isinstance(properties, Mapping):
                properties = {}
            params_by_tool.setdefault(
                name, {str(p): admitted_types(s) for p, s in properties.items()}
            )
        return cls(params_by_tool)

    def __contains__(self, name: object) -> bool:
        return name in self.params_by_tool

    def param_types(self, tool: str, param: str) -> ParamTypes:
        """Admitted types of a declared parameter; None (untyped) for undeclared parameters."""
        return self.params_by_tool[tool].get(param)
