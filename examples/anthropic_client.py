"""Talk to `ninfer serve` with the official anthropic SDK: count, answer, stream, call a tool.

Start a server first (the demo artifact has random weights, so its text is gibberish):

    ninfer serve --dtype fp32 --max-context 4096 --port 8080

then run `python examples/anthropic_client.py [BASE_URL]`.
"""

from __future__ import annotations

import sys

from anthropic import Anthropic

WEATHER_TOOL = {
    "name": "get_weather",
    "description": "Weather forecast for a city",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
        "required": ["city"],
    },
}


def main(base_url: str = "http://127.0.0.1:8080") -> None:
    client = Anthropic(base_url=base_url, api_key="unused-unless-serve-has---api-key")
    model = "local"  # any label: the server runs its one artifact and echoes this back
    system = "Answer concisely."
    messages = [{"role": "user", "content": "What is speculative decoding?"}]

    count = client.messages.count_tokens(model=model, system=system, messages=messages)
    print(f"[prompt tokens] {count.input_tokens}")

    reply = client.messages.create(model=model, system=system, messages=messages, max_tokens=64)
    for block in reply.content:
        print(f"[{block.type}] {getattr(block, 'thinking', None) or getattr(block, 'text', '')}")
    print(f"[usage] {reply.usage}\n[stop] {reply.stop_reason}")

    with client.messages.stream(
        model=model,
        system=system,
        messages=messages,
        max_tokens=1100,
        thinking={"type": "enabled", "budget_tokens": 1024},  # capped thinking, then the answer
    ) as stream:
        for text in stream.text_stream:
            print(text, end="", flush=True)
        print(f"\n[usage] {stream.get_final_message().usage}")

    # With a real model this usually ends in a tool_use block; answer it with a tool_result.
    ask = [{"role": "user", "content": "What's the weather in Paris?"}]
    first = client.messages.create(model=model, messages=ask, tools=[WEATHER_TOOL], max_tokens=128)
    calls = [b for b in first.content if b.type == "tool_use"]
    if calls:
        results = [
            {"type": "tool_result", "tool_use_id": c.id, "content": "Sunny, 21 C"} for c in calls
        ]
        history = [*ask, {"role": "assistant", "content": first.content}]
        history.append({"role": "user", "content": results})
        final = client.messages.create(
            model=model, messages=history, tools=[WEATHER_TOOL], max_tokens=128
        )
        print(f"[after tool] {final.content}")
    else:
        print(f"[no tool call] stop_reason={first.stop_reason}")


if __name__ == "__main__":
    main(*sys.argv[1:])
