"""`ninfer serve --max-concurrency N` with N beyond the spec's 8: N streams at once through the
official OpenAI SDK, all decoding together, each receiving its own complete answer.

On the CPU the demo serves 16 lanes; the GPU variant (`-m gpu`) serves 64. Each stream's text must
equal what the same request gives alone (greedy, EOS ignored by a fixed seed and max_tokens), so
sharing steps with up to N - 1 others changes nothing a client sees.
"""

from __future__ import annotations

import asyncio
import time

import openai
import pytest
import torch

from e2e.serve_process import MODEL_ID, serve

pytestmark = pytest.mark.e2e


def _messages(i: int) -> list[dict]:
    return [{"role": "user", "content": f"Stream {i}: count to {3 + i % 5}, please." * (1 + i % 3)}]


async def _stream(
    client: openai.AsyncOpenAI, i: int, max_tokens: int, spans: list | None = None
) -> tuple[str, str]:
    stream = await client.chat.completions.create(
        model=MODEL_ID,
        messages=_messages(i),
        max_tokens=max_tokens,
        temperature=0,
        stream=True,
        extra_body={"chat_template_kwargs": {"enable_thinking": False}},
    )
    text, finish, times = [], "", []
    async for chunk in stream:
        for choice in chunk.choices:
            if choice.delta.content:
                times.append(time.monotonic())
            text.append(choice.delta.content or "")
            finish = choice.finish_reason or finish
    if spans is not None:
        spans.append((times[0], times[-1]))
    return "".join(text), finish


def _run_lanes(lanes: int, *device_args: str) -> None:
    args = ["--max-concurrency", str(lanes), "--max-pending-requests", str(lanes)]
    args += ["--kv-capacity", str(lanes * 512), "--greedy", *device_args]
    spans: list[tuple[float, float]] = []
    with serve(*args) as server:
        client = openai.AsyncOpenAI(base_url=f"{server.base_url}/v1", api_key="x", max_retries=0)

        async def main() -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
            together = await asyncio.gather(*(_stream(client, i, 12, spans) for i in range(lanes)))
            alone = [await _stream(client, i, 12) for i in range(0, lanes, 5)]
            return list(together), alone

        together, alone = asyncio.run(main())
        assert any(f"max_concurrency={lanes}" in line for line in server.log)
    assert all(finish in ("length", "stop") for _, finish in together)
    assert all(text for text, _ in together)
    assert [together[i] for i in range(0, lanes, 5)] == alone
    # all N were streaming at one moment: the last first delta precedes the first last delta
    assert max(first for first, _ in spans) < min(last for _, last in spans)


def test_sixteen_lanes_on_the_cpu() -> None:
    _run_lanes(16)


@pytest.mark.gpu
def test_sixty_four_lanes_on_the_gpu() -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    _run_lanes(64, "--device", "0")
