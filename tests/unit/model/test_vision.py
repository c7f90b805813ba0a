"""The vision tower and media prompts against transformers' Qwen3_5ForConditionalGeneration.

A tiny random nested checkpoint (bf16 values, both sides compute in fp32) goes through the real
converter; ninfer runs the tower, the MRoPE layout and a chunked prefill whose chunk edges cut
through media, then greedy decode with the rope delta. Tolerances: tower output and logits within
1e-3 relative error (max |a - b| / max |b|); greedy tokens equal.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

import pytest
import torch

from ninfer.artifact.convert import convert
from ninfer.artifact.reader import Artifact
from ninfer.engine.media_join import TowerCache, chunk_inputs, encode_media
from ninfer.media.image import preprocess_image
from ninfer.media.layout import MediaTokens, expand_prompt
from ninfer.media.settings import MediaSettings
from ninfer.media.video import decode_video, preprocess_video
from ninfer.model.batch import ForwardBatch
from ninfer.model.cache import ModelCache
from ninfer.model.config import TextConfig
from ninfer.model.errors import WeightError
from ninfer.model.qwen3_5 import Qwen3_5Model
from ninfer.model.vision import VisionConfig, VisionTower
from ninfer.testing import TinySpec, make_tiny_checkpoint
from ninfer.tokenizer import Tokenizer
from support.media_files import make_video, noise_image

transformers = pytest.importorskip("transformers")

TOL = 1e-3
PAGE = 16
SPEC = TinySpec(with_mtp=False, vision_depth=2, video_max_frames=8)


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).abs().max() / b.float().abs().max()).item()


class Tiny(NamedTuple):
    hf: Any
    model: Qwen3_5Model
    tower: VisionTower
    settings: MediaSettings
    tokens: MediaTokens
    tokenizer: Tokenizer


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Tiny:
    tmp = tmp_path_factory.mktemp("vision")
    ckpt = make_tiny_checkpoint(tmp / "hf", SPEC, seed=5)
    art = Artifact(convert(ckpt, tmp / "v.ninfer").path)
    model = Qwen3_5Model(TextConfig.from_hf(art.config["text"]), art.load("text"))
    tower = VisionTower(VisionConfig.from_dict(art.config["vision"]), art.load("vision"))
    hf = transformers.Qwen3_5ForConditionalGeneration.from_pretrained(
        ckpt, dtype=torch.float32
    ).eval()
    return Tiny(
        hf,
        model,
        tower,
        MediaSettings.from_config(art.config["media"]),
        MediaTokens.from_config(art.config["model"]),
        Tokenizer.qwen3_5(),
    )


def _run_ours(tiny: Tiny, prompt, chunk: int, steps: int) -> tuple[torch.Tensor, list[int]]:
    """All prompt logits (chunked prefill) and `steps` greedy tokens."""
    config = tiny.model.config
    n = len(prompt.token_ids)
    pages = list(range(-(-(n + steps) // PAGE)))
    cache = ModelCache.allocate(
        config, num_pages=len(pages), num_slots=1, page_size=PAGE, dtype=torch.float32
    )
    encoded = encode_media(tiny.tower, prompt)
    logits = []
    for start in range(0, n, chunk):
        ids = prompt.token_ids[start : start + chunk]
        positions, index, rows = chunk_inputs(encoded, start, len(ids))
        batch = ForwardBatch.prefill(
            ids,
            num_computed=start,
            page_ids=pages,
            state_slot=0,
            positions=positions,
            embed_index=index,
            embed_rows=rows,
        )
        logits.append(tiny.model.forward(batch, cache, all_logits=True))
    prompt_logits = torch.cat(logits)
    tokens = [int(prompt_logits[-1].argmax())]
    for step in range(steps - 1):
        batch = ForwardBatch.decode(
            [tokens[-1]],
            num_computed=[n + step],
            page_tables=[pages],
            state_slots=[0],
            position_offsets=[encoded.rope_delta],
        )
        tokens.append(int(tiny.model.forward(batch, cache)[0].argmax()))
    return prompt_logits, tokens


def _hf_inputs(tiny: Tiny, prompt) -> dict[str, torch.Tensor]:
    ids = torch.tensor([prompt.token_ids])
    types = torch.zeros_like(ids)
    types[ids == tiny.tokens.image_pad] = 1
    types[ids == tiny.tokens.video_pad] = 2
    out: dict[str, torch.Tensor] = {"input_ids": ids, "mm_token_type_ids": types}
    for kind, key, grid in (
        ("image", "pixel_values", "image_grid_thw"),
        ("video", "pixel_values_videos", "video_grid_thw"),
    ):
        items = [m for m in prompt.items if m.modality == kind]
        if items:
            out[key] = torch.cat([m.patches for m in items])
            out[grid] = torch.tensor([list(m.grid_thw) for m in items])
    return out


def _prompt(tiny: Tiny, items: list) -> Any:
    t = tiny.tokens
    ids = tiny.tokenizer.encode_text("Look:")
    for k, m in enumerate(items):
        pad = t.image_pad if m.modality == "image" else t.video_pad
        ids += [t.vision_start, pad, t.vision_end, *tiny.tokenizer.encode_text(f" and {k}")]
    ids += tiny.tokenizer.encode_text(" what do you see?")
    return expand_prompt(ids, items, t, tiny.tokenizer.encode_text)


def test_tower_matches_transformers_visual(tiny: Tiny) -> None:
    images = [noise_image(90, 40, seed=1), noise_image(33, 120, "L", seed=2)]
    items = [preprocess_image(img, tiny.settings.image) for img in images]
    ours = tiny.tower.encode([m.patches for m in items], [m.grid_thw for m in items])
    with torch.no_grad():
        ref = tiny.hf.model.visual(
            torch.cat([m.patches for m in items]),
            grid_thw=torch.tensor([list(m.grid_thw) for m in items]),
        ).pooler_output
    assert [o.shape[0] for o in ours] == [m.num_tokens for m in items]
    assert rel_err(torch.cat(ours), ref) < TOL


@pytest.mark.parametrize(
    ("case", "chunk"),
    [("one-image", 7), ("three-images", 16), ("video", 13), ("image-and-video", 1000)],
)
def test_logits_and_greedy_match_transformers(tiny: Tiny, case: str, chunk: int) -> None:
    s = tiny.settings
    images = {
        "one-image": [noise_image(70, 50, seed=3)],
        "three-images": [noise_image(40, 40, seed=4), noise_image(200, 30, seed=5)]
        + [noise_image(64, 97, "RGBA", seed=6)],
        "video": [],
        "image-and-video": [noise_image(100, 60, seed=7)],
    }[case]
    items = [preprocess_image(img, s.image) for img in images]
    if "video" in case:
        items.append(preprocess_video(decode_video(make_video(24, 8), s.video), s.video))
    prompt = _prompt(tiny, items)
    steps = 12
    logits, tokens = _run_ours(tiny, prompt, chunk, steps)
    inputs = _hf_inputs(tiny, prompt)
    with torch.no_grad():
        ref = tiny.hf(**inputs).logits[0]
        out = tiny.hf.generate(
            **inputs, max_new_tokens=steps, do_sample=False, eos_token_id=None, pad_token_id=0
        )
    assert rel_err(logits, ref) < TOL
    assert tokens == out[0, len(prompt.token_ids) :].tolist()


def test_text_only_batches_carry_no_media_work(tiny: Tiny) -> None:
    """The override fields default to None and the forward is the plain text path."""
    batch = ForwardBatch.prefill([1, 2, 3], num_computed=0, page_ids=[0], state_slot=0)
    assert batch.embed_index is None and batch.embed_rows is None
    assert batch.positions.dim() == 1


def test_tower_refuses_wrong_weights(tiny: Tiny, tmp_path: Path) -> None:
    weights = {n: torch.zeros(1) for n in ("patch_embed.proj.weight",)}
    with pytest.raises(WeightError, match="has shape"):
        VisionTower(tiny.tower.config, weights)


def test_replay_past_a_media_prompt_and_a_start_after_its_media(tiny: Tiny) -> None:
    """A replay rebuilds prompt + committed output as prefill chunks (one straddles the prompt's
    end): positions past the prompt are KV index + rope_delta, as in decode, so the next greedy
    token is the decoded one. A computation starting after the media (a prefix hit) encodes
    none of it."""
    items = [preprocess_image(noise_image(70, 50, seed=3), tiny.settings.image)]
    prompt = _prompt(tiny, items)
    _, tokens = _run_ours(tiny, prompt, 16, 6)
    full = [*prompt.token_ids, *tokens[:5]]
    pages = list(range(-(-(len(full) + 1) // PAGE)))
    cache = ModelCache.allocate(
        tiny.model.config, num_pages=len(pages), num_slots=1, page_size=PAGE, dtype=torch.float32
    )
    encoded = encode_media(tiny.tower, prompt)
    chunk = 7
    assert len(prompt.token_ids) % chunk  # a chunk crosses from the prompt into the output
    for start in range(0, len(full), chunk):
        ids = full[start : start + chunk]
        positions, index, rows = chunk_inputs(encoded, start, len(ids))
        assert positions.shape == (3, len(ids))
        batch = ForwardBatch.prefill(
            ids,
            num_computed=start,
            page_ids=pages,
            state_slot=0,
            positions=positions,
            embed_index=index,
            embed_rows=rows,
        )
        logits = tiny.model.forward(batch, cache)
    assert int(logits[-1].argmax()) == tokens[5]
    towers = TowerCache(1 << 20)
    after = max(r.start + r.length for r in prompt.runs)
    skipped = encode_media(tiny.tower, prompt, towers, start=after)
    assert skipped.rows.shape[0] == 0 and towers.encoded == 0 and towers.prefix_skips == 1
    assert torch.equal(skipped.positions, encoded.positions)
