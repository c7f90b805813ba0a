"""The Engine serves an artifact converted with `--weights fp8` (CPU, fp32).

Its greedy tokens must be those of a plain greedy loop over the model built from the artifact's
independently dequantized weights (`artifact.quantize.dequantize_fp8_block`).
"""

from __future__ import annotations

from pathlib import Path

import torch

from ninfer import Engine
from ninfer.artifact.quantize import dequantize_fp8_block
from ninfer.artifact.reader import Artifact
from ninfer.engine.request import EventKind, FinishReason
from ninfer.model import ForwardBatch, ModelCache, Qwen3_5Model, TextConfig
from ninfer.testing import TinySpec
from support.tiny_artifacts import convert_tiny

VOCAB = 8192
STEPS = 8


def _reference_greedy(path: Path, prompt: list[int]) -> list[int]:
    with Artifact(path) as art:
        config = TextConfig.from_hf(art.config["text"])
        weights = art.load("text")
        plain = {
            name: dequantize_fp8_block(t, weights[name + "_scale_inv"], torch.float32)
            if t.dtype == torch.float8_e4m3fn
            else t.clone()
            for name, t in weights.items()
            if not name.endswith("_scale_inv")
        }
    model = Qwen3_5Model(config, plain, dtype=torch.float32)
    cache = ModelCache.allocate(config, num_pages=4, num_slots=1, page_size=16, dtype=torch.float32)
    pages = list(range(4))
    logits = model.forward(
        ForwardBatch.prefill(prompt, num_computed=0, page_ids=pages, state_slot=0), cache
    )
    tokens = [int(logits[0].argmax())]
    for step in range(STEPS - 1):
        batch = ForwardBatch.decode(
            tokens[-1:], num_computed=[len(prompt) + step], page_tables=[pages], state_slots=[0]
        )
        tokens.append(int(model.forward(batch, cache)[0].argmax()))
    return tokens


def test_engine_serves_an_fp8_artifact(tmp_path: Path) -> None:
    spec = TinySpec(kind="dense", vocab_size=VOCAB, with_vision=False)
    _, path = convert_tiny(tmp_path, spec, seed=11, name="tiny-fp8", weights="fp8")
    prompt = torch.randint(0, VOCAB, (21,), generator=torch.Generator().manual_seed(4)).tolist()
    with Engine.load(path, dtype="fp32", page_size=16, max_context=64, prefill_chunk=8) as engine:
        events = list(
            engine.generate(
                prompt, max_tokens=STEPS, ignore_eos=True, greedy=True, presence_penalty=0.0
            )
        )
    got = [t for e in events if e.kind == EventKind.TOKENS for t in e.token_ids]
    assert got == _reference_greedy(path, prompt)
    assert events[-1].finish_reason == FinishReason.LENGTH


def test_decode_tiles_is_refused_where_nothing_would_read_them(tmp_path: Path) -> None:
    """`decode_tiles` binds copies for the CUDA decode GEMVs: asked on the CPU it fails by name
    (engine options, and the model itself for an `auto` device resolved to the CPU), and an
    engine over a model bound without tiles refuses the option instead of ignoring it."""
    import pytest

    spec = TinySpec(kind="dense", vocab_size=VOCAB, with_vision=False)
    _, path = convert_tiny(tmp_path, spec, seed=4, name="tiles", weights="fp8")
    with pytest.raises(ValueError, match="decode_tiles needs a CUDA device"):
        Engine.load(path, decode_tiles=True, device="cpu")
    with pytest.raises(ValueError, match="decode_tiles needs dtype bf16"):
        Engine.load(path, decode_tiles=True, device="cuda", dtype="fp32")
    with Artifact(path) as art:
        config = TextConfig.from_hf(art.config["text"])
        weights = art.load("text")
    with pytest.raises(ValueError, match="decode_tiles needs a CUDA device"):
        Qwen3_5Model(config, weights, decode_tiles=True)
    model = Qwen3_5Model(config, weights)
    assert model.decode_tiles is False
    with pytest.raises(ValueError, match="the model has none"):
        Engine.from_model(model, architecture="qwen3_5", decode_tiles=True, device="cuda")
