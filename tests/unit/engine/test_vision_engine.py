"""The engine with `vision=True` on a tiny random vision checkpoint (CPU, fp32): chat requests
with images and a video produce transformers' greedy tokens, concurrently with text requests;
the media cache serves repeats; vision-less engines refuse media with `vision_disabled`."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest
import torch

from ninfer import Engine
from ninfer.artifact.convert import convert
from ninfer.engine.handles import RequestHandle
from ninfer.media.errors import MediaError
from ninfer.media.sources import MediaSource
from ninfer.testing import TinySpec, make_tiny_checkpoint
from support.media_files import encode_image, make_video, noise_image

transformers = pytest.importorskip("transformers")
SPEC = TinySpec(with_mtp=False, video_max_frames=8)
GREEDY = {"greedy": True, "presence_penalty": 0.0}


def data_uri(data: bytes, mime: str) -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("vision-engine")
    ckpt = make_tiny_checkpoint(tmp / "hf", SPEC, seed=9)
    art = convert(ckpt, tmp / "v.ninfer").path
    engine = Engine.load(
        art,
        dtype="fp32",
        vision=True,
        max_concurrency=4,
        prefill_chunk=24,  # chunk edges cut through the media tokens
        page_size=16,
        max_context=2048,
    )
    hf = transformers.Qwen3_5ForConditionalGeneration.from_pretrained(ckpt, dtype=torch.float32)
    yield engine, hf.eval(), art
    engine.close()


def _messages(parts: list[dict]) -> list[dict]:
    return [{"role": "user", "content": [*parts, {"type": "text", "text": "Describe."}]}]


def _chat_tokens(engine: Engine, messages: list[dict], n: int) -> tuple[list[int], int]:
    tokens, prompt = [], 0
    for event in engine.chat(
        messages, enable_thinking=False, max_tokens=n, ignore_eos=True, **GREEDY
    ):
        tokens += event.token_ids
        if event.kind == "finished":
            prompt = event.usage.prompt_tokens
    return tokens, prompt


def _hf_greedy(engine: Engine, hf, messages: list[dict], n: int, images, video=None):
    """transformers' greedy tokens for the same expanded prompt, with its own image processor."""
    ids = engine.render(messages, enable_thinking=False)
    expanded, media, lease = engine.prepare_prompt(ids, messages)
    lease.release()
    inputs = {"input_ids": torch.tensor([expanded])}
    types = torch.zeros_like(inputs["input_ids"])
    types[inputs["input_ids"] == engine.media_tokens.image_pad] = 1
    types[inputs["input_ids"] == engine.media_tokens.video_pad] = 2
    inputs["mm_token_type_ids"] = types
    if images:
        s = engine.media.settings.image
        proc = transformers.Qwen2VLImageProcessorPil(
            size={"shortest_edge": s.min_pixels, "longest_edge": s.max_pixels},
            patch_size=s.patch_size,
            merge_size=s.merge_size,
            image_mean=list(s.image_mean),
            image_std=list(s.image_std),
        )
        inputs.update(proc(images=images, return_tensors="pt"))
    if video is not None:  # no torchvision here: ninfer's video patches (tested separately)
        inputs["pixel_values_videos"] = video.patches
        inputs["video_grid_thw"] = torch.tensor([list(video.grid_thw)])
    with torch.no_grad():
        out = hf.generate(
            **inputs, max_new_tokens=n, do_sample=False, eos_token_id=None, pad_token_id=0
        )
    return out[0, len(expanded) :].tolist(), len(expanded)


def test_images_greedy_match_transformers(tiny) -> None:
    engine, hf, _ = tiny
    images = [noise_image(90, 70, seed=1), noise_image(40, 160, "RGBA", seed=2)]
    parts = [{"type": "image", "image": data_uri(encode_image(i), "image/png")} for i in images]
    messages = _messages(parts)
    got, prompt_tokens = _chat_tokens(engine, messages, 10)
    ref, ref_len = _hf_greedy(engine, hf, messages, 10, images)
    assert got == ref
    assert prompt_tokens == ref_len  # usage counts the expanded prompt


def test_video_greedy_matches_transformers(tiny) -> None:
    engine, hf, _ = tiny
    clip = make_video(20, 10, width=80, height=48)
    messages = _messages([{"type": "video", "video": data_uri(clip, "video/mp4")}])
    got, _ = _chat_tokens(engine, messages, 8)
    lease = engine.media.prepare([MediaSource("video", messages[0]["content"][0]["video"], "v")])
    video = lease.items[0]
    lease.release()
    ref, _ = _hf_greedy(engine, hf, messages, 8, [], video)
    assert got == ref


def test_media_and_text_requests_run_together(tiny) -> None:
    engine, _, _ = tiny
    img = data_uri(encode_image(noise_image(64, 64, seed=5)), "image/png")
    solo_media, _ = _chat_tokens(engine, _messages([{"type": "image", "image": img}]), 6)
    text = [{"role": "user", "content": "Hello there"}]
    solo_text, _ = _chat_tokens(engine, text, 6)
    handles = []
    for msgs in (_messages([{"type": "image", "image": img}]), text):
        request, _, lease = engine._chat_request(
            msgs, None, False, None, {"max_tokens": 6, "ignore_eos": True, **GREEDY}
        )
        handles.append((RequestHandle(engine.core, request), lease))
    outs = []
    for handle, lease in handles:
        outs.append([t for e in handle for t in e.token_ids])
        if lease is not None:
            lease.release()
    assert outs == [solo_media, solo_text]


def test_repeated_image_hits_the_cache(tiny) -> None:
    engine, _, _ = tiny
    img = data_uri(encode_image(noise_image(50, 50, seed=11)), "image/png")
    before = engine.media_stats()
    first, _ = _chat_tokens(engine, _messages([{"type": "image", "image": img}]), 4)
    second, _ = _chat_tokens(engine, _messages([{"type": "image", "image": img}]), 4)
    after = engine.media_stats()
    assert first == second
    assert after["builds"] - before["builds"] == 1  # decoded and resized once
    assert after["hits"] - before["hits"] == 1
    assert after["tower_encoded"] - before["tower_encoded"] == 1  # the tower ran once
    assert after["tower_hits"] - before["tower_hits"] == 1


def test_vision_disabled_engine_refuses_media(tiny, tmp_path: Path) -> None:
    _, _, art = tiny
    with Engine.load(art, dtype="fp32", max_context=256) as plain:
        img = data_uri(encode_image(noise_image(20, 20)), "image/png")
        with pytest.raises(MediaError) as e:
            list(plain.chat(_messages([{"type": "image", "image": img}]), max_tokens=2))
        assert e.value.code == "vision_disabled"
        # text still works
        assert list(plain.chat([{"role": "user", "content": "hi"}], max_tokens=2))


def test_bad_media_is_a_media_error_naming_the_part(tiny) -> None:
    engine, _, _ = tiny
    bad = data_uri(b"definitely not a png", "image/png")
    with pytest.raises(MediaError) as e:
        list(engine.chat(_messages([{"type": "image", "image": bad}]), max_tokens=2))
    assert e.value.code == "invalid_media"
    assert e.value.param == "messages[0].content[0]"
    assert engine.media.cache.snapshot()["live_bytes"] >= 0
