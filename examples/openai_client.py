"""Talk to `ninfer serve` with the official openai SDK: one answer, then one streamed answer.

Start a server first (the demo artifact has random weights, so its text is gibberish):

    ninfer serve --dtype fp32 --max-context 4096 --port 8080

then run `python examples/openai_client.py [BASE_URL]`.
"""

from __future__ import annotations

import sys

from openai import OpenAI


def main(base_url: str = "http://127.0.0.1:8080/v1") -> None:
    client = OpenAI(base_url=base_url, api_key="unused-unless-serve-has---api-key")
    model = client.models.list().data[0].id
    messages = [
        {"role": "system", "content": "Answer concisely."},
        {"role": "user", "content": "What is speculative decoding?"},
    ]

    reply = client.chat.completions.create(model=model, messages=messages, max_tokens=64, seed=1)
    message = reply.choices[0].message
    reasoning = (message.model_extra or {}).get("reasoning_content", "")
    print(f"[reasoning] {reasoning}\n[answer] {message.content}")
    print(f"[usage] {reply.usage}\n[finish] {reply.choices[0].finish_reason}")

    stream = client.chat.completions.create(
        model=model,
        messages=messages,
        max_tokens=64,
        reasoning_effort="none",  # thinking off for this request
        stream=True,
        stream_options={"include_usage": True},
    )
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            print(chunk.choices[0].delta.content, end="", flush=True)
        if chunk.usage is not None:
            print(f"\n[usage] {chunk.usage}")


if __name__ == "__main__":
    main(*sys.argv[1:])
