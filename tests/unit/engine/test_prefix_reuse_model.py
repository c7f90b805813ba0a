"""Prefix reuse on the real engine and model (the demo artifact: tiny random weights, the real
tokenizer and chat template; CPU, fp32). A prompt that extends a stored checkpoint restores its
state, shares its pages and prefills only the suffix; its tokens and every logit row must equal
the cold run's: bit for bit when the cold run splits its chunks at the same offset (the hit
then computes exactly the same arithmetic), and within 1e-4 (absolute, logits of magnitude ~5)
against an engine without prefix reuse, whose different chunk boundaries round differently."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from ninfer import Engine
from ninfer.artifact.demo import ensure_demo
from ninfer.engine.handles import RequestHandle
from ninfer.engine.request import EngineEvent, EventKind

BASE = {"dtype": "fp32", "page_size": 16, "prefill_chunk": 16, "max_context": 512}
GREEDY = {"greedy": True}
SEEDED = {"seed": 11, "temperature": 0.9, "top_p": 0.95}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather of a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]


class Recorder:
    """An engine whose model forwards are recorded (logits of every sampling row, in order)."""

    def __init__(self, **options) -> None:
        self.engine = Engine.load(ensure_demo(), **BASE, **options)
        self.logits: list[torch.Tensor] = []
        forward = self.engine.model.forward

        def recording(batch, cache):
            out = forward(batch, cache)
            self.logits.append(out.detach().clone())
            return out

        self.engine.model.forward = recording  # type: ignore[method-assign]

    def run(self, ids: list[int], checkpoints=(), sampling=GREEDY, max_tokens=8):
        self.logits = []
        request = self.engine.make_request(
            ids, max_tokens=max_tokens, ignore_eos=True, cache_checkpoints=checkpoints, **sampling
        )
        events = list(RequestHandle(self.engine.core, request))
        tokens = [t for e in events if e.kind == EventKind.TOKENS for t in e.token_ids]
        return tokens, self.logits, _admitted(events), events[-1]


def _admitted(events: list[EngineEvent]) -> EngineEvent:
    return next(e for e in events if e.kind == EventKind.ADMITTED)


@pytest.fixture(scope="module")
def engines() -> Iterator[dict[str, Recorder]]:
    made = {
        "warm": Recorder(),
        "cold_same": Recorder(),  # prefix reuse on, never shown the stems: splits chunks alike
        "cold_plain": Recorder(no_prefix_reuse=True),
    }
    yield made
    for r in made.values():
        r.engine.close()


def _random_ids(seed: int, n: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 150_000, (n,), generator=g).tolist()


def _check_hit(engines, stem: list[int], second: list[int], cut: int, sampling=GREEDY) -> None:
    warm = engines["warm"]
    warm.run(stem, checkpoints=(cut,), sampling=sampling)
    tokens, logits, admitted, finished = warm.run(second, checkpoints=(cut,), sampling=sampling)
    assert admitted.num_cached == cut, admitted.prefix_cache
    assert finished.usage.cached_tokens == cut and finished.timings.cache_n == cut
    same_tokens, same_logits, same_admitted, _ = engines["cold_same"].run(
        second, checkpoints=(cut,), sampling=sampling
    )
    assert same_admitted.num_cached == 0
    assert tokens == same_tokens
    assert len(logits) == len(same_logits) == 8
    assert all(torch.equal(a, b) for a, b in zip(logits, same_logits, strict=True))
    if sampling is GREEDY:
        plain_tokens, plain_logits, plain_admitted, _ = engines["cold_plain"].run(second)
        assert plain_admitted.prefix_cache == "miss=disabled"
        assert tokens == plain_tokens
        for a, b in zip(logits, plain_logits, strict=True):
            torch.testing.assert_close(a, b, atol=1e-4, rtol=0)


@pytest.mark.parametrize("cut", [32, 31, 33])  # page-aligned, one before / after a boundary
def test_hit_equals_the_cold_run_around_a_page_boundary(engines, cut) -> None:
    stem = _random_ids(cut, 60)
    _check_hit(engines, stem, stem[:cut] + _random_ids(100 + cut, 11), cut)


@pytest.mark.parametrize("sampling", [GREEDY, SEEDED], ids=["greedy", "seeded"])
def test_hit_at_a_checkpoint_followed_by_a_one_token_suffix(engines, sampling) -> None:
    stem = _random_ids(7 if sampling is GREEDY else 8, 50)
    _check_hit(engines, stem, stem[:41], 40, sampling)


def test_hit_inside_tool_call_history(engines) -> None:
    engine = engines["warm"].engine
    history = [
        {"role": "system", "content": "You call tools."},
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": {"city": "Paris"}},
                }
            ],
        },
        {"role": "tool", "content": "sunny, 21 C"},
    ]
    stem = engine.render(history + [{"role": "user", "content": "And tomorrow?"}], TOOLS)
    second = engine.render(history + [{"role": "user", "content": "What about Lyon?"}], TOOLS)
    call = stem.index(engine.tokenizer.special_tokens["<tool_call>"])
    cut = call + 5  # inside the call: after `<tool_call>\n<function=get_weather>`
    assert stem[:cut] == second[:cut]
    _check_hit(engines, stem, second, cut)


def test_second_chat_turn_reuses_the_input_checkpoint(engines) -> None:
    warm, plain = engines["warm"].engine, engines["cold_plain"].engine
    messages = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Name three rivers of Europe, please."},
    ]
    first = list(warm.chat(messages, max_tokens=12, greedy=True))
    prompt1 = warm.render(messages, enable_thinking=True)
    prologue = len(prompt1) - prompt1.index(warm.tokenizer.special_tokens["<|im_start|>"], -6)
    reply = {
        "role": "assistant",
        "content": "".join(e.text for e in first if e.kind == "content"),
        "reasoning_content": "".join(e.text for e in first if e.kind == "reasoning"),
    }
    turn2 = messages + [reply, {"role": "user", "content": "And of Asia?"}]
    second = list(warm.chat(turn2, max_tokens=12, greedy=True))
    admitted = next(e for e in second if e.kind == "admitted")
    done = second[-1]
    # the previous prompt minus its generation prologue was reused (at least)
    assert done.usage.cached_tokens >= len(prompt1) - prologue
    assert admitted.num_cached == done.usage.cached_tokens
    assert admitted.prefix_cache == f"hit={done.usage.cached_tokens}; path=checkpoint"
    cold = list(plain.chat(turn2, max_tokens=12, greedy=True))
    assert cold[-1].usage.cached_tokens == 0
    text = ["".join(e.text for e in events if e.kind in ("reasoning", "content"))
            for events in (second, cold)]  # fmt: skip
    assert text[0] == text[1]


def _usage_split(engine: Engine, ids: list[int], checkpoints, marked: int) -> tuple[int, int, int]:
    request = engine.make_request(
        ids,
        max_tokens=2,
        ignore_eos=True,
        cache_checkpoints=checkpoints,
        cache_marked=marked,
        greedy=True,
    )
    events = list(RequestHandle(engine.core, request))
    admitted, usage = _admitted(events), events[-1].usage
    assert usage is not None and admitted.num_cached == usage.cached_tokens
    assert admitted.num_cache_creation == usage.cache_creation_tokens  # fixed at admission
    return usage.prompt_tokens, usage.cached_tokens, usage.cache_creation_tokens


def test_cache_creation_is_the_prompt_past_the_hit_up_to_the_last_marker(engines) -> None:
    """Usage.cache_creation_tokens (Anthropic's cache_creation_input_tokens) is disjoint from the
    hit, so the two and the uncached rest add up to the prompt: the tokens past the hit up to
    the client's last explicit marker; the engine's own checkpoints (here 60 and the end) are
    not creation, and with prefix reuse off nothing is created."""
    warm = engines["warm"].engine
    ids = _random_ids(7, 70)
    assert _usage_split(warm, ids, (40, 60), marked=40) == (70, 0, 40)
    # the same first 60 tokens: the hit (the checkpoint at 60) covers the marker at 40
    assert _usage_split(warm, ids[:60] + _random_ids(8, 10), (40,), marked=40) == (70, 60, 0)
    # a marker past the hit: only the tokens between them are created
    assert _usage_split(warm, ids[:60] + _random_ids(9, 20), (75,), marked=75) == (80, 60, 15)
    plain = engines["cold_plain"].engine
    assert _usage_split(plain, ids, (40,), marked=40) == (70, 0, 0)
