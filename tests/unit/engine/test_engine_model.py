"""The whole engine on tiny real models: transformers parity through `ninfer convert`, batching
invariance, seeded reproducibility and stop strings. CPU, fp32."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from ninfer import Engine
from ninfer.engine.request import EventKind, FinishReason
from ninfer.testing import TinySpec
from support.tiny_artifacts import convert_tiny

transformers = pytest.importorskip("transformers")
VOCAB = 8192
GREEDY = {"greedy": True, "presence_penalty": 0.0}


def _artifact(tmp: Path, kind: str) -> tuple[Path, Path]:
    # bf16 values: the artifact (bf16) and transformers (fp32 upcast) then hold identical weights
    return convert_tiny(tmp, TinySpec(kind=kind, vocab_size=VOCAB), seed=3, name=f"tiny-{kind}")


@pytest.fixture(scope="module", params=["dense", "moe"])
def tiny(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    ckpt, art = _artifact(tmp_path_factory.mktemp(request.param), request.param)
    engine = Engine.load(
        art,
        dtype="fp32",
        max_concurrency=8,
        max_pending_requests=16,
        prefill_chunk=32,
        page_size=16,
        max_context=512,
    )
    yield request.param, ckpt, engine
    engine.close()


def _tokens(events) -> list[int]:
    return [t for e in events if e.kind == EventKind.TOKENS for t in e.token_ids]


def _prompt(i: int, n: int) -> list[int]:
    g = torch.Generator().manual_seed(100 + i)
    return torch.randint(0, VOCAB, (n,), generator=g).tolist()


def test_greedy_matches_transformers(tiny) -> None:
    kind, ckpt, engine = tiny
    cls = transformers.Qwen3_5MoeForCausalLM if kind == "moe" else transformers.Qwen3_5ForCausalLM
    hf = cls.from_pretrained(ckpt, dtype=torch.float32).eval()
    prompt = _prompt(0, 45)
    with torch.no_grad():
        ref = hf.generate(
            torch.tensor([prompt]),
            max_new_tokens=64,
            do_sample=False,
            min_new_tokens=64,
            eos_token_id=None,
            pad_token_id=0,
        )[0, 45:].tolist()
    got = _tokens(engine.generate(prompt, max_tokens=64, ignore_eos=True, **GREEDY))
    assert got == ref


def test_concurrent_greedy_requests_equal_solo(tiny) -> None:
    _, _, engine = tiny
    prompts = [_prompt(i, 5 + 9 * i) for i in range(8)]
    solo = [_tokens(engine.generate(p, max_tokens=12, ignore_eos=True, **GREEDY)) for p in prompts]
    from ninfer.engine.handles import RequestHandle

    handles = [
        RequestHandle(engine.core, engine.make_request(p, max_tokens=12, ignore_eos=True, **GREEDY))
        for p in prompts
    ]
    together = [_tokens(list(h)) for h in handles]
    assert together == solo
    assert len({tuple(s) for s in solo}) > 1


def test_seeded_sampling_is_batch_invariant(tiny) -> None:
    _, _, engine = tiny
    from ninfer.engine.handles import RequestHandle

    kw = {
        "max_tokens": 16,
        "ignore_eos": True,
        "temperature": 1.0,
        "top_k": 0,
        "top_p": 0.95,
        "seed": -77,
    }
    alone = _tokens(engine.generate(_prompt(9, 20), **kw))
    others = [
        RequestHandle(
            engine.core, engine.make_request(_prompt(j, 30), max_tokens=16, ignore_eos=True, seed=j)
        )
        for j in range(3)
    ]
    mine = RequestHandle(engine.core, engine.make_request(_prompt(9, 20), **kw))
    for h in others:
        list(h)
    assert _tokens(list(mine)) == alone
    assert _tokens(engine.generate(_prompt(9, 20), **(kw | {"seed": 5}))) != alone


def test_stop_string_withholds_and_finishes(tiny) -> None:
    _, _, engine = tiny
    full = list(engine.generate(_prompt(4, 10), max_tokens=24, ignore_eos=True, **GREEDY))
    text = "".join(e.text for e in full)
    assert len(text) > 6
    stop = text[3:6]
    cut = list(
        engine.generate(_prompt(4, 10), max_tokens=24, ignore_eos=True, stop=[stop], **GREEDY)
    )
    assert cut[-1].finish_reason == FinishReason.STOP
    assert "".join(e.text for e in cut) == text[: text.index(stop)]


@pytest.mark.parametrize("kind", ["dense", "moe"])
def test_converted_artifact_logits_match_transformers(kind: str, tmp_path: Path) -> None:
    """The artifact path end to end: `ninfer convert` output bound into the model, fp32 logits
    within 1e-3 relative error (max |a - b| / max |b|) of transformers for prefills of 1..300
    tokens and for 50 decode steps after one of them."""
    from ninfer.artifact.reader import Artifact
    from ninfer.model import ForwardBatch, ModelCache, Qwen3_5Model, TextConfig

    ckpt, art_path = _artifact(tmp_path, kind)
    cls = transformers.Qwen3_5MoeForCausalLM if kind == "moe" else transformers.Qwen3_5ForCausalLM
    hf = cls.from_pretrained(ckpt, dtype=torch.float32).eval()
    with Artifact(art_path) as art:
        config = TextConfig.from_hf(art.config["text"])
        model = Qwen3_5Model(config, art.load("text"), dtype=torch.float32)

    def rel(a: torch.Tensor, b: torch.Tensor) -> float:
        return ((a - b).abs().max() / b.abs().max()).item()

    pages = list(range(24))
    for n in (1, 7, 64, 300):
        ids = _prompt(n, n)
        cache = ModelCache.allocate(
            config, num_pages=24, num_slots=1, page_size=16, dtype=torch.float32
        )
        ours = model.forward(
            ForwardBatch.prefill(ids, num_computed=0, page_ids=pages, state_slot=0),
            cache,
            all_logits=True,
        )
        with torch.no_grad():
            out = hf(torch.tensor([ids]), use_cache=True)
        assert rel(ours, out.logits[0]) < 1e-3, n
    # 50 decode steps continuing the 300-token prefill, fed the reference's greedy tokens
    past, token = out.past_key_values, out.logits[0, -1].argmax().item()
    for step in range(50):
        batch = ForwardBatch.decode(
            [token], num_computed=[300 + step], page_tables=[pages], state_slots=[0]
        )
        ours = model.forward(batch, cache)[0]
        with torch.no_grad():
            out = hf(torch.tensor([[token]]), past_key_values=past, use_cache=True)
        past, ref = out.past_key_values, out.logits[0, -1]
        assert rel(ours, ref) < 1e-3, step
        token = ref.argmax().item()
