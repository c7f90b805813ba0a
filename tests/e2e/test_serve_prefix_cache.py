"""Prefix reuse through `ninfer serve` (the demo model, real runner, greedy), driven by the openai
and anthropic SDKs: a second turn reuses at least the first turn's prompt up to its generation
prologue on Chat Completions, Responses (previous_response_id and a full-history resend) and
Anthropic Messages (cache_control on the system prompt and the last message); every generation
response says why in `x-ninfer-prefix-cache`; `--no-prefix-reuse` reports 0 cached tokens and
gives the same text."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anthropic
import openai
import pytest

from e2e.serve_process import MODEL_ID, ServeProcess, serve, sse_events

pytestmark = pytest.mark.e2e
HEADER = "x-ninfer-prefix-cache"
PROLOGUE = 5  # "<|im_start|>" "assistant" "\n" "<think>" "\n": the generation prologue


@pytest.fixture(scope="module")
def servers() -> Iterator[dict[str, ServeProcess]]:
    with serve("--greedy") as warm, serve("--greedy", "--no-prefix-reuse") as cold:
        yield {"warm": warm, "cold": cold}


def _openai(server: ServeProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0)


def _anthropic(server: ServeProcess) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.base_url, api_key="unused", max_retries=0)


def _chat_turns(server: ServeProcess, topic: str) -> list[tuple[Any, dict[str, str]]]:
    client = _openai(server)
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a careful assistant."},
        {"role": "user", "content": f"Tell me about {topic}."},
    ]
    out = []
    for follow_up in ("And why?", "Summarize."):
        raw = client.chat.completions.with_raw_response.create(
            model=MODEL_ID, messages=messages, max_tokens=10
        )
        completion = raw.parse()
        out.append((completion, dict(raw.headers)))
        message = completion.choices[0].message
        messages.append(
            {
                "role": "assistant",
                "content": message.content or "",
                "reasoning_content": (message.model_extra or {}).get("reasoning_content", ""),
            }
        )
        messages.append({"role": "user", "content": follow_up})
    return out


def test_chat_completions_second_turn_reuses_the_first(servers) -> None:
    (first, h1), (second, h2) = _chat_turns(servers["warm"], "rivers")
    assert h1[HEADER] == "miss=no_candidate"
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert cached >= first.usage.prompt_tokens - PROLOGUE
    assert h2[HEADER] == f"hit={cached}; path=checkpoint"
    timings = (second.model_extra or {})["timings"]
    assert timings["cache_n"] == cached
    assert timings["prompt_n"] == second.usage.prompt_tokens - cached
    (c1, _), (c2, hc) = _chat_turns(servers["cold"], "rivers")
    assert c2.usage.prompt_tokens_details.cached_tokens == 0 and hc[HEADER] == "miss=disabled"
    assert c2.choices[0].message == second.choices[0].message
    assert c2.usage.prompt_tokens == second.usage.prompt_tokens


def test_chat_stream_header_and_progress_start_at_the_cache(servers) -> None:
    server = servers["warm"]
    messages = [{"role": "user", "content": "Count the stars, please, one by one."}]
    client = _openai(server)
    client.chat.completions.create(model=MODEL_ID, messages=messages, max_tokens=2)
    body = {
        "model": MODEL_ID,
        "messages": messages + [{"role": "assistant", "content": "One."},
                                {"role": "user", "content": "Next?"}],
        "max_tokens": 3,
        "stream": True,
        "return_progress": True,
        "stream_options": {"include_usage": True},
    }  # fmt: skip
    conn = server.connection()
    conn.request(
        "POST", "/v1/chat/completions", json.dumps(body), {"content-type": "application/json"}
    )
    resp = conn.getresponse()
    header = resp.getheader(HEADER)
    chunks = [json.loads(x[6:]) for x in sse_events(resp) if x.startswith("data: {")]
    conn.close()
    progress = [c["prompt_progress"] for c in chunks if "prompt_progress" in c]
    cached = chunks[-1]["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached > 0 and header == f"hit={cached}; path=checkpoint"
    assert progress[0]["cache"] == progress[0]["processed"] == cached
    assert progress[-1]["processed"] == progress[-1]["total"]


def test_chat_explicit_breakpoint_and_explicit_mode(servers) -> None:
    client = _openai(servers["warm"])
    stable = ("Reference text. " * 20).strip()  # a boundary before "\n" is a token boundary
    parts = [
        {"type": "text", "text": stable, "prompt_cache_breakpoint": {"mode": "explicit"}},
        {"type": "text", "text": "\nQuestion one?"},
    ]
    first = client.chat.completions.create(
        model=MODEL_ID,
        messages=[{"role": "user", "content": parts}],
        max_tokens=2,
        extra_body={"prompt_cache_options": {"mode": "explicit"}},
    )
    # a different question after the same stable text: the breakpoint's checkpoint serves it
    parts[1] = {"type": "text", "text": "\nAnother question?"}
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL_ID, messages=[{"role": "user", "content": parts}], max_tokens=2
    )
    second = raw.parse()
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert 0 < cached < first.usage.prompt_tokens - PROLOGUE
    assert raw.headers[HEADER] == f"hit={cached}; path=checkpoint"
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(
            model=MODEL_ID,
            messages=[{"role": "user", "content": "x"}],
            max_tokens=1,
            extra_body={"prompt_cache_options": {"mode": "sometimes"}},
        )


def test_responses_previous_response_id_and_full_history(servers) -> None:
    client = _openai(servers["warm"])
    first = client.responses.create(
        model=MODEL_ID, input="Describe a lighthouse at night.", max_output_tokens=10
    )
    raw = client.responses.with_raw_response.create(
        model=MODEL_ID,
        previous_response_id=first.id,
        input="Now describe it at dawn.",
        max_output_tokens=6,
    )
    chained = raw.parse()
    cached = chained.usage.input_tokens_details.cached_tokens
    assert cached >= first.usage.input_tokens - PROLOGUE
    assert raw.headers[HEADER] == f"hit={cached}; path=checkpoint"
    history = [{"role": "user", "content": "Describe a lighthouse at night."}]
    history += [item.model_dump(exclude_none=True) for item in first.output]
    history.append({"role": "user", "content": "And at noon?"})
    resent = client.responses.create(model=MODEL_ID, input=history, max_output_tokens=6)
    assert resent.usage.input_tokens_details.cached_tokens >= first.usage.input_tokens - PROLOGUE


def test_anthropic_cache_control_on_system_and_last_message(servers) -> None:
    def turns(server: ServeProcess) -> list[Any]:
        client = _anthropic(server)
        system = [
            {"type": "text", "text": "You answer briefly.", "cache_control": {"type": "ephemeral"}}
        ]
        messages: list[dict[str, Any]] = [
            {"role": "user", "content": [{"type": "text", "text": "Name a color.",
                                          "cache_control": {"type": "ephemeral"}}]},
        ]  # fmt: skip
        out = []
        for follow_up in ("Another one?", "Why?"):
            raw = client.messages.with_raw_response.create(
                model="local", system=system, messages=messages, max_tokens=8
            )
            msg = raw.parse()
            out.append((msg, raw.headers[HEADER]))
            messages.append({"role": "assistant", "content": msg.content})
            marked = {"type": "text", "text": follow_up, "cache_control": {"type": "ephemeral"}}
            messages.append({"role": "user", "content": [marked]})
        return out

    (first, _), (second, header) = turns(servers["warm"])
    u1 = first.usage
    prompt1 = u1.input_tokens + u1.cache_creation_input_tokens + u1.cache_read_input_tokens
    assert u1.cache_creation_input_tokens > 0  # the markers' checkpoints were written
    read = second.usage.cache_read_input_tokens
    assert read >= prompt1 - PROLOGUE and header == f"hit={read}; path=checkpoint"
    (_, _), (cold, cold_header) = turns(servers["cold"])
    assert cold.usage.cache_read_input_tokens == 0 and cold_header == "miss=disabled"
    assert cold.usage.cache_creation_input_tokens == 0
    assert [b.model_dump() for b in cold.content] == [b.model_dump() for b in second.content]


def test_anthropic_usage_adds_up_to_the_prompt_from_message_start(servers) -> None:
    """Anthropic's input_tokens, cache_creation_input_tokens and cache_read_input_tokens are
    disjoint and add up to the prompt (clients such as Claude Code add them up for the context
    in use; counting the created tokens twice overstated it), and message_start already carries
    the final split."""
    client = _anthropic(servers["warm"])
    system = [
        {"type": "text", "text": "Answer in one word. " * 8, "cache_control": {"type": "ephemeral"}}
    ]

    def ask(question: str, marked: bool) -> tuple[int, tuple[int, ...], tuple[int, ...]]:
        block: dict[str, Any] = {"type": "text", "text": question}
        if marked:
            block["cache_control"] = {"type": "ephemeral"}
        messages = [{"role": "user", "content": [block]}]
        prompt = client.messages.count_tokens(model=MODEL_ID, system=system, messages=messages)
        events = list(
            client.messages.create(
                model=MODEL_ID, system=system, messages=messages, max_tokens=4, stream=True
            )
        )
        start = events[0].message.usage
        final = [e for e in events if e.type == "message_delta"][-1].usage
        split = [
            (u.input_tokens, u.cache_creation_input_tokens, u.cache_read_input_tokens)
            for u in (start, final)
        ]
        return prompt.input_tokens, split[0], split[1]

    prompt, start, final = ask("Name a color.", marked=True)
    assert sum(final) == prompt and start == final
    # past the last marker: the user turn's closing tokens and the generation prologue
    assert 0 < final[0] <= PROLOGUE + 2 and final[1] > 0
    # the same system prompt and an unmarked question: the system marker's checkpoint is read
    prompt, start, final = ask("Name a fruit.", marked=False)
    assert sum(final) == prompt and start == final
    assert final[2] > 0 and final[1] == 0
