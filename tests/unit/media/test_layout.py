"""Prompt expansion of media placeholders and MRoPE positions, against transformers'
Qwen3.5 `get_rope_index` (the reference for positions)."""

from __future__ import annotations

import pytest
import torch

from ninfer.media.errors import MediaError
from ninfer.media.layout import MediaTokens, expand_prompt
from ninfer.media.prepared import PreparedMedia

transformers = pytest.importorskip("transformers")

TOK = MediaTokens()
VS, VE, IMG, VID = TOK.vision_start, TOK.vision_end, TOK.image_pad, TOK.video_pad


def _image(h: int, w: int) -> PreparedMedia:
    return PreparedMedia("image", torch.zeros(h * w, 4), (1, h, w), 2)


def _video(t: int, h: int, w: int) -> PreparedMedia:
    stamps = tuple(0.25 + i for i in range(t))
    return PreparedMedia("video", torch.zeros(t * h * w, 4), (t, h, w), 2, timestamps=stamps)


def _encode(text: str) -> list[int]:
    return [1000 + ord(c) for c in text]  # any injective text encoding


@pytest.fixture(scope="module")
def reference_model() -> object:
    text = {
        "vocab_size": 248320,
        "hidden_size": 16,
        "num_hidden_layers": 1,
        "num_attention_heads": 1,
        "num_key_value_heads": 1,
        "head_dim": 16,
        "intermediate_size": 16,
        "layer_types": ["full_attention"],
    }
    vision = {"depth": 1, "hidden_size": 16, "num_heads": 1, "intermediate_size": 16}
    cfg = transformers.Qwen3_5Config(text_config=text, vision_config=vision)
    return transformers.Qwen3_5Model(cfg)


def _reference_positions(model: object, ids: tuple[int, ...], items: list[PreparedMedia]):
    t = torch.tensor([ids])
    types = torch.zeros_like(t)
    types[t == IMG] = 1
    types[t == VID] = 2
    grids = {k: [list(m.grid_thw) for m in items if m.modality == k] for k in ("image", "video")}
    pos, delta = model.get_rope_index(
        t,
        types,
        image_grid_thw=torch.tensor(grids["image"]) if grids["image"] else None,
        video_grid_thw=torch.tensor(grids["video"]) if grids["video"] else None,
    )
    return pos[:, 0], int(delta)


@pytest.mark.parametrize(
    "items",
    [
        [_image(4, 6)],
        [_image(2, 16), _image(8, 2)],  # wide then tall: text resumes at max(rows, cols)
        [_video(3, 4, 4)],
        [_image(6, 6), _video(2, 2, 8), _image(2, 2)],
    ],
    ids=["one-image", "two-images", "video", "mixed"],
)
def test_positions_match_get_rope_index(reference_model: object, items: list) -> None:
    ids = [11, 12]
    for k, m in enumerate(items):
        ids += [VS, IMG if m.modality == "image" else VID, VE, 20 + k]
    ids += [13, 14, 15]
    prompt = expand_prompt(ids, items, TOK, _encode)
    ref_pos, ref_delta = _reference_positions(reference_model, prompt.token_ids, items)
    assert torch.equal(prompt.positions, ref_pos)
    assert prompt.rope_delta == ref_delta
    assert prompt.num_media_tokens == sum(m.num_tokens for m in items)
    # every run points at pads of its item's kind, in order
    for run in prompt.runs:
        pad = IMG if items[run.item].modality == "image" else VID
        assert set(prompt.token_ids[run.start : run.start + run.length]) == {pad}


def test_video_expands_to_timestamped_frames() -> None:
    video = _video(2, 2, 4)  # 2 temporal patches of 1 x 2 merged tokens
    prompt = expand_prompt([5, VS, VID, VE, 6], [video], TOK, _encode)
    expected = [5]
    for t in video.timestamps:
        expected += [*_encode(f"<{t:.1f} seconds>"), VS, VID, VID, VE]
    assert list(prompt.token_ids) == [*expected, 6]


def test_placeholder_count_must_match_items() -> None:
    with pytest.raises(MediaError, match="more image placeholders"):
        expand_prompt([VS, IMG, VE, VS, IMG, VE], [_image(2, 2)], TOK, _encode)
    with pytest.raises(MediaError, match="2 media items"):
        expand_prompt([VS, IMG, VE], [_image(2, 2), _image(2, 2)], TOK, _encode)
    with pytest.raises(MediaError, match="is a video, its placeholder is for an image"):
        expand_prompt([VS, IMG, VE], [_video(1, 2, 2)], TOK, _encode)


def _digested(item: PreparedMedia, digest: str) -> PreparedMedia:
    return PreparedMedia(item.modality, item.patches, item.grid_thw, item.merge_size,
                         item.timestamps, digest=digest)  # fmt: skip


def test_prefix_identity_covers_media_digest_and_grid() -> None:
    ids = [5, 6, VS, IMG, VE, 7, VS, VID, VE, 8]
    a, b = _digested(_image(4, 6), "a" * 64), _digested(_image(4, 6), "b" * 64)
    v = _digested(_video(2, 4, 4), "c" * 64)
    one = expand_prompt(ids, [a, v], TOK, _encode)
    same = expand_prompt(ids, [_digested(_image(4, 6), "a" * 64), v], TOK, _encode)
    other = expand_prompt(ids, [b, v], TOK, _encode)  # same pad count, other bytes
    wider = expand_prompt(ids, [_digested(_image(6, 4), "a" * 64), v], TOK, _encode)
    assert one.token_ids == other.token_ids  # the ids alone cannot tell the images apart
    assert one.identity == same.identity and len(one.identity) == len(one.token_ids)
    first_pad = one.runs[0].start
    for changed in (other, wider):
        pairs = zip(one.identity, changed.identity, strict=True)
        diverge = next(i for i, (x, y) in enumerate(pairs) if x != y)
        assert diverge == first_pad
    assert one.identity[:first_pad] == tuple(ids[:first_pad])  # text keeps its ids
    pixels = expand_prompt(ids, [_image(4, 6), v], TOK, _encode)  # no digest: matches nothing
    again = expand_prompt(ids, [_image(4, 6), v], TOK, _encode)
    assert pixels.identity[first_pad] != again.identity[first_pad]


def test_rendered_offsets_map_past_expanded_media() -> None:
    ids = [5, 6, VS, IMG, VE, 7, VS, VID, VE, 8]
    prompt = expand_prompt(ids, [_image(4, 6), _video(2, 4, 4)], TOK, _encode)
    out = prompt.token_ids
    for offset in range(len(ids) + 1):
        mapped = prompt.expanded_offset(offset)
        if offset < 4:  # before (and at) the image pad: unchanged
            assert mapped == offset
        # the token at each boundary outside a placeholder is the same token after expansion
        # (the video's whole vision_start / pad / vision_end triple is its placeholder)
        if offset < len(ids) and offset not in (3, 6, 7, 8):
            assert out[mapped] == ids[offset], offset
    assert prompt.expanded_offset(len(ids)) == len(out)
