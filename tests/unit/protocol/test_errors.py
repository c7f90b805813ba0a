"""Protocol errors: OpenAI error body shape and one-line messages."""

from __future__ import annotations

from ninfer.protocol.errors import ProtocolError, invalid_type, unsupported


def test_body_has_the_four_openai_keys() -> None:
    err = ProtocolError("too many", status=429, code="server_overloaded", type="rate_limit_error")
    assert err.body() == {
        "error": {
            "message": "too many",
            "type": "rate_limit_error",
            "param": None,
            "code": "server_overloaded",
        }
    }
    assert err.status == 429


def test_messages_are_one_line() -> None:
    err = ProtocolError("line one\n  line two")
    assert err.message == "line one line two"


def test_helpers_name_the_field() -> None:
    err = invalid_type("messages[0].content", "a string", 3)
    assert (err.param, err.code) == ("messages[0].content", "invalid_type")
    assert err.message == "messages[0].content: must be a string, got a number"
    err = unsupported("logprobs", "log probabilities are not returned")
    assert (err.param, err.code, err.status) == ("logprobs", "unsupported_parameter", 400)
