"""Sizes of a tiny Qwen3.5-family model, validated once so every builder can trust them.

Owns `TinySpec` and `TinySpecError`; imports nothing but the standard library.
Defaults are tiny yet structurally complete (hybrid layers, gated attention with partial
interleaved MRoPE, key heads < value heads, MTP, vision tower), so a tiny checkpoint exercises
every code path a real 27B / 35B-A3B checkpoint does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

ModelKind = Literal["dense", "moe"]


class TinySpecError(ValueError):
    """A `TinySpec` whose sizes cannot form a valid Qwen3.5 model."""


@dataclass(frozen=True)
class TinySpec:
    """Sizes of a tiny model. Field names follow the house `num_*` style; `tiny_config` maps
    them onto the Hugging Face config names."""

    kind: ModelKind = "dense"
    vocab_size: int = 248320  # the real vocabulary; tests pass a smaller one for speed
    hidden_size: int = 64
    num_layers: int = 4
    full_attention_interval: int = 4  # 3 x linear_attention then 1 x full_attention, repeated
    rms_norm_eps: float = 1e-6
    max_position_embeddings: int = 262144
    # Gated full attention: q_proj emits query and output gate together.
    num_attention_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 32
    partial_rotary_factor: float = 0.25  # 8 rotary dims of 32, as 64 of 256 in the real models
    mrope_section: tuple[int, ...] = (2, 1, 1)  # sums to rotary_dim / 2, like [11, 11, 10]
    rope_theta: float = 1e7
    # Gated DeltaNet: key heads < value heads, 1:3 like the real 16:48.
    num_linear_key_heads: int = 2
    num_linear_value_heads: int = 6
    linear_key_head_dim: int = 16
    linear_value_head_dim: int = 16
    conv_kernel_size: int = 4
    # Dense FFN.
    intermediate_size: int = 128
    # MoE FFN (top-k probabilities renormalised, plus a sigmoid-gated shared expert).
    num_experts: int = 8
    num_experts_per_token: int = 2
    moe_intermediate_size: int = 32
    shared_expert_intermediate_size: int = 32
    # Optional components.
    with_mtp: bool = True
    with_vision: bool = True
    # Vision tower; patch / merge / temporal sizes are the real ones so media code sees real grids.
    vision_depth: int = 2
    vision_hidden_size: int = 32
    vision_intermediate_size: int = 64
    vision_num_heads: int = 2
    vision_patch_size: int = 16
    vision_temporal_patch_size: int = 2
    vision_spatial_merge_size: int = 2
    vision_num_position_embeddings: int = 16  # a square grid (4 x 4), as 2304 = 48 x 48
    # Preprocessing bounds (pixels of a resized image / video): small, so media tests stay fast;
    # the real checkpoints use 65536..16777216 (images) and 4096..25165824 (videos).
    image_min_pixels: int = 4096
    image_max_pixels: int = 65536
    video_min_pixels: int = 4096
    video_max_pixels: int = 131072
    video_fps: float = 2.0
    video_min_frames: int = 4
    video_max_frames: int = 16

    def __post_init__(self) -> None:
        _check(self.kind in ("dense", "moe"), f"kind must be 'dense' or 'moe', got {self.kind!r}")
        for name in _POSITIVE_INTS:
            value = getattr(self, name)
            _check(isinstance(value, int) and value > 0, f"{name} must be a positive int")
        _check(
            self.num_attention_heads % self.num_kv_heads == 0,
            "num_attention_heads must be a multiple of num_kv_heads",
        )
        _check(
            self.num_linear_value_heads % self.num_linear_key_heads == 0,
            "num_linear_value_heads must be a multiple of num_linear_key_heads",
        )
        rotary_dim = self.head_dim * self.partial_rotary_factor
        _check(
            rotary_dim == int(rotary_dim) and int(rotary_dim) % 2 == 0 and rotary_dim > 0,
            "head_dim * partial_rotary_factor must be a positive even integer",
        )
        _check(
            len(self.mrope_section) == 3 and 2 * sum(self.mrope_section) == rotary_dim,
            f"mrope_section must have 3 parts summing to rotary_dim / 2 = {int(rotary_dim) // 2}",
        )
        _check(
            self.num_experts_per_token <= self.num_experts,
            "num_experts_per_token must not exceed num_experts",
        )
        _check(
            self.vision_hidden_size % (4 * self.vision_num_heads) == 0,
            "vision_hidden_size / vision_num_heads must be a multiple of 4 (2-D rotary)",
        )
        grid_side = math.isqrt(self.vision_num_position_embeddings)
        _check(
            grid_side * grid_side == self.vision_num_position_embeddings,
            "vision_num_position_embeddings must be a perfect square",
        )

    @property
    def layer_types(self) -> tuple[str, ...]:
        return tuple(
            "full_attention" if (i + 1) % self.full_attention_interval == 0 else "linear_attention"
            for i in range(self.num_layers)
        )

    @property
    def rotary_dim(self) -> int:
        return int(self.head_dim * self.partial_rotary_factor)

    @property
    def linear_key_dim(self) -> int:
        return self.num_linear_key_heads * self.linear_key_head_dim

    @property
    def linear_value_dim(self) -> int:
        return self.num_linear_value_heads * self.linear_value_head_dim

    @property
    def linear_conv_dim(self) -> int:
        """Channels of the depthwise conv: q, k and v side by side."""
        return 2 * self.linear_key_dim + self.linear_value_dim


_POSITIVE_INTS = (
    "vocab_size",
    "hidden_size",
    "num_layers",
    "full_attention_interval",
    "max_position_embeddings",
    "num_attention_heads",
    "num_kv_heads",
    "head_dim",
    "num_linear_key_heads",
    "num_linear_value_heads",
    "linear_key_head_dim",
    "linear_value_head_dim",
    "conv_kernel_size",
    "intermediate_size",
    "num_experts",
    "num_experts_per_token",
    "moe_intermediate_size",
    "shared_expert_intermediate_size",
    "vision_depth",
    "vision_hidden_size",
    "vision_intermediate_size",
    "vision_num_heads",
    "vision_patch_size",
    "vision_temporal_patch_size",
    "vision_spatial_merge_size",
    "vision_num_position_embeddings",
    "image_min_pixels",
    "image_max_pixels",
    "video_min_pixels",
    "video_max_pixels",
    "video_min_frames",
    "video_max_frames",
)


def _check(condition: bool, message: str) -> None:
    if not condition:
        raise TinySpecError(f"invalid TinySpec: {message}")
