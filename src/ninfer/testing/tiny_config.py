"""The Hugging Face `config.json` / `generation_config.json` dicts of a tiny checkpoint.

Owns the mapping from `TinySpec` onto real Qwen3.5 / 3.6 config fields; must not import
`transformers` (the demo artifact is built on user machines). The dicts mirror a published
Qwen3.6-27B `config.json` field for field, extras included (`attn_output_gate`, `mtp_*`, ...).
"""

from __future__ import annotations

from typing import Any, Literal

import torch

from ninfer.testing.tiny_spec import TinySpec

Layout = Literal["nested", "flat"]

# Real special-token ids (FACTS.md, Tokenizer): kept even when a tiny vocabulary is smaller.
ENDOFTEXT_ID = 248044
IM_END_ID = 248046
VISION_START_ID = 248053
VISION_END_ID = 248054
IMAGE_PAD_ID = 248056
VIDEO_PAD_ID = 248057

_DTYPE_NAMES = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32"}


def dtype_name(dtype: torch.dtype) -> str:
    """The config spelling of a checkpoint dtype; only the three HF float dtypes are allowed."""
    if dtype not in _DTYPE_NAMES:
        raise ValueError(f"unsupported checkpoint dtype {dtype}; use bfloat16, float16 or float32")
    return _DTYPE_NAMES[dtype]


def tiny_config(
    spec: TinySpec, *, layout: Layout = "nested", dtype: torch.dtype = torch.bfloat16
) -> dict[str, Any]:
    """The `config.json` dict: nested (text_config + vision_config, multimodal architecture) or
    flat (text fields at the top level, `*ForCausalLM`, no vision)."""
    text = _text_config(spec, dtype)
    moe = spec.kind == "moe"
    if layout == "flat":
        return {
            "architectures": ["Qwen3_5MoeForCausalLM" if moe else "Qwen3_5ForCausalLM"],
            **text,
        }
    if layout != "nested":
        raise ValueError(f"layout must be 'nested' or 'flat', got {layout!r}")
    config: dict[str, Any] = {
        "architectures": [
            "Qwen3_5MoeForConditionalGeneration" if moe else "Qwen3_5ForConditionalGeneration"
        ],
        "image_token_id": IMAGE_PAD_ID,
        "language_model_only": not spec.with_vision,
        "model_type": "qwen3_5_moe" if moe else "qwen3_5",
        "text_config": text,
        "tie_word_embeddings": False,
        "video_token_id": VIDEO_PAD_ID,
        "vision_config": _vision_config(spec),
        "vision_end_token_id": VISION_END_ID,
        "vision_start_token_id": VISION_START_ID,
    }
    return config


def tiny_generation_config() -> dict[str, Any]:
    """`generation_config.json` as Qwen3.6 checkpoints ship it: two stop ids, sampling defaults."""
    return {
        "bos_token_id": ENDOFTEXT_ID,
        "do_sample": True,
        "eos_token_id": [IM_END_ID, ENDOFTEXT_ID],
        "pad_token_id": ENDOFTEXT_ID,
        "temperature": 1.0,
        "top_k": 20,
        "top_p": 0.95,
    }


def tiny_preprocessor_configs(spec: TinySpec) -> dict[str, dict[str, Any]]:
    """`preprocessor_config.json` and `video_preprocessor_config.json` as Qwen3.5 checkpoints
    ship them (the fields the transformers processors read), with the spec's pixel bounds."""
    common: dict[str, Any] = {
        "patch_size": spec.vision_patch_size,
        "temporal_patch_size": spec.vision_temporal_patch_size,
        "merge_size": spec.vision_spatial_merge_size,
        "image_mean": [0.5, 0.5, 0.5],
        "image_std": [0.5, 0.5, 0.5],
    }
    image = {
        "size": {"longest_edge": spec.image_max_pixels, "shortest_edge": spec.image_min_pixels},
        **common,
        "processor_class": "Qwen3VLProcessor",
        "image_processor_type": "Qwen2VLImageProcessorFast",
    }
    video = {
        "size": {"longest_edge": spec.video_max_pixels, "shortest_edge": spec.video_min_pixels},
        **common,
        "fps": spec.video_fps,
        "min_frames": spec.video_min_frames,
        "max_frames": spec.video_max_frames,
        "video_processor_type": "Qwen3VLVideoProcessor",
    }
    return {"preprocessor_config.json": image, "video_preprocessor_config.json": video}


def _text_config(spec: TinySpec, dtype: torch.dtype) -> dict[str, Any]:
    moe = spec.kind == "moe"
    ffn: dict[str, Any]
    if moe:
        ffn = {
            "moe_intermediate_size": spec.moe_intermediate_size,
            "num_experts": spec.num_experts,
            "num_experts_per_tok": spec.num_experts_per_token,
            "shared_expert_intermediate_size": spec.shared_expert_intermediate_size,
        }
    else:
        ffn = {"intermediate_size": spec.intermediate_size}
    text = {
        "attention_bias": False,
        "attention_dropout": 0.0,
        "attn_output_gate": True,
        "bos_token_id": ENDOFTEXT_ID,
        "dtype": dtype_name(dtype),
        "eos_token_id": ENDOFTEXT_ID,
        "full_attention_interval": spec.full_attention_interval,
        "head_dim": spec.head_dim,
        "hidden_act": "silu",
        "hidden_size": spec.hidden_size,
        "initializer_range": 0.02,
        **ffn,
        "layer_types": list(spec.layer_types),
        "linear_conv_kernel_dim": spec.conv_kernel_size,
        "linear_key_head_dim": spec.linear_key_head_dim,
        "linear_num_key_heads": spec.num_linear_key_heads,
        "linear_num_value_heads": spec.num_linear_value_heads,
        "linear_value_head_dim": spec.linear_value_head_dim,
        "mamba_ssm_dtype": "float32",
        "max_position_embeddings": spec.max_position_embeddings,
        "model_type": "qwen3_5_moe_text" if moe else "qwen3_5_text",
        "mtp_num_hidden_layers": 1 if spec.with_mtp else 0,
        "mtp_use_dedicated_embeddings": False,
        "num_attention_heads": spec.num_attention_heads,
        "num_hidden_layers": spec.num_layers,
        "num_key_value_heads": spec.num_kv_heads,
        "output_gate_type": "swish",
        "pad_token_id": None,
        "partial_rotary_factor": spec.partial_rotary_factor,
        "rms_norm_eps": spec.rms_norm_eps,
        "rope_parameters": {
            "mrope_interleaved": True,
            "mrope_section": list(spec.mrope_section),
            "partial_rotary_factor": spec.partial_rotary_factor,
            "rope_theta": spec.rope_theta,
            "rope_type": "default",
        },
        "tie_word_embeddings": False,
        "use_cache": True,
        "vocab_size": spec.vocab_size,
    }
    if moe:
        text["output_router_logits"] = False
        text["router_aux_loss_coef"] = 0.001
    return text


def _vision_config(spec: TinySpec) -> dict[str, Any]:
    return {
        "deepstack_visual_indexes": [],
        "depth": spec.vision_depth,
        "hidden_act": "gelu_pytorch_tanh",
        "hidden_size": spec.vision_hidden_size,
        "in_channels": 3,
        "initializer_range": 0.02,
        "intermediate_size": spec.vision_intermediate_size,
        "model_type": "qwen3_5_moe_vision" if spec.kind == "moe" else "qwen3_5_vision",
        "num_heads": spec.vision_num_heads,
        "num_position_embeddings": spec.vision_num_position_embeddings,
        "out_hidden_size": spec.hidden_size,
        "patch_size": spec.vision_patch_size,
        "spatial_merge_size": spec.vision_spatial_merge_size,
        "temporal_patch_size": spec.vision_temporal_patch_size,
    }
