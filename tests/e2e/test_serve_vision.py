"""`ninfer serve --vision` on a tiny random vision checkpoint, driven by the openai and anthropic
SDKs: images (and a video) through all three APIs give transformers' greedy output and the
expanded prompt counts; the token-count endpoints count media; media errors are 400s.

Expected tokens come from transformers' Qwen3_5ForConditionalGeneration on the same checkpoint,
fed the expanded prompt ninfer's library prepares (its positions and pad counts are checked
against transformers in tests/unit/media and tests/unit/model) and transformers' own image
processor output.
"""

from __future__ import annotations

import base64
import http.server
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest
import torch

from e2e.serve_process import ServeProcess, serve
from ninfer import Engine
from ninfer.artifact.convert import convert
from ninfer.testing import TinySpec, make_tiny_checkpoint
from support.media_files import encode_image, make_video, noise_image

pytestmark = pytest.mark.e2e
transformers = pytest.importorskip("transformers")

SPEC = TinySpec(with_mtp=False, video_max_frames=8)
MODEL = "tiny-vision"
N = 6
IMAGE = noise_image(96, 64, seed=21)
PNG = encode_image(IMAGE)
PNG_B64 = base64.b64encode(PNG).decode()
PNG_URI = f"data:image/png;base64,{PNG_B64}"


class Setup:
    def __init__(self, tmp: Path) -> None:
        self.ckpt = make_tiny_checkpoint(tmp / "hf", SPEC, seed=13)
        self.artifact = convert(self.ckpt, tmp / f"{MODEL}.ninfer", name=MODEL).path
        self.engine = Engine.load(self.artifact, dtype="fp32", vision=True, max_context=1024)
        self.hf = transformers.Qwen3_5ForConditionalGeneration.from_pretrained(
            self.ckpt, dtype=torch.float32
        ).eval()

    def expected(self, messages: list[dict[str, Any]], images: list, video=None):
        """(prompt tokens, greedy text) of transformers for the template messages."""
        e = self.engine
        ids = e.render(messages, enable_thinking=False)
        expanded, _, lease = e.prepare_prompt(ids, messages)
        inputs: dict[str, Any] = {"input_ids": torch.tensor([expanded])}
        types = torch.zeros_like(inputs["input_ids"])
        types[inputs["input_ids"] == e.media_tokens.image_pad] = 1
        types[inputs["input_ids"] == e.media_tokens.video_pad] = 2
        inputs["mm_token_type_ids"] = types
        if images:
            s = e.media.settings.image
            proc = transformers.Qwen2VLImageProcessorPil(
                size={"shortest_edge": s.min_pixels, "longest_edge": s.max_pixels},
                patch_size=s.patch_size,
                image_mean=list(s.image_mean),
                image_std=list(s.image_std),
            )
            inputs.update(proc(images=images, return_tensors="pt"))
        if video is not None:
            item = next(m for m in lease.items if m.modality == "video")
            inputs["pixel_values_videos"] = item.patches
            inputs["video_grid_thw"] = torch.tensor([list(item.grid_thw)])
        lease.release()
        with torch.no_grad():
            out = self.hf.generate(
                **inputs, max_new_tokens=N, do_sample=False, eos_token_id=None, pad_token_id=0
            )
        tokens = out[0, len(expanded) :].tolist()
        return len(expanded), e.tokenizer.decode(tokens)


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    s = Setup(tmp_path_factory.mktemp("serve-vision"))
    yield s
    s.engine.close()


@pytest.fixture(scope="module")
def server(setup: Setup) -> Iterator[ServeProcess]:
    args = (str(setup.artifact), "--vision", "--greedy", "--no-thinking", "--max-context", "1024")
    with serve(*args) as s:
        yield s


@pytest.fixture(scope="module")
def oai(server: ServeProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="x", max_retries=0)


@pytest.fixture(scope="module")
def claude(server: ServeProcess) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.base_url, api_key="x", max_retries=0)


def _template(*parts: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"role": "user", "content": list(parts)}]


IMG_PART = {"type": "image", "image": PNG_URI}
TEXT_PART = {"type": "text", "text": "What is this?"}


def test_chat_completions_image(setup: Setup, oai: openai.OpenAI) -> None:
    prompt, text = setup.expected(_template(IMG_PART, TEXT_PART), [IMAGE])
    out = oai.chat.completions.create(
        model=MODEL,
        max_tokens=N,
        messages=[
            {
                "role": "user",
                "content": [
                    {"type": "image_url", "image_url": {"url": PNG_URI, "detail": "auto"}},
                    {"type": "text", "text": "What is this?"},
                ],
            }
        ],
    )
    assert out.usage.prompt_tokens == prompt
    assert out.usage.completion_tokens == N
    assert out.choices[0].message.content == text


def test_responses_input_image_and_input_tokens(
    setup: Setup, oai: openai.OpenAI, server: ServeProcess
) -> None:
    prompt, text = setup.expected(_template(TEXT_PART, IMG_PART, IMG_PART), [IMAGE, IMAGE])
    content = [
        {"type": "input_text", "text": "What is this?"},
        {"type": "input_image", "image_url": PNG_URI},
        {"type": "input_image", "image_url": PNG_URI, "detail": "auto"},
    ]
    out = oai.responses.create(
        model=MODEL, max_output_tokens=N, input=[{"role": "user", "content": content}]
    )
    assert out.usage.input_tokens == prompt
    assert out.output_text == text
    status, _, body = server.request(
        "POST",
        "/v1/responses/input_tokens",
        {"model": MODEL, "input": [{"role": "user", "content": content}]},
    )
    assert status == 200 and body["input_tokens"] == prompt


def test_anthropic_image_block_and_count_tokens(setup: Setup, claude: anthropic.Anthropic) -> None:
    prompt, text = setup.expected(_template(IMG_PART, TEXT_PART), [IMAGE])
    blocks = [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG_B64}},
        {"type": "text", "text": "What is this?"},
    ]
    messages = [{"role": "user", "content": blocks}]
    out = claude.messages.create(model=MODEL, max_tokens=N, messages=messages)
    # Anthropic's input_tokens leaves out what was read from the cache: the Chat Completions
    # test sent this same image and text, so its prefix may be reused here
    assert out.usage.input_tokens + (out.usage.cache_read_input_tokens or 0) == prompt
    assert "".join(b.text for b in out.content if b.type == "text") == text
    assert claude.messages.count_tokens(model=MODEL, messages=messages).input_tokens == prompt


def test_anthropic_tool_result_screenshot_counts_its_image(claude: anthropic.Anthropic) -> None:
    tool = {"name": "shot", "description": "screenshot", "input_schema": {"type": "object"}}
    history = [
        {"role": "user", "content": "take one"},
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "t1", "name": "shot", "input": {}}],
        },
    ]
    source = {"type": "base64", "media_type": "image/png", "data": PNG_B64}
    with_image = [
        *history,
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": [
            {"type": "text", "text": "done"}, {"type": "image", "source": source}]}]},
    ]  # fmt: skip
    text_only = [
        *history,
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": [
            {"type": "text", "text": "done"}]}]},
    ]  # fmt: skip
    a = claude.messages.count_tokens(model=MODEL, messages=with_image, tools=[tool]).input_tokens
    b = claude.messages.count_tokens(model=MODEL, messages=text_only, tools=[tool]).input_tokens
    # 96x64 -> resized to 96x64 (3 x 2 merged tokens) plus vision_start / vision_end
    assert a - b == 6 + 2
    out = claude.messages.create(model=MODEL, max_tokens=2, messages=with_image, tools=[tool])
    assert out.usage.input_tokens + (out.usage.cache_read_input_tokens or 0) == a


def test_chat_video_url_extension(setup: Setup, server: ServeProcess) -> None:
    clip = make_video(16, 8, width=64, height=64)
    uri = f"data:video/mp4;base64,{base64.b64encode(clip).decode()}"
    prompt, text = setup.expected(
        _template({"type": "video", "video": uri}, TEXT_PART), [], video=True
    )
    status, _, body = server.request(
        "POST",
        "/v1/chat/completions",
        {
            "model": MODEL,
            "max_tokens": N,
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "video_url", "video_url": {"url": uri}},
                        {"type": "text", "text": "What is this?"},
                    ],
                }
            ],
        },
    )
    assert status == 200, body
    assert body["usage"]["prompt_tokens"] == prompt
    assert body["choices"][0]["message"]["content"] == text


class _Images(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:  # noqa: N802
        self.send_response(200)
        self.send_header("Content-Length", str(len(PNG)))
        self.end_headers()
        self.wfile.write(PNG)


@pytest.fixture(scope="module")
def image_host() -> Iterator[str]:
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Images)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/cat.png"
    httpd.shutdown()


@pytest.mark.parametrize(
    ("part", "code", "param"),
    [
        (
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,bm90IGFuIGltYWdl"}},
            "invalid_media",
            "messages[0].content[0].image_url",
        ),
        (
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,%%%"}},
            "invalid_media",
            "messages[0].content[0].image_url",
        ),
        (
            {"type": "image_url", "image_url": {"url": "file:///etc/passwd"}},
            "invalid_media",
            "messages[0].content[0].image_url.url",
        ),
        (
            {"type": "image_url", "image_url": {"url": "data:,", "detail": "low"}},
            "unsupported_parameter",
            "messages[0].content[0].image_url.detail",
        ),
    ],
)
def test_media_errors_are_400_naming_the_part(
    server: ServeProcess, part: dict, code: str, param: str
) -> None:
    body = {"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": [part]}]}
    status, _, err = server.request("POST", "/v1/chat/completions", body)
    assert status == 400, err
    assert (err["error"]["code"], err["error"]["param"]) == (code, param)


def test_private_media_urls_are_refused(server: ServeProcess, image_host: str) -> None:
    part = {"type": "image_url", "image_url": {"url": image_host}}
    body = {"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": [part]}]}
    status, _, err = server.request("POST", "/v1/chat/completions", body)
    assert status == 400
    assert err["error"]["code"] == "media_fetch_failed"
    assert "non-public" in err["error"]["message"]
    # the server keeps serving
    ok = server.request("POST", "/v1/chat/completions", {**body, "messages": [
        {"role": "user", "content": [{"type": "image_url", "image_url": PNG_URI}]}]})  # fmt: skip
    assert ok[0] == 200


def test_allow_private_media_urls_fetches(setup: Setup, image_host: str) -> None:
    args = (str(setup.artifact), "--vision", "--greedy", "--no-thinking")
    with serve(*args, "--allow-private-media-urls") as s:
        part = {"type": "image_url", "image_url": {"url": image_host}}
        body = {"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": [part]}]}
        status, _, out = s.request("POST", "/v1/chat/completions", body)
        assert status == 200, out
        inline = {**body, "messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": PNG_URI}]}]}  # fmt: skip
        again = s.request("POST", "/v1/chat/completions", inline)[2]["usage"]
        # the same bytes fetched or inline are the same media: the second reuses the first's
        # prefix through the image (its identity is the bytes' digest, not where they came from)
        assert again["prompt_tokens"] == out["usage"]["prompt_tokens"]
        assert again["completion_tokens"] == out["usage"]["completion_tokens"]
        # past the whole image: <|im_start|> user \n <|vision_start|>, then its 6 pads
        assert again["prompt_tokens_details"]["cached_tokens"] > 4 + 6


def test_without_vision_media_is_vision_disabled(setup: Setup) -> None:
    with serve(str(setup.artifact)) as s:
        part = {"type": "image_url", "image_url": {"url": PNG_URI}}
        body = {"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": [part]}]}
        status, _, err = s.request("POST", "/v1/chat/completions", body)
        assert status == 400
        assert err["error"]["code"] == "vision_disabled"
        assert err["error"]["param"] == "messages[0].content[0].image_url"
        count = s.request(
            "POST",
            "/v1/messages/count_tokens",
            {"model": MODEL, "messages": [{"role": "user", "content": [
                {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                             "data": PNG_B64}}]}]},
        )  # fmt: skip
        assert count[0] == 400 and count[2]["error"]["type"] == "invalid_request_error"
