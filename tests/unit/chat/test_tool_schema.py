"""Tool declarations and the spec's parameter typing rule, table-driven."""

from __future__ import annotations

import pytest

from ninfer.chat.tool_schema import (
    Coerced,
    ToolCatalog,
    ToolSchemaError,
    admitted_types,
    coerce_parameter,
)


@pytest.mark.parametrize(
    ("schema", "expected"),
    [
        ({"type": "integer"}, {"integer"}),
        ({"type": ["integer", "null"]}, {"integer", "null"}),
        ({"anyOf": [{"type": "number"}, {"type": "null"}]}, {"number", "null"}),
        ({"oneOf": [{"type": "boolean"}, {"type": ["string"]}]}, {"boolean", "string"}),
        ({"anyOf": [{"type": "number"}, {"$ref": "#/x"}]}, None),
        ({"anyOf": []}, None),
        ({"type": "int"}, None),
        ({"enum": ["a", "b"]}, None),
        ({"description": "free"}, None),
        ("not a schema", None),
    ],
)
def test_admitted_types(schema, expected):
    got = admitted_types(schema)
    assert got == (None if expected is None else frozenset(expected))


T = frozenset


@pytest.mark.parametrize(
    ("text", "types", "expected"),
    [
        ("", T({"string"}), Coerced("")),
        (" 12 ", T({"string", "integer"}), Coerced(" 12 ")),
        ("", T({"integer"}), Coerced(None, omitted=True)),
        ("\t", T({"boolean"}), Coerced(None, omitted=True)),
        ("12", T({"integer"}), Coerced(12)),
        ("2.0", T({"integer"}), Coerced(2.0)),
        ("2.5", T({"integer"}), Coerced(2.5, mismatched=True)),
        ("2.5", T({"number"}), Coerced(2.5)),
        ("tRuE", T({"boolean"}), Coerced(True)),
        ("yes", T({"boolean"}), Coerced("yes", mismatched=True)),
        ("null", T({"integer", "null"}), Coerced(None)),
        ("None", T({"integer", "null"}), Coerced("None", mismatched=True)),
        ('"text"', T({"integer"}), Coerced("text", mismatched=True)),
        ('{"b": 1, "a": [true]}', T({"object"}), Coerced({"b": 1, "a": [True]})),
        ("[1, 2", T({"array"}), Coerced("[1, 2", mismatched=True)),
        ("NaN", T({"number"}), Coerced("NaN", mismatched=True)),
        ("1e400", T({"number"}), Coerced("1e400", mismatched=True)),
        ("", None, Coerced("")),
        ("7", None, Coerced(7)),
        ("False", None, Coerced(False)),
        ("plain words", None, Coerced("plain words")),
    ],
)
def test_coerce_parameter(text, types, expected):
    got = coerce_parameter(text, types)
    assert got == expected
    assert type(got.value) is type(expected.value)


def test_catalog_reads_every_wire_shape():
    catalog = ToolCatalog.from_tools(
        [
            {
                "type": "function",
                "function": {
                    "name": "chat",
                    "parameters": {"properties": {"n": {"type": "integer"}}},
                },
            },
            {
                "type": "function",
                "name": "responses",
                "parameters": {"properties": {"s": {"type": "string"}}},
            },
            {"name": "anthropic", "input_schema": {"properties": {"b": {"type": "boolean"}}}},
            {"name": "bare"},
        ]
    )
    assert catalog.param_types("chat", "n") == {"integer"}
    assert catalog.param_types("responses", "s") == {"string"}
    assert catalog.param_types("anthropic", "b") == {"boolean"}
    assert catalog.param_types("bare", "anything") is None
    assert "bare" in catalog and "missing" not in catalog


def test_tool_without_name_is_rejected():
    with pytest.raises(ToolSchemaError):
        ToolCatalog.from_tools([{"type": "function", "function": {"parameters": {}}}])
