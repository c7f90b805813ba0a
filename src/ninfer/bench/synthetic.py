"""Synthetic models of the real Qwen3.6 shapes with random bf16 or fp8 weights, built on the device.

Imports torch, artifact.schema and artifact.quantize (the weight names, shapes and fp8 selection an
artifact would hold, so the model binds them exactly as it binds a converted checkpoint) and
model/. Weights are drawn directly on the target device: a 27B model never touches host memory.
Scales keep activations O(1) so the maths runs on realistic values (zeros can run faster).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from ninfer.artifact.quantize import quantize_fp8_block
from ninfer.artifact.schema import is_quantizable, mtp_tensors, text_tensors
from ninfer.model.config import TextConfig
from ninfer.model.qwen3_5 import Qwen3_5Model

_ROPE = {
    "rope_type": "default",
    "rope_theta": 1e7,
    "partial_rotary_factor": 0.25,
    "mrope_section": [11, 11, 10],
    "mrope_interleaved": True,
}
_COMMON: dict[str, Any] = {
    "vocab_size": 248320,
    "num_attention_heads": 0,  # filled per model
    "head_dim": 256,
    "linear_num_key_heads": 16,
    "linear_key_head_dim": 128,
    "linear_value_head_dim": 128,
    "linear_conv_kernel_dim": 4,
    "full_attention_interval": 4,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
    "max_position_embeddings": 262144,
    "rope_parameters": _ROPE,
}

_TINY: dict[str, Any] = _COMMON | {
    "vocab_size": 4096,
    "hidden_size": 256,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
}

# Text configs of the real checkpoints (shared/FACTS.md "The model family"), then tiny ones.
SYNTHETIC_CONFIGS: dict[str, dict[str, Any]] = {
    "qwen3.6-27b": _COMMON
    | {
        "model_type": "qwen3_5_text",
        "hidden_size": 5120,
        "num_hidden_layers": 64,
        "num_attention_heads": 24,
        "num_key_value_heads": 4,
        "linear_num_value_heads": 48,
        "intermediate_size": 17408,
    },
    "qwen3.6-35b-a3b": _COMMON
    | {
        "model_type": "qwen3_5_moe_text",
        "hidden_size": 2048,
        "num_hidden_layers": 40,
        "num_attention_heads": 16,
        "num_key_value_heads": 2,
        "linear_num_value_heads": 32,
        "num_experts": 256,
        "num_experts_per_tok": 8,
        "moe_intermediate_size": 512,
        "shared_expert_intermediate_size": 512,
    },
    # Tiny shapes with the real head sizes (256 attention, 128 DeltaNet), for tests and smoke
    # runs: seconds on any GPU, and the CPU reference runs them too.
    "tiny-dense": _TINY | {"model_type": "qwen3_5_text", "intermediate_size": 512},
    "tiny-moe": _TINY
    | {
        "model_type": "qwen3_5_moe_text",
        "num_experts": 16,
        "num_experts_per_tok": 4,
        "moe_intermediate_size": 128,
        "shared_expert_intermediate_size": 128,
    },
}


class UnknownSyntheticModel(ValueError):
    """The name is not one of SYNTHETIC_CONFIGS."""


def synthetic_hf_config(name: str) -> dict[str, Any]:
    """The HF-style text config dict of a synthetic model (what an artifact's `text` holds)."""
    try:
        return dict(SYNTHETIC_CONFIGS[name])
    except KeyError:
        known = ", ".join(SYNTHETIC_CONFIGS)
        raise UnknownSyntheticModel(f"unknown synthetic model {name!r} (known: {known})") from None


def synthetic_config(name: str) -> TextConfig:
    return TextConfig.from_hf(synthetic_hf_config(name))


def weight_shapes(name: str) -> dict[str, tuple[int, ...]]:
    """Every text weight's name and shape, as the model binds them."""
    return text_tensors(synthetic_hf_config(name))


def num_parameters(name: str) -> int:
    return sum(math.prod(shape) for shape in weight_shapes(name).values())


def _init(name: str, shape: tuple[int, ...]) -> Callable[[torch.Tensor], None]:
    """How to fill one weight in place (mirrors the test oracle's O(1)-activation scheme)."""
    if name.endswith("A_log"):
        return lambda t: t.uniform_(0.05, 2.0).log_()
    if name.endswith("dt_bias"):
        return lambda t: t.normal_(0.0, 0.5)
    if name.endswith("embed_tokens.weight"):
        return lambda t: t.normal_(0.0, 1.0)
    if "norm" in name:
        return lambda t: t.normal_(0.0, 0.1)
    if name.endswith("conv1d.weight"):
        return lambda t: t.normal_(0.0, 0.5)
    return lambda t: t.normal_(0.0, shape[-1] ** -0.5)


def random_weights(
    name: str,
    *,
    device: torch.device | str,
    dtype: torch.dtype = torch.bfloat16,
    seed: int = 0,
    fp8: bool = False,
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, torch.Tensor]:
    """Random weights of model `name`, drawn on `device` (A_log and dt_bias in fp32).

    Args:
        fp8: store the weights `ninfer convert --weights fp8` would as e4m3 plus their
            `*_scale_inv` 128x128 block scales (each drawn in `dtype`, then quantized).
        progress: called with (bytes done, bytes total) after each tensor (drawn, not stored).
    """
    shapes = weight_shapes(name)
    total = sum(math.prod(s) * (4 if _is_fp32(n) else dtype.itemsize) for n, s in shapes.items())
    torch.manual_seed(seed)  # seeds every device generator too
    out: dict[str, torch.Tensor] = {}
    done = 0
    for weight_name, shape in shapes.items():
        wdtype = torch.float32 if _is_fp32(weight_name) else dtype
        tensor = torch.empty(shape, dtype=wdtype, device=device)
        _init(weight_name, shape)(tensor)
        done += tensor.numel() * tensor.element_size()
        if fp8 and is_quantizable(weight_name, shape):
            tensor, out[weight_name + "_scale_inv"] = quantize_fp8_block(tensor)
        out[weight_name] = tensor
        if progress is not None:
            progress(done, total)
    return out


def random_mtp_weights(
    name: str,
    *,
    device: torch.device | str,
    dtype: torch.dtype = torch.bfloat16,
    seed: int = 1,
    fp8: bool = False,
) -> dict[str, torch.Tensor]:
    """Random weights of model `name`'s one-layer MTP head (names relative to `mtp.`), drawn
    like `random_weights`: a head of the real shape, which proposes almost nothing useful."""
    shapes = mtp_tensors(synthetic_hf_config(name), 1)
    torch.manual_seed(seed)
    out: dict[str, torch.Tensor] = {}
    for weight_name, shape in shapes.items():
        tensor = torch.empty(shape, dtype=dtype, device=device)
        _init(weight_name, shape)(tensor)
        if fp8 and is_quantizable(weight_name, shape):
            tensor, out[weight_name + "_scale_inv"] = quantize_fp8_block(tensor)
        out[weight_name] = tensor
    return out


def synthetic_model(
    name: str,
    *,
    device: torch.device | str,
    weights: str = "bf16",
    say: Callable[[str], None] = lambda _: None,
    decode_tiles: bool = False,
) -> Qwen3_5Model:
    """Model `name` over `random_weights` (bf16, or fp8 as `--weights fp8` stores them), computing
    in bf16 on `device`: what each `ninfer bench` mode starts from. The name and `weights` are
    checked before anything is drawn (UnknownSyntheticModel / ValueError); `say` hears the
    drawing start; `decode_tiles` as `Qwen3_5Model` takes it."""
    if weights not in ("bf16", "fp8"):
        raise ValueError(f"--weights must be bf16 or fp8, got {weights!r}")
    config = synthetic_config(name)
    say(f"drawing random {name} {weights} weights on {device}")
    drawn = random_weights(name, device=device, fp8=weights == "fp8")
    return Qwen3_5Model(
        config,
        drawn,
        device=device,
        dtype=torch.bfloat16,
        consume_weights=True,
        decode_tiles=decode_tiles,
    )


def _is_fp32(name: str) -> bool:
    return name.endswith(("A_log", "dt_bias"))
