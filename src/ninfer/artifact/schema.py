"""Which tensors each component must hold, with shapes derived from the model config.

Shared by the converter (to refuse incomplete sources) and the reader (to refuse inconsistent
artifacts). Names are relative to the component: the artifact stores `text.` + name, `mtp.` + name,
`vision.` + name. MoE experts are always fused: `experts.gate_up_proj` [E, 2I, H] (gate rows first)
and `experts.down_proj` [E, H, I], whatever layout the source checkpoint used.
"""

from __future__ import annotations

from typing import Any

Shapes = dict[str, tuple[int, ...]]


def layer_types(text: dict[str, Any]) -> list[str]:
    n = int(text["num_hidden_layers"])
    types = text.get("layer_types")
    if types is None:
        interval = int(text.get("full_attention_interval", 4))
        types = [
            "full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(n)
        ]
    return list(types)


def is_moe(text: dict[str, Any]) -> bool:
    """MoE by model type; dense configs may still carry (unused) expert fields."""
    model_type = str(text.get("model_type") or "")
    if model_type:
        return "moe" in model_type
    return int(text.get("num_experts") or 0) > 0


def _attention(prefix: str, t: dict[str, Any]) -> Shapes:
    h, d = (
        int(t["hidden_size"]),
        int(t.get("head_dim") or t["hidden_size"] // t["num_attention_heads"]),
    )
    nq, nkv = int(t["num_attention_heads"]), int(t["num_key_value_heads"])
    gate = 2 if t.get("attn_output_gate", True) else 1
    return {
        f"{prefix}q_proj.weight": (nq * d * gate, h),
        f"{prefix}k_proj.weight": (nkv * d, h),
        f"{prefix}v_proj.weight": (nkv * d, h),
        f"{prefix}o_proj.weight": (h, nq * d),
        f"{prefix}q_norm.weight": (d,),
        f"{prefix}k_norm.weight": (d,),
    }


def _linear_attention(prefix: str, t: dict[str, Any]) -> Shapes:
    h = int(t["hidden_size"])
    nk, dk = int(t["linear_num_key_heads"]), int(t["linear_key_head_dim"])
    nv, dv = int(t["linear_num_value_heads"]), int(t["linear_value_head_dim"])
    conv_dim = 2 * nk * dk + nv * dv
    return {
        f"{prefix}in_proj_qkv.weight": (conv_dim, h),
        f"{prefix}in_proj_z.weight": (nv * dv, h),
        f"{prefix}in_proj_b.weight": (nv, h),
        f"{prefix}in_proj_a.weight": (nv, h),
        f"{prefix}conv1d.weight": (conv_dim, 1, int(t.get("linear_conv_kernel_dim", 4))),
        f"{prefix}dt_bias": (nv,),
        f"{prefix}A_log": (nv,),
        f"{prefix}norm.weight": (dv,),
        f"{prefix}out_proj.weight": (h, nv * dv),
    }


def _mlp(prefix: str, t: dict[str, Any]) -> Shapes:
    h = int(t["hidden_size"])
    if not is_moe(t):
        i = int(t["intermediate_size"])
        return {
            f"{prefix}gate_proj.weight": (i, h),
            f"{prefix}up_proj.weight": (i, h),
            f"{prefix}down_proj.weight": (h, i),
        }
    e, im = int(t["num_experts"]), int(t["moe_intermediate_size"])
    out: Shapes = {
        f"{prefix}gate.weight": (e, h),
        f"{prefix}experts.gate_up_proj": (e, 2 * im, h),
        f"{prefix}experts.down_proj": (e, h, im),
    }
    shared = int(t.get("shared_expert_intermediate_size") or 0)
    if shared:
        out |= {
            f"{prefix}shared_expert.gate_proj.weight": (shared, h),
            f"{prefix}shared_expert.up_proj.weight": (shared, h),
            f"{prefix}shared_expert.down_proj.weight": (h, shared),
            f"{prefix}shared_expert_gate.weight": (1, h),
        }
    return out


def _decoder_layer(prefix: str, kind: str, t: dict[str, Any]) -> Shapes:
    h = int(t["hidden_size"])
    out: Shapes = {
        f"{prefix}input_layernorm.weight": (h,),
        f"{prefix}post_attention_layernorm.weight": (h,),
    }
    if kind == "full_attention":
        out |= _attention(f"{prefix}self_attn.", t)
    elif kind == "linear_attention":
        out |= _linear_attention(f"{prefix}linear_attn.", t)
    else:
        raise ValueError(f"unknown layer type {kind!r}")
    return out | _mlp(f"{prefix}mlp.", t)


def text_tensors(t: dict[str, Any]) -> Shapes:
    h, v = int(t["hidden_size"]), int(t["vocab_size"])
    out: Shapes = {"embed_tokens.weight": (v, h), "norm.weight": (h,), "lm_head.weight": (v, h)}
    for i, kind in enumerate(layer_types(t)):
        out |= _decoder_layer(f"layers.{i}.", kind, t)
    return out


def mtp_tensors(t: dict[str, Any], num_layers: int) -> Shapes:
    h = int(t["hidden_size"])
    out: Shapes = {
        "fc.weight": (h, 2 * h),
        "pre_fc_norm_embedding.weight": (h,),
        "pre_fc_norm_hidden.weight": (h,),
        "norm.weight": (h,),
    }
    for j in range(num_layers):
        out |= _decoder_layer(f"layers.{j}.", "full_attention", t)
    return out


def vision_tensors(v: dict[str, Any]) -> Shapes:
    hv, iv = int(v["hidden_size"]), int(v["intermediate_size"])
    p, tp, c = int(v["patch_size"]), int(v["temporal_patch_size"]), int(v.get("in_channels", 3))
    m, out_h = int(v["spatial_merge_size"]), int(v["out_hidden_size"])
    merged = hv * m * m
    out: Shapes = {
        "patch_embed.proj.weight": (hv, c, tp, p, p),
        "patch_embed.proj.bias": (hv,),
        "pos_embed.weight": (int(v.get("num_position_embeddings", 2304)), hv),
        "merger.norm.weight": (hv,),
        "merger.norm.bias": (hv,),
        "merger.linear_fc1.weight": (merged, merged),
        "merger.linear_fc1.bias": (merged,),
        "merger.linear_fc2.weight": (out_h, merged),
        "merger.linear_fc2.bias": (out_h,),
    }
    for k in range(int(v["depth"])):
        b = f"blocks.{k}."
        out |= {
            f"{b}attn.qkv.weight": (3 * hv, hv),
            f"{b}attn.qkv.bias": (3 * hv,),
            f"{b}attn.proj.weight": (hv, hv),
            f"{b}attn.proj.bias": (hv,),
            f"{b}mlp.linear_fc1.weight": (iv, hv),
            f"{b}mlp.linear_fc1.bias": (iv,),
            f"{b}mlp.linear_fc2.weight": (hv, iv),
            f"{b}mlp.linear_fc2.bias": (hv,),
            f"{b}norm1.weight": (hv,),
            f"{b}norm1.bias": (hv,),
            f"{b}norm2.weight": (hv,),
            f"{b}norm2.bias": (hv,),
        }
    return out


def component_tensors(config: dict[str, Any], component: str) -> Shapes:
    """Required tensors of one component of an artifact config (see docs/artifact.md)."""
    text = config["text"]
    if component == "text":
        return text_tensors(text)
    if component == "mtp":
        return mtp_tensors(text, int(config["mtp"]["num_hidden_layers"]))
    if component == "vision":
        return vision_tensors(config["vision"])
    if component == "dflash":
        return {}  # companion drafter weights: free-form until the DFlash issue defines them
    raise ValueError(f"unknown component {component!r}")


# Kept in high precision by `--weights fp8`, as in the official Qwen3.5 FP8 checkpoints: they are a
# small share of the bytes and the most sensitive to rounding (gathers, routers, gates, tiny heads).
_HIGH_PRECISION = (
    "embed_tokens.weight",
    "lm_head.weight",
    "mlp.gate.weight",
    "shared_expert_gate.weight",
    "in_proj_a.weight",
    "in_proj_b.weight",
)


def is_quantizable(name: str, shape: tuple[int, ...]) -> bool:
    """Text / MTP linear weights that `--weights fp8` stores as e4m3 with 128x128 block scales."""
    if name.endswith(("experts.gate_up_proj", "experts.down_proj")):
        return len(shape) == 3
    return len(shape) == 2 and name.endswith(".weight") and not name.endswith(_HIGH_PRECISION)
