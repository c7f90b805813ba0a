"""The vision path on CUDA against the CPU reference (written for the GPU machine; skipped here).

fp32 CUDA (TF32 off) greedy tokens of an image chat equal the CPU engine's, with CUDA-graph
decode carrying the media rope delta; bf16 tower output is within 3e-2 relative error (max |a - b|
/ max |b|) of the fp32 CPU tower.
"""

from __future__ import annotations

import base64
from pathlib import Path

import pytest
import torch

from ninfer import Engine
from ninfer.artifact.convert import convert
from ninfer.artifact.reader import Artifact
from ninfer.media.image import preprocess_image
from ninfer.media.settings import MediaSettings
from ninfer.model.vision import VisionConfig, VisionTower
from ninfer.testing import TinySpec, make_tiny_checkpoint
from support.media_files import encode_image, noise_image

pytestmark = pytest.mark.gpu
GREEDY = {"greedy": True, "presence_penalty": 0.0}


@pytest.fixture(scope="module")
def artifact(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("vision-gpu")
    ckpt = make_tiny_checkpoint(tmp / "hf", TinySpec(with_mtp=False), seed=4)
    return convert(ckpt, tmp / "v.ninfer").path


def _tokens(engine: Engine, n: int) -> list[int]:
    uri = "data:image/png;base64," + base64.b64encode(encode_image(noise_image(120, 90))).decode()
    messages = [{"role": "user", "content": [{"type": "image", "image": uri},
                                             {"type": "text", "text": "Describe."}]}]  # fmt: skip
    out = []
    for event in engine.chat(messages, enable_thinking=False, max_tokens=n, ignore_eos=True,
                             **GREEDY):  # fmt: skip
        out += event.token_ids
    return out


def test_fp32_cuda_image_chat_equals_cpu_with_graphs(artifact: Path) -> None:
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    base = {"dtype": "fp32", "vision": True, "max_context": 1024, "page_size": 16}
    with Engine.load(artifact, device="cpu", **base) as cpu:
        want = _tokens(cpu, 24)
    with Engine.load(artifact, device="cuda:0", **base) as gpu:
        assert gpu.graph_status == "on"
        assert _tokens(gpu, 24) == want


def test_bf16_cuda_tower_close_to_fp32_cpu(artifact: Path) -> None:
    art = Artifact(artifact)
    config = VisionConfig.from_dict(art.config["vision"])
    settings = MediaSettings.from_config(art.config["media"])
    item = preprocess_image(noise_image(200, 130, seed=3), settings.image)
    ref = VisionTower(config, art.load("vision")).encode([item.patches], [item.grid_thw])[0]
    gpu = VisionTower(config, art.load("vision"), dtype=torch.bfloat16, device="cuda:0")
    got = gpu.encode([item.patches.to(torch.bfloat16)], [item.grid_thw])[0].float().cpu()
    assert ((got - ref).abs().max() / ref.abs().max()).item() < 3e-2
