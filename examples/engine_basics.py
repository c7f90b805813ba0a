"""ninfer as a library: load, generate token events, chat with reasoning, chat under asyncio.

Run it with `python examples/engine_basics.py [ARTIFACT]`. Without an artifact it uses the demo
model (built on first use), whose weights are RANDOM: the text is gibberish, the mechanics are real.
"""

from __future__ import annotations

import asyncio
import sys

from ninfer import Engine
from ninfer.engine.request import EventKind


def generate_tokens(engine: Engine) -> None:
    """Token level: a raw prompt in, committed token ids and their text out."""
    print("== generate")
    # A str prompt is encoded with special tokens honoured; a list of ids is taken as is.
    prompt = "<|im_start|>user\nName three colours.<|im_end|>\n<|im_start|>assistant\n"
    for event in engine.generate(prompt, max_tokens=12, thinking=False, greedy=True):
        if event.kind == EventKind.TOKENS:
            print(f"  tokens {event.token_ids} -> {event.text!r}")
        elif event.kind == EventKind.FINISHED:
            assert event.usage is not None and event.timings is not None
            print(
                f"  finished: {event.finish_reason.value}, {event.usage.completion_tokens} tokens, "
                f"{event.timings.predicted_per_second:.1f} tok/s"
            )


def chat_once(engine: Engine) -> list[dict[str, str]]:
    """Conversation level: the chat template in, reasoning / content / tool calls out."""
    print("== chat")
    messages = [{"role": "user", "content": "Why is the sky blue? One sentence."}]
    reasoning, content = "", ""
    for event in engine.chat(messages, enable_thinking=True, max_tokens=24, seed=0):
        if event.kind == "progress":
            print(f"  prompt {event.num_processed}/{event.num_prompt} tokens processed")
        elif event.kind == "reasoning":
            reasoning += event.text
        elif event.kind == "content":
            content += event.text
        elif event.kind == "finished":
            assert event.usage is not None
            print(
                f"  {event.usage.completion_tokens} tokens, {event.usage.reasoning_tokens} of "
                f"them reasoning; finish: {event.finish_reason.value}"
            )
    print(f"  reasoning: {reasoning!r}\n  content:   {content!r}")
    # Keep both parts so the next turn is rendered the way the model produced this one.
    return [
        *messages,
        {"role": "assistant", "content": content, "reasoning_content": reasoning},
        {"role": "user", "content": "And at sunset?"},
    ]


async def chat_async(engine: Engine, conversation: list[dict[str, str]]) -> None:
    """The same under asyncio: two requests in flight at once, each its own stream."""
    print("== async chat")

    async def one(name: str, messages: list[dict[str, str]]) -> str:
        text = ""
        async for event in engine.achat(messages, enable_thinking=False, max_tokens=16):
            if event.kind == "content":
                text += event.text
        return f"  {name}: {text!r}"

    fresh = [{"role": "user", "content": "Say hello."}]
    for line in await asyncio.gather(one("follow-up", conversation), one("fresh", fresh)):
        print(line)


def main() -> None:
    path = sys.argv[1] if len(sys.argv) > 1 else None  # None: the demo artifact
    engine = Engine.load(path, max_context=2048, max_concurrency=2, dtype="fp32")
    try:
        if engine.artifact.metadata.get("random_weights"):
            print("(demo model with RANDOM weights: expect gibberish)")
        generate_tokens(engine)
        conversation = chat_once(engine)
        asyncio.run(chat_async(engine, conversation))
    finally:
        engine.close()  # stops the worker thread and unmaps the artifact


if __name__ == "__main__":
    main()
