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
from ninfer.tokenizer import Tokenizer
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
    middle = engine.media_stats()
    # the same prompt again: a prefix-cache hit past the image, which skips the tower entirely
    assert first == second
    assert middle["builds"] - before["builds"] == 1  # decoded and resized once
    assert middle["hits"] - before["hits"] == 1
    assert middle["tower_encoded"] - before["tower_encoded"] == 1  # the tower ran once
    assert middle["tower_prefix_skips"] - before["tower_prefix_skips"] == 1
    assert middle["tower_hits"] == before["tower_hits"]
    # other text after the same image: no checkpoint covers the image, the tower cache does
    other = [{"role": "user", "content": [{"type": "image", "image": img},
                                          {"type": "text", "text": "Other words."}]}]  # fmt: skip
    _chat_tokens(engine, other, 2)
    after = engine.media_stats()
    assert after["tower_encoded"] == middle["tower_encoded"]
    assert after["tower_hits"] - middle["tower_hits"] == 1


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


def _finished(engine: Engine, messages: list[dict], n: int, **kw) -> tuple[list[int], object]:
    tokens, done = [], None
    for event in engine.chat(
        messages, enable_thinking=False, max_tokens=n, ignore_eos=True, **GREEDY, **kw
    ):
        tokens += event.token_ids
        if event.kind == "finished":
            done = event
    return tokens, done


def test_multimodal_history_reuses_its_prefix_and_skips_the_tower(tiny) -> None:
    """A conversation with an image: the second turn starts from the first turn's checkpoint
    (the image inside it never reaches the tower again) and still gives transformers' greedy
    tokens, so its MRoPE positions after the image are right; a different image of the same
    size reuses only the text before it (an explicit mark at the system prompt's end)."""
    engine, hf, _ = tiny
    system = {"role": "system", "content": "You look at pictures and answer briefly."}
    first_image, other_image = noise_image(64, 48, seed=31), noise_image(64, 48, seed=32)

    def turn(image) -> list[dict]:
        uri = data_uri(encode_image(image), "image/png")
        parts = [{"type": "image", "image": uri}, {"type": "text", "text": "Describe."}]
        return [system, {"role": "user", "content": parts}]

    mark = [(0, None)]  # a checkpoint right after the system prompt
    one = turn(first_image)
    answer, done_one = _finished(engine, one, 5, cache_marks=mark)
    two = one + [
        {"role": "assistant", "content": engine.tokenizer.decode(answer)},
        {"role": "user", "content": "And the colors?"},
    ]
    before = engine.media_stats()
    got, done_two = _finished(engine, two, 6, cache_marks=mark)
    after = engine.media_stats()
    ids = engine.render(two, enable_thinking=False)
    expanded, media, lease = engine.prepare_prompt(ids, two)
    lease.release()
    last_pad = max(r.start + r.length for r in media.runs)
    assert done_two.usage.cached_tokens > last_pad  # the image lies inside the reused prefix
    assert done_two.usage.cached_tokens >= done_one.usage.prompt_tokens - 8  # minus the prologue
    assert done_two.prefix_cache.startswith(f"hit={done_two.usage.cached_tokens};")
    assert after["tower_encoded"] == before["tower_encoded"]  # the tower never ran
    assert after["tower_hits"] == before["tower_hits"]
    assert after["tower_prefix_skips"] - before["tower_prefix_skips"] == 1
    ref, _ = _hf_greedy(engine, hf, two, 6, [first_image])
    assert got == ref  # identical to a cold run (transformers on the whole prompt)

    # the same text around another image of the same size: only the system prompt is reused
    three = turn(other_image)
    got3, done3 = _finished(engine, three, 5, cache_marks=mark)
    first_pad = min(r.start for r in media.runs)
    system_end = len(engine.render([system], enable_thinking=False, add_generation_prompt=False))
    assert 0 < done3.usage.cached_tokens < first_pad
    assert done3.usage.cached_tokens <= system_end
    assert engine.media_stats()["tower_encoded"] == after["tower_encoded"] + 1
    ref3, _ = _hf_greedy(engine, hf, three, 5, [other_image])
    assert got3 == ref3


def test_media_requests_paused_and_replayed_equal_their_solo_runs(tiny, monkeypatch) -> None:
    """Two image requests over a KV pool of four 16-token pages (each prompt takes two, each
    finished request three): the younger pauses and, with
    no host backing, comes back by replay, which recomputes its media prompt (or restores its
    own checkpoint past the image) and its committed output at MRoPE positions; both outputs
    equal their solo runs."""
    engine, _, art = tiny
    convos = [
        _messages(
            [
                {
                    "type": "image",
                    "image": data_uri(encode_image(noise_image(64, 48, seed=s)), "image/png"),
                }
            ]
        )  # fmt: skip
        for s in (41, 42)
    ]
    solo = [_chat_tokens(engine, m, 24)[0] for m in convos]  # ~20 prompt tokens + 24
    # the artifact's tokenizer is the one `engine` already built: reuse it (building the
    # 248k-token vocabulary again costs seconds)
    monkeypatch.setattr(Tokenizer, "from_json", staticmethod(lambda _json: engine.tokenizer))
    with Engine.load(art, dtype="fp32", vision=True, max_concurrency=2, page_size=16,
                     prefill_chunk=8, max_context=256, kv_capacity=64,
                     host_context_mib=0) as small:  # fmt: skip
        handles = []
        for m in convos:
            request, _, lease = small._chat_request(
                m, None, False, None, {"max_tokens": 24, "ignore_eos": True, **GREEDY}
            )
            handles.append((RequestHandle(small.core, request), lease))
        outs = []
        for handle, lease in handles:
            outs.append([t for e in handle for t in e.token_ids])
            lease.release()
        stats = small.stats()
    assert stats.preemptions > 0 and stats.replay_restores > 0 and stats.replayed_tokens > 0
    assert outs == solo
