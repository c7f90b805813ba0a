"""Talk to `ninfer serve` through the OpenAI Responses API: create, continue, stream, inspect.

Start a server first (the demo artifact has random weights, so its text is gibberish):

    ninfer serve --dtype fp32 --max-context 4096 --port 8080

then run `python examples/responses_client.py [BASE_URL]`.
"""

from __future__ import annotations

import sys

from openai import OpenAI


def main(base_url: str = "http://127.0.0.1:8080/v1") -> None:
    client = OpenAI(base_url=base_url, api_key="unused-unless-serve-has---api-key")
    model = client.models.list().data[0].id

    first = client.responses.create(
        model=model,
        instructions="Answer concisely.",
        input="What is speculative decoding?",
        max_output_tokens=64,
    )
    print(f"[{first.id}] status={first.status} items={[item.type for item in first.output]}")
    print(f"[answer] {first.output_text}\n[usage] {first.usage}")

    # The server keeps the conversation: continue it by id (instructions are not carried over).
    count = client.responses.input_tokens.count(
        model=model, previous_response_id=first.id, input="And in one word?"
    )
    print(f"[next prompt] {count.input_tokens} tokens")
    stream = client.responses.create(
        model=model,
        previous_response_id=first.id,
        input="And in one word?",
        max_output_tokens=32,
        reasoning={"effort": "none"},  # thinking off for this request
        stream=True,
    )
    second_id = None
    for event in stream:
        if event.type == "response.output_text.delta":
            print(event.delta, end="", flush=True)
        elif event.type in ("response.completed", "response.incomplete"):
            second_id = event.response.id
            print(f"\n[{event.type}] usage={event.response.usage}")

    if second_id is not None:
        items = client.responses.input_items.list(second_id, order="asc")
        print(f"[input items] {[item.type for item in items.data]}")
        client.responses.delete(second_id)


if __name__ == "__main__":
    main(*sys.argv[1:])
