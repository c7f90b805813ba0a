"""The tensor inventory of a tiny checkpoint and its deterministic random values.

Owns the real key names and shapes (checked against `transformers` 5.x `save_pretrained` and the
published Qwen3.6-27B tensor list, MTP head included); must not import `transformers`. Each
tensor draws from its own generator seeded by (seed, canonical name), so values do not depend on
which other tensors are written: fp8, flat, fused and sharded variants share one seed's weights.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from enum import Enum

import torch

from ninfer.testing.tiny_spec import TinySpec

TEXT_PREFIX = "model.language_model."
VISION_PREFIX = "model.visual."
MTP_PREFIX = "mtp."


class Init(Enum):
    """How a tensor's values are drawn; chosen so a forward pass gives O(1), finite logits."""

    LINEAR = "linear"  # normal(0, 1/sqrt(fan_in)): activations stay O(1) layer after layer
    EMBEDDING = "embedding"  # normal(0, 1)
    NORM_ZERO_CENTRED = "norm_zero_centred"  # normal(0, 0.1): used as x * (1 + w)
    NORM_UNIT = "norm_unit"  # 1 + normal(0, 0.1): used as x * w (gated / layer norms)
    BIAS = "bias"  # normal(0, 0.02)
    CONV = "conv"  # normal(0, 1/sqrt(kernel)): depthwise causal conv taps
    A_LOG = "a_log"  # log(uniform(0.1, 4)): some heads decay slowly, so state carries over
    DT_BIAS = "dt_bias"  # 1 + normal(0, 0.1)


@dataclass(frozen=True)
class TensorSpec:
    """One checkpoint tensor under its canonical (nested-layout) name."""

    name: str
    shape: tuple[int, ...]
    init: Init
    is_linear: bool = False  # weight of a Linear / Embedding / patch Conv module
    is_fp8: bool = False  # quantised to block fp8 in an fp8 checkpoint

    @property
    def module(self) -> str:
        return self.name.removesuffix(".weight")


def tensor_specs(spec: TinySpec) -> list[TensorSpec]:
    """Every tensor of the checkpoint, MoE experts as per-expert keys, in a fixed order."""
    h = spec.hidden_size
    specs = [
        TensorSpec(f"{TEXT_PREFIX}embed_tokens.weight", (spec.vocab_size, h), Init.EMBEDDING, True),
        TensorSpec("lm_head.weight", (spec.vocab_size, h), Init.LINEAR, True),
        TensorSpec(f"{TEXT_PREFIX}norm.weight", (h,), Init.NORM_ZERO_CENTRED),
    ]
    for i, layer_type in enumerate(spec.layer_types):
        specs += _decoder_layer(spec, f"{TEXT_PREFIX}layers.{i}.", layer_type)
    if spec.with_mtp:
        specs += _mtp(spec)
    if spec.with_vision:
        specs += _vision(spec)
    return specs


def make_tensor(tensor: TensorSpec, seed: int) -> torch.Tensor:
    """The float32 values of one tensor for one seed; the same (seed, name) always gives the
    same values."""
    gen = torch.Generator().manual_seed(_name_seed(seed, tensor.name))
    shape = tensor.shape
    if tensor.init is Init.LINEAR:
        fan_in = math.prod(shape[1:])
        return torch.randn(shape, generator=gen) / math.sqrt(fan_in)
    if tensor.init is Init.EMBEDDING:
        return torch.randn(shape, generator=gen)
    if tensor.init is Init.NORM_ZERO_CENTRED:
        return 0.1 * torch.randn(shape, generator=gen)
    if tensor.init in (Init.NORM_UNIT, Init.DT_BIAS):
        return 1.0 + 0.1 * torch.randn(shape, generator=gen)
    if tensor.init is Init.BIAS:
        return 0.02 * torch.randn(shape, generator=gen)
    if tensor.init is Init.CONV:
        return torch.randn(shape, generator=gen) / math.sqrt(shape[-1])
    if tensor.init is Init.A_LOG:
        return torch.empty(shape).uniform_(0.1, 4.0, generator=gen).log_()
    raise AssertionError(f"unhandled init {tensor.init}")


def _name_seed(seed: int, name: str) -> int:
    digest = hashlib.sha256(f"{seed}/{name}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def _linear(name: str, out_features: int, in_features: int, fp8: bool = True) -> TensorSpec:
    # NOTE: fp8 by default, MTP included: at the 35B-A3B sizes this selection gives exactly the
    # 31,746 fp8 weights of the published Qwen3.5-35B-A3B-FP8 checkpoint (test_tiny_weights.py).
    return TensorSpec(f"{name}.weight", (out_features, in_features), Init.LINEAR, True, fp8)


def _decoder_layer(spec: TinySpec, prefix: str, layer_type: str) -> list[TensorSpec]:
    h = spec.hidden_size
    specs = [
        TensorSpec(f"{prefix}input_layernorm.weight", (h,), Init.NORM_ZERO_CENTRED),
        TensorSpec(f"{prefix}post_attention_layernorm.weight", (h,), Init.NORM_ZERO_CENTRED),
    ]
    if layer_type == "full_attention":
        specs += _full_attention(spec, f"{prefix}self_attn.")
    else:
        specs += _gated_deltanet(spec, f"{prefix}linear_attn.")
    specs += _ffn(spec, f"{prefix}mlp.")
    return specs


def _full_attention(spec: TinySpec, prefix: str) -> list[TensorSpec]:
    h, d = spec.hidden_size, spec.head_dim
    return [
        # q_proj rows: per head, head_dim query then head_dim output gate.
        _linear(f"{prefix}q_proj", 2 * spec.num_attention_heads * d, h),
        _linear(f"{prefix}k_proj", spec.num_kv_heads * d, h),
        _linear(f"{prefix}v_proj", spec.num_kv_heads * d, h),
        _linear(f"{prefix}o_proj", h, spec.num_attention_heads * d),
        TensorSpec(f"{prefix}q_norm.weight", (d,), Init.NORM_ZERO_CENTRED),
        TensorSpec(f"{prefix}k_norm.weight", (d,), Init.NORM_ZERO_CENTRED),
    ]


def _gated_deltanet(spec: TinySpec, prefix: str) -> list[TensorSpec]:
    h, hv = spec.hidden_size, spec.num_linear_value_heads
    return [
        _linear(f"{prefix}in_proj_qkv", spec.linear_conv_dim, h),
        _linear(f"{prefix}in_proj_z", spec.linear_value_dim, h),
        # in_proj_a / in_proj_b stay high precision in real fp8 checkpoints.
        _linear(f"{prefix}in_proj_b", hv, h, fp8=False),
        _linear(f"{prefix}in_proj_a", hv, h, fp8=False),
        TensorSpec(
            f"{prefix}conv1d.weight", (spec.linear_conv_dim, 1, spec.conv_kernel_size), Init.CONV
        ),
        TensorSpec(f"{prefix}dt_bias", (hv,), Init.DT_BIAS),
        TensorSpec(f"{prefix}A_log", (hv,), Init.A_LOG),
        # Gated RMSNorm over one value head, weight used as-is (not zero-centred).
        TensorSpec(f"{prefix}norm.weight", (spec.linear_value_head_dim,), Init.NORM_UNIT),
        _linear(f"{prefix}out_proj", h, spec.linear_value_dim),
    ]


def _ffn(spec: TinySpec, prefix: str) -> list[TensorSpec]:
    h = spec.hidden_size
    if spec.kind == "dense":
        return _swiglu(prefix, h, spec.intermediate_size)
    specs = [_linear(f"{prefix}gate", spec.num_experts, h, fp8=False)]  # the router
    for e in range(spec.num_experts):
        specs += _swiglu(f"{prefix}experts.{e}.", h, spec.moe_intermediate_size)
    specs += _swiglu(f"{prefix}shared_expert.", h, spec.shared_expert_intermediate_size)
    specs.append(_linear(f"{prefix}shared_expert_gate", 1, h, fp8=False))
    return specs


def _swiglu(prefix: str, hidden: int, intermediate: int) -> list[TensorSpec]:
    return [
        _linear(f"{prefix}gate_proj", intermediate, hidden),
        _linear(f"{prefix}up_proj", intermediate, hidden),
        _linear(f"{prefix}down_proj", hidden, intermediate),
    ]


def _mtp(spec: TinySpec) -> list[TensorSpec]:
    """The MTP head: fc over [norm(embedding), norm(hidden)] (embedding first), one full-attention
    decoder layer with the main model's FFN kind, a final norm; embed and lm_head are shared."""
    h = spec.hidden_size
    return [
        _linear(f"{MTP_PREFIX}fc", h, 2 * h),
        TensorSpec(f"{MTP_PREFIX}pre_fc_norm_embedding.weight", (h,), Init.NORM_ZERO_CENTRED),
        TensorSpec(f"{MTP_PREFIX}pre_fc_norm_hidden.weight", (h,), Init.NORM_ZERO_CENTRED),
        *_decoder_layer(spec, f"{MTP_PREFIX}layers.0.", "full_attention"),
        TensorSpec(f"{MTP_PREFIX}norm.weight", (h,), Init.NORM_ZERO_CENTRED),
    ]


def _vision(spec: TinySpec) -> list[TensorSpec]:
    """The ViT tower and patch merger; never quantised (real fp8 checkpoints keep it bf16)."""
    c, p, t = spec.vision_hidden_size, spec.vision_patch_size, spec.vision_temporal_patch_size
    merged = c * spec.vision_spatial_merge_size**2
    specs = [
        TensorSpec(f"{VISION_PREFIX}patch_embed.proj.weight", (c, 3, t, p, p), Init.LINEAR, True),
        TensorSpec(f"{VISION_PREFIX}patch_embed.proj.bias", (c,), Init.BIAS),
        TensorSpec(
            f"{VISION_PREFIX}pos_embed.weight",
            (spec.vision_num_position_embeddings, c),
            Init.EMBEDDING,
            True,
        ),
    ]
    for i in range(spec.vision_depth):
        prefix = f"{VISION_PREFIX}blocks.{i}."
        specs += [
            *_layer_norm(f"{prefix}norm1", c),
            *_layer_norm(f"{prefix}norm2", c),
            *_biased_linear(f"{prefix}attn.qkv", 3 * c, c),
            *_biased_linear(f"{prefix}attn.proj", c, c),
            *_biased_linear(f"{prefix}mlp.linear_fc1", spec.vision_intermediate_size, c),
            *_biased_linear(f"{prefix}mlp.linear_fc2", c, spec.vision_intermediate_size),
        ]
    specs += [
        *_layer_norm(f"{VISION_PREFIX}merger.norm", c),
        *_biased_linear(f"{VISION_PREFIX}merger.linear_fc1", merged, merged),
        *_biased_linear(f"{VISION_PREFIX}merger.linear_fc2", spec.hidden_size, merged),
    ]
    return specs


def _layer_norm(name: str, size: int) -> list[TensorSpec]:
    return [
        TensorSpec(f"{name}.weight", (size,), Init.NORM_UNIT),
        TensorSpec(f"{name}.bias", (size,), Init.BIAS),
    ]


def _biased_linear(name: str, out_features: int, in_features: int) -> list[TensorSpec]:
    return [
        _linear(name, out_features, in_features, fp8=False),
        TensorSpec(f"{name}.bias", (out_features,), Init.BIAS),
    ]
