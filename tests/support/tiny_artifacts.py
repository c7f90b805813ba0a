"""Test support: tiny random checkpoints converted to .ninfer artifacts the way users convert.

Each test picks the spec, seed and weight format; the checkpoint is bf16 in the flat layout (so the
artifact and transformers' fp32 upcast hold identical values) and goes through the real converter.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ninfer.artifact.convert import convert
from ninfer.testing import TinySpec, make_tiny_checkpoint

# the fp8 test variants; "aligned": DeltaNet qkv (256 rows) and z (128) on the 128-row block grid,
# so they merge into one fp8 matrix
FP8_VARIANTS = ("dense", "moe", "aligned")
_ALIGNED: dict[str, Any] = {
    "num_linear_value_heads": 4,
    "linear_key_head_dim": 32,
    "linear_value_head_dim": 32,
}


def variant_spec(variant: str, vocab_size: int) -> TinySpec:
    """A text-only TinySpec for one of FP8_VARIANTS."""
    kind, extra = ("dense", _ALIGNED) if variant == "aligned" else (variant, {})
    return TinySpec(kind=kind, vocab_size=vocab_size, with_vision=False, **extra)


def convert_tiny(
    tmp: Path, spec: TinySpec, *, seed: int, name: str, weights: str = "bf16"
) -> tuple[Path, Path]:
    """(checkpoint dir tmp/hf-NAME, artifact tmp/NAME.ninfer) for a tiny bf16 flat checkpoint."""
    ckpt = make_tiny_checkpoint(
        tmp / f"hf-{name}", spec, seed=seed, dtype=torch.bfloat16, layout="flat"
    )
    out = tmp / f"{name}.ninfer"
    convert(ckpt, out, name=name, weights=weights)
    return ckpt, out
