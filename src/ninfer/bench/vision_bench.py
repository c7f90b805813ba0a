"""Vision-tower throughput and image-plus-text time to first token, on random real-shape weights.

Imports torch, pillow, media/ and model/. The tower has the Qwen3.5-27B vision shape (27 blocks of
width 1152, 16 heads, 2304-entry position table, merger to 5120); images are random-noise PNGs of
the requested size that go through the real media path (decode, smart resize, normalize,
patchify), so a 1024x1024 image is 4096 patches and 1024 merged tokens. TTFT covers host
preprocessing, the tower, the text prefill with the media rows spliced in, and the first token's
arrival on the host. Runs on CUDA for reports; the CPU path exists for the smoke test.
"""

from __future__ import annotations

import io
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch
from PIL import Image

from ninfer.artifact import schema
from ninfer.artifact.media_settings import IMAGE_DEFAULTS, VIDEO_DEFAULTS
from ninfer.media.image import decode_image, preprocess_image
from ninfer.media.layout import MediaTokens, expand_prompt
from ninfer.media.settings import MediaSettings
from ninfer.model.batch import ForwardBatch
from ninfer.model.cache import ModelCache
from ninfer.model.qwen3_5 import Qwen3_5Model
from ninfer.model.vision import VisionConfig, VisionTower

VISION_27B: dict[str, Any] = {
    "depth": 27,
    "hidden_size": 1152,
    "num_heads": 16,
    "intermediate_size": 4304,
    "patch_size": 16,
    "temporal_patch_size": 2,
    "spatial_merge_size": 2,
    "out_hidden_size": 5120,
    "num_position_embeddings": 2304,
    "rope_theta": 10000.0,
    "hidden_act": "gelu_pytorch_tanh",
}


@dataclass(frozen=True)
class TowerResult:
    image_size: int
    batch: int  # images per tower call
    patches: int  # per image
    merged_tokens: int  # per image
    seconds: float  # best call
    images_per_s: float
    tokens_per_s: float


@dataclass(frozen=True)
class TtftResult:
    image_size: int
    prompt_tokens: int
    preprocess_ms: float
    tower_ms: float
    prefill_ms: float
    ttft_ms: float


def random_tower(
    config: dict[str, Any], *, device: torch.device | str, dtype: torch.dtype, seed: int = 0
) -> VisionTower:
    """A tower of `config`'s shape with weights drawn so activations stay O(1)."""
    gen = torch.Generator(device=device).manual_seed(seed)
    weights = {}
    for name, shape in schema.vision_tensors(config).items():
        t = torch.empty(shape, dtype=torch.float32, device=device)
        if name.endswith("bias"):
            t.normal_(0.0, 0.02, generator=gen)
        elif "norm" in name:
            t.normal_(1.0, 0.1, generator=gen)
        elif name == "pos_embed.weight":
            t.normal_(0.0, 1.0, generator=gen)
        else:
            fan_in = int(np.prod(shape[1:]))
            t.normal_(0.0, fan_in**-0.5, generator=gen)
        weights[name] = t.to(dtype)
    return VisionTower(VisionConfig.from_dict(config), weights, dtype=dtype, device=device)


def noise_png(size: int, seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    img = Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8))
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def bench_tower(
    tower: VisionTower,
    *,
    image_size: int,
    batches: tuple[int, ...],
    repeats: int,
    settings: MediaSettings,
    on_progress: Callable[[str], None] = lambda _: None,
) -> list[TowerResult]:
    """Best-of-`repeats` tower calls over `batch` preprocessed images each."""
    item = preprocess_image(
        decode_image(noise_png(image_size, 0)), settings.image, dtype=tower.dtype
    )
    patches = item.patches.to(tower.device)
    out = []
    for batch in batches:
        on_progress(f"vision tower: {batch} x {image_size}px")
        inputs, grids = [patches] * batch, [item.grid_thw] * batch
        tower.encode(inputs, grids)  # warm-up
        _sync(tower.device)
        best = float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            tower.encode(inputs, grids)
            _sync(tower.device)
            best = min(best, time.perf_counter() - start)
        tokens = item.num_tokens
        out.append(
            TowerResult(
                image_size, batch, item.num_patches, tokens, best, batch / best,
                batch * tokens / best,
            )
        )  # fmt: skip
    return out


def bench_ttft(
    tower: VisionTower,
    model: Qwen3_5Model,
    *,
    image_size: int,
    text_tokens: int,
    repeats: int,
    settings: MediaSettings,
    prefill_chunk: int = 8192,
) -> TtftResult:
    """An image plus `text_tokens` random text tokens: PNG bytes in, first token on the host."""
    tokens = MediaTokens()
    png = noise_png(image_size, 1)
    vocab = model.config.vocab_size
    gen = torch.Generator().manual_seed(0)
    text = torch.randint(0, min(vocab, 240000), (text_tokens,), generator=gen).tolist()
    ids = [*text[:8], tokens.vision_start, tokens.image_pad, tokens.vision_end, *text[8:]]
    device = model.device
    page = 64
    best: tuple[float, float, float, float] | None = None
    prompt_len = 0
    for _ in range(repeats + 1):  # the first run warms up
        _sync(device)
        t0 = time.perf_counter()
        item = preprocess_image(decode_image(png), settings.image, dtype=tower.dtype)
        prompt = expand_prompt(ids, [item], tokens, lambda s: [])
        t1 = time.perf_counter()
        rows = tower.encode([item.patches], [item.grid_thw])[0]
        _sync(device)
        t2 = time.perf_counter()
        n = len(prompt.token_ids)
        prompt_len = n
        cache = ModelCache.allocate(
            model.config,
            num_pages=-(-n // page),
            num_slots=1,
            page_size=page,
            dtype=model.dtype,
            device=device,
        )
        index = [i for r in prompt.runs for i in range(r.start, r.start + r.length)]
        logits = None
        for begin in range(0, n, prefill_chunk):
            end = min(n, begin + prefill_chunk)
            sel = [k for k, i in enumerate(index) if begin <= i < end]
            batch = ForwardBatch.prefill(
                prompt.token_ids[begin:end],
                num_computed=begin,
                page_ids=list(range(-(-n // page))),
                state_slot=0,
                device=device,
                positions=prompt.positions[:, begin:end],
                embed_index=torch.tensor([index[k] - begin for k in sel], device=device)
                if sel
                else None,
                embed_rows=rows[sel] if sel else None,
            )
            logits = model.forward(batch, cache)
        assert logits is not None
        int(logits.argmax(-1).item())
        t3 = time.perf_counter()
        run = (t1 - t0, t2 - t1, t3 - t2, t3 - t0)
        if best is None or run[3] < best[3]:
            best = run
        del cache
    assert best is not None
    return TtftResult(
        image_size, prompt_len, best[0] * 1e3, best[1] * 1e3, best[2] * 1e3, best[3] * 1e3
    )


def run_vision_bench(
    *,
    device: str,
    image_size: int = 1024,
    batches: tuple[int, ...] = (1, 4, 8),
    repeats: int = 5,
    text_model: Qwen3_5Model | None = None,
    text_tokens: int = 64,
    vision_config: dict[str, Any] | None = None,
    dtype: torch.dtype = torch.bfloat16,
    on_progress: Callable[[str], None] = lambda _: None,
) -> dict[str, Any]:
    """The JSON-able report: tower rows per batch and, with a text model, TTFT."""
    config = dict(vision_config or VISION_27B)
    if text_model is not None:
        config["out_hidden_size"] = text_model.config.hidden_size
    settings = MediaSettings.from_config({"image": IMAGE_DEFAULTS, "video": VIDEO_DEFAULTS})
    on_progress("vision tower: random weights")
    tower = random_tower(config, device=device, dtype=dtype)
    report: dict[str, Any] = {
        "vision_config": config,
        "device": torch.cuda.get_device_name(device) if "cuda" in device else device,
        "tower": [
            asdict(r)
            for r in bench_tower(
                tower,
                image_size=image_size,
                batches=batches,
                repeats=repeats,
                settings=settings,
                on_progress=on_progress,
            )
        ],
    }
    if text_model is not None:
        on_progress("image + text time to first token")
        report["ttft"] = asdict(
            bench_ttft(
                tower,
                text_model,
                image_size=image_size,
                text_tokens=text_tokens,
                repeats=repeats,
                settings=settings,
            )
        )
    return report
